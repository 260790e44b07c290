"""Helpers app tests import by name (not from conftest: several conftest.py files exist)."""

from __future__ import annotations


def drop(widget, paths):
    """Drop local files on `widget` as a file manager would."""
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    ev = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                    Qt.KeyboardModifier.NoModifier)  # fmt: skip
    widget.dropEvent(ev)


def wait_job(qtbot, window, kind: type, timeout: int = 60_000):
    """Wait for the next finished job whose request is a `kind` (engine.requests); returns its result."""
    got = []

    def on_finished(job, result):
        if isinstance(job.request, kind):
            got.append(result)

    window.client.finished.connect(on_finished)
    try:
        qtbot.waitUntil(lambda: bool(got), timeout=timeout)
    finally:
        window.client.finished.disconnect(on_finished)
    return got[0]


def engine_of(window):
    """The window's engine facade, for tests that look inside it (the app itself reads only the ledger,
    through client.snapshot())."""
    return window.client._worker.engine
