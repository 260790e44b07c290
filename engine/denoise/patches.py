"""LoRA patches during a run: baked into the resident modules, on the fly for the streamed ones.

engine.stacking keeps a LoRA stack as on-the-fly functions on every op (the stored tensors are never
rewritten, so any move keeps its patch and a revert is exact). Running a patch inside every forward
of a resident module would redo the same work each step, so for the length of a run the patched
weight of each *resident* module is computed once and bound in place of the stored one (the
patcher's bake: the same function, so the same bits); streamed modules keep patching on the fly, as
their bytes arrive. Afterwards — finished, failed or cancelled — every op gets back its own tensor
object and its functions: the patches are exactly as they were.

On the CPU a resident weight is a view of the file's private mapping (transfer.FileBlock): it is
baked in place, the written pages becoming the process's own copies of the page-cache pages they
replace (its RSS and USS do not grow), and afterwards the mapping drops them and reads the file's
bytes again -- the file is the backup, so the restore is exact. Any other resident weight (a GPU's,
a RAM copy converted to another dtype) takes a second copy for the run, only in the `room` the
device has beside the resident weights and the step's activations; the modules beyond it patch on
the fly (one weight at a time, the same bits). Baking everything as copies put an SD1.5 UNet with a
LoKr over its 278 modules at 1.9 GB above the step's start on the CPU, against 0.2 GB unpatched: on
a card sized for the weights, an out-of-memory the plan could not foresee. In place, on the CPU (SD1.5
demo with a LoKr and a LoRA, 512^2, 2 cores): 5.8 s/step at 2.1 GiB above the start, against 6.2 s
at 3.5 GiB as copies and 7.8 s patching on the fly under a 2.5 GiB budget.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..jobs import CancelToken
from ..model.transfer import FileBlock
from ..ops import Castable


@contextlib.contextmanager
def baked_resident(component, token: CancelToken | None = None, room: int | None = None) -> Iterator[int]:
    """Bake the on-the-fly patches of `component`'s device-tier ops for the block; yields how many
    tensors were baked. A weight that is a view of the file's private mapping (the CPU's resident
    copies, transfer.FileBlock) is baked in place and needs no room; any other takes a second copy,
    in unit order while those fit in `room` bytes (None: all of them)."""
    import torch
    from torch import nn

    saved: list[tuple[object, str, object, list, list]] = []
    written: dict[int, tuple[FileBlock, list[tuple[int, int]]]] = {}  # per mapping, the pages written
    shared = _shared(component)
    left = room
    try:
        for u in component.units:
            m = u.module
            if u.tier != "device" or not isinstance(m, Castable):
                continue
            for attr, name in ((m.weight_attr, "weight_functions"), ("bias", "bias_functions")):
                fns = getattr(m, name, None)
                original = m._parameters.get(attr)
                if not fns or original is None or attr in m.quantized:
                    continue  # (a quantized or scaled weight is patched after dequantizing, per op)
                if token is not None:
                    token.raise_if_cancelled()
                span = _in_place(u.block, original, shared)
                if span is None and left is not None:
                    size = original.numel() * original.element_size()  # the fns keep the stored dtype
                    if size > left:
                        continue  # patched on the fly, as if streamed
                    left -= size
                t = original.detach()
                for fn in fns:
                    t = fn(t)
                saved.append((m, attr, original, fns, list(fns)))
                if span is not None:
                    # noted before the write: a write cut short is undone too
                    written.setdefault(id(u.block), (u.block, []))[1].append(span)
                    with torch.no_grad():
                        original.copy_(t)
                else:
                    m._parameters[attr] = nn.Parameter(t, requires_grad=False)
                del t
                fns.clear()
        yield len(saved)
    finally:
        for block, spans in written.values():
            block.revert(spans)  # the file's bytes again
        for m, attr, original, fns, kept in reversed(saved):
            m._parameters[attr] = original
            fns[:] = kept


def _in_place(block, t, shared: set[int]) -> tuple[int, int] | None:
    """The pages of the file mapping `block` that weight t can be baked into, or None: t is no view of
    a FileBlock, or another tensor of the component starts where it does (a tied weight would be
    patched twice)."""
    if not isinstance(block, FileBlock) or t.data_ptr() in shared:
        return None
    return block.span_of(t)


def _shared(component) -> set[int]:
    """Addresses where more than one tensor of the component's device-tier ops starts."""
    seen: dict[int, int] = {}
    for u in component.units:
        if u.tier != "device":
            continue
        for p in u.module.parameters(recurse=False):
            key = p.data_ptr()
            seen[key] = seen.get(key, 0) + 1
    return {k for k, n in seen.items() if n > 1}
