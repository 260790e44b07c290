"""A LoRA stack over a base model's weights: apply, change, restore, clone — exactly and cheaply.

The base is a mapping name -> torch tensor (a model's parameters). Patching never writes into a base
tensor: a patched key gets a new tensor computed from the original in fp32 and rounded once to the
storage dtype, and the original is kept (the backup, taken once, costs no copy). So

* restore puts the original tensor objects back: bit-exact by construction;
* a change of stack recomputes only the keys whose list of contributions changed, always from the
  original (never a delta on top of a delta); an identical stack does no work;
* clones share every tensor — originals and patched ones — and only keys patched afterwards in one
  clone get new tensors there;
* all new tensors of an apply are computed before any is committed, with the cancel token checked per
  key, so an interrupted apply leaves the weights exactly as they were.

`weight_function(key, stack)` gives the same computation as a callable `patch(weight) -> patched` for
modules the residency manager keeps offloaded (engine.ops runs it inside forward): it rounds to the
input's dtype exactly as baking does, so both give the same bits. ComfyUI's ModelPatcher (patches kept
beside the weights, a backup, fp32 then round) is the idea; this is our own design.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .jobs import CancelToken, Progress, Report, no_report
from .lora.adapter import Adapter, load_adapter
from .lora.coverage import Coverage, coverage
from .lora.keymap import KeyMap

MODEL_COMPONENTS = frozenset({"unet", "transformer"})


@dataclass(frozen=True)
class LoraEntry:
    """One row of the LoRA stack."""

    file: str
    strength_model: float = 1.0
    strength_clip: float = 1.0
    enabled: bool = True
    order: int = 0


@dataclass(frozen=True)
class Contribution:
    """One adapter module's change to one base key (signature fields compare by value)."""

    file: str
    module: str
    view: tuple | None
    strength: float
    bias: bool
    rows: tuple[int, int] | None = None  # the row block of the module's change this key receives (None: all)


@dataclass
class ApplyReport:
    patched: list[str] = field(default_factory=list)  # keys recomputed
    restored: list[str] = field(default_factory=list)  # keys put back to the original
    unchanged: int = 0  # keys already as asked


def _apply_view(w, view, fn):
    """fn applied to a view of fp32 tensor w (w is owned by the caller and may be modified)."""
    import torch

    if view is None:
        return fn(w)
    kind = view[0]
    if kind == "rows":
        _, start, length = view
        w[start : start + length] = fn(w[start : start + length])
        return w
    if kind == "swap":
        h = w.shape[0] // 2
        swapped = fn(torch.cat([w[h:], w[:h]]))
        return torch.cat([swapped[h:], swapped[:h]])
    if kind == "transpose":
        return fn(w.transpose(0, 1)).transpose(0, 1).contiguous()
    raise ValueError(f"unknown view {view!r}")


