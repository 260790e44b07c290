"""Cooperative cancellation and progress reports shared by every long engine call."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from .errors import Cancelled


class CancelToken:
    """Thread-safe flag: the GUI thread calls cancel(), the worker checks between steps.

    Cancellation is cooperative (as superqt's workers): a job stops at its next check, so every
    loop over modules, tiles or tensors calls raise_if_cancelled().
    """

    __slots__ = ("_event", "reason")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def cancel(self, reason: str = "") -> None:
        self.reason = reason
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def raise_if_cancelled(self) -> None:
        if self._event.is_set():
            raise Cancelled(self.reason or "Cancelled by the user.")


@dataclass(frozen=True)
class TileDone:
    """A tile of a tiled decode or encode finished a pass: pass `pass_index` of `passes` (1-based),
    tile `index` (0-based, in the order of the tiling's rectangles) of `count`, covering `rect`
    (y0, y1, x0, x1 in image pixels)."""

    pass_index: int
    passes: int
    index: int
    count: int
    rect: tuple[int, int, int, int]


@dataclass(frozen=True)
class Progress:
    """One step of a long job: `done` of `total` units of `stage` (total 0 = unknown); `detail` is
    for people, `tile` for code (set by tiled VAE passes)."""

    stage: str
    done: int = 0
    total: int = 0
    detail: str = ""
    tile: TileDone | None = None

    @property
    def fraction(self) -> float | None:
        return self.done / self.total if self.total else None


Report = Callable[[Progress], None]


def no_report(_: Progress) -> None:
    """The default `report`: drop progress."""
