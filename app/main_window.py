"""The main window, first version: an honest empty state in the middle and a status bar with the
device, the VRAM state and free memory, sampled live by a timer in the GUI thread."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QIcon, QPixmap
from PySide6.QtWidgets import QFrame, QLabel, QMainWindow, QVBoxLayout, QWidget

from app.bridge import EngineClient
from app.excepthooks import CrashReporter, ErrorInfo
from engine import memory
from engine.cli._common import human_bytes
from engine.devices import DeviceOptions
from engine.jobs import Progress

log = logging.getLogger("loadout.app")
# Icons live in the repository's top-level resources/ (a PyInstaller build puts them beside the code).
RESOURCES = Path(getattr(sys, "_MEIPASS", Path(__file__).resolve().parents[1])) / "resources"
SAMPLE_INTERVAL_MS = 500


def app_icon() -> QIcon:
    icon = QIcon()
    for n in (16, 24, 32, 48, 64, 128, 256):
        p = RESOURCES / f"loadout-{n}.png"
        if p.exists():
            icon.addFile(str(p))
    return icon


class WelcomeView(QWidget):
    """The central area until the library exists: says what to do, lists paths given so far."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.addStretch(2)
        logo = QLabel(alignment=Qt.AlignmentFlag.AlignCenter)
        logo.setPixmap(QPixmap(str(RESOURCES / "loadout-128.png")))
        title = QLabel("<h1>Loadout</h1>", alignment=Qt.AlignmentFlag.AlignCenter)
        tagline = QLabel(
            "Know what a model file is, what it will cost, and what is loaded where.",
            alignment=Qt.AlignmentFlag.AlignCenter,
        )
        tagline.setStyleSheet("color: palette(placeholder-text);")
        self.hint = QLabel("No library yet \u2014 drop model files or folders here", objectName="hint")
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setFrameShape(QFrame.Shape.StyledPanel)
        self.hint.setMinimumHeight(90)
        self.hint.setStyleSheet("QLabel#hint { border: 2px dashed palette(mid); border-radius: 10px; padding: 16px;"
                                " font-size: 15px; }")  # fmt: skip
        self.pending = QLabel(alignment=Qt.AlignmentFlag.AlignCenter)
        self.pending.setWordWrap(True)
        for w in (logo, title, tagline):
            layout.addWidget(w)
        layout.addSpacing(24)
        row = QVBoxLayout()
        row.setContentsMargins(120, 0, 120, 0)
        row.addWidget(self.hint)
        row.addWidget(self.pending)
        layout.addLayout(row)
        layout.addStretch(3)

    def show_paths(self, paths: list[str]) -> None:
        if not paths:
            self.pending.clear()
            return
        names = ", ".join(os.path.basename(p.rstrip("/\\")) or p for p in paths[:5])
        more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
        self.pending.setText(
            f"{len(paths)} path{'s' if len(paths) != 1 else ''} kept for the library: {names}{more}. "
            "(Scanning arrives with the library panel.)"
        )


class MainWindow(QMainWindow):
    def __init__(
        self,
        options: DeviceOptions | None = None,
        paths: list[str] | None = None,
        client: EngineClient | None = None,
    ) -> None:
        super().__init__()
        self.setWindowTitle("Loadout")
        self.setWindowIcon(app_icon())
        self.resize(1100, 720)
        self.setAcceptDrops(True)
        self.options = options or DeviceOptions()
        self.paths: list[str] = []  # files/folders for the library (a later issue scans them)
        self.report = None  # engine.devices.DeviceReport once detected
        self.reporter = CrashReporter(self)
        self.client = client or EngineClient(self)
        self.client.devices_detected.connect(self._on_devices_detected)
        self.client.progress.connect(self._on_progress)
        self.client.failed.connect(self._on_failed)

        self.welcome = WelcomeView(self)
        self.setCentralWidget(self.welcome)
        self.device_label = QLabel("Detecting devices\u2026")
        self.state_label = QLabel("")
        self.memory_label = QLabel("")
        bar = self.statusBar()
        for w in (self.device_label, self.state_label, self.memory_label):
            w.setContentsMargins(8, 0, 8, 0)
            bar.addPermanentWidget(w)
        self.add_paths(paths or [])

        self.sample_timer = QTimer(self)
        self.sample_timer.setInterval(SAMPLE_INTERVAL_MS)
        self.sample_timer.timeout.connect(self._on_sample)

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Begin sampling and ask the engine thread for the devices (it imports torch there)."""
        self._on_sample()
        self.sample_timer.start()
        self.client.detect_devices(self.options)

    def closeEvent(self, event: QCloseEvent) -> None:
        self.sample_timer.stop()
        self.client.shutdown()
        super().closeEvent(event)

    def add_paths(self, paths: list[str]) -> None:
        for p in paths:
            p = os.path.abspath(p)
            if p not in self.paths:
                self.paths.append(p)
        self.welcome.show_paths(self.paths)

    # -- drag and drop: keep the paths for the library ----------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if any(u.isLocalFile() for u in event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        self.add_paths([u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()])
        event.acceptProposedAction()

    # -- engine and sampler --------------------------------------------------------------------------

    @Slot(object)
    def _on_devices_detected(self, report) -> None:
        self.report = report
        d = report.selected
        log.info("device %s (%s), VRAM state %s", d.torch_device, d.name, report.vram_state.value)
        self.device_label.setText(
            f"Device: {d.name} ({d.torch_device})" if d.kind != "cpu" else f"Device: CPU ({d.name})"
        )
        self.device_label.setToolTip("\n".join(f"{x.torch_device}: {x.name}" for x in report.devices))
        self.state_label.setText(f"VRAM state: {report.vram_state.value}")
        self.state_label.setToolTip(
            f"CPU state {report.cpu_state.value}. Reserved {human_bytes(report.reserve_bytes)}, minimum "
            f"inference memory {human_bytes(report.min_inference_bytes)}; VAE on {report.vae_device}"
        )
        self.statusBar().showMessage("Ready", 3000)
        self._on_sample()

    @Slot(object)
    def _on_progress(self, p: Progress) -> None:
        self.statusBar().showMessage(f"{p.stage}\u2026")

    @Slot(object)
    def _on_failed(self, info: ErrorInfo) -> None:
        self.device_label.setText("Device detection failed")
        self.statusBar().clearMessage()
        self.reporter.report.emit(info)

    @Slot()
    def _on_sample(self) -> None:
        s = memory.sample()
        what = "RAM" if s.device_is_ram else "VRAM"
        text = f"{what} free {human_bytes(s.device_free)} of {human_bytes(s.device_total)}"
        if self.report is not None:
            budget = self.report.budget_bytes(s.device_free)
            text += f" \u00b7 weight budget {human_bytes(budget)}"
        self.memory_label.setText(text)
        tip = [f"{s.device_label}: {human_bytes(s.device_used)} used ({s.device_source})",
               f"Process RSS {human_bytes(s.process_rss)}",
               f"System RAM {human_bytes(s.ram_available)} available of {human_bytes(s.ram_total)}"]  # fmt: skip
        if s.torch_allocated is not None:
            tip.append(
                f"torch allocated {human_bytes(s.torch_allocated)}, reserved {human_bytes(s.torch_reserved)}"
            )
        self.memory_label.setToolTip("\n".join(tip))
