"""Which devices this machine has, and how Loadout will use them (VRAM state, reserve, budget).

Two halves, kept apart so every decision is testable without a GPU:

* `probe_hardware()` asks the installed torch what it exposes and returns a `HardwareFacts`, a plain
  dataclass of facts. It is the only function here that imports torch, and nothing probes at import.
* `build_report(facts, options)` turns facts + user options into a `DeviceReport`: the selected
  device, `VRAMState`, `CPUState`, reserved memory, minimum inference memory and the weight budget.
  Tests feed it hand-written facts (a 4 GiB card, an Apple M2, ...).

The states and their meaning follow ComfyUI's `comfy/model_management.py` (GPL-3.0; facts only, no
code): DISABLED = no device memory to manage (CPU), NO_VRAM / LOW_VRAM = offload aggressively,
NORMAL_VRAM = load what fits, HIGH_VRAM = keep everything on the device, SHARED = device and CPU share
one memory (Apple MPS, integrated GPUs) but tensors still move between them.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, dataclass, field
from enum import Enum

from . import device_rules as rules
from .errors import InvalidRequest

GiB = 1024**3
MiB = 1024**2

# ComfyUI model_management.py: EXTRA_RESERVED_VRAM is 400 MiB; on Windows 600 MiB ("because of the
# shared vram issue"), plus 100 MiB more when the device has more than 15 GiB; `--reserve-vram GB`
# replaces it. minimum_inference_memory() = 0.8 GiB + that reserve.
RESERVE_DEFAULT = 400 * MiB
RESERVE_WINDOWS = 600 * MiB
RESERVE_WINDOWS_BIG_EXTRA = 100 * MiB
RESERVE_WINDOWS_BIG_ABOVE = 15 * GiB
INFERENCE_FLOOR = int(0.8 * GiB)

# ComfyUI (2023-2024 versions of model_management.py) switched to LOW_VRAM by itself when the card's
# total memory, from torch.cuda.mem_get_info, was <= 4096 MiB, unless --normalvram or --cpu was given.
# Later versions dropped the automatic switch in favour of partial loading in NORMAL_VRAM; Loadout
# keeps the documented rule because partial loading is exactly what LOW_VRAM selects here.
AUTO_LOWVRAM_AT_OR_BELOW = 4096 * MiB


class VRAMState(str, Enum):
    """How the residency manager spends device memory (ComfyUI's states). A str enum: its value is its
    name, so it reads and prints as ComfyUI's flag words do."""

    DISABLED = "DISABLED"
    NO_VRAM = "NO_VRAM"
    LOW_VRAM = "LOW_VRAM"
    NORMAL_VRAM = "NORMAL_VRAM"
    HIGH_VRAM = "HIGH_VRAM"
    SHARED = "SHARED"


class CPUState(str, Enum):
    GPU = "GPU"
    CPU = "CPU"
    MPS = "MPS"


DTYPE_CHOICES = ("fp32", "fp16", "bf16")
WEIGHT_DTYPE_CHOICES = ("fp32", "fp16", "bf16", "fp8_e4m3fn", "fp8_e5m2")


@dataclass(frozen=True)
class DeviceOptions:
    """What the user asked for (the device flags every device-touching command accepts). GB = GiB."""

    cpu: bool = False
    lowvram: bool = False
    novram: bool = False
    normalvram: bool = False  # opt out of the automatic LOW_VRAM on small cards, as ComfyUI's flag
    highvram: bool = False
    gpu_only: bool = False  # HIGH_VRAM, and text encoders / VAE / intermediates stay on the device too
    reserve_vram_gb: float | None = None
    vram_budget_gb: float | None = None
    inference_memory_gb: float | None = None  # overrides the 0.8 GiB floor (no flag yet)
    cpu_vae: bool = False
    force_dtype: str | None = None  # fp32 / fp16 / bf16
    unet_dtype: str | None = None
    vae_dtype: str | None = None
    text_encoder_dtype: str | None = None
    device_index: int | None = None
    disable_smart_memory: bool = False

    def __post_init__(self) -> None:
        for name in ("reserve_vram_gb", "vram_budget_gb", "inference_memory_gb"):
            v = getattr(self, name)
            if v is not None and not (v >= 0):  # also rejects NaN
                raise ValueError(f"{name} must be a number of GiB >= 0, not {v!r}")
        if self.device_index is not None and self.device_index < 0:
            raise ValueError(f"device index must be >= 0, not {self.device_index}")
        if self.force_dtype is not None and self.force_dtype not in DTYPE_CHOICES:
            raise ValueError(f"force_dtype must be one of {DTYPE_CHOICES}, not {self.force_dtype!r}")
        for name in ("unet_dtype", "vae_dtype", "text_encoder_dtype"):
            v = getattr(self, name)
            if v is not None and v not in WEIGHT_DTYPE_CHOICES:
                raise ValueError(f"{name} must be one of {WEIGHT_DTYPE_CHOICES}, not {v!r}")


def add_device_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the device flags (ComfyUI's names where they exist) to a sub-command's parser."""
    g = parser.add_argument_group("device options (sizes in GB are GiB)")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--cpu", action="store_true", help="use the CPU only, even when a GPU is present")
    mode.add_argument("--lowvram", action="store_true", help="offload model parts to RAM to save VRAM")
    mode.add_argument("--novram", action="store_true", help="keep as little as possible in VRAM")
    mode.add_argument("--normalvram", action="store_true", help="no automatic LOW_VRAM on cards <= 4 GiB")
    mode.add_argument("--highvram", action="store_true", help="keep models in VRAM instead of offloading")
    mode.add_argument(
        "--gpu-only", action="store_true", help="keep everything, text encoders too, on the GPU"
    )
    g.add_argument("--reserve-vram", type=_gib, metavar="GB", help="memory left to other programs")
    g.add_argument("--vram-budget", type=_gib, metavar="GB", help="cap on memory for weights (any device)")
    g.add_argument("--cpu-vae", action="store_true", help="run the VAE on the CPU")
    dt = g.add_mutually_exclusive_group()
    dt.add_argument("--force-fp32", action="store_const", dest="force_dtype", const="fp32")
    dt.add_argument("--force-fp16", action="store_const", dest="force_dtype", const="fp16")
    dt.add_argument("--force-bf16", action="store_const", dest="force_dtype", const="bf16")
    g.add_argument("--unet-dtype", choices=WEIGHT_DTYPE_CHOICES, help="weight dtype of the diffusion model")
    g.add_argument("--vae-dtype", choices=DTYPE_CHOICES, help="dtype of the VAE")
    g.add_argument("--text-encoder-dtype", choices=WEIGHT_DTYPE_CHOICES, help="dtype of the text encoders")
    g.add_argument("--device", type=int, metavar="N", dest="device_index", help="which GPU (default 0)")
    g.add_argument("--disable-smart-memory", action="store_true", help="unload models eagerly")


def _gib(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of GiB") from None
    if not v >= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be >= 0 GiB")
    return v


def options_from_args(args: argparse.Namespace) -> DeviceOptions:
    """DeviceOptions from parsed device flags; flags a parser did not define keep their defaults."""
    a = vars(args)
    return DeviceOptions(
        cpu=bool(a.get("cpu")),
        lowvram=bool(a.get("lowvram")),
        novram=bool(a.get("novram")),
        normalvram=bool(a.get("normalvram")),
        highvram=bool(a.get("highvram")),
        gpu_only=bool(a.get("gpu_only")),
        reserve_vram_gb=a.get("reserve_vram"),
        vram_budget_gb=a.get("vram_budget"),
        cpu_vae=bool(a.get("cpu_vae")),
        force_dtype=a.get("force_dtype"),
        unet_dtype=a.get("unet_dtype"),
        vae_dtype=a.get("vae_dtype"),
        text_encoder_dtype=a.get("text_encoder_dtype"),
        device_index=a.get("device_index"),
        disable_smart_memory=bool(a.get("disable_smart_memory")),
    )


@dataclass(frozen=True)
class DeviceInfo:
    """One compute device as torch exposes it. `fp16` / `bf16` / `fp8_compute` mean "worth computing
    in by default" by the rules in engine/device_rules.py, not merely "torch accepts the dtype"."""

    kind: str  # cuda, rocm, xpu, npu, mps, cpu
    index: int
    name: str
    total_memory: int
    torch_device: str  # "cuda:0", "xpu:0", "mps", "cpu"
    capability: tuple[int, int] | None = None
    arch: str | None = None  # ROCm gcnArchName, e.g. gfx1100
    integrated: bool = False  # shares the system RAM (Apple silicon, iGPUs, Jetson-like boards)
    uuid: str | None = None
    fp16: bool = False
    bf16: bool = False
    fp8_compute: bool = False

    @property
    def is_accelerator(self) -> bool:
        return self.kind != "cpu"

    @property
    def label(self) -> str:
        return "CPU RAM" if self.kind == "cpu" else f"{self.name} ({self.torch_device})"

    def to_json(self) -> dict:
        d = asdict(self)
        d["capability"] = list(self.capability) if self.capability else None
        return d


@dataclass(frozen=True)
class HardwareFacts:
    """Everything the state choice depends on, as plain facts (tests write these by hand)."""

    platform: str  # "linux", "windows", "darwin"
    ram_total: int
    cpu_name: str = "CPU"
    accelerators: tuple[DeviceInfo, ...] = ()
    torch_version: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def cpu(self) -> DeviceInfo:
        return DeviceInfo("cpu", 0, self.cpu_name, self.ram_total, "cpu")


@dataclass(frozen=True)
class DeviceReport:
    """The outcome of detection: every device, the one in use, and the memory policy numbers."""

    devices: tuple[DeviceInfo, ...]
    selected: DeviceInfo
    vram_state: VRAMState
    cpu_state: CPUState
    reserve_bytes: int
    inference_floor_bytes: int
    vram_budget_bytes: int | None
    vae_device: str
    options: DeviceOptions = field(default_factory=DeviceOptions)
    platform: str = ""
    torch_version: str = ""
    ram_total: int = 0
    warnings: tuple[str, ...] = ()

    @property
    def min_inference_bytes(self) -> int:
        """ComfyUI's minimum inference memory: the working floor plus the reserve."""
        return self.inference_floor_bytes + self.reserve_bytes

    def budget_bytes(self, free_bytes: int) -> int:
        """Bytes of weights that may go on the selected device now (see `budget_bytes`)."""
        return budget_bytes(free_bytes, self.min_inference_bytes, self.vram_budget_bytes)

    def to_json(self) -> dict:
        return {
            "platform": self.platform,
            "torch": self.torch_version,
            "devices": [d.to_json() for d in self.devices],
            "selected": self.selected.torch_device,
            "vram_state": self.vram_state.value,
            "cpu_state": self.cpu_state.value,
            "vae_device": self.vae_device,
            "reserve_bytes": self.reserve_bytes,
            "inference_floor_bytes": self.inference_floor_bytes,
            "min_inference_bytes": self.min_inference_bytes,
            "vram_budget_bytes": self.vram_budget_bytes,
            "ram_total": self.ram_total,
            "dtypes": {
                "force": self.options.force_dtype,
                "unet": self.options.unet_dtype,
                "vae": self.options.vae_dtype,
                "text_encoder": self.options.text_encoder_dtype,
            },
            "smart_memory": not self.options.disable_smart_memory,
            "options": asdict(self.options),
            "warnings": list(self.warnings),
        }


def budget_bytes(free_bytes: int, min_inference_bytes: int, cap_bytes: int | None = None) -> int:
    """Memory for weights: free - (reserve + 0.8 GiB working floor), never below 0, capped by
    --vram-budget. The reserve is counted once: ComfyUI's minimum inference memory already holds it."""
    b = max(0, int(free_bytes) - int(min_inference_bytes))
    return b if cap_bytes is None else min(b, int(cap_bytes))


def reserve_bytes_for(platform: str, device_total: int, options: DeviceOptions) -> int:
    """Memory left to other programs and the driver (see RESERVE_* above for the source)."""
    if options.reserve_vram_gb is not None:
        return int(options.reserve_vram_gb * GiB)
    if platform == "windows":
        extra = RESERVE_WINDOWS_BIG_EXTRA if device_total > RESERVE_WINDOWS_BIG_ABOVE else 0
        return RESERVE_WINDOWS + extra
    return RESERVE_DEFAULT


# Preferred accelerator kinds, first wins; a machine rarely has two kinds.
_KIND_ORDER = ("cuda", "rocm", "xpu", "npu", "mps")


def select_device(facts: HardwareFacts, options: DeviceOptions) -> DeviceInfo:
    """The device to compute on: the CPU with --cpu or without accelerators, else the N-th (--device)
    device of the preferred kind."""
    if options.cpu or not facts.accelerators:
        if options.device_index not in (None, 0) and not options.cpu:
            raise InvalidRequest(f"--device {options.device_index}: no GPU was found, only the CPU.")
        return facts.cpu
    for kind in _KIND_ORDER:
        same = [d for d in facts.accelerators if d.kind == kind]
        if same:
            want = options.device_index or 0
            for d in same:
                if d.index == want:
                    return d
            have = ", ".join(d.torch_device for d in same)
            raise InvalidRequest(f"--device {want}: there is no such {kind} device; found {have}.")
    return facts.accelerators[0]


def choose_states(device: DeviceInfo, options: DeviceOptions) -> tuple[VRAMState, CPUState]:
    """VRAMState and CPUState for a selected device, in ComfyUI's precedence: --lowvram, then --novram,
    then --highvram/--gpu-only; a card <= 4 GiB starts LOW_VRAM unless --normalvram; the CPU is
    DISABLED; Apple MPS (and any device that shares system RAM) is SHARED."""
    if device.kind == "cpu":
        return VRAMState.DISABLED, CPUState.CPU
    cpu_state = CPUState.MPS if device.kind == "mps" else CPUState.GPU
    if device.integrated:
        return VRAMState.SHARED, cpu_state
    state = VRAMState.NORMAL_VRAM
    if device.total_memory <= AUTO_LOWVRAM_AT_OR_BELOW and not options.normalvram:
        state = VRAMState.LOW_VRAM
    if options.lowvram:
        state = VRAMState.LOW_VRAM
    elif options.novram:
        state = VRAMState.NO_VRAM
    elif options.highvram or options.gpu_only:
        state = VRAMState.HIGH_VRAM
    return state, cpu_state


def build_report(facts: HardwareFacts, options: DeviceOptions | None = None) -> DeviceReport:
    """Decide everything from facts and options; pure, so tests run it with invented hardware."""
    options = options or DeviceOptions()
    selected = select_device(facts, options)
    vram_state, cpu_state = choose_states(selected, options)
    floor = INFERENCE_FLOOR if options.inference_memory_gb is None else int(options.inference_memory_gb * GiB)
    budget = None if options.vram_budget_gb is None else int(options.vram_budget_gb * GiB)
    vae_device = "cpu" if options.cpu_vae else selected.torch_device
    return DeviceReport(
        devices=(facts.cpu, *facts.accelerators),
        selected=selected,
        vram_state=vram_state,
        cpu_state=cpu_state,
        reserve_bytes=reserve_bytes_for(facts.platform, selected.total_memory, options),
        inference_floor_bytes=floor,
        vram_budget_bytes=budget,
        vae_device=vae_device,
        options=options,
        platform=facts.platform,
        torch_version=facts.torch_version,
        ram_total=facts.ram_total,
        warnings=facts.warnings,
    )


def detect_devices(options: DeviceOptions | None = None) -> DeviceReport:
    """Probe the installed torch (imports it) and decide. Call from the engine thread or the CLI."""
    return build_report(probe_hardware(), options)


def probe_hardware() -> HardwareFacts:
    """Ask the installed torch which devices it exposes. Imports torch; a backend that fails to answer
    (broken driver, missing runtime) is left out with a warning instead of stopping detection."""
    import platform as _platform

    import psutil
    import torch

    warnings: list[str] = []
    found: list[DeviceInfo] = []
    tv = str(torch.__version__)
    for probe in (_probe_cuda, _probe_xpu, _probe_npu, _probe_mps):
        try:
            found.extend(probe(torch, tv))
        except Exception as e:  # a driver/runtime error: report it, keep the other backends
            warnings.append(f"{probe.__name__[7:]}: {type(e).__name__}: {e}")
    return HardwareFacts(
        platform=_platform_name(_platform.system()),
        ram_total=int(psutil.virtual_memory().total),
        cpu_name=_cpu_name(),
        accelerators=tuple(found),
        torch_version=tv,
        warnings=tuple(warnings),
    )


def _platform_name(system: str) -> str:
    return {"Windows": "windows", "Darwin": "darwin", "Linux": "linux"}.get(system, system.lower())


def _cpu_name() -> str:
    import platform as _platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine() or "CPU"


def _probe_cuda(torch, tv: str) -> list[DeviceInfo]:
    if not torch.cuda.is_available():
        return []
    hip = getattr(torch.version, "hip", None)
    out = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        cap = (int(p.major), int(p.minor))
        arch = getattr(p, "gcnArchName", None) if hip else None
        if hip:
            fp16, bf16, fp8 = rules.rocm_support(arch, tv, hip)
        else:
            fp16, bf16, fp8 = rules.cuda_support(cap, p.name, tv)
        uuid = getattr(p, "uuid", None)
        out.append(
            DeviceInfo(
                kind="rocm" if hip else "cuda",
                index=i,
                name=str(p.name),
                total_memory=int(p.total_memory),
                torch_device=f"cuda:{i}",
                capability=cap,
                arch=arch,
                integrated=bool(getattr(p, "is_integrated", False)),
                uuid=str(uuid) if uuid is not None else None,
                fp16=fp16,
                bf16=bf16,
                fp8_compute=fp8,
            )
        )
    return out


def _probe_xpu(torch, tv: str) -> list[DeviceInfo]:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        return []
    out = []
    for i in range(xpu.device_count()):
        p = xpu.get_device_properties(i)
        fp16, bf16, fp8 = rules.xpu_support(getattr(p, "has_fp16", True), xpu.is_bf16_supported())
        out.append(
            DeviceInfo(
                "xpu", i, str(p.name), int(p.total_memory), f"xpu:{i}", fp16=fp16, bf16=bf16, fp8_compute=fp8
            )
        )
    return out


def _probe_npu(torch, tv: str) -> list[DeviceInfo]:
    import importlib.util

    if importlib.util.find_spec("torch_npu") is None:
        return []
    import torch_npu  # noqa: F401  (registers torch.npu)

    if not torch.npu.is_available():
        return []
    fp16, bf16, fp8 = rules.npu_support()
    out = []
    for i in range(torch.npu.device_count()):
        p = torch.npu.get_device_properties(i)
        out.append(
            DeviceInfo(
                "npu", i, str(p.name), int(p.total_memory), f"npu:{i}", fp16=fp16, bf16=bf16, fp8_compute=fp8
            )
        )
    return out


def _probe_mps(torch, tv: str) -> list[DeviceInfo]:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_available():
        return []
    import platform as _platform

    import psutil

    try:
        mac = tuple(int(n) for n in _platform.mac_ver()[0].split("."))
    except ValueError:
        mac = None
    fp16, bf16, fp8 = rules.mps_support(mac)
    # Unified memory: the GPU's memory is the system RAM (ComfyUI's get_total_memory does the same).
    total = int(psutil.virtual_memory().total)
    name = f"Apple {_platform.machine()} GPU (MPS)"
    return [DeviceInfo("mps", 0, name, total, "mps", integrated=True, fp16=fp16, bf16=bf16, fp8_compute=fp8)]
