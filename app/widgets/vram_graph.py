"""The live memory graph (pyqtgraph): device used/total, torch allocated/reserved, this process's RAM,
loaded components as stacked areas, and event markers with labels on hover. Fed with MemorySamples
by the window's GUI-thread timer; redraws are throttled and skipped while paused or hidden."""

from __future__ import annotations

import csv
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

GIB = 1024**3
WINDOWS = (("30 s", 30.0), ("2 min", 120.0), ("10 min", 600.0), ("All", 0.0))
MAX_SAMPLES = 20 * 60 * 30  # 30 minutes at 20 samples/s
REDRAW_MIN_S = 0.25  # at most 4 redraws a second: samples still arrive at ~10/s
AREA_COLORS = ("#6c5ce7", "#00b894", "#fdcb6e", "#e17055", "#0984e3", "#d63031", "#a29bfe", "#55efc4")
EVENT_COLORS = {"Loaded": "#27ae60", "PartiallyOffloaded": "#e67e22", "Moved": "#2980b9", "Evicted": "#c0392b",
                "Unloaded": "#7f8c8d", "Patched": "#e84393", "Unpatched": "#b2bec3",
                "DecodeStarted": "#8e44ad", "DecodeFinished": "#8e44ad", "Cancelled": "#2d3436"}  # fmt: skip


