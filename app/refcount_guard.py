"""Workaround for a reference-count bug in PySide6 6.12.0 on Python < 3.12: every Qt call that returns
None (a void method such as QLabel.setText, or a None QVariant such as QComboBox.currentData) drops
one reference to None without taking it, and every Signal.emit() drops one reference to the bool it
returns (True). None is not immortal before Python 3.12, so after some tens
of thousands of such calls (a few seconds to minutes of a live window) the interpreter aborts with
"Fatal Python error: none_dealloc". Measured here: 1000 QTimer.setInterval calls -> None refcount
-1000; 1000 emits -> True refcount -1000 ("Fatal Python error: bool_dealloc"). The real fix is a PySide6 without the bug (or Python >= 3.12); until then we hold a pool of
surplus of references on None, True and False, topped up from a GUI timer: the same as the immortal None of Python
3.12 (PEP 683), done by hand. The surplus is never released, so finalization cannot hit zero either.
"""

from __future__ import annotations

import sys

LOW_WATER = 1 << 30
CHUNK = 1 << 40  # the leak runs at ~2-3k refs/s in a busy window: this lasts for ever
added = 0


def leaks_none() -> bool:
    """True when this PySide6 drops None references (probed with 100 void calls)."""
    if sys.version_info >= (3, 12):
        return False  # None is immortal: the bug is harmless
    from PySide6.QtCore import QTimer

    t = QTimer()
    before = sys.getrefcount(None)
    for _ in range(100):
        t.setInterval(5)
    return sys.getrefcount(None) < before - 50


def top_up() -> None:
    """Give None, True and False enough references to outlive the leak (CPython < 3.12 only: ob_refcnt
    is the first field of every object there, and these are static objects that are never freed)."""
    global added
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return
    import ctypes

    for obj in (None, True, False):
        if sys.getrefcount(obj) < LOW_WATER:
            ctypes.c_ssize_t.from_address(id(obj)).value += CHUNK
            added += CHUNK


def install(parent=None):
    """Top up now and every second from a GUI-thread timer; returns the timer (None if not needed)."""
    if not leaks_none():
        return None
    from PySide6.QtCore import QTimer

    top_up()
    timer = QTimer(parent)
    timer.setInterval(1000)
    timer.timeout.connect(top_up)
    timer.start()
    return timer
