"""The one placement rule, pure: which modules of a component go on the device under a budget. The
residency manager executes it (manager.Residency._fill) and `loadout plan` predicts with it, so the
plan's "partial, 37 % resident" is what a load will really do.

Modules are decided smallest first while they fit — fewer bytes left out means fewer streamed per
step — except that tensors with no castable op to stream them (`must`) go first and all together,
or the load does not fit at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..devices import VRAMState


@dataclass(frozen=True)
class Placement:
    """Indices (into the sizes given) chosen for the device and left off it; `short` is set when the
    `must` modules alone exceed the budget: (their first size that did not fit, the room left)."""

    chosen: tuple[int, ...]
    offloaded: tuple[int, ...]
    device_bytes: int
    short: tuple[int, int] | None = None


def place_modules(
    sizes: Sequence[int], must: Sequence[bool], budget: int | None, state: VRAMState
) -> Placement:
    """Decide every module: `budget` None means no limit (a component on another device)."""
    order = sorted(range(len(sizes)), key=lambda i: (not must[i], sizes[i]))
    chosen: list[int] = []
    offloaded: list[int] = []
    room = budget
    for i in order:
        size = sizes[i]
        if room is None or state == VRAMState.HIGH_VRAM:
            fits = True
        elif must[i]:  # plain tensors cannot stream: they go with the component or not at all
            if size > room:
                return Placement((), tuple(order), 0, (size, room))
            fits = True
        elif state == VRAMState.NO_VRAM:
            fits = False
        else:
            fits = size <= room
        if fits:
            chosen.append(i)
            if room is not None:
                room -= size
        else:
            offloaded.append(i)
    return Placement(tuple(chosen), tuple(offloaded), sum(sizes[i] for i in chosen))