class ModelPatcher:
    """Patches name -> tensor weights with a LoRA stack; see the module docstring for the guarantees."""

    def __init__(
        self,
        weights: Mapping[str, Any],
        *,
        loader: Callable[[str], Adapter] = load_adapter,
        setter: Callable[[str, Any], None] | None = None,
        keymap: KeyMap | None = None,
    ):
        self.weights: dict[str, Any] = dict(weights)
        self._originals: dict[str, Any] = {}  # backups: the original tensor of every patched key
        self._applied: dict[str, tuple[Contribution, ...]] = {}
        self._loader = loader
        self._adapters: dict[str, Adapter] = {}
        self._placements: dict[str, Coverage] = {}
        self._setter = setter
        self._keymap = keymap
        self.keys_computed = 0  # total keys whose patched tensor was computed (work counter)
        self.stack: tuple[LoraEntry, ...] = ()

    # -- adapters ------------------------------------------------------------------------------------
    @property
    def keymap(self) -> KeyMap:
        if self._keymap is None:
            self._keymap = KeyMap({k: tuple(v.shape) for k, v in self.original_weights().items()})
        return self._keymap

    def adapter(self, file: str) -> Adapter:
        a = self._adapters.get(file)
        if a is None:
            a = self._adapters[file] = self._loader(file)
        return a

    def coverage(self, file: str) -> Coverage:
        """Where the adapter's modules land on this base (shape-checked placements)."""
        cov = self._placements.get(file)
        if cov is None:
            idx = self.adapter(file).index()
            base_shapes = {k: tuple(v.shape) for k, v in self.original_weights().items()}
            cov = coverage(idx, base_shapes, lora_path=file, keymap=self.keymap)
            self._placements[file] = cov
        return cov

    # -- the plan --------------------------------------------------------------------------------------
    def plan(self, stack: Sequence[LoraEntry]) -> dict[str, tuple[Contribution, ...]]:
        """key -> the contributions the stack asks for, in stack order."""
        wanted: dict[str, list[Contribution]] = {}
        ordered = sorted(enumerate(stack), key=lambda p: (p[1].order, p[0]))
        for _, entry in ordered:
            if not entry.enabled:
                continue
            cov = self.coverage(entry.file)
            adapter = self.adapter(entry.file)
            # one target per module, then the split weights of each fused module (each its rows of the change)
            split = ((n, t) for n, ts in cov.split.items() for t in ts)
            for name, target in itertools.chain(cov.placements.items(), split):
                module = adapter.modules.get(name)
                if module is None:
                    continue
                s = entry.strength_model if target.component in MODEL_COMPONENTS else entry.strength_clip
                if s == 0.0:
                    continue
                if module.patches_weight:
                    wanted.setdefault(target.key, []).append(
                        Contribution(entry.file, name, target.view, s, False, target.change_rows)
                    )
                if module.patches_bias and target.bias_key:
                    wanted.setdefault(target.bias_key, []).append(
                        Contribution(entry.file, name, target.view, s, True, target.change_rows)
                    )
        return {k: tuple(v) for k, v in wanted.items()}

    def _compute(self, original, contributions: Iterable[Contribution]):
        """The patched tensor: fp32 from the original, every contribution in order, one rounding."""
        import torch

        from .model.transfer import ALIGN, aligned_like

        # On the CPU the result sits at the original's address modulo ALIGN (transfer.aligned_like): a
        # weight patched on the fly then computes the bits of the one baked in place in its file mapping.
        cpu = original.device.type == "cpu" and original.numel() > 0
        if cpu and original.dtype == torch.float32:
            w = aligned_like(original).copy_(original)  # patched in place by the common LoRA: stays put
        else:
            w = original.to(torch.float32, copy=True)
        for c in contributions:
            module = self.adapter(c.file).modules[c.module]
            if c.rows is not None:
                module = module.row_block(*c.rows)
            if c.bias:
                fn = lambda t, m=module, s=c.strength: m.patch_bias(t, s)  # noqa: E731
            else:  # w is this call's own float32 copy (and so is every view _apply_view hands over)
                fn = lambda t, m=module, s=c.strength: m.patch_weight(t, s, owned=True)  # noqa: E731
            w = _apply_view(w, c.view, fn)
        out = w.to(original.dtype)
        if cpu and (out.data_ptr() - original.data_ptr()) % ALIGN:
            out = aligned_like(original).copy_(out)
        return out

    # -- apply / restore -----------------------------------------------------------------------------
    def original(self, key: str):
        return self._originals.get(key, self.weights[key])

    def original_weights(self) -> dict[str, Any]:
        return {k: self._originals.get(k, v) for k, v in self.weights.items()}

    def apply(
        self, stack: Sequence[LoraEntry], *, token: CancelToken | None = None, report: Report = no_report
    ) -> ApplyReport:
        """Make the weights what `stack` asks for, touching only keys whose contributions changed."""
        wanted = self.plan(stack)
        rep = ApplyReport()
        changed = [k for k in wanted if self._applied.get(k) != wanted[k]]
        to_restore = [k for k in self._applied if k not in wanted]
        rep.unchanged = len(wanted) - len(changed)
        pending: dict[str, Any] = {}
        total = len(changed)
        for i, key in enumerate(changed):
            if token is not None:
                token.raise_if_cancelled()
            pending[key] = self._compute(self.original(key), wanted[key])
            self.keys_computed += 1
            report(Progress("Patching", i + 1, total, key))
        # Commit: nothing below can be interrupted, so weights are all-old or all-new.
        for key, t in pending.items():
            self._originals.setdefault(key, self.weights[key])
            self._set(key, t)
            self._applied[key] = wanted[key]
            rep.patched.append(key)
        for key in to_restore:
            self._set(key, self._originals.pop(key))
            del self._applied[key]
            rep.restored.append(key)
        self.stack = tuple(stack)
        return rep

    def restore(self) -> ApplyReport:
        """Every patched key back to its original tensor (the same object: bit-exact)."""
        return self.apply(())

    def _set(self, key: str, t) -> None:
        self.weights[key] = t
        if self._setter is not None:
            self._setter(key, t)

    @property
    def patched_keys(self) -> list[str]:
        return list(self._applied)

    # -- clones and on-the-fly patches -------------------------------------------------------------
    def clone(self, *, setter: Callable[[str, Any], None] | None = None) -> ModelPatcher:
        """A patcher sharing every tensor (originals and patched) and the parsed adapters."""
        c = ModelPatcher(self.weights, loader=self._loader, setter=setter, keymap=self._keymap)
        c._originals = dict(self._originals)
        c._applied = dict(self._applied)
        c._adapters = self._adapters
        c._placements = self._placements
        c.stack = self.stack
        return c

    def weight_function(self, key: str, stack: Sequence[LoraEntry]) -> Callable[[Any], Any] | None:
        """`patch(weight) -> patched` for `key` under `stack` (None when the stack leaves it alone).

        Given the original weight (in any dtype, on any device) it returns what baking would store,
        rounded to the weight's dtype — for modules patched during forward instead of baked.
        """
        contributions = self.plan(stack).get(key)
        if not contributions:
            return None
        return lambda weight: self._compute(weight, contributions)


def module_setter(root) -> Callable[[str, Any], None]:
    """A setter that rebinds a torch module's parameter `a.b.weight` to a new tensor (no copy)."""
    import torch

    def set_param(key: str, t) -> None:
        owner_name, _, attr = key.rpartition(".")
        owner = root.get_submodule(owner_name) if owner_name else root
        if attr in owner._parameters:
            owner._parameters[attr] = torch.nn.Parameter(t, requires_grad=False)
        else:
            setattr(owner, attr, t)

    return set_param


def patcher_for_module(root, **kw) -> ModelPatcher:
    """A ModelPatcher over a module's parameters (and buffers), rebinding them as keys change."""
    weights = {k: v.detach() for k, v in root.state_dict(keep_vars=True).items()}
    return ModelPatcher(weights, setter=module_setter(root), **kw)
