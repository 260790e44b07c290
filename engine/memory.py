"""A cheap, thread-safe memory snapshot: device, torch allocator, this process and the system RAM.

The GUI thread calls `sample()` from a QTimer 10-20 times a second, often before the engine thread
has imported torch, so this module never imports torch. It touches torch only once the engine has
called `configure()` with an accelerator target, which happens after detection (torch fully imported
and the device initialised); until then, and on machines without an accelerator, the "device" is the
CPU's RAM, labelled as such.

Device numbers come from NVML (nvidia-ml-py, optional) when it is importable: it sees every process
on the GPU and this process's own share, and it costs no CUDA context. Otherwise from
torch.cuda.mem_get_info (driver-wide free/total, like nvidia-smi).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass

import psutil

log = logging.getLogger("loadout.memory")

# label -> (device bytes, RAM bytes[, key]): the key names the component across samples while its label may
# change (engine.residency.ledger.Snapshot.per_model); without one the label is the key
ResidencyProvider = Callable[[], Mapping[str, tuple]]


@dataclass(frozen=True)
class MemoryTarget:
    """Which device `sample()` reports: set by the engine after detection."""

    kind: str = "cpu"  # cpu, cuda, rocm, xpu, npu, mps
    index: int = 0
    name: str = "CPU RAM"
    uuid: str | None = None  # CUDA device UUID, to find the same GPU in NVML whatever the index order


CPU_TARGET = MemoryTarget()


@dataclass(frozen=True)
class ComponentResidency:
    """Bytes of one loaded component on the device and in RAM (from the residency ledger)."""

    name: str  # its label now: a second loaded component of the same name adds the file's name to both
    device_bytes: int
    ram_bytes: int
    key: str = ""  # the same component in every sample (its file and name), whatever its label

    @property
    def identity(self) -> str:
        return self.key or self.name


def component_key(path: str, name: str) -> str:
    """What names a loaded component across samples: its file and its name."""
    return f"{path}\n{name}"


def label_with_file(key: str) -> str:
    """A component's label that says its file ("vae (sd15.safetensors)"), from its key; a key of no file
    is its own label."""
    path, sep, name = key.partition("\n")
    return f"{name} ({os.path.basename(path)})" if sep else key


@dataclass(frozen=True)
class MemorySample:
    """One snapshot. `None` means "not known here" (e.g. torch numbers before torch is loaded)."""

    timestamp: float  # time.time(), for logs
    monotonic: float  # time.monotonic(), for graphs
    device_kind: str
    device_index: int
    device_label: str  # "NVIDIA H200" or "CPU RAM"
    device_total: int
    device_used: int
    device_free: int
    device_source: str  # "nvml", "torch" or "psutil" (the RAM stands in for a device)
    process_device_bytes: int | None  # this process's share of the device (NVML), RSS for the CPU
    torch_allocated: int | None
    torch_reserved: int | None
    torch_active: int | None
    process_rss: int
    ram_total: int
    ram_available: int
    residency: tuple[ComponentResidency, ...] = ()

    @property
    def device_is_ram(self) -> bool:
        return self.device_source == "psutil"

    def to_json(self) -> dict:
        d = asdict(self)
        d["residency"] = {
            c.name: {"device_bytes": c.device_bytes, "ram_bytes": c.ram_bytes} for c in self.residency
        }
        return d


class MemorySampler:
    """Holds the target, the NVML handle and the residency providers; `sample()` may be called from
    any thread. One lock serialises the readings (NVML and psutil objects are shared state)."""

    def __init__(self, target: MemoryTarget = CPU_TARGET, *, use_nvml: bool = True) -> None:
        self._lock = threading.Lock()
        self._target = target
        self._use_nvml = use_nvml
        self._nvml = None  # the pynvml module once initialised, False after a failure
        self._nvml_handle = None
        self._process = psutil.Process()
        self._pid = os.getpid()
        self._providers: list[ResidencyProvider] = []
        self._provider_failed: set[int] = set()

    @property
    def target(self) -> MemoryTarget:
        return self._target

    def configure(self, target: MemoryTarget) -> None:
        """Report `target` from now on. Call it only once torch is imported, if the target needs it."""
        with self._lock:
            self._target = target
            self._nvml_handle = None

    def register_residency_provider(self, provider: ResidencyProvider) -> Callable[[], None]:
        """Add a callable returning {component: (device_bytes, ram_bytes)} (a locked snapshot of the
        residency ledger); its numbers go into every sample. Returns a function that removes it."""
        with self._lock:
            self._providers.append(provider)

        def unregister() -> None:
            with self._lock:
                if provider in self._providers:
                    self._providers.remove(provider)

        return unregister

    def sample(self) -> MemorySample:
        with self._lock:
            target = self._target
            vm = psutil.virtual_memory()
            rss = int(self._process.memory_info().rss)
            dev = self._device(target, vm, rss)
            torch_stats = self._torch_stats(target)
            providers = list(self._providers)
        # Providers take their own (ledger) lock: call them outside ours so the two never nest.
        residency = self._residency(providers)
        total, used, free, source, proc, label = dev
        allocated, reserved, active = torch_stats
        return MemorySample(
            timestamp=time.time(),
            monotonic=time.monotonic(),
            device_kind=target.kind,
            device_index=target.index,
            device_label=label,
            device_total=total,
            device_used=used,
            device_free=free,
            device_source=source,
            process_device_bytes=proc,
            torch_allocated=allocated,
            torch_reserved=reserved,
            torch_active=active,
            process_rss=rss,
            ram_total=int(vm.total),
            ram_available=int(vm.available),
            residency=residency,
        )

    # -- device section ---------------------------------------------------------------------------

    def _device(self, target: MemoryTarget, vm, rss: int):
        if target.kind == "cuda":
            got = self._nvml_reading(target)
            if got is not None:
                return got
        if target.kind in ("cuda", "rocm", "xpu", "npu"):
            got = self._torch_device_reading(target)
            if got is not None:
                return got
        label = "Unified memory" if target.kind == "mps" else "CPU RAM"
        total, avail = int(vm.total), int(vm.available)
        return total, total - avail, avail, "psutil", rss, label

    def _nvml_reading(self, target: MemoryTarget):
        handle = self._nvml_device(target)
        if handle is None:
            return None
        nv = self._nvml
        try:
            info = nv.nvmlDeviceGetMemoryInfo(handle)
        except nv.NVMLError as e:
            log.warning("NVML stopped answering (%s); using torch.cuda.mem_get_info", e)
            self._nvml, self._nvml_handle = False, None
            return None
        mine = None
        try:
            for p in nv.nvmlDeviceGetComputeRunningProcesses(handle):
                # usedGpuMemory is None where the driver hides it (containers, WDDM on Windows).
                if p.pid == self._pid and p.usedGpuMemory is not None:
                    mine = (mine or 0) + int(p.usedGpuMemory)
        except nv.NVMLError:  # not supported on some virtual GPUs: the per-process share stays unknown
            mine = None
        return int(info.total), int(info.used), int(info.free), "nvml", mine, target.name

    def _nvml_device(self, target: MemoryTarget):
        if self._nvml_handle is not None:
            return self._nvml_handle
        if not self._use_nvml or self._nvml is False:
            return None
        try:
            if self._nvml is None:
                import pynvml  # nvidia-ml-py, optional

                pynvml.nvmlInit()
                self._nvml = pynvml
            nv = self._nvml
            if target.uuid:
                uuid = target.uuid if target.uuid.startswith("GPU-") else f"GPU-{target.uuid}"
                self._nvml_handle = nv.nvmlDeviceGetHandleByUUID(uuid)
            elif not os.environ.get("CUDA_VISIBLE_DEVICES"):
                # Without a UUID the CUDA index equals NVML's only when no devices are hidden/reordered.
                self._nvml_handle = nv.nvmlDeviceGetHandleByIndex(target.index)
        except ImportError:
            self._nvml = False
        except Exception as e:  # pynvml.NVMLError and friends: no driver library, unknown UUID, ...
            log.info("NVML unavailable (%s); using torch for device memory", e)
            self._nvml = False
        return self._nvml_handle

    def _torch_device_reading(self, target: MemoryTarget):
        torch = sys.modules.get("torch")
        if torch is None:
            return None
        i = target.index
        try:
            if target.kind in ("cuda", "rocm"):
                if not torch.cuda.is_initialized():  # never create a CUDA context from the GUI thread
                    return None
                free, total = torch.cuda.mem_get_info(i)
            elif target.kind == "xpu":
                if hasattr(torch.xpu, "mem_get_info"):
                    free, total = torch.xpu.mem_get_info(i)
                else:
                    total = torch.xpu.get_device_properties(i).total_memory
                    free = total - torch.xpu.memory_reserved(i)
            else:  # npu
                free, total = torch.npu.mem_get_info(i)
        except (RuntimeError, AttributeError) as e:
            log.debug("torch device memory unavailable: %s", e)
            return None
        return int(total), int(total - free), int(free), "torch", None, target.name

    # -- torch allocator ---------------------------------------------------------------------------

    def _torch_stats(self, target: MemoryTarget) -> tuple[int | None, int | None, int | None]:
        torch = sys.modules.get("torch")
        if torch is None or target.kind == "cpu":
            return None, None, None
        try:
            if target.kind in ("cuda", "rocm"):
                if not torch.cuda.is_initialized():
                    return None, None, None
                s = torch.cuda.memory_stats(target.index)
            elif target.kind == "mps":
                return (
                    int(torch.mps.current_allocated_memory()),
                    int(torch.mps.driver_allocated_memory()),
                    None,
                )
            elif target.kind == "xpu":
                s = torch.xpu.memory_stats(target.index)
            else:
                s = torch.npu.memory_stats(target.index)
        except (RuntimeError, AttributeError) as e:
            log.debug("torch allocator stats unavailable: %s", e)
            return None, None, None
        return (
            int(s.get("allocated_bytes.all.current", 0)),
            int(s.get("reserved_bytes.all.current", 0)),
            int(s.get("active_bytes.all.current", 0)),
        )

    def _residency(self, providers: list[ResidencyProvider]) -> tuple[ComponentResidency, ...]:
        merged: dict[str, ComponentResidency] = {}
        for p in providers:
            try:
                for name, (dev, ram, *key) in p().items():
                    merged[name] = ComponentResidency(
                        str(name), int(dev), int(ram), str(key[0]) if key else ""
                    )
            except Exception:  # a broken provider must not stop the 20 Hz sampler: log it once
                if id(p) not in self._provider_failed:
                    self._provider_failed.add(id(p))
                    log.exception("residency provider %r failed", p)
        return tuple(sorted(merged.values(), key=lambda c: c.name))


_default = MemorySampler()


def sample() -> MemorySample:
    """A snapshot from the process-wide sampler (thread-safe, no torch import)."""
    return _default.sample()


def configure(target: MemoryTarget) -> None:
    """Point the process-wide sampler at a device (the engine calls this after detection)."""
    _default.configure(target)


def register_residency_provider(provider: ResidencyProvider) -> Callable[[], None]:
    """Register a {component: (device_bytes, ram_bytes)} snapshot callable; returns its remover."""
    return _default.register_residency_provider(provider)


def target_for(device) -> MemoryTarget:
    """The MemoryTarget for an engine.devices.DeviceInfo (duck-typed: this module stays import-light)."""
    if device.kind == "cpu":
        return CPU_TARGET
    return MemoryTarget(device.kind, device.index, device.name, device.uuid)


# -- handing freed memory back to the OS ------------------------------------------------------------


def release_memory() -> None:
    """Hand freed memory back to the OS after a run (done, failed or cancelled): collect reference
    cycles (an exception's traceback holds tensors), then trim the heap."""
    import gc

    gc.collect()
    trim_heap()


def trim_heap(min_free: int = 0) -> None:
    """glibc keeps freed heap pages (its mmap threshold rises after big frees, so later tensors land on
    the heap), which would make RSS grow tile after tile (and a load's read buffers stay counted); malloc_trim(0) returns them (a few ms; a no-op
    off glibc). No gc.collect here: a tile's tensors are freed by reference counting, and a full
    collection costs 0.1-0.3 s in a process as big as the window's -- per tile, most of a small-tile
    decode's time.

    `min_free`: trim only once the heap holds more than this many free bytes (glibc's mallinfo2, a
    microsecond). Returned pages are faulted in again, zeroed, by the next allocations: a tiled decode
    trimming after every tile spent a third of its time so (1024^2: 16 s against 11.5 s)."""
    global _libc
    if _libc is None:
        try:
            import ctypes

            class MallInfo2(ctypes.Structure):
                _fields_ = [
                    (n, ctypes.c_size_t)
                    for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                              "uordblks", "fordblks", "keepcost")
                ]  # fmt: skip

            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
            if hasattr(_libc, "mallinfo2"):  # glibc >= 2.33; without it every call trims
                _libc.mallinfo2.restype = MallInfo2
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return
    global _rss_low
    if min_free > 0 and hasattr(_libc, "mallinfo2"):
        if _libc.mallinfo2().fordblks <= min_free:
            return
        # glibc still counts the pages malloc_trim handed back as free heap (fordblks), so after a big
        # run had left more free heap than `min_free`, the test above passed on every call, every call
        # trimmed, and every page came back as a fault (the window's 128-px tiles after a 2048x768
        # TAEF2 round trip: 1.5x the full decode's time, against 1.1x never trimming). What the slack
        # bounds is memory the process holds: trim once RSS has grown by more than `min_free` above
        # its lowest since the last trim (/proc/self/statm: one small read).
        rss = _rss()
        if rss is not None:
            _rss_low = min(_rss_low, rss)
            if rss - _rss_low <= min_free:
                return
    _libc.malloc_trim(0)
    _rss_low = _rss() or 0


def _rss() -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


_libc = None
_rss_low = 0  # the process's lowest RSS since the last malloc_trim (bytes)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def default_probe(device: str) -> Callable[[], int]:
    """Free bytes on `device` now: torch.cuda.mem_get_info on CUDA, available RAM on the CPU."""
    if device.startswith("cuda"):

        def cuda_free() -> int:
            import torch

            free, _ = torch.cuda.mem_get_info(torch.device(device))
            return int(free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device))

        return cuda_free
    import psutil

    return lambda: int(psutil.virtual_memory().available)
