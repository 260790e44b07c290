"""The only place engine calls become Qt signals: EngineWorkers, each in its own QThread (the engine
thread owns the Engine facade and all torch work, so torch is imported there, never in the GUI thread),
and an EngineClient in the GUI thread that submits requests by queued signals and cancels them through
their CancelToken directly (a queued cancel would arrive only after the job).

Whoever submits a request owns its outcome: `submit(request, on_done, on_failed, on_progress=...,
on_cancelled=...)`, as napari's workers take `_connect` callbacks. The callbacks run in the GUI thread
(the client's own slots call them when the worker's queued signals arrive) and never on a QObject that
has been deleted since. A failure without an on_failed goes to `error`, the window's one path to the user
(message bar or crash dialog); an on_failed that also wants the user told hands it on with
`report_error`. A cancellation is not a failure: it goes to on_cancelled."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import shiboken6
from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.excepthooks import ErrorInfo
from engine.errors import Cancelled, EngineError
from engine.facade import Engine
from engine.jobs import CancelToken, Progress
from engine.requests import (
    DetectDevices,
    EstimateDecode,
    FindLibraries,
    HashFiles,
    Inspect,
    LoraCoverage,
    SaveAudio,
    SaveClip,
    Scan,
)

log = logging.getLogger("loadout.bridge")
# Torch-free reads of headers and folders run in a second thread, so a scan, a coverage report or the
# first run's search never waits behind a long load or decode (and hashing never blocks a load) ...
IO_REQUESTS = (Scan, HashFiles, LoraCoverage, FindLibraries, Inspect, SaveClip, SaveAudio)
# ... and the Decode panel's estimate (a few header reads) in a third, so it never waits behind a hash.
PEEK_REQUESTS = (EstimateDecode,)
PROGRESS_INTERVAL_S = 0.05  # at most ~20 progress signals a second per job: the GUI never floods


@dataclass(frozen=True)
class Job:
    """A submitted request as the GUI sees it."""

    id: int
    request: object
    started: float


@dataclass(frozen=True)
class _Callbacks:
    on_done: Callable | None = None  # (result)
    on_failed: Callable | None = None  # (ErrorInfo)
    on_progress: Callable | None = None  # (Progress)
    on_cancelled: Callable | None = None  # ()


_NONE = _Callbacks()


def _alive(fn: Callable | None) -> bool:
    """False for a bound method (or a partial of one) of a QObject whose C++ side is gone (a dialog
    closed meanwhile): calling it would raise in the GUI thread for a widget nobody sees."""
    owner = getattr(getattr(fn, "func", fn), "__self__", None)
    return fn is not None and not (isinstance(owner, QObject) and not shiboken6.isValid(owner))


class EngineWorker(QObject):
    """Runs in its engine thread. Every payload it emits is a frozen dataclass."""

    progress = Signal(int, object)  # job id, engine.jobs.Progress
    finished = Signal(int, object)  # job id, result
    failed = Signal(int, object)  # job id, ErrorInfo
    cancelled = Signal(int)
    event = Signal(object)  # engine.residency.Event (residency, patch and decode events)

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(on_event=self.event.emit)

    @Slot(int, object, object)
    def run_job(self, job_id: int, request, token: CancelToken) -> None:
        last = [0.0]

        def report(p: Progress) -> None:
            now = time.monotonic()
            if now - last[0] >= PROGRESS_INTERVAL_S or (p.total and p.done >= p.total):
                last[0] = now
                self.progress.emit(job_id, p)

        try:
            token.raise_if_cancelled()
            result = self.engine.run(request, token=token, report=report)
        except Cancelled:
            self.cancelled.emit(job_id)
        except EngineError as e:
            self.failed.emit(job_id, ErrorInfo.from_engine_error(e))
        except Exception as e:  # a bug: log it with its stack, show the crash dialog
            log.exception("job %d (%r) crashed", job_id, request)
            self.failed.emit(job_id, ErrorInfo.from_exception(e))
        else:
            self.finished.emit(job_id, result)

    @Slot()
    def close(self) -> None:
        self.engine.close()


class EngineClient(QObject):
    """GUI-thread side: starts the engine threads, submits requests, delivers each outcome to its
    submitter's callbacks and relays it as GUI-thread signals (with the Job it answers) for whoever
    watches every job (the status bar), and stops the threads cleanly on shutdown."""

    devices_detected = Signal(object)  # DeviceReport, answering detect_devices()
    job_started = Signal(object)  # Job
    job_progress = Signal(object, object)  # Job, Progress
    finished = Signal(object, object)  # Job, result (after its on_done)
    failed = Signal(object)  # ErrorInfo of every failed job
    job_failed = Signal(object, object)  # Job, ErrorInfo (after its on_failed)
    error = Signal(object)  # ErrorInfo for the user: a failure no on_failed took, or one handed on
    job_cancelled = Signal(object)  # Job (after its on_cancelled)
    event = Signal(object)  # engine event
    idle = Signal()  # no job queued or running any more
    _submit = Signal(int, object, object)
    _submit_io = Signal(int, object, object)
    _submit_peek = Signal(int, object, object)
    _close = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._tokens: dict[int, CancelToken] = {}
        self._callbacks: dict[int, _Callbacks] = {}
        self.jobs: dict[int, Job] = {}  # queued or running, in submission order
        self._threads: list[QThread] = []
        self._worker = self._make("loadout-engine", self._submit)
        self._make("loadout-io", self._submit_io)
        self._make("loadout-peek", self._submit_peek)

    def _make(self, name: str, submit: Signal) -> EngineWorker:
        thread = QThread()
        thread.setObjectName(name)
        worker = EngineWorker()
        worker.moveToThread(thread)
        thread.finished.connect(worker.deleteLater)
        submit.connect(worker.run_job)
        self._close.connect(worker.close)
        # Bound slots of this GUI-thread object: Qt queues each call over to the GUI thread.
        worker.progress.connect(self._on_progress)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        worker.cancelled.connect(self._on_cancelled)
        worker.event.connect(self._on_event)
        self._threads.append(thread)
        return worker

    @property
    def running(self) -> bool:
        return any(t.isRunning() for t in self._threads)

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    def snapshot(self):
        """The residency ledger now (a frozen snapshot, read under its lock; None before devices are
        detected): the GUI's one read of engine state outside a job's result."""
        return self._worker.engine.snapshot()

    def start(self) -> None:
        for t in self._threads:
            if not t.isRunning():
                t.start()

    def submit(
        self,
        request,
        on_done: Callable | None = None,
        on_failed: Callable | None = None,
        *,
        on_progress: Callable | None = None,
        on_cancelled: Callable | None = None,
    ) -> int:
        """Queue `request` (a frozen dataclass) for its thread; returns its job id. The callbacks get the
        result, the ErrorInfo, each Progress, or nothing, in the GUI thread."""
        self.start()
        job_id = next(self._ids)
        token = CancelToken()
        self._tokens[job_id] = token
        self._callbacks[job_id] = _Callbacks(on_done, on_failed, on_progress, on_cancelled)
        job = Job(job_id, request, time.monotonic())
        self.jobs[job_id] = job
        if isinstance(request, IO_REQUESTS):
            self._submit_io.emit(job_id, request, token)
        elif isinstance(request, PEEK_REQUESTS):
            self._submit_peek.emit(job_id, request, token)
        else:
            self._submit.emit(job_id, request, token)
        self.job_started.emit(job)
        return job_id

    def detect_devices(self, options, on_failed: Callable | None = None) -> int:
        """Ask the engine thread to import torch and detect devices; `devices_detected` brings the report."""
        return self.submit(DetectDevices(options), self.devices_detected.emit, on_failed)

    def report_error(self, info: ErrorInfo) -> None:
        """Hand a failure an on_failed took on to the user as well (the window's message bar or dialog)."""
        self.error.emit(info)

    def cancel(self, job_id: int, reason: str = "") -> None:
        """Thread-safe and immediate: the job stops at its next check."""
        token = self._tokens.get(job_id)
        if token is not None:
            token.cancel(reason)

    def cancel_all(self, reason: str = "Stopped by the user.") -> int:
        """Stop: the running job stops at its next check, queued ones never start. Returns how many."""
        for token in self._tokens.values():
            token.cancel(reason)
        return len(self._tokens)

    def shutdown(self) -> None:
        """Cancel every job, stop the engine threads and wait for them (a live QThread at exit aborts)."""
        self.cancel_all("Loadout is closing.")
        self._close.emit()  # queued after the jobs: each worker drops its objects in its own thread
        for t in self._threads:
            if t.isRunning():
                t.quit()
                t.wait()

    def _done(self, job_id: int) -> tuple[Job | None, _Callbacks]:
        self._tokens.pop(job_id, None)
        return self.jobs.pop(job_id, None), self._callbacks.pop(job_id, _NONE)

    def _after(self) -> None:
        if not self.jobs:
            self.idle.emit()

    @Slot(int, object)
    def _on_progress(self, job_id: int, p: Progress) -> None:
        job = self.jobs.get(job_id)
        if job is None:
            return
        cb = self._callbacks.get(job_id, _NONE).on_progress
        if _alive(cb):
            cb(p)
        self.job_progress.emit(job, p)

    @Slot(int, object)
    def _on_finished(self, job_id: int, result) -> None:
        job, cbs = self._done(job_id)
        try:
            if job is not None and _alive(cbs.on_done):
                cbs.on_done(result)
        finally:  # a bug in on_done reaches the crash dialog; the job still ends for the status bar
            if job is not None:
                self.finished.emit(job, result)
            self._after()

    @Slot(int, object)
    def _on_failed(self, job_id: int, info: ErrorInfo) -> None:
        job, cbs = self._done(job_id)
        try:
            if _alive(cbs.on_failed):
                cbs.on_failed(info)
            else:  # nobody took it (or its taker is gone): the user hears of it
                self.error.emit(info)
        finally:
            self.failed.emit(info)
            if job is not None:
                self.job_failed.emit(job, info)
            self._after()

    @Slot(int)
    def _on_cancelled(self, job_id: int) -> None:
        job, cbs = self._done(job_id)
        try:
            if _alive(cbs.on_cancelled):
                cbs.on_cancelled()
        finally:
            if job is not None:
                self.job_cancelled.emit(job)
            self._after()

    @Slot(object)
    def _on_event(self, event) -> None:
        self.event.emit(event)
