"""The status bar's job: what the engine is doing now, with its progress, ETA and how many jobs wait behind
it; the Stop action that interrupts them; and the notice that a stopped job left nothing half done. Every
text comes from one table keyed by the request's type."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar

from app.bridge import IO_REQUESTS, EngineClient, Job
from engine import requests as rq
from engine.catalog.layout import display_name
from engine.jobs import Progress


def _name(path: str) -> str:
    return display_name(path) if path else ""


# request type -> what the status bar calls the job; None: background work the user never waits for
LABELS: dict[type, Callable[[object], str | None]] = {
    rq.DetectDevices: lambda r: "Detecting devices",
    rq.Configure: lambda r: "Applying device options",
    rq.Scan: lambda r: "Scanning the library",
    rq.HashFiles: lambda r: "Hashing",
    rq.Load: lambda r: f"Loading {_name(r.path)}",
    rq.Unload: lambda r: f"Unloading {r.component}",
    rq.UnloadAll: lambda r: "Unloading everything",
    rq.Pin: lambda r: "Pinning",
    rq.LoraCoverage: lambda r: f"Coverage of {_name(r.lora)}",
    rq.SetLoras: lambda r: "Applying LoRAs",
    rq.Bake: lambda r: "Baking",
    rq.Decode: lambda r: "Decoding",
    rq.Encode: lambda r: "Encoding",
    rq.FindLibraries: lambda r: "Looking for model libraries",
    rq.WriteDemo: lambda r: "Writing the demo library",
    rq.EstimateDecode: lambda r: None,
}


def job_text(job: Job) -> str | None:
    label = LABELS.get(type(job.request))
    return label(job.request) if label is not None else "Working"


class JobStatus(QObject):
    """Lives in the status bar's left side; enables Stop while a job the user waits for runs."""

    notice = Signal(str, str)  # text, level: for the window's message bar

    def __init__(self, client: EngineClient, bar: QStatusBar, stop: QAction) -> None:
        super().__init__(bar)
        self.client = client
        self.stop_action = stop
        self.label = QLabel("")
        self.bar = QProgressBar()
        self.bar.setMaximumWidth(180)
        self.bar.setMaximumHeight(14)
        self.bar.hide()
        bar.addWidget(self.label)
        bar.addWidget(self.bar)
        stop.setEnabled(False)
        stop.triggered.connect(self._on_stop_triggered)
        client.job_started.connect(self._on_job_started)
        client.job_progress.connect(self._on_job_progress)
        client.finished.connect(self._on_job_ended)
        client.job_failed.connect(self._on_job_ended)
        client.job_cancelled.connect(self._on_job_cancelled)

    def _shown(self) -> list[Job]:
        return [j for j in self.client.jobs.values() if job_text(j) is not None]

    def current(self) -> Job | None:
        """The oldest unfinished job (an engine-thread job first: that is the one the user waits for)."""
        shown = self._shown()
        heavy = [j for j in shown if not isinstance(j.request, IO_REQUESTS)]
        return next(iter(heavy or shown), None)

    def show(self, job: Job, p: Progress | None) -> None:
        text = job_text(job) or ""
        if p is not None and p.total:
            frac = p.done / p.total
            elapsed = time.monotonic() - job.started
            eta = f" · {elapsed / frac - elapsed:.0f} s left" if 0.05 < frac < 1 and elapsed > 1 else ""
            count = f"{100 * frac:.0f} %" if p.total > 10_000 else f"{p.done}/{p.total}"
            text += f" · {p.stage} {count}{eta}" if p.stage not in text else f" {count}{eta}"
            self.bar.setRange(0, 1000)
            self.bar.setValue(round(1000 * frac))
        else:
            if p is not None and p.stage:
                text += f" · {p.stage}"
            self.bar.setRange(0, 0)
        queued = len(self._shown()) - 1
        if queued > 0:
            text += f" (+{queued} queued)"
        self.label.setText(text)
        self.bar.show()

    @Slot(object)
    def _on_job_started(self, job: Job) -> None:
        if job_text(job) is None:
            return
        self.stop_action.setEnabled(True)
        if self.current() is job:
            self.show(job, None)

    @Slot(object, object)
    def _on_job_progress(self, job: Job, p: Progress) -> None:
        if job_text(job) is not None:
            self.show(job, p)

    @Slot(object, object)
    def _on_job_ended(self, _job: Job, _outcome) -> None:
        self._next()

    def _next(self) -> None:
        cur = self.current()
        if cur is not None:
            self.show(cur, None)
        else:
            self.stop_action.setEnabled(False)
            self.label.setText("")
            self.bar.hide()

    @Slot(object)
    def _on_job_cancelled(self, job: Job) -> None:
        self._next()
        text = job_text(job)
        if text is not None:
            self.notice.emit(f"{text}: stopped; nothing was left half done.", "info")

    @Slot()
    def _on_stop_triggered(self) -> None:
        if self.client.cancel_all("Stopped by the user."):
            self.label.setText("Stopping\u2026")
