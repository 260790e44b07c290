"""The only place engine calls become Qt signals: an EngineWorker living in one QThread (it owns all
torch work, so torch is imported there, never in the GUI thread) and an EngineClient in the GUI
thread that submits jobs by queued signals and cancels them through their CancelToken directly."""

from __future__ import annotations

import itertools
import logging

from PySide6.QtCore import QObject, QThread, Signal, Slot

from app.excepthooks import ErrorInfo
from engine.errors import Cancelled, EngineError
from engine.jobs import CancelToken, Progress

log = logging.getLogger("loadout.bridge")


class EngineWorker(QObject):
    """Runs in the engine thread. Every payload it emits is a frozen dataclass."""

    progress = Signal(int, object)  # job id, engine.jobs.Progress
    devices_detected = Signal(int, object)  # job id, engine.devices.DeviceReport
    failed = Signal(int, object)  # job id, ErrorInfo
    cancelled = Signal(int)

    @Slot(int, object, object)
    def detect_devices(self, job_id: int, options, token: CancelToken) -> None:
        try:
            token.raise_if_cancelled()
            self.progress.emit(job_id, Progress("Loading torch"))
            import torch  # noqa: F401  (the slow import, seconds on a cold disk: here, not in the GUI)

            token.raise_if_cancelled()
            self.progress.emit(job_id, Progress("Detecting devices"))
            from engine import memory
            from engine.devices import detect_devices

            report = detect_devices(options)
            # From now on the GUI's sampler may ask torch/NVML about this device.
            memory.configure(memory.target_for(report.selected))
        except Cancelled:
            self.cancelled.emit(job_id)
        except EngineError as e:
            self.failed.emit(job_id, ErrorInfo.from_engine_error(e))
        except Exception as e:  # a bug: log it with its stack, show the crash dialog
            log.exception("job %d (detect devices) crashed", job_id)
            self.failed.emit(job_id, ErrorInfo.from_exception(e))
        else:
            self.devices_detected.emit(job_id, report)


class EngineClient(QObject):
    """GUI-thread side: starts the engine thread, submits jobs, relays results as GUI-thread signals,
    and stops the thread cleanly on shutdown."""

    devices_detected = Signal(object)  # DeviceReport
    progress = Signal(object)  # Progress
    failed = Signal(object)  # ErrorInfo
    cancelled = Signal(int)
    _submit_detect = Signal(int, object, object)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._ids = itertools.count(1)
        self._tokens: dict[int, CancelToken] = {}
        self._thread = QThread()
        self._thread.setObjectName("loadout-engine")
        self._worker = EngineWorker()
        self._worker.moveToThread(self._thread)
        self._thread.finished.connect(self._worker.deleteLater)
        self._submit_detect.connect(self._worker.detect_devices)
        # Bound slots of this GUI-thread object: Qt queues each call over to the GUI thread.
        self._worker.progress.connect(self._on_progress)
        self._worker.devices_detected.connect(self._on_devices_detected)
        self._worker.failed.connect(self._on_failed)
        self._worker.cancelled.connect(self._on_cancelled)

    @property
    def running(self) -> bool:
        return self._thread.isRunning()

    def start(self) -> None:
        if not self._thread.isRunning():
            self._thread.start()

    def detect_devices(self, options) -> int:
        """Ask the engine thread to import torch and detect devices; returns the job id."""
        self.start()
        job_id = next(self._ids)
        token = CancelToken()
        self._tokens[job_id] = token
        self._submit_detect.emit(job_id, options, token)
        return job_id

    def cancel(self, job_id: int) -> None:
        """Thread-safe and immediate: the job stops at its next check (a queued signal would arrive
        only after the job)."""
        token = self._tokens.get(job_id)
        if token is not None:
            token.cancel()

    def shutdown(self) -> None:
        """Cancel every job, stop the engine thread and wait for it (a live QThread at exit aborts)."""
        for token in self._tokens.values():
            token.cancel("Loadout is closing.")
        if self._thread.isRunning():
            self._thread.quit()
            self._thread.wait()

    @Slot(int, object)
    def _on_progress(self, job_id: int, p: Progress) -> None:
        self.progress.emit(p)

    @Slot(int, object)
    def _on_devices_detected(self, job_id: int, report) -> None:
        self._tokens.pop(job_id, None)
        self.devices_detected.emit(report)

    @Slot(int, object)
    def _on_failed(self, job_id: int, info: ErrorInfo) -> None:
        self._tokens.pop(job_id, None)
        self.failed.emit(info)

    @Slot(int)
    def _on_cancelled(self, job_id: int) -> None:
        self._tokens.pop(job_id, None)
        self.cancelled.emit(job_id)
