"""The only place engine calls become Qt signals: an EngineWorker living in one QThread (it owns the
Engine facade and all torch work, so torch is imported there, never in the GUI thread) and an
EngineClient in the GUI thread that submits requests by queued signals and cancels them through
their CancelToken directly (a queued cancel would arrive only after the job). Torch-free header and
file reads (scan, hash, LoRA coverage) go to a second worker thread so they never queue behind a load."""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.excepthooks import ErrorInfo
from engine.errors import Cancelled, EngineError
from engine.facade import Engine
from engine.jobs import CancelToken, Progress
from engine.requests import DetectDevices, HashFiles, Inspect, LoraCoverage, Scan

log = logging.getLogger("loadout.bridge")
# Header and file reads that never touch torch or the device run in a second thread, so a scan or a
# coverage report never waits behind a long load or decode (and hashing never blocks a load).
IO_REQUESTS = (Scan, HashFiles, LoraCoverage, Inspect)
PROGRESS_INTERVAL_S = 0.05  # at most ~20 progress signals a second per job: the GUI never floods


@dataclass(frozen=True)
class Job:
    """A submitted request as the GUI sees it."""

    id: int
    request: object
    started: float

    @property
    def name(self) -> str:
        return type(self.request).__name__


class EngineWorker(QObject):
    """Runs in the engine thread. Every payload it emits is a frozen dataclass."""

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
            log.exception("job %d (%s) crashed", job_id, type(request).__name__)
            self.failed.emit(job_id, ErrorInfo.from_exception(e))
        else:
            self.finished.emit(job_id, result)

    @Slot()
    def close(self) -> None:
        self.engine.close()


class EngineClient(QObject):
    """GUI-thread side: starts the engine thread, submits requests, relays results as GUI-thread
    signals (with the Job they answer), and stops the thread cleanly on shutdown."""

    devices_detected = Signal(object)  # DeviceReport
    job_started = Signal(object)  # Job
    progress = Signal(object)  # Progress (any job)
    job_progress = Signal(object, object)  # Job, Progress
    finished = Signal(object, object)  # Job, result
    failed = Signal(object)  # ErrorInfo
    job_failed = Signal(object, object)  # Job, ErrorInfo
    cancelled = Signal(int)
    job_cancelled = Signal(object)  # Job
    event = Signal(object)  # engine event
    idle = Signal()  # no job queued or running any more
    _submit = Signal(int, object, object)
    _submit_io = Signal(int, object, object)
    _close = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._tokens: dict[int, CancelToken] = {}
        self.jobs: dict[int, Job] = {}  # queued or running, in submission order
        self._thread, self._worker = self._make("loadout-engine")
        self._io_thread, self._io_worker = self._make("loadout-io")

    def _make(self, name: str) -> tuple[QThread, EngineWorker]:
        thread = QThread()
        thread.setObjectName(name)
        worker = EngineWorker()
        worker.moveToThread(thread)
        thread.finished.connect(worker.deleteLater)
        (self._submit_io if name == "loadout-io" else self._submit).connect(worker.run_job)
        self._close.connect(worker.close)
        # Bound slots of this GUI-thread object: Qt queues each call over to the GUI thread.
        worker.progress.connect(self._on_progress)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        worker.cancelled.connect(self._on_cancelled)
        worker.event.connect(self._on_event)
        return thread, worker

    @property
    def running(self) -> bool:
        return self._thread.isRunning() or self._io_thread.isRunning()

    @property
    def engine(self) -> Engine:
        """The facade, for its thread-safe reads only (snapshot()); never call run() from the GUI."""
        return self._worker.engine

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    @property
    def current(self) -> Job | None:
        """The oldest unfinished job (an engine-thread job first: that is the one the user waits for)."""
        eng = [j for j in self.jobs.values() if not isinstance(j.request, IO_REQUESTS)]
        return next(iter(eng or self.jobs.values()), None)

    def start(self) -> None:
        for t in (self._thread, self._io_thread):
            if not t.isRunning():
                t.start()

    def submit(self, request) -> int:
        """Queue `request` (a frozen dataclass) for the engine thread; returns its job id."""
        self.start()
        job_id = next(self._ids)
        token = CancelToken()
        self._tokens[job_id] = token
        job = Job(job_id, request, time.monotonic())
        self.jobs[job_id] = job
        (self._submit_io if isinstance(request, IO_REQUESTS) else self._submit).emit(job_id, request, token)
        self.job_started.emit(job)
        return job_id

    def detect_devices(self, options) -> int:
        """Ask the engine thread to import torch and detect devices; returns the job id."""
        return self.submit(DetectDevices(options))

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
        """Cancel every job, stop the engine thread and wait for it (a live QThread at exit aborts)."""
        self.cancel_all("Loadout is closing.")
        self._close.emit()  # queued after the jobs: each worker drops its objects in its own thread
        for t in (self._thread, self._io_thread):
            if t.isRunning():
                t.quit()
                t.wait()

    def _done(self, job_id: int) -> Job | None:
        self._tokens.pop(job_id, None)
        job = self.jobs.pop(job_id, None)
        return job

    def _after(self) -> None:
        if not self.jobs:
            self.idle.emit()

    @Slot(int, object)
    def _on_progress(self, job_id: int, p: Progress) -> None:
        job = self.jobs.get(job_id)
        self.progress.emit(p)
        if job is not None:
            self.job_progress.emit(job, p)

    @Slot(int, object)
    def _on_finished(self, job_id: int, result) -> None:
        job = self._done(job_id)
        if job is not None and isinstance(job.request, DetectDevices):
            self.devices_detected.emit(result)
        if job is not None:
            self.finished.emit(job, result)
        self._after()

    @Slot(int, object)
    def _on_failed(self, job_id: int, info: ErrorInfo) -> None:
        job = self._done(job_id)
        self.failed.emit(info)
        if job is not None:
            self.job_failed.emit(job, info)
        self._after()

    @Slot(int)
    def _on_cancelled(self, job_id: int) -> None:
        job = self._done(job_id)
        self.cancelled.emit(job_id)
        if job is not None:
            self.job_cancelled.emit(job)
        self._after()

    @Slot(object)
    def _on_event(self, event) -> None:
        self.event.emit(event)
