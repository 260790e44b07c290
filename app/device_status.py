"""The status bar's right side: the device detected, its VRAM state, and free memory with the weight
budget. It owns the device options: detection at start and Configure when Settings change them. And the
sampler behind it and the graph: a GUI-thread QTimer calling the engine's thread-safe memory.sample()
(a timer in the busy engine thread could not fire during a long job)."""

from __future__ import annotations

import gc
import logging
import time

from PySide6.QtCore import QObject, QTimer, Signal, Slot
from PySide6.QtWidgets import QLabel, QStatusBar

from app.bridge import EngineClient
from app.excepthooks import CrashReporter, ErrorInfo
from engine import memory
from engine.formatting import human_bytes
from engine.requests import Configure

log = logging.getLogger("loadout.app")
STATUS_INTERVAL_S = 0.5  # the status bar's memory text changes at most twice a second

_frozen = False


def _freeze_startup_objects() -> None:
    """Once torch is imported (first device detection), move the ~200k objects of startup out of the
    collector's reach: a full collection (Python's own, or one the engine asks for) then scans only
    what came after — a few ms instead of ~0.2 s with the GIL held, while the window cannot paint or
    react. Once per process: later objects stay collectable (cyclic garbage of frozen ones would not)."""
    global _frozen
    if not _frozen:
        _frozen = True
        gc.freeze()


class DeviceStatus(QObject):
    """Detects devices through the engine thread, applies new options, shows the report, samples."""

    sampled = Signal(object)  # engine.memory.Sample, every tick of the sampler
    configured = Signal(object)  # engine.requests.Configured, once its report is shown
    notice = Signal(str, str)  # text, level: for the window's message bar

    def __init__(
        self, client: EngineClient, bar: QStatusBar, reporter: CrashReporter, options, rate_hz: float
    ) -> None:
        super().__init__(bar)
        self.client = client
        self.reporter = reporter
        self.options = options  # engine.devices.DeviceOptions the engine runs with
        self.report = None  # engine.devices.DeviceReport once detected
        self.device_label = QLabel("Detecting devices\u2026")
        self.state_label = QLabel("")
        self.memory_label = QLabel("")
        for w in (self.device_label, self.state_label, self.memory_label):
            w.setContentsMargins(8, 0, 8, 0)
            bar.addPermanentWidget(w)
        self.timer = QTimer(self)
        self.set_rate(rate_hz)
        self.timer.timeout.connect(self._on_sample)
        self._last_status = 0.0
        client.devices_detected.connect(self.show_report)

    def set_rate(self, hz: float) -> None:
        self.timer.setInterval(round(1000 / hz))

    def start(self) -> None:
        """Sample now and from now on; detect devices (torch is imported there)."""
        self._on_sample()
        self.timer.start()
        self.client.detect_devices(self.options, self._on_detection_failed)

    def configure(self, options) -> bool:
        """Apply device options now: the engine re-detects and rebuilds its budget (engine.facade's
        configure). False when they are the options already in use."""
        if options == self.options:
            return False
        self.options = options
        self.client.submit(Configure(options), self._on_configured)
        return True

    def _on_configured(self, result) -> None:
        self.show_report(result.report)
        self.configured.emit(result)
        text = "Device options applied"
        if result.unloaded:
            text += f"; unloaded {', '.join(result.unloaded)}"
        if result.evicted_bytes:
            text += f"; {human_bytes(result.evicted_bytes)} offloaded to fit the new budget"
        self.notice.emit(text + ".", "info")

    def stop(self) -> None:
        self.timer.stop()

    @Slot(object)
    def show_report(self, report) -> None:
        self.report = report
        _freeze_startup_objects()
        d = report.selected
        log.info("device %s (%s), VRAM state %s", d.torch_device, d.name, report.vram_state.value)
        self.device_label.setText(
            f"Device: {d.name} ({d.torch_device})" if d.kind != "cpu" else f"Device: CPU ({d.name})"
        )
        self.device_label.setToolTip("\n".join(f"{x.torch_device}: {x.name}" for x in report.devices))
        cap = report.vram_budget_bytes
        self.state_label.setText(
            f"VRAM state: {report.vram_state.value}"
            + (f" · cap {human_bytes(cap)}" if cap is not None else "")
        )
        self.state_label.setToolTip(
            f"CPU state {report.cpu_state.value}. Reserved {human_bytes(report.reserve_bytes)}, minimum "
            f"inference memory {human_bytes(report.min_inference_bytes)}; VAE on {report.vae_device}"
        )
        self._last_status = 0.0
        self._on_sample()

    def _on_detection_failed(self, info: ErrorInfo) -> None:
        self.device_label.setText("Device detection failed")
        self.reporter.report.emit(info)  # nothing works without a device: a dialog, even when expected

    @Slot()
    def _on_sample(self) -> None:
        s = memory.sample()
        self.sampled.emit(s)
        now = time.monotonic()
        if now - self._last_status < STATUS_INTERVAL_S:
            return
        self._last_status = now
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
