"""What the engine tells its listeners (the memory graph, the Decode panel, the CLI's log): one frozen
dataclass per kind of event, each with the fields that kind has — no free-form dicts.

Torch-free and cheap to import: the GUI thread reads these objects. `EventLog` fans them out to
subscribers in the thread that caused them (the GUI's subscriber turns them into queued signals).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import ClassVar

log = logging.getLogger("loadout.events")


class EventKind(str, Enum):
    """Every kind of event (DESIGN.md's list, plus TilingChanged). The value is the name shown and
    written to JSON."""

    LOADED = "Loaded"
    PARTIALLY_OFFLOADED = "PartiallyOffloaded"
    MOVED = "Moved"
    EVICTED = "Evicted"
    UNLOADED = "Unloaded"
    PATCHED = "Patched"
    UNPATCHED = "Unpatched"
    DECODE_STARTED = "DecodeStarted"
    TILING_CHANGED = "TilingChanged"
    DECODE_FINISHED = "DecodeFinished"
    STEP_FINISHED = "StepFinished"
    CANCELLED = "Cancelled"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Tiers:
    """A component's bytes per tier after the event: on its device, offloaded to RAM, on the mmap."""

    device: int = 0
    ram: int = 0
    disk: int = 0

    @classmethod
    def of(cls, counts: dict) -> Tiers:
        return cls(int(counts.get("device", 0)), int(counts.get("ram", 0)), int(counts.get("disk", 0)))


Rect = tuple[int, int, int, int]  # y0, y1, x0, x1 in output pixels


@dataclass(frozen=True)
class Tiling:
    """How a decode or encode runs: `full`, or `tiled` with these tiles (their core rectangles in
    output pixels, in the order they finish) of `tile_px` with `overlap_px`, up to `batch_px` pixels
    of equal tiles computed together (0: one at a time). Chosen once (engine.vae.choice) and then
    executed as it says; an out-of-memory retry chooses a new one and says so (TilingChanged)."""

    mode: str = "full"
    tile_px: int = 0
    overlap_px: int = 0
    rects: tuple[Rect, ...] = ()
    batch_px: int = 0
    tile_frames: int = 0  # video: latent frames per temporal chunk (0: all at once, or not a video)
    overlap_frames: int = 0  # video: warm-up latent frames when a chunk restarts without its cache

    @property
    def tiled(self) -> bool:
        return self.mode == "tiled"

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "tile_px": self.tile_px,
            "overlap_px": self.overlap_px,
            "tiles": [list(r) for r in self.rects],
            "batch_px": self.batch_px,
            "tile_frames": self.tile_frames,
            "overlap_frames": self.overlap_frames,
        }


@dataclass(frozen=True)
class Event:
    """Fields every event has. `time` is wall-clock seconds (time.time()); `bytes_moved` counts bytes
    copied or released; `duration_s` is how long the step took."""

    kind: ClassVar[EventKind]
    component: str
    bytes_moved: int = 0
    duration_s: float = 0.0
    time: float = field(default_factory=time.time, kw_only=True)

    def to_json(self) -> dict:
        common = {"component", "bytes_moved", "duration_s", "time"}
        detail = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name not in common}
        return {
            "kind": self.kind.value,
            "component": self.component,
            "bytes_moved": self.bytes_moved,
            "duration_s": self.duration_s,
            "time": self.time,
            "detail": detail,
        }


def _plain(v):
    if hasattr(v, "to_json"):
        return v.to_json()
    if isinstance(v, Tiers):
        return {"device": v.device, "ram": v.ram, "disk": v.disk}
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    return v


@dataclass(frozen=True)
class Loaded(Event):
    kind: ClassVar[EventKind] = EventKind.LOADED
    device: str = ""
    tiers: Tiers = Tiers()


@dataclass(frozen=True)
class PartiallyOffloaded(Event):
    """A component left partly on the offload tier (a partial load, or an explicit 'free N bytes')."""

    kind: ClassVar[EventKind] = EventKind.PARTIALLY_OFFLOADED
    device: str = ""
    requested: int | None = None
    tiers: Tiers = Tiers()


@dataclass(frozen=True)
class Evicted(Event):
    """The policy took bytes of a component off `source` (the device, or RAM copies back to the mmap)."""

    kind: ClassVar[EventKind] = EventKind.EVICTED
    source: str = "device"
    target: str = ""
    requested: int | None = None
    tiers: Tiers = Tiers()


