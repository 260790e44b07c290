"""LoRA patches during a run: baked into the resident modules, on the fly for the streamed ones.

engine.stacking keeps a LoRA stack as on-the-fly functions on every op (the stored tensors are never
rewritten, so any move keeps its patch and a revert is exact). Running a patch inside every forward
of a resident module would redo the same work each step, so for the length of a run the patched
weight of each *resident* module is computed once and bound in place of the stored one (the
patcher's bake: the same function, so the same bits); streamed modules keep patching on the fly, as
their bytes arrive. Afterwards — finished, failed or cancelled — every op gets back its own tensor
object and its functions: the patches are exactly as they were.

A baked weight is a second copy beside the stored one for the run, so baking takes only the `room`
the device has beside the resident weights and the step's activations; the modules beyond it patch on
the fly (one weight at a time, the same bits). Baking everything put an SD1.5 UNet with a LoKr over
its 278 modules at 1.9 GB above the step's start on the CPU, against 0.2 GB unpatched: on a card
sized for the weights, an out-of-memory the plan could not foresee.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ..jobs import CancelToken
from ..ops import Castable


@contextlib.contextmanager
def baked_resident(component, token: CancelToken | None = None, room: int | None = None) -> Iterator[int]:
    """Bake the on-the-fly patches of `component`'s device-tier ops for the block, in unit order while
    the baked copies fit in `room` bytes (None: all of them); yields how many tensors were baked."""
    from torch import nn

    saved: list[tuple[object, str, object, list, list]] = []
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
                if left is not None:
                    size = original.numel() * original.element_size()  # the fns keep the stored dtype
                    if size > left:
                        continue  # patched on the fly, as if streamed
                    left -= size
                t = original.detach()
                for fn in fns:
                    t = fn(t)
                saved.append((m, attr, original, fns, list(fns)))
                m._parameters[attr] = nn.Parameter(t, requires_grad=False)
                fns.clear()
        yield len(saved)
    finally:
        for m, attr, original, fns, kept in reversed(saved):
            m._parameters[attr] = original
            fns[:] = kept
