"""The Engine facade the window talks to (DESIGN.md's `engine` row: detect, scan, load, unload,
set_loras, decode, plan), written here in app/ because engine/ has no facade module yet. It is plain
Python: no Qt. One instance lives in the engine thread and owns every torch object; each request is a
frozen dataclass and `Engine.run(request, token, report)` returns a frozen result.

Only `snapshot()` and `events` may be read from other threads (the residency ledger is locked).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from engine.errors import FormatError
from engine.jobs import CancelToken, Report, no_report

log = logging.getLogger("loadout.facade")


# -- requests (frozen: they cross threads) -----------------------------------------------------------


@dataclass(frozen=True)
class DetectDevices:
    options: object  # engine.devices.DeviceOptions


@dataclass(frozen=True)
class Scan:
    paths: tuple[str, ...]


@dataclass(frozen=True)
class HashFiles:
    items: tuple[tuple[str, int, int], ...]  # (path, size, mtime_ns) as the scan saw them


@dataclass(frozen=True)
class Load:
    path: str
    components: tuple[str, ...] = ()  # empty: every component detection found


@dataclass(frozen=True)
class Unload:
    path: str
    component: str
    nbytes: int | None = None  # None: unload completely; else free this many device bytes


@dataclass(frozen=True)
class UnloadAll:
    pass


@dataclass(frozen=True)
class Pin:
    path: str
    component: str
    pinned: bool


@dataclass(frozen=True)
class LoraCoverage:
    lora: str
    base: str


@dataclass(frozen=True)
class StackItem:
    file: str
    strength_model: float = 1.0
    strength_clip: float = 1.0
    enabled: bool = True


@dataclass(frozen=True)
class SetLoras:
    base: str
    stack: tuple[StackItem, ...]


@dataclass(frozen=True)
class Bake:
    base: str
    stack: tuple[StackItem, ...]
    out: str


@dataclass(frozen=True)
class PlanRequest:
    model: str
    loras: tuple[str, ...] = ()
    decode: tuple[int, int] | None = None


# -- results ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HashResult:
    hashed: tuple[tuple[str, str], ...]  # (path, sha256)
    skipped: tuple[tuple[str, str], ...]
    failed: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class LedgerResult:
    """What a residency request did, with the ledger after it."""

    snapshot: object  # engine.residency.LedgerSnapshot (frozen)
    bytes: int = 0
    message: str = ""


@dataclass(frozen=True)
class CoverageResult:
    lora: str
    base: str
    coverage: dict  # DESIGN.md's LoRA coverage JSON


@dataclass(frozen=True)
class LorasApplied:
    base: str
    stack: tuple[StackItem, ...]
    patched: int
    restored: int
    unchanged: int
    coverages: tuple[CoverageResult, ...] = field(default=())
    patched_units: dict = field(default_factory=dict)  # component -> frozenset of module paths (read-only)


@dataclass(frozen=True)
class Baked:
    out: str
    bytes: int


def _prefixes(path: str) -> dict[str, str]:
    """name -> key prefix of every component detection found. engine.model.build_components skips an
    empty prefix (a standalone VAE or text encoder file has one), so the facade passes them itself."""
    from engine.detect import detect_file

    det = detect_file(path)
    if det.error is not None and not det.components:
        raise FormatError(f"{os.path.basename(path)}: {det.error.get('message', 'cannot be read')}")
    return {n: c.prefix for n, c in det.components.items() if n != "other"}


class Engine:
    """Owns the device report, the residency manager, loaded components and their patchers."""

    def __init__(self, on_event: Callable[[object], None] | None = None) -> None:
        self.on_event = on_event
        self.report = None
        self.residency = None
        self.components: dict[tuple[str, str], object] = {}  # (path, name) -> engine.model.Component
        self.patchers: dict[str, object] = {}  # base path -> ModelPatcher over its loaded components
        self._unsubscribe: list[Callable[[], None]] = []

    def run(self, request, token: CancelToken | None = None, report: Report = no_report):
        token = token or CancelToken()
        handler = getattr(self, "_run_" + type(request).__name__, None)
        if handler is None:
            raise TypeError(f"the engine does not know the request {type(request).__name__}")
        return handler(request, token, report)

    def snapshot(self):
        """The residency ledger now (thread-safe); None before devices are detected."""
        r = self.residency
        return r.snapshot() if r is not None else None

    def close(self) -> None:
        for fn in self._unsubscribe:
            fn()
        self._unsubscribe.clear()
        self.patchers.clear()
        self.components.clear()
        self.__dict__.pop("vaes", None)
        self.residency = None

    # -- devices --------------------------------------------------------------------------------------

    def _run_DetectDevices(self, req: DetectDevices, token, report):
        from engine.jobs import Progress

        token.raise_if_cancelled()
        report(Progress("Loading torch"))
        import torch  # noqa: F401  (seconds on a cold disk: in the engine thread, never the GUI's)

        token.raise_if_cancelled()
        report(Progress("Detecting devices"))
        from engine import memory
        from engine.devices import detect_devices
        from engine.residency import Residency

        rep = detect_devices(req.options)
        memory.configure(memory.target_for(rep.selected))  # the GUI's sampler may now ask torch/NVML
        self.report = rep
        self.close()
        self.residency = Residency.from_report(rep)
        self._unsubscribe.append(self.residency.register_with_sampler())
        if self.on_event is not None:
            self._unsubscribe.append(self.residency.subscribe(self.on_event))
        return rep

    def _need_residency(self):
        if self.residency is None:
            from engine.errors import EngineError

            raise EngineError("The device is not ready yet: wait for device detection to finish.")
        return self.residency

    # -- library ----------------------------------------------------------------------------------------

    def _run_Scan(self, req: Scan, token, report):
        from engine.catalog import scan

        return scan(list(req.paths), token=token, report=report)

    def _run_HashFiles(self, req: HashFiles, token, report):
        from engine.catalog import LibraryCache, hash_missing

        cache = LibraryCache()
        try:
            run = hash_missing(req.items, cache, token, report)
        finally:
            cache.close()
        return HashResult(
            tuple((p, h.sha256) for p, h in run.hashed.items()),
            tuple(run.skipped.items()),
            tuple(run.failed.items()),
        )

    # -- residency --------------------------------------------------------------------------------------

    def _components_of(self, path: str, names: tuple[str, ...]):
        from engine.model import build_components

        path = os.path.abspath(path)
        if not path.endswith((".safetensors", ".sft")):
            raise FormatError(f"{os.path.basename(path)}: only .safetensors files can be loaded for now.")
        have = {n: c for (p, n), c in self.components.items() if p == path}
        if names and all(n in have for n in names):
            return [have[n] for n in names]
        if not names and have:
            return list(have.values())
        built = build_components(path, _prefixes(path), report=self.report)
        if not built:
            raise FormatError(
                f"{os.path.basename(path)}: no loadable component (UNet, text encoder, VAE) found."
            )
        for n, c in built.items():
            self.components.setdefault((path, n), c)
        wanted = names or tuple(built)
        missing = [n for n in wanted if (path, n) not in self.components]
        if missing:
            raise FormatError(f"{os.path.basename(path)} has no component {', '.join(missing)}.")
        return [self.components[(path, n)] for n in wanted]

    def _run_Load(self, req: Load, token, report):
        res = self._need_residency()
        comps = self._components_of(req.path, req.components)
        before = res.snapshot()
        snap = res.load(comps, token=token, report=report)
        added = snap.total("device_bytes") - before.total("device_bytes")
        return LedgerResult(snap, added, f"Loaded {', '.join(c.name for c in comps)}")

    def _find(self, path: str, name: str):
        c = self.components.get((os.path.abspath(path), name))
        if c is None:
            raise FormatError(f"{name} of {os.path.basename(path)} is not loaded.")
        return c

    def _run_Unload(self, req: Unload, token, report):
        res = self._need_residency()
        c = self._find(req.path, req.component)
        freed = res.unload(c, req.nbytes, token=token)
        if req.nbytes is None:
            self.components.pop((os.path.abspath(req.path), req.component), None)
            self.patchers.pop(os.path.abspath(req.path), None)
        what = "Unloaded" if req.nbytes is None else "Freed"
        return LedgerResult(res.snapshot(), freed, f"{what} {req.component}")

    def _run_UnloadAll(self, req: UnloadAll, token, report):
        res = self._need_residency()
        freed = res.unload_all(token=token)
        self.components.clear()
        self.patchers.clear()
        return LedgerResult(res.snapshot(), freed, "Unloaded everything")

    def _run_Pin(self, req: Pin, token, report):
        res = self._need_residency()
        res.pin(self._find(req.path, req.component), req.pinned)
        return LedgerResult(res.snapshot(), 0, ("Pinned " if req.pinned else "Unpinned ") + req.component)

    # -- LoRA -------------------------------------------------------------------------------------------

    def _run_LoraCoverage(self, req: LoraCoverage, token, report):
        from engine.formats import open_index
        from engine.lora.coverage import coverage

        lora, base = open_index(req.lora), open_index(req.base)
        cov = coverage(
            lora, {k: tuple(v.shape) for k, v in base.tensors.items()}, lora_path=req.lora, base_path=req.base
        )
        return CoverageResult(req.lora, req.base, cov.to_json())

    def _run_SetLoras(self, req: SetLoras, token, report):
        from app.lora_adapter import apply_stack, patched_units

        base = os.path.abspath(req.base)
        comps = {n: c for (p, n), c in self.components.items() if p == base}
        if not comps:
            raise FormatError(f"Load {os.path.basename(base)} first: LoRAs are applied to a loaded model.")
        covs = tuple(self._run_LoraCoverage(LoraCoverage(i.file, base), token, report) for i in req.stack)
        rep = apply_stack(self, base, comps, req.stack, token, report)
        return LorasApplied(
            base, req.stack, len(rep.patched), len(rep.restored), rep.unchanged, covs,
            patched_units(self, base),
        )  # fmt: skip

    def _run_Bake(self, req: Bake, token, report):
        from app.lora_adapter import bake

        return bake(req, token, report)

    def _run_Decode(self, req, token, report):
        from app.decode_adapter import decode

        return decode(self, req, token, report)

    def _run_Encode(self, req, token, report):
        from app.decode_adapter import encode

        return encode(self, req, token, report)

    def _run_PlanRequest(self, req: PlanRequest, token, report):
        from engine.plan import make_plan

        return make_plan(req.model, loras=req.loras, decode=req.decode, report=self.report)