@dataclass(frozen=True)
class Moved(Event):
    kind: ClassVar[EventKind] = EventKind.MOVED
    source: str = ""
    target: str = ""
    tiers: Tiers = Tiers()


@dataclass(frozen=True)
class Unloaded(Event):
    """A component left the ledger: unloaded on request, or `collected` once nobody held it."""

    kind: ClassVar[EventKind] = EventKind.UNLOADED
    collected: bool = False
    tiers: Tiers = Tiers()  # before the unload


@dataclass(frozen=True)
class Patched(Event):
    """`modules` modules of the component now carry on-the-fly patches of `base`'s LoRA stack."""

    kind: ClassVar[EventKind] = EventKind.PATCHED
    base: str = ""
    modules: int = 0


@dataclass(frozen=True)
class Unpatched(Event):
    """`modules` modules of the component lost their patches (the stack changed, or it was unloaded)."""

    kind: ClassVar[EventKind] = EventKind.UNPATCHED
    base: str = ""
    modules: int = 0


@dataclass(frozen=True)
class DecodeStarted(Event):
    """A decode or encode starts with this tiling (the one it runs, not a guess)."""

    kind: ClassVar[EventKind] = EventKind.DECODE_STARTED
    direction: str = "decode"  # or "encode": the same marks for a VAE's (or an audio VAE's) encoder
    vae: str = ""
    latent_shape: tuple[int, ...] = ()  # what the decoder takes; () for an encode (its latent comes out)
    requested_mode: str = "auto"
    tiling: Tiling = Tiling()
    downscale: int = 8  # output pixels per latent pixel (16 for Wan 2.2; 0 for a sound)
    media: str = "image"  # "image", "video" or "sound" (an audio VAE, decoded or encoded whole)


@dataclass(frozen=True)
class TilingChanged(Event):
    """A running decode changed its tiling (after an out-of-memory: smaller tiles); tiles from now on
    follow `tiling`."""

    kind: ClassVar[EventKind] = EventKind.TILING_CHANGED
    tiling: Tiling = Tiling()
    reason: str = ""


@dataclass(frozen=True)
class DecodeFinished(Event):
    """The decode or encode DecodeStarted announced ended; `bytes_moved` is what it made (the RGB bytes of every
    frame, the latent's float32 bytes, a sound's float32 samples)."""

    kind: ClassVar[EventKind] = EventKind.DECODE_FINISHED
    direction: str = "decode"
    media: str = "image"
    tiling: Tiling = Tiling()
    dtype: str = ""
    device: str = ""
    fp32_rerun: bool = False
    oom_retries: int = 0


@dataclass(frozen=True)
class StepFinished(Event):
    """A denoiser ran `steps` forward passes (`loadout step`); `bytes_moved` is what one step streamed
    of its offloaded modules, `duration_s` the median step."""

    kind: ClassVar[EventKind] = EventKind.STEP_FINISHED
    steps: int = 0
    mode: str = "full"
    device: str = ""
    first_step_s: float = 0.0
    peak_bytes: int = 0
    tiers: Tiers = Tiers()


@dataclass(frozen=True)
class JobCancelled(Event):
    """A job stopped at a cancel check; `at` says where (a module path, or the job's name)."""

    kind: ClassVar[EventKind] = EventKind.CANCELLED
    at: str = ""
    tiers: Tiers | None = None


Subscriber = Callable[[Event], None]


class EventLog:
    """A bounded log plus subscribers (callbacks, called in the thread that caused the event). A failing
    subscriber never breaks the engine's work, but it is logged with its stack: a listener's bug is
    still a bug."""

    def __init__(self, maxlen: int = 1000):
        self._log: deque[Event] = deque(maxlen=maxlen)
        self._subs: list[Subscriber] = []
        self._lock = threading.Lock()

    def subscribe(self, fn: Subscriber) -> Callable[[], None]:
        """Add a callback; returns a function that removes it."""
        with self._lock:
            self._subs.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._subs:
                    self._subs.remove(fn)

        return unsubscribe

    def emit(self, event: Event) -> None:
        with self._lock:
            self._log.append(event)
            subs = list(self._subs)
        for fn in subs:
            try:
                fn(event)
            except Exception:  # the load or decode that caused the event goes on; the bug is reported
                log.exception("an event listener failed on %s", event.kind.value)

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._log)