class VramGraph(QWidget):
    exported = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.t0: float | None = None
        self.t: list[float] = []
        self.lines: dict[str, list[float]] = {
            k: [] for k in ("used", "total", "allocated", "reserved", "ram")
        }
        self.areas: dict[str, list[float]] = {}  # component label -> device bytes per sample (0 when absent)
        self.events: list[tuple[float, str, str]] = []  # (t, kind, label)
        self.device_label = "Device"
        self.paused = False
        self.follow = True
        self.window_s = 120.0
        self._last_draw = 0.0
        self.draws = 0

        pg.setConfigOptions(antialias=False)
        self.plot = pg.PlotWidget(background=None)
        self.plot.setLabel("left", "GiB")
        # pyqtgraph rescales small ranges with an SI prefix ("GiB (x0.001)"): meaningless for binary units.
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.setLabel("bottom", "seconds")
        self.plot.showGrid(x=True, y=True, alpha=0.2)
        self.plot.setMouseEnabled(x=True, y=True)
        # Draw only what is in view, at most a few points per pixel: the cost stays flat as history grows.
        self.plot.setClipToView(True)
        self.plot.setDownsampling(auto=True, mode="peak")
        self.legend = self.plot.addLegend(offset=(8, 8), labelTextSize="8pt")
        vb = self.plot.getViewBox()
        vb.sigRangeChangedManually.connect(self._on_range_changed_manually)
        self.curves = {
            "total": self.plot.plot(pen=pg.mkPen("#7f8c8d", width=1, style=Qt.PenStyle.DashLine), name="device total"),
            "used": self.plot.plot(pen=pg.mkPen("#2e86de", width=2), name="device used"),
            "reserved": self.plot.plot(pen=pg.mkPen("#8e44ad", width=1), name="torch reserved"),
            "allocated": self.plot.plot(pen=pg.mkPen("#c0392b", width=1), name="torch allocated"),
            "ram": self.plot.plot(pen=pg.mkPen("#f39c12", width=2), name="process RAM"),
        }  # fmt: skip
        self.area_items: dict[str, pg.PlotDataItem] = {}
        self.markers = pg.ScatterPlotItem(size=9, hoverable=True, tip=self._tip, hoverSize=13)
        self.plot.addItem(self.markers)
        self.marker_lines: list[pg.InfiniteLine] = []

        self.window_box = QComboBox()
        for label, s in WINDOWS:
            self.window_box.addItem(label, s)
        self.window_box.setCurrentIndex(1)
        self.window_box.currentIndexChanged.connect(self._on_window_changed)
        self.pause_box = QCheckBox("Pause")
        self.pause_box.toggled.connect(self._on_pause_toggled)
        self.device_box = QCheckBox("Device lines")
        self.device_box.setToolTip("Show the device's used and total memory (off by default when the device is the "
                                   "machine's RAM, whose use is mostly other programs)")  # fmt: skip
        self.device_box.setChecked(True)
        self._device_box_touched = False
        self.device_box.toggled.connect(self._on_device_lines_toggled)
        self.follow_button = QPushButton("Follow")
        self.follow_button.setToolTip("Scroll with the newest samples again after panning or zooming")
        self.follow_button.clicked.connect(self._on_follow_clicked)
        export = QToolButton(text="Export")
        export.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        menu = QMenu(export)
        menu.addAction("Samples as CSV…", lambda: self._ask_export("csv"))
        menu.addAction("Graph as PNG…", lambda: self._ask_export("png"))
        export.setMenu(menu)
        self.info = QLabel("")
        self.info.setStyleSheet("color: gray")
        bar = QHBoxLayout()
        self.window_box.setToolTip("How many seconds the graph shows")
        bar.addWidget(self.window_box)
        bar.addWidget(self.pause_box)
        bar.addWidget(self.device_box)
        bar.addWidget(self.follow_button)
        bar.addStretch(1)
        bar.addWidget(export)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(bar)
        self.info.setWordWrap(True)  # a line of its own: in the bar it set the dock's minimum width
        lay.addWidget(self.info)
        lay.addWidget(self.plot, 1)

    # -- data in --------------------------------------------------------------------------------------

    def add_sample(self, s) -> None:
        """Append one engine.memory.MemorySample (frozen) and redraw if due."""
        if self.t0 is None:
            self.t0 = s.monotonic
        self.device_label = s.device_label
        if self.t0 == s.monotonic and not self._device_box_touched:
            self.device_box.blockSignals(True)
            self.device_box.setChecked(not s.device_is_ram)
            self.device_box.blockSignals(False)
            self._apply_device_lines()
        self.t.append(s.monotonic - self.t0)
        L = self.lines
        L["used"].append(s.device_used / GIB)
        L["total"].append(s.device_total / GIB)
        L["allocated"].append((s.torch_allocated or 0) / GIB if s.torch_allocated is not None else np.nan)
        L["reserved"].append((s.torch_reserved or 0) / GIB if s.torch_reserved is not None else np.nan)
        L["ram"].append(s.process_rss / GIB)
        n = len(self.t)
        present = {c.name: c.device_bytes / GIB for c in s.residency}
        for label in present:
            if label not in self.areas:
                self.areas[label] = [0.0] * (n - 1)
        for label, col in self.areas.items():
            col.append(present.get(label, 0.0))
        if n > MAX_SAMPLES:
            cut = n - MAX_SAMPLES
            del self.t[:cut]
            for col in (*L.values(), *self.areas.values()):
                del col[:cut]
        self.redraw()

    def add_event(self, event) -> None:
        """A residency / patch / decode event: a marker at its time with a hover label."""
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        # event.time is wall-clock; place it on the monotonic axis by its age.
        t = now - self.t0 - max(0.0, time.time() - event.time)
        mb = event.bytes_moved / 2**20
        label = f"{event.kind} {event.component}" + (f" · {mb:,.0f} MiB" if mb >= 1 else "")
        if event.duration_s:
            label += f" · {event.duration_s * 1000:.0f} ms"
        self.events.append((t, event.kind, label))
        color = EVENT_COLORS.get(event.kind, "#2d3436")
        line = pg.InfiniteLine(pos=t, angle=90, pen=pg.mkPen(color, width=1, style=Qt.PenStyle.DotLine))
        self.plot.addItem(line)
        self.marker_lines.append(line)
        self.redraw(force=True)

    # -- drawing ---------------------------------------------------------------------------------------

    def redraw(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.paused or not self.t or (not force and now - self._last_draw < REDRAW_MIN_S):
            return
        if not self.isVisible() and not force:
            return
        self._last_draw = now
        self.draws += 1
        x = np.asarray(self.t)
        for k, c in self.curves.items():
            y = np.asarray(self.lines[k], dtype=float)
            c.setData(x, y, connect="finite")
        base = np.zeros_like(x)
        for i, (label, col) in enumerate(self.areas.items()):
            top = base + np.asarray(col)
            item = self.area_items.get(label)
            if item is None:
                color = pg.mkColor(AREA_COLORS[i % len(AREA_COLORS)])
                fill = pg.mkColor(color)
                fill.setAlpha(110)
                item = self.area_items[label] = pg.PlotDataItem(
                    pen=pg.mkPen(color, width=1), brush=fill, name=label
                )
                self.plot.addItem(item)
            item.setData(x, top)
            item.setFillLevel(0.0)
            item.setZValue(-10 - i)  # earlier components in front, stacked bottom-up
            base = top
        if self.events:
            shown = ["ram", "reserved"] + (["total", "used"] if self.device_box.isChecked() else [])
            vals = np.concatenate([np.asarray(self.lines[k], dtype=float) for k in shown] + [base])
            vals = vals[np.isfinite(vals)]
            ymax = max(float(vals.max()) if len(vals) else 0.0, 0.01)
            self.markers.setData(
                [e[0] for e in self.events], [ymax * 1.02] * len(self.events),
                brush=[pg.mkBrush(EVENT_COLORS.get(e[1], "#2d3436")) for e in self.events],
                data=[e[2] for e in self.events],
            )  # fmt: skip
        if self.follow:
            right = x[-1]
            left = max(0.0, right - self.window_s) if self.window_s else 0.0
            self.plot.setXRange(left, max(right, left + 1), padding=0.01)
            self.plot.enableAutoRange(axis="y")
        last = self.lines
        self.info.setText(f"{self.device_label}: {last['used'][-1]:.2f} of {last['total'][-1]:.2f} GiB · "
                          f"RAM {last['ram'][-1]:.2f} GiB")  # fmt: skip

    def area_top_bytes(self, label: str) -> float:
        """The newest height of `label`'s band in bytes (tests compare it with the ledger)."""
        col = self.areas.get(label)
        return col[-1] * GIB if col else 0.0

    @staticmethod
    def _tip(x, y, data) -> str:
        return f"{data}\nat {x:.1f} s"

    # -- controls ----------------------------------------------------------------------------------------

    @Slot(int)
    def _on_window_changed(self, _i: int) -> None:
        self.window_s = float(self.window_box.currentData())
        self.follow = True
        self.redraw(force=True)

    def _apply_device_lines(self) -> None:
        on = self.device_box.isChecked()
        for k in ("used", "total"):
            self.curves[k].setVisible(on)

    @Slot(bool)
    def _on_device_lines_toggled(self, _on: bool) -> None:
        self._device_box_touched = True
        self._apply_device_lines()
        self.redraw(force=True)

    @Slot(bool)
    def _on_pause_toggled(self, on: bool) -> None:
        self.paused = on
        if not on:
            self.redraw(force=True)

    @Slot()
    def _on_follow_clicked(self) -> None:
        self.follow = True
        self.redraw(force=True)

    @Slot(object)
    def _on_range_changed_manually(self, *_):
        self.follow = False

    def _ask_export(self, fmt: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export the graph as {fmt.upper()}", f"loadout-memory.{fmt}",
                                              f"{fmt.upper()} (*.{fmt})")  # fmt: skip
        if path:
            (self.export_csv if fmt == "csv" else self.export_png)(path)

    def export_csv(self, path: str) -> None:
        """Every sample kept: time and each line and component band, in bytes."""
        comps = list(self.areas)
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "device_used", "device_total", "torch_allocated", "torch_reserved", "process_rss",
                        *comps])  # fmt: skip
            for i, t in enumerate(self.t):
                row = [f"{t:.3f}"]
                for k in ("used", "total", "allocated", "reserved", "ram"):
                    v = self.lines[k][i]
                    row.append("" if v != v else int(round(v * GIB)))
                row += [int(round(self.areas[c][i] * GIB)) for c in comps]
                w.writerow(row)
            for t, kind, label in self.events:
                w.writerow([f"# event {t:.3f}", kind, label])
        self.exported.emit(path)

    def export_png(self, path: str) -> None:
        self.redraw(force=True)
        self.plot.grab().save(path, "PNG")
        self.exported.emit(path)
