"""The Engine facade the app and the CLI use (DESIGN.md's `engine` row): detect, configure, scan, load,
unload, set_loras, decode, encode, plan — each long call takes `token` and `report`.

Plain Python, no Qt. One instance lives in the engine thread and owns every torch object; the window
sends frozen requests (engine.requests) that `run(request, token, report)` hands to the method of the
same meaning. Only `snapshot()` may be read from other threads (the residency ledger is locked).
Torch is imported by the calls, never by importing this module.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from types import MappingProxyType

from . import requests as rq
from .errors import EngineError, FormatError, InvalidRequest
from .events import EventLog, Unpatched
from .jobs import CancelToken, Progress, Report, no_report
from .loaded import LoadedModels

log = logging.getLogger("loadout.engine")


def _prefixes(f) -> tuple[dict[str, str], str | None]:
    """name -> key prefix of every component detection finds in an open SafetensorsFile or GGUFFile
    (from the header already read: detection never reads it again), and the file's architecture. The
    `other` bucket is not a component."""
    from .detect.core import detect_index
    from .detect.result import not_a_model

    det = detect_index(f.index(), path=f.path)
    if det.error is not None and not det.components:
        raise FormatError(f"{os.path.basename(f.path)}: {det.error.message}")
    what = not_a_model(det.kind)
    if what is not None:  # weights, but no model to load by themselves (no component)
        raise InvalidRequest(f"{os.path.basename(f.path)} is {what}")
    return {n: c.prefix for n, c in det.components.items() if n != "other"}, det.architecture


# request type -> how run() calls the facade (keyed by the class itself: a renamed or look-alike class
# can never be routed by accident)
_HANDLERS: dict[type, Callable] = {
    rq.DetectDevices: lambda e, r, t, p: e.detect(r.options, token=t, report=p),
    rq.Configure: lambda e, r, t, p: e.configure(r.options, token=t, report=p),
    rq.Scan: lambda e, r, t, p: e.scan(r.paths, token=t, report=p),
    rq.Inspect: lambda e, r, t, p: e.inspect(r.paths, r.read_values, token=t, report=p),
    rq.HashFiles: lambda e, r, t, p: e.hash_files(r.items, token=t, report=p),
    rq.Load: lambda e, r, t, p: e.load(r.path, r.components, token=t, report=p),
    rq.Unload: lambda e, r, t, p: e.unload(r.path, r.component, r.nbytes, token=t),
    rq.UnloadAll: lambda e, r, t, p: e.unload_all(token=t),
    rq.Pin: lambda e, r, t, p: e.pin(r.path, r.component, r.pinned),
    rq.LoraCoverage: lambda e, r, t, p: e.lora_coverage(r.lora, r.base),
    rq.SetLoras: lambda e, r, t, p: e.set_loras(r.base, r.stack, token=t, report=p),
    rq.Bake: lambda e, r, t, p: e.bake(r.base, r.stack, r.out, token=t, report=p),
    rq.Decode: lambda e, r, t, p: e.decode(r, token=t, report=p),
    rq.DecodeAudio: lambda e, r, t, p: e.decode_audio(r, token=t, report=p),
    rq.EncodeAudio: lambda e, r, t, p: e.encode_audio(r, token=t, report=p),
    rq.Encode: lambda e, r, t, p: e.encode(r, token=t, report=p),
    rq.PlanRequest: lambda e, r, t, p: e.plan(r.model, r.loras, r.decode, r.vram_gb),
    rq.FindLibraries: lambda e, r, t, p: e.find_libraries(),
    rq.WriteDemo: lambda e, r, t, p: e.write_demo(r.folder, token=t, report=p),
    rq.EstimateDecode: lambda e, r, t, p: e.estimate_decode(r),
    rq.Step: lambda e, r, t, p: e.step(r, token=t, report=p),
    rq.SaveClip: lambda e, r, t, p: e.save_clip(r),
    rq.SaveAudio: lambda e, r, t, p: e.save_audio(r),
}


# Jobs that run models: with --disable-smart-memory everything is unloaded after them, as ComfyUI
# unloads its models after each prompt under that flag.
_USES_MODELS = (rq.Decode, rq.DecodeAudio, rq.EncodeAudio, rq.Encode, rq.Step)
# Jobs whose working memory is large and gone when they end (activations, baked or merged weights):
# glibc keeps such freed heap pages, so without a trim an SD1.5 step with a LoRA left RSS 1.4 GB up
# and a bake 0.24 GB -- memory the graph showed as the app's, and no other program could use.
_TRANSIENT_HEAVY = (rq.Decode, rq.DecodeAudio, rq.EncodeAudio, rq.Encode, rq.Step, rq.Bake)
_TRIM_SLACK = 32 << 20


class Engine:
    """Owns the device report, the residency manager, the registry of loaded models and the event log.
    Every piece of loaded state lives in `loaded` (engine.loaded); every byte's place in `residency`."""

    def __init__(self, on_event: Callable[[object], None] | None = None) -> None:
        self.report = None  # engine.devices.DeviceReport once detected
        self.residency = None
        self.loaded = LoadedModels()
        self.event_log = EventLog()
        self._unsubscribe: list[Callable[[], None]] = []
        if on_event is not None:
            self.event_log.subscribe(on_event)

    @property
    def components(self) -> dict[tuple[str, str], object]:
        """(path, name) -> component of everything loaded (a copy of the registry's view)."""
        return self.loaded.as_dict()

    def run(self, request, token: CancelToken | None = None, report: Report = no_report):
        """Do what a frozen request (engine.requests) asks; the bridge's one entry point."""
        call = _HANDLERS.get(type(request))
        if call is None:
            raise TypeError(f"the engine does not know the request {request!r}")
        try:
            return call(self, request, token or CancelToken(), report)
        finally:
            if isinstance(request, _USES_MODELS):
                self.after_job()
            if isinstance(request, _TRANSIENT_HEAVY):
                from .memory import trim_heap

                trim_heap(_TRIM_SLACK)  # finished, failed or cancelled: give the pages back

    def after_job(self) -> None:
        """--disable-smart-memory: unload everything once a job that ran models ends."""
        if self.residency is not None and self.residency.policy.disable_smart_memory:
            self.unload_all()

    def snapshot(self):
        """The residency ledger now (thread-safe); None before devices are detected."""
        r = self.residency
        return r.snapshot() if r is not None else None

    def close(self) -> None:
        """Drop every component and stop feeding the sampler (the engine thread calls this last)."""
        for fn in self._unsubscribe:
            fn()
        self._unsubscribe.clear()
        self.loaded.clear()
        self.residency = None

    def need_residency(self):
        if self.residency is None:
            raise EngineError("The device is not ready yet: wait for device detection to finish.")
        return self.residency

    # -- devices ----------------------------------------------------------------------------------------

    def detect(self, options=None, *, token: CancelToken | None = None, report: Report = no_report):
        """Import torch, detect devices with `options` and start an empty residency ledger for the
        selected device (anything loaded before is dropped)."""
        token = token or CancelToken()
        token.raise_if_cancelled()
        report(Progress("Loading torch"))
        import torch  # noqa: F401  (seconds on a cold disk: in the engine thread, never the GUI's)

        token.raise_if_cancelled()
        report(Progress("Detecting devices"))
        from .devices import DeviceOptions, detect_devices

        rep = detect_devices(options or DeviceOptions())
        self.close()
        self._adopt(rep, new_ledger=True)
        return rep

    def _adopt(self, rep, *, new_ledger: bool) -> None:
        from . import memory
        from .residency import Residency

        memory.configure(memory.target_for(rep.selected))  # the GUI's sampler may now ask torch/NVML
        self.report = rep
        if not new_ledger:
            return
        self.residency = Residency.from_report(rep, events=self.event_log)
        self._unsubscribe.append(self.residency.register_with_sampler())

    def configure(self, options, *, token: CancelToken | None = None, report: Report = no_report):
        """Apply device options now. A change of device, VRAM mode, --cpu-vae or dtype flags unloads
        every component first (they were placed for the old rules); a change of reserve or budget
        keeps them and evicts, by policy, what no longer fits the new budget."""
        if self.residency is None or self.report is None:
            rep = self.detect(options, token=token, report=report)
            return rq.Configured(rep, self.residency.snapshot())
        from .devices import detect_devices
        from .residency import Policy

        report(Progress("Applying device options"))
        rep = detect_devices(options)
        old = self.report
        res = self.residency
        moved = rq.unloads_components(old.options, rep.options) or (
            rep.selected.torch_device != old.selected.torch_device
        )
        if moved:
            names = tuple(c.name for c in res.snapshot().components)
            res.unload_all()  # quick (every module back onto its file); not cancellable half-way
            self.close()
            self._adopt(rep, new_ledger=True)
            return rq.Configured(rep, self.residency.snapshot(), names, 0)
        self._adopt(rep, new_ledger=False)
        evicted = res.rebudget(Policy.from_report(rep), token=token)
        return rq.Configured(rep, res.snapshot(), (), evicted)

    # -- library ----------------------------------------------------------------------------------------

    def scan(self, paths, *, token: CancelToken | None = None, report: Report = no_report):
        from .catalog import scan

        return scan(list(paths), token=token or CancelToken(), report=report)

    def inspect(self, paths, read_values: bool = False, *, token=None, report: Report = no_report):
        """One Detection per path from its header alone (never torch); an unreadable file's has `error`."""
        from .detect.file import detect_files

        return detect_files(paths, read_values=read_values, token=token or CancelToken(), report=report)

    def hash_files(self, items, *, token: CancelToken | None = None, report: Report = no_report):
        """SHA-256 of (path, size, mtime_ns) items the scan saw without a cached hash."""
        from .catalog import LibraryCache, hash_missing

        cache = LibraryCache()
        try:
            run = hash_missing(items, cache, token or CancelToken(), report)
        finally:
            cache.close()
        return rq.HashResult(
            tuple((p, h.sha256) for p, h in run.hashed.items()),
            tuple(run.skipped.items()),
            tuple(run.failed.items()),
            tuple((p, h.old_hash) for p, h in run.hashed.items()),
        )

    # -- residency --------------------------------------------------------------------------------------

    def _components_of(self, path: str, names: tuple[str, ...]):
        """The file's components (those named, or every one detection found), built once and reused —
        a VAE an earlier decode built stands for the file's `vae`, so it is never held twice. The
        header is read once here and handed to detection, the component build and the VAE's."""
        path = os.path.abspath(path)
        have = self.loaded.of_file(path)
        runnable = self.loaded.runnable_vae(path)
        if runnable is not None:
            have.setdefault("vae", runnable)
        if names and all(n in have for n in names):
            return [have[n] for n in names]
        from .formats import open_weights
        from .model import build_components

        f = open_weights(path)
        prefixes, architecture = _prefixes(f)
        todo = {n: p for n, p in prefixes.items() if n not in have}
        if todo:
            built = build_components(f, todo, report=self.report, architecture=architecture)
            if "vae" in built:
                built["vae"] = self._runnable_or(built["vae"], f)
            for n, c in built.items():
                self.loaded.add(path, n, c)
                have[n] = c
        if not have:
            raise FormatError(
                f"{os.path.basename(path)}: no loadable component (UNet, text encoder, VAE) found."
            )
        wanted = names or tuple(prefixes)
        missing = [n for n in wanted if n not in have]
        if missing:
            raise FormatError(f"{os.path.basename(path)} has no component {', '.join(missing)}.")
        return list(dict.fromkeys(have[n] for n in wanted))

    def _runnable_or(self, generic, f):
        """The VAE with its own forward (so a later decode reuses these very weights), else the
        header-built component (a VAE layout engine.vae cannot run is still loadable and inspectable)."""
        from .decoding import runnable_vae

        try:
            c = runnable_vae(f.path, self.report, pair=False, header=f.header)
        except EngineError as e:
            log.info("%s: its VAE loads as plain tensors (%s)", os.path.basename(f.path), e.message)
            return generic
        return c if c.name == "vae" else generic

    def load(self, path: str, components=(), *, token: CancelToken | None = None, report: Report = no_report):
        """Load the file's components (all that detection found, or those named) under the budget."""
        res = self.need_residency()
        comps = self._components_of(path, tuple(components))
        before = res.snapshot()
        try:
            snap = res.load(comps, token=token or CancelToken(), report=report)
        finally:
            from .memory import trim_heap

            trim_heap()  # the read buffers of a load (or of a cancelled one) go back to the OS, not RSS
        added = snap.total("device_bytes") - before.total("device_bytes")
        return rq.LedgerResult(snap, added, f"Loaded {', '.join(c.name for c in comps)}")

    def _find(self, path: str, name: str):
        c = self.loaded.get(path, name)
        if c is None:
            raise FormatError(f"{name} of {os.path.basename(path)} is not loaded.")
        return c

    def unload(self, path: str, component: str, nbytes: int | None = None, *, token=None):
        """Unload a component (nbytes None), or free that many of its device bytes. A full unload takes
        the component's LoRA patches with it (an Unpatched event says how many); the stack stays
        applied to the file's other components."""
        res = self.need_residency()
        c = self._find(path, component)
        freed = res.unload(c, nbytes, token=token)
        if nbytes is None:
            self._forget(path, component)
        what = "Unloaded" if nbytes is None else "Freed"
        return rq.LedgerResult(res.snapshot(), freed, f"{what} {component}")

    def _forget(self, path: str, component: str) -> None:
        _, patched = self.loaded.remove(path, component)
        if patched:
            self.event_log.emit(Unpatched(component, base=os.path.abspath(path), modules=patched))

    def unload_all(self, *, token=None):
        res = self.need_residency()
        freed = res.unload_all(token=token)
        for (base, name), n in self.loaded.clear().items():
            self.event_log.emit(Unpatched(name, base=base, modules=n))
        return rq.LedgerResult(res.snapshot(), freed, "Unloaded everything")

    def pin(self, path: str, component: str, pinned: bool = True):
        res = self.need_residency()
        res.pin(self._find(path, component), pinned)
        return rq.LedgerResult(res.snapshot(), 0, ("Pinned " if pinned else "Unpinned ") + component)

    # -- LoRA -------------------------------------------------------------------------------------------

    def lora_coverage(self, lora: str, base: str):
        """DESIGN.md's coverage JSON of `lora` on `base` (headers only)."""
        from .detect import detect_index
        from .detect.result import NOT_A_MODEL
        from .formats import open_index
        from .lora.coverage import coverage

        lo, ba = open_index(lora), open_index(base)
        base_det = detect_index(ba)  # header-only; names the base in a "does not fit" warning
        if base_det.kind in NOT_A_MODEL:  # two LoRAs: no model for the coverage to be about
            raise InvalidRequest(
                f"the base {os.path.basename(base)} is {NOT_A_MODEL[base_det.kind]}: "
                "give the model the LoRA patches"
            )
        arch = base_det.architecture
        shapes = {k: tuple(v.shape) for k, v in ba.tensors.items()}
        cov = coverage(lo, shapes, lora_path=lora, base_path=base, base_architecture=arch)
        return rq.CoverageResult(lora, base, rq.frozen(cov.to_json()))

    def set_loras(self, base: str, stack, *, token: CancelToken | None = None, report: Report = no_report):
        """Patch the loaded components of `base` on the fly as `stack` says (all or nothing)."""
        from .stacking import apply_stack

        base = os.path.abspath(base)
        if not self.loaded.of_file(base):
            raise FormatError(f"Load {os.path.basename(base)} first: LoRAs are applied to a loaded model.")
        covs = tuple(self.lora_coverage(i.file, base) for i in stack)
        rep = apply_stack(self.loaded, self.event_log, base, stack, token or CancelToken(), report)
        return rq.LorasApplied(
            base, tuple(stack), len(rep.patched), len(rep.restored), rep.unchanged, covs,
            MappingProxyType(self.loaded.patched_units(base)),
        )  # fmt: skip

    def bake(self, base: str, stack, out: str, *, token=None, report: Report = no_report):
        """Merge the stack into a new .safetensors checkpoint (engine.bake; no device needed)."""
        from .bake import bake

        return bake(base, stack, out, token or CancelToken(), report)

    # -- VAE and planning -------------------------------------------------------------------------------

    def decode(self, req: rq.Decode, *, token: CancelToken | None = None, report: Report = no_report):
        """Decode a latent file: the VAE is placed through the ledger and stays loaded afterwards."""
        from .decoding import decode

        return decode(self._parts(), req, token or CancelToken(), report)

    def decode_audio(
        self, req: rq.DecodeAudio, *, token: CancelToken | None = None, report: Report = no_report
    ):
        """Decode an audio latent: the audio VAE and vocoder are placed through the ledger and stay loaded."""
        from .sound import decode_audio

        return decode_audio(self._parts(), req, token or CancelToken(), report)

    def encode_audio(
        self, req: rq.EncodeAudio, *, token: CancelToken | None = None, report: Report = no_report
    ):
        """Encode a sound with LTX-2's audio VAE to a .latent: the encoder is placed through the ledger and stays loaded."""
        from .sound import encode_audio

        return encode_audio(self._parts(), req, token or CancelToken(), report)

    def encode(self, req: rq.Encode, *, token: CancelToken | None = None, report: Report = no_report):
        from .decoding import encode

        return encode(self._parts(), req, token or CancelToken(), report)

    def step(self, req: rq.Step, *, token: CancelToken | None = None, report: Report = no_report):
        """Run the model's denoiser (engine.stepping): placed through the ledger and kept loaded, with
        `req.loras` set on the model first when given."""
        from .stepping import denoiser_of, step

        token = token or CancelToken()
        self._components_of(req.model, ())
        comp = denoiser_of(self.loaded.of_file(req.model), req.component)
        applied = None
        if req.loras is not None:
            applied = self.set_loras(req.model, req.loras, token=token, report=report)
        result = step(self._parts(), comp, req, token, report)
        if applied is None:
            return result
        loras = tuple(
            rq.frozen(
                {
                    "file": item.file,
                    "strength_model": item.strength_model,
                    "strength_clip": item.strength_clip,
                    "modules": cov.coverage["modules"],
                    "mapped": cov.coverage["mapped"],
                    "warning": cov.coverage.get("warning"),
                }
            )
            for item, cov in zip(applied.stack, applied.coverages, strict=True)
        )
        return dataclasses.replace(result, loras=loras)

    def _parts(self):
        from .decoding import Parts

        return Parts(self.loaded, self.need_residency(), self.report, self.event_log)

    def plan(self, model: str, loras=(), decode: tuple[int, int] | None = None, vram_gb: float | None = None):
        """Will it fit? (DESIGN.md's plan JSON), for the detected device or one of `vram_gb` GiB."""
        from .plan import make_plan

        return make_plan(model, loras=tuple(loras), decode=decode, vram_gb=vram_gb, report=self.report)

    # -- the window's background work (it never touches the disk from the GUI thread) ------------------

    def find_libraries(self):
        """First run: the installs of the user's other tools (engine.discover; seconds at most)."""
        from .discover import find_installs

        return tuple(find_installs())

    def write_demo(self, folder: str, *, token: CancelToken | None = None, report: Report = no_report):
        from .catalog.demo import write_demo

        try:
            return tuple(write_demo(folder, token=token or CancelToken(), report=report))
        except OSError as e:  # a folder the user cannot write: say which and why
            raise EngineError(f"{e.filename or folder}: {e.strerror or e}", path=folder) from e

    def save_clip(self, req: rq.SaveClip) -> rq.SavedClip:
        """Write a decoded clip as MP4, WebP or PNG frames (atomically; engine.formats.video_out)."""
        from .formats.video_out import write_clip

        return rq.SavedClip(tuple(write_clip(req.out, req.frames, req.width, req.height, req.fps)))

    def save_audio(self, req: rq.SaveAudio) -> rq.SavedClip:
        """Write decoded sound as a 16-bit WAV (atomically; engine.formats.audio_out)."""
        from .formats.audio_out import write_wav

        write_wav(req.out, req.samples, req.channels, req.sample_rate)
        return rq.SavedClip((req.out,))

    def estimate_decode(self, req: rq.EstimateDecode):
        """A decode's or encode's memory before it runs (headers only; engine.preflight)."""
        from .preflight import estimate

        return estimate(req)
