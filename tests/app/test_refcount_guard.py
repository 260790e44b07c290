"""The None-refcount workaround keeps a window alive through many void Qt calls (PySide6 6.12.0 bug)."""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer

from app import refcount_guard


def test_many_void_qt_calls_and_emits_do_not_exhaust_none_or_true(qapp):
    from PySide6.QtCore import QObject, Signal

    class Source(QObject):
        changed = Signal(object)

    src = Source()
    got = []
    src.changed.connect(got.append)
    t = QTimer()
    for _ in range(30):
        refcount_guard.top_up()  # what the guard's timer does once a second
        for _ in range(20_000):
            t.setInterval(5)
        for _ in range(2_000):
            src.changed.emit(None)
    assert len(got) == 60_000
    assert sys.getrefcount(None) > 100_000 and sys.getrefcount(True) > 100_000
    if refcount_guard.leaks_none():
        assert refcount_guard.added >= refcount_guard.CHUNK
