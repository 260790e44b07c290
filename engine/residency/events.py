"""Residency events for the graph and the log: what moved, how many bytes, how long it took."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

KINDS = ("Loaded", "PartiallyOffloaded", "Moved", "Evicted", "Unloaded", "Cancelled")


@dataclass(frozen=True)
class Event:
    """One residency event. `time` is wall-clock seconds (time.time()); `bytes_moved` counts bytes
    copied or released; `detail` says from/to tiers and what was left where."""

    kind: str
    component: str
    bytes_moved: int
    duration_s: float
    time: float = field(default_factory=time.time)
    detail: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


Subscriber = Callable[[Event], None]


class EventLog:
    """A bounded log plus subscribers (callbacks, called in the thread that caused the event; the GUI
    turns them into queued signals). A failing subscriber never breaks the engine."""

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
            except Exception:  # a broken listener must not corrupt a load
                pass

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._log)
