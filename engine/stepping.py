"""The facade's Step: the denoiser's forward pass run under the residency manager, measured as a user
feels it — seconds per step and peak memory — fully resident or partially, with the rest streamed.

The denoiser is the ledger's own component (placed by Residency.load under the budget, as a decode
places its VAE, and kept loaded afterwards); engine.denoise runs its castable ops where they are. Its
LoRA stack (engine.stacking's on-the-fly functions) is baked into the resident modules for the run
and applied on the fly to the streamed ones (engine.denoise.patches); the offloaded modules are read
ahead of the compute (engine.denoise.stream). A cancel stops within one op and leaves the ledger and
the patches as they were. Runs in the engine thread only; everything it touches is passed in.
"""

from __future__ import annotations

import os
import statistics
import time
from types import MappingProxyType

from .errors import Cancelled, FormatError
from .events import JobCancelled, StepFinished, Tiers
from .jobs import Progress
from .requests import Step, StepResult

DENOISERS = ("unet", "transformer")


def denoiser_of(components: dict, name: str | None = None):
    """The component to step among a file's (name -> component): the one named, else its denoiser, else
    (a text encoder's own file) its text encoder; a FormatError when there is none."""
    from .model.dtypes import role_of

    if name is not None:
        if name not in components:
            raise FormatError(f"this file has no component {name} (it has {', '.join(components) or 'none'})")
        return components[name]
    for n in DENOISERS:
        if n in components:
            return components[n]
    for n, c in components.items():
        if role_of(n) == "text_encoder":
            return c
    from .catalog.step_families import NO_DENOISER

    raise FormatError(NO_DENOISER)


def architecture_of(component):
    """(architecture, variant) of the component's file, from its header (engine.detect)."""
    from .detect.core import detect_index
    from .formats.index import index_of_header, open_index

    f = component.file
    # A safetensors header already read is indexed in place; a GGUF file's index has its own reader.
    index = index_of_header(f.header, f.path) if hasattr(f.header, "data_size") else open_index(f.path)
    det = detect_index(index, path=f.path)
    return det.architecture, det.variant


def read_inputs(path: str) -> dict:
    """The tensors of an --inputs file, copied out of its mapping."""
    from .formats.safetensors import SafetensorsFile

    try:
        f = SafetensorsFile(path)
        return {k: f.tensor(k).clone() for k in f.header.tensors}
    except OSError as e:
        raise FormatError(f"{os.path.basename(path)}: cannot read the inputs ({e})") from e


class PeakMeter:
    """Peak device memory above the level when created: torch's peak allocated bytes on CUDA; on the
    CPU the process's peak RSS (Linux: VmHWM after resetting it through /proc/self/clear_refs)."""

    def __init__(self, device):
        import torch

        self.device = torch.device(device)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        from .memory import trim_heap

        trim_heap()
        self.reset = _reset_hwm()
        self.base = _status_kb("VmRSS") * 1024

    def read(self) -> int:
        import torch

        if self.device.type == "cuda":
            return max(0, torch.cuda.max_memory_allocated(self.device) - self.base)
        if self.reset:
            return max(0, _status_kb("VmHWM") * 1024 - self.base)
        import resource

        return max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base)


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # proc(5): "5" resets the peak resident set size to the current RSS
        return True
    except OSError:
        return False


