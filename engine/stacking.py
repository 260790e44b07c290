"""The facade's LoRA stack over loaded components: engine.patcher's plans set as on-the-fly patches.

LoRAs are applied *on the fly*: every castable op of a loaded component gets the patcher's
`weight_function` for its key (engine.ops runs it inside forward), so stored tensors are never
rewritten — wherever the residency manager moves a module (device, RAM, the mmap), its patch goes
with it, and revert is exact by construction (the functions are dropped). Baking to a file is
engine.bake (the patcher's baked path). Runs in the engine thread only.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .events import EventLog, Patched, Unpatched
from .jobs import Progress
from .loaded import LoadedModels, StackState


def _entries(stack):
    from .patcher import LoraEntry

    return [LoraEntry(i.file, i.strength_model, i.strength_clip, i.enabled, n) for n, i in enumerate(stack)]


def _patcher_for(path: str):
    """A ModelPatcher keyed by the checkpoint's own key names; shapes come from the header (no data):
    safetensors or GGUF, whose quantized tensors have their logical shapes there (the patches are
    computed on the dequantized weight when an op runs, never on the blocks)."""
    from .formats import open_weights
    from .patcher import ModelPatcher

    return ModelPatcher(dict(open_weights(path).header.tensors))


@dataclass
class ApplySummary:
    patched: list[str]
    restored: list[str]
    unchanged: int


def apply_stack(loaded: LoadedModels, events: EventLog, base: str, stack, token, report) -> ApplySummary:
    """Set on-the-fly patches on every op of `base`'s loaded components as the stack asks;
    all-or-nothing on cancel. Emits Patched / Unpatched for each component whose patches changed."""
    comps = loaded.of_file(base)
    state = loaded.stack(base)
    if state is None:
        state = StackState(_patcher_for(base))
        loaded.set_stack(base, state)
    patcher = state.patcher
    entries = _entries(stack)
    t0 = time.perf_counter()
    wanted = patcher.plan(entries)  # key -> contributions (coverage is computed here, header-only)
    new: dict[str, tuple[object, str, object]] = {}  # unit path key -> (module, attr, fn|None)
    units = [(name, c, u) for name, c in comps.items() for u in c.units]
    for i, (name, _c, u) in enumerate(units):
        token.raise_if_cancelled()
        for attr, key in u.keys.items():
            if attr not in ("weight", "bias") or not hasattr(u.module, "weight_functions"):
                continue
            fn = patcher.weight_function(key, entries) if key in wanted else None
            new[f"{name}:{u.path}:{attr}"] = (u.module, attr, fn)
        if i % 64 == 0:
            report(Progress("Preparing patches", i, len(units)))
    # Commit (no cancel below): every op gets its functions or none.
    patched, restored, before = [], [], {k: set(v) for k, v in state.patched.items()}
    state.patched = {}
    for key, (module, attr, fn) in new.items():
        lst = module.weight_functions if attr == "weight" else module.bias_functions
        had = bool(lst)
        lst.clear()
        comp, upath, _ = key.split(":", 2)
        if fn is not None:
            lst.append(fn)
            patched.append(key)
            state.patched.setdefault(comp, set()).add(upath)
        elif had:
            restored.append(key)
    report(Progress("Preparing patches", len(units), len(units)))
    dt = time.perf_counter() - t0
    for comp in sorted(set(before) | set(state.patched)):
        n = len(state.patched.get(comp, ()))
        if n:
            events.emit(Patched(comp, 0, dt, base=base, modules=n))
        elif before.get(comp):
            events.emit(Unpatched(comp, 0, dt, base=base, modules=len(before[comp])))
    patcher.stack = tuple(entries)
    return ApplySummary(patched, restored, 0)
