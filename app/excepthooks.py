"""One path for errors to reach the user: ErrorInfo for expected engine errors and for bugs, and the
process-wide hooks that turn any unhandled exception (GUI thread or any other thread) into a crash
dialog while the application keeps running (as napari and qutebrowser do)."""

from __future__ import annotations

import logging
import sys
import threading
import traceback
from dataclasses import dataclass

from PySide6.QtCore import QObject, Qt, Signal, Slot
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.errors import Cancelled

log = logging.getLogger("loadout.app")


@dataclass(frozen=True)
class ErrorInfo:
    """What the user sees about a failure. `expected` errors (a bad file, out of memory) get a plain
    message; unexpected ones are bugs and come with the traceback to report."""

    title: str
    message: str
    details: str = ""
    expected: bool = False

    @classmethod
    def from_engine_error(cls, e: BaseException) -> ErrorInfo:
        return cls("Loadout", str(getattr(e, "message", e)), "", True)

    @classmethod
    def from_exception(cls, e: BaseException) -> ErrorInfo:
        details = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        return cls("Loadout hit a bug", f"{type(e).__name__}: {e}", details, False)


class CrashReporter(QObject):
    """Lives in the GUI thread; `report` may be emitted from any thread (the signal queues it over)."""

    report = Signal(object)  # ErrorInfo
    MAX_OPEN = 3  # a bug that repeats in a timer must not bury the screen in dialogs

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._parent_widget = parent
        self.dialogs: list[QMessageBox] = []
        self.reports: list[ErrorInfo] = []
        self.report.connect(self._on_report, Qt.ConnectionType.QueuedConnection)

    @Slot(object)
    def _on_report(self, info: ErrorInfo) -> None:
        self.reports.append(info)
        self.dialogs = [d for d in self.dialogs if d.isVisible()]
        if len(self.dialogs) >= self.MAX_OPEN:
            return
        box = QMessageBox(self._parent_widget)
        box.setIcon(QMessageBox.Icon.Warning if info.expected else QMessageBox.Icon.Critical)
        box.setWindowTitle(info.title)
        box.setText(info.message)
        if not info.expected:
            box.setInformativeText("Loadout keeps running. Please report this with the details below.")
        if info.details:
            box.setDetailedText(info.details)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()  # not exec(): a nested event loop would stall the engine's signals
        self.dialogs.append(box)


_installed: CrashReporter | None = None
_previous: tuple = ()


def install_excepthooks(reporter: CrashReporter) -> None:
    """Route unhandled exceptions to `reporter`. Once per process: a second call only re-targets."""
    global _installed, _previous
    if _installed is None:
        _previous = (sys.excepthook, threading.excepthook)
        sys.excepthook = _sys_hook
        threading.excepthook = _thread_hook
    _installed = reporter


def uninstall_excepthooks() -> None:
    """Put the previous hooks back (tests; the application never needs it)."""
    global _installed, _previous
    if _installed is not None:
        sys.excepthook, threading.excepthook = _previous
        _installed, _previous = None, ()


def _deliver(exc: BaseException) -> None:
    reporter = _installed
    if reporter is None:
        return
    try:
        reporter.report.emit(ErrorInfo.from_exception(exc))
    except RuntimeError:  # the reporter's C++ side is gone (application shutting down)
        pass


def _sys_hook(exc_type, exc, tb) -> None:
    if issubclass(exc_type, KeyboardInterrupt):
        sys.__excepthook__(exc_type, exc, tb)
        return
    if issubclass(exc_type, Cancelled):  # a stop the user asked for that nobody caught: not a crash
        log.info("cancelled outside a job: %s", exc)
        return
    log.error("unhandled exception", exc_info=(exc_type, exc, tb))
    _deliver(exc.with_traceback(tb) if exc is not None else exc_type())


def _thread_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread else "?"
    if issubclass(args.exc_type, Cancelled):  # a stop the user asked for, not a crash
        log.info("cancelled in thread %s: %s", name, args.exc_value)
        return
    log.error(
        "unhandled exception in thread %s", name, exc_info=(args.exc_type, args.exc_value, args.exc_traceback)
    )
    if args.exc_value is not None:
        _deliver(args.exc_value.with_traceback(args.exc_traceback))