def _status_kb(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    import psutil

    return psutil.Process().memory_info().rss // 1024


def step(parts, comp, req: Step, token, report) -> StepResult:
    """Run `req.steps` forward passes of the denoiser component `comp` (already in parts.loaded).
    `parts`: the loaded registry, residency, device report and event log (engine.decoding.Parts)."""
    import torch

    from . import ops
    from .denoise import bind
    from .denoise.patches import baked_resident
    from .denoise.stream import Streamer
    from .formats.safetensors import save_tensors

    if req.steps < 1:
        raise FormatError("--steps must be at least 1")
    arch, _variant = architecture_of(comp)
    device = torch.device(comp.device)
    dtype = torch.float32 if device.type == "cpu" else getattr(torch, comp.compute_dtype)
    den = bind(comp, arch, dtype)
    ignored: tuple[str, ...] = ()
    if req.inputs:
        given = read_inputs(req.inputs)
        inputs = den.check_inputs(given, os.path.basename(req.inputs))
        ignored = tuple(sorted(set(given) - set(inputs)))
    else:
        inputs = den.random_inputs(req.size[0], req.size[1], seed=req.seed)
    res = parts.residency
    meter = PeakMeter(device)
    act = _activation_bytes(den, inputs, dtype)
    res.load([comp], extra_memory=act, token=token, report=report)
    # what the device holds beside the weights and the activations: the room for baked LoRA patches
    room = res.budget(act) if comp.device == res.device else None
    tiers = comp.tier_bytes()
    mode = "full" if tiers["ram"] == tiers["disk"] == 0 else "partial"
    x = {k: v.to(device) for k, v in inputs.items()}
    times: list[float] = []
    cpu: list[float] = []
    stream = Streamer(comp, den.op_order(), device, steps=req.steps, pinned=getattr(res, "pinned", None))
    t_job = time.perf_counter()
    try:
        with ops.cancel_scope(token), torch.inference_mode(), baked_resident(comp, token, room), stream:
            for i in range(req.steps):
                token.raise_if_cancelled()
                t0, c0 = time.perf_counter(), time.process_time()
                outs = den.outputs(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
                report(Progress("step", i + 1, req.steps, f"{times[-1]:.2f} s"))
            # `out`, and a second stream's output beside it (LTX-2's audio: `audio_out`)
            outs = {k: v.float().cpu() for k, v in outs.items()}
            out = outs["out"]
    except Cancelled:
        parts.events.emit(JobCancelled(comp.name, 0, time.perf_counter() - t_job, at="step",
                                       tiers=Tiers.of(comp.tier_bytes())))  # fmt: skip
        raise
    peak = meter.read()
    res.note_streamed(comp, stream.bytes_per_step if mode == "partial" else 0)
    if req.out:
        save_tensors(req.out, {k: v.contiguous() for k, v in outs.items()})
    med = statistics.median(times)
    streamed = stream.bytes_per_step if stream.units else 0
    parts.events.emit(StepFinished(comp.name, streamed, med, steps=req.steps, mode=mode, device=str(device),
                                   first_step_s=times[0], peak_bytes=peak, tiers=Tiers.of(comp.tier_bytes())))  # fmt: skip
    result = StepResult(
        model=os.path.abspath(req.model), component=comp.name, architecture=den.architecture, naming=den.naming,
        device=str(device), dtype=str(dtype).removeprefix("torch."), mode=mode, steps=req.steps,
        s_per_step=med, first_step_s=times[0], step_seconds=tuple(times), peak_device_bytes=peak,
        resident_bytes=comp.tier_bytes()["device"], streamed_bytes_per_step=streamed,
        input_shapes=MappingProxyType({k: tuple(v.shape) for k, v in inputs.items()}),
        output_shape=tuple(out.shape), out=req.out, snapshot=res.snapshot(),
        prefetched=stream.prefetched if stream.units else 0.0, step_cpu_seconds=tuple(cpu), ignored_inputs=ignored,
    )  # fmt: skip
    _record(parts, req, den, inputs, result)
    return result


def _units(den, inputs: dict) -> int:
    """Latent pixels (UNet) or image tokens (FLUX; MMDiT and Wan: 2x2 patches of the (every frame's) latent)."""
    from .denoise.inputs import IMAGE_LATENT, IMAGE_PATCHED, VIDEO_LATENT

    first = inputs[den.input_names[0]]
    if hasattr(
        den.model, "step_inputs"
    ):  # a self-described family counts its own tokens (not its latent's channels)
        return den.model.step_units(inputs)
    if den.kind == "hidream":  # a non-square latent's tokens are padded (engine.denoise.hidream)
        h, w = first.shape[-2:]
        return first.shape[0] * (den.model.padded_length(h, w, inputs.get("max_seq")) or (h // 2) * (w // 2))
    if den.kind in IMAGE_LATENT:
        p = IMAGE_LATENT[den.kind][0]
        return first.shape[0] * (first.shape[2] // p) * (first.shape[3] // p)
    if den.kind in VIDEO_LATENT:
        p = VIDEO_LATENT[den.kind][0]
        units = first.shape[0] * first.shape[2] * (first.shape[3] // p) * (first.shape[4] // p)
        ref = inputs.get("driving_video_latents")  # Wan-Animate-2's reference pass runs beside its first step
        if ref is not None and ref.dim() == 5:
            units += ref.shape[0] * ref.shape[2] * (ref.shape[3] // p) * (ref.shape[4] // p)
        return units
    if den.kind == "text":
        return first.shape[0] * first.shape[1]  # tokens
    if den.kind in IMAGE_PATCHED:
        ref = inputs.get("ref_latents")  # Qwen-Image-Edit's reference image: tokens of the same sequence
        more = (ref.shape[2] // 2) * (ref.shape[3] // 2) if ref is not None else 0
        frames = first.shape[2] if first.dim() == 5 else 1  # Qwen-Image-Layered's layers
        return first.shape[0] * (frames * (first.shape[-2] // 2) * (first.shape[-1] // 2) + more)
    return first.shape[0] * (first.shape[2] * first.shape[3] if den.kind == "unet" else first.shape[1])


def _activation_bytes(den, inputs: dict, dtype) -> int:
    import torch

    from .catalog.measured import activation_bytes

    return activation_bytes(den.kind, _units(den, inputs), torch.empty((), dtype=dtype).element_size())


def _record(parts, req: Step, den, inputs: dict, result: StepResult) -> None:
    """Keep the measurement, so `loadout plan` calibrates its step prediction for this file and device."""
    from .catalog.measured import record_step

    if den.kind == "text":  # a text encoder's run is not a sampling step: the plan calibrates from those
        return

    from .denoise.inputs import IMAGE_LATENT, IMAGE_PATCHED, VIDEO_LATENT

    first = inputs[den.input_names[0]]
    if den.kind == "unet" or den.kind in IMAGE_PATCHED:
        h, w = first.shape[-2] * 8, first.shape[-1] * 8
    elif den.kind in IMAGE_LATENT:
        h, w = first.shape[2] * IMAGE_LATENT[den.kind][1], first.shape[3] * IMAGE_LATENT[den.kind][1]
    elif den.kind in VIDEO_LATENT:
        vae = VIDEO_LATENT[den.kind][1]
        h, w = first.shape[3] * vae, first.shape[4] * vae
    else:
        w, h = req.size
    label = parts.device_report.selected.label if parts.device_report is not None else result.device
    record_step(req.model, label, den.kind, w, h, {
        "s_per_step": result.s_per_step, "mode": result.mode, "dtype": result.dtype, "units": _units(den, inputs),
        "streamed_bytes_per_step": result.streamed_bytes_per_step, "peak_device_bytes": result.peak_device_bytes,
        "resident_bytes": result.resident_bytes, "steps": result.steps,
    })  # fmt: skip
