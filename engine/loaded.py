"""The one registry of what the engine holds: each file's components (the runnable VAE among them)
and the LoRA stack state of each base. The Engine owns one instance and passes it explicitly to the
code that loads, decodes or patches; nothing else keeps loaded state. (Where the bytes of those
components live — device, RAM, disk — is the residency ledger's business, not this registry's.)

Engine-thread only; other threads read the residency ledger's snapshots instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class StackState:
    """What is applied to one base now: its patcher, and the patched module paths per component."""

    patcher: object  # engine.patcher.ModelPatcher keyed by the base's own key names
    patched: dict[str, set[str]] = field(default_factory=dict)  # component -> unit paths


def is_runnable(component) -> bool:
    """Whether a component is a VAE with its own forward pass (engine.vae), not plain tensors."""
    m = getattr(component, "module", None)
    return hasattr(m, "decode_head") or hasattr(m, "encode_tail")


class LoadedModels:
    """Components keyed by (absolute file path, component name), and stack states keyed by base path."""

    def __init__(self) -> None:
        self._components: dict[tuple[str, str], object] = {}
        self._stacks: dict[str, StackState] = {}

    # -- components -----------------------------------------------------------------------------------
    def items(self) -> Iterator[tuple[tuple[str, str], object]]:
        return iter(list(self._components.items()))

    def as_dict(self) -> dict[tuple[str, str], object]:
        return dict(self._components)

    def of_file(self, path: str) -> dict[str, object]:
        path = os.path.abspath(path)
        return {n: c for (p, n), c in self._components.items() if p == path}

    def get(self, path: str, name: str):
        return self._components.get((os.path.abspath(path), name))

    def add(self, path: str, name: str, component) -> None:
        self._components[(os.path.abspath(path), name)] = component

    def runnable_vae(self, path: str):
        """The file's VAE with a forward pass, if one is held (a loaded checkpoint's, or a decode's)."""
        return next((c for c in self.of_file(path).values() if is_runnable(c)), None)

    def remove(self, path: str, name: str) -> tuple[object | None, int]:
        """Drop one component. Its on-the-fly patches go with it: returns (the component, how many of
        its modules were patched). The base's stack state stays for its other components; it goes
        when none is left."""
        path = os.path.abspath(path)
        comp = self._components.pop((path, name), None)
        state = self._stacks.get(path)
        patched = 0
        if state is not None:
            units = state.patched.pop(name, set())
            patched = len(units)
            if comp is not None and units:
                clear_patches(comp)
            if not self.of_file(path):
                self._stacks.pop(path, None)
        return comp, patched

    def clear(self) -> dict[tuple[str, str], int]:
        """Drop everything; returns the patched-module count of each (path, name) that had patches."""
        had = {
            (base, name): len(units)
            for base, state in self._stacks.items()
            for name, units in state.patched.items()
            if units
        }
        self._components.clear()
        self._stacks.clear()
        return had

    # -- LoRA stacks ----------------------------------------------------------------------------------
    def stack(self, base: str) -> StackState | None:
        return self._stacks.get(os.path.abspath(base))

    def set_stack(self, base: str, state: StackState) -> None:
        self._stacks[os.path.abspath(base)] = state

    def patched_units(self, base: str) -> dict[str, frozenset[str]]:
        state = self.stack(base)
        return {k: frozenset(v) for k, v in state.patched.items() if v} if state else {}


def clear_patches(component) -> None:
    """Remove every on-the-fly patch from a component's ops (its stored tensors were never changed)."""
    for u in getattr(component, "units", ()):
        for name in ("weight_functions", "bias_functions"):
            lst = getattr(u.module, name, None)
            if lst:
                lst.clear()
