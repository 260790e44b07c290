"""The live memory graph (pyqtgraph): device used/total, torch allocated/reserved, this process's RAM,
loaded components as stacked areas, and event markers with labels on hover. Fed with MemorySamples
by the window's GUI-thread timer (~10/s); drawing runs on its own slower timer, only when something
changed, and never while paused, hidden (a closed or background dock tab) or minimised."""

from __future__ import annotations

import csv
import math
import time

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtGui import QColor, QHideEvent, QPalette, QShowEvent
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

from app.widgets.graph_history import GIB, LINES, SampleHistory

WINDOWS = (("30 s", 30.0), ("2 min", 120.0), ("10 min", 600.0), ("All", 0.0))
MAX_SAMPLES = 20 * 60 * 30  # 30 minutes at 20 samples/s
# Drawing is throttled to what the eye can see: samples arrive at ~10/s, but a redraw happens only when
# the view would scroll by SCROLL_STEP_PX (the 2-minute window on a 700 px plot: every ~0.5 s), and
# never more often than 4 times or less often than once a second. Each redraw costs ~5-10 ms of the
# GUI thread (pyqtgraph setData + repaint), so this keeps the graph near 1 % of one core.
REDRAW_TICK_MS = 250
MAX_REDRAW_INTERVAL_S = 1.0
SCROLL_STEP_PX = 3.0
Y_HEADROOM = 1.06  # the top of the y range over the highest value (markers sit at 1.02)
AREA_COLORS = ("#6c5ce7", "#00b894", "#fdcb6e", "#e17055", "#0984e3", "#d63031", "#a29bfe", "#55efc4")
EVENT_COLORS = {"Loaded": "#27ae60", "PartiallyOffloaded": "#e67e22", "Moved": "#2980b9", "Evicted": "#c0392b",
                "Unloaded": "#7f8c8d", "Patched": "#e84393", "Unpatched": "#b2bec3",
                "DecodeStarted": "#8e44ad", "DecodeFinished": "#8e44ad", "Cancelled": "#2d3436"}  # fmt: skip


def runs_compressed(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Drop the inner points of runs of equal values: the polyline is the same (a flat segment), but
    memory curves are mostly flat, so pyqtgraph draws tens of points instead of thousands — its area
    fills are split into a fillPath call per 50 points, which dominated the graph's paint time."""
    if len(y) <= 2:
        return x, y
    keep = np.ones(len(y), dtype=bool)
    keep[1:-1] = (y[1:-1] != y[:-2]) | (y[1:-1] != y[2:])  # NaN never equals: unknown points stay
    return x[keep], y[keep]


def _grid_pen(widget: QWidget) -> pg.QtGui.QPen:
    """An opaque grid colour, 20 % of the text colour over the background. pyqtgraph's own grid
    (alpha=0.2) draws translucent lines, which Qt's raster engine blends slowly: it was most of the
    graph's cost (≈4 ms of a 7 ms repaint at 800×330, measured with QPicture playback)."""
    pal = widget.palette()
    fg, bg = pal.color(QPalette.ColorRole.WindowText), pal.color(QPalette.ColorRole.Window)
    mix = QColor(*(round(0.8 * b + 0.2 * f) for f, b in zip(fg.getRgb()[:3], bg.getRgb()[:3], strict=True)))
    return pg.mkPen(mix)


class VramGraph(QWidget):
    exported = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.t0: float | None = None
        self.history = SampleHistory(MAX_SAMPLES)
        self.events: list[tuple[float, str, str]] = []  # (t, kind, label)
        self.device_label = "Device"
        self.paused = False
        self.follow = True
        self.window_s = 120.0
        self.draws = 0
        self._last_draw = 0.0  # time.monotonic() of the last redraw
        self._dirty = False
        self._markers_drawn = (0, 0.0)  # (events drawn, their height): redo the scatter only on change
        self._y_top = 0.0
        self._info_text = ""

        pg.setConfigOptions(antialias=False)
        self.plot = pg.PlotWidget(background=None)
        self.plot.setLabel("left", "GiB")
        # pyqtgraph rescales small ranges with an SI prefix ("GiB (x0.001)"): meaningless for binary units.
        self.plot.getAxis("left").enableAutoSIPrefix(False)
        self.plot.setLabel("bottom", "seconds")
        self.plot.showGrid(x=True, y=True, alpha=1.0)
        for side in ("left", "bottom"):
            axis = self.plot.getAxis(side)
            axis.setTickPen(_grid_pen(self))
            axis.setStyle(tickAlpha=255, maxTickLevel=1)  # opaque major and minor lines, no third level
            # Axes sit above the plot's ViewBox in pyqtgraph: an opaque grid would hide a curve lying on a
            # grid line (device total at 12 GiB). Behind the (transparent) ViewBox, the data is drawn over it.
            axis.setZValue(-200)
        self.plot.setMouseEnabled(x=True, y=True)
        # Draw only what is in view, at most a few points per pixel: the cost stays flat as history grows.
        self.plot.setClipToView(True)
        self.plot.setDownsampling(auto=True, mode="peak")
        # The y range comes from running maxima kept with the samples (see _set_ranges): pyqtgraph's
        # auto-range would scan every item's data on every redraw.
        self.plot.disableAutoRange()
        # The legend sits in a row of its own above the plot, not over it: inside the view it covered the
        # oldest samples (the top-left corner, where a load's first rise is drawn). It wraps into as many
        # rows as the plot's width needs (_fit_legend), the title's row of the PlotItem's grid.
        pal = self.palette()
        self.legend = pg.LegendItem(labelTextSize="8pt", labelTextColor=pal.text().color(), frame=False)
        self.plot.getPlotItem().layout.removeItem(self.plot.getPlotItem().titleLabel)
        self.plot.getPlotItem().titleLabel.hide()
        self.legend.setMinimumWidth(0)  # its entries' widths must not keep the dock from narrowing: it wraps
        self.plot.getPlotItem().layout.addItem(self.legend, 0, 1, alignment=Qt.AlignmentFlag.AlignLeft)
        vb = self.plot.getViewBox()
        vb.sigResized.connect(self._fit_legend)
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
        # One dotted-line item per event kind, each event a vertical segment from 0 up to its marker:
        # a handful of items however many events a session has (one InfiniteLine each cost ~0.2 ms a frame).
        self.marker_lines: dict[str, pg.PlotCurveItem] = {}
        self.redraw_timer = QTimer(self)
        self.redraw_timer.setInterval(REDRAW_TICK_MS)
        self.redraw_timer.timeout.connect(self._on_redraw_timer)

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
        self._device_is_ram = False  # set from the first sample: then torch lines leave the legend
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

    # -- what is kept (views of the history, in GiB) -----------------------------------------------------

    @property
    def t(self) -> np.ndarray:
        """Sample times in seconds since the first sample."""
        return self.history.t

    @property
    def lines(self) -> dict[str, np.ndarray]:
        return self.history.lines

    @property
    def areas(self) -> dict[str, np.ndarray]:
        return self.history.areas

    # -- data in --------------------------------------------------------------------------------------

    def add_sample(self, s) -> None:
        """Append one engine.memory.MemorySample (frozen); it is drawn at the next redraw tick."""
        if self.t0 is None:
            self.t0 = s.monotonic
            self._device_is_ram = bool(s.device_is_ram)
            if not self._device_box_touched:
                self.device_box.blockSignals(True)
                self.device_box.setChecked(not s.device_is_ram)
                self.device_box.blockSignals(False)
            self._apply_device_lines()
        self.device_label = s.device_label
        nan = np.nan
        values = {
            "used": s.device_used / GIB,
            "total": s.device_total / GIB,
            "allocated": s.torch_allocated / GIB if s.torch_allocated is not None else nan,
            "reserved": s.torch_reserved / GIB if s.torch_reserved is not None else nan,
            "ram": s.process_rss / GIB,
        }
        self.history.append(
            s.monotonic - self.t0,
            values,
            {c.identity: c.device_bytes / GIB for c in s.residency},
            {c.identity: c.name for c in s.residency},
        )
        self._dirty = True

    def add_event(self, event) -> None:
        """A residency / patch / decode event: a marker at its time with a hover label."""
        now = time.monotonic()
        if self.t0 is None:
            self.t0 = now
        # event.time is wall-clock; place it on the monotonic axis by its age.
        t = now - self.t0 - max(0.0, time.time() - event.time)
        mb = event.bytes_moved / 2**20
        name = str(event.kind)
        if getattr(event, "direction", "decode") == "encode":  # a VAE's encoder: the decode marks, named so
            name = name.replace("Decode", "Encode")
        media = getattr(event, "media", "image")
        label = f"{name} {event.component}" + (f" ({media})" if media != "image" else "")
        label += f" · {mb:,.0f} MiB" if mb >= 1 else ""
        if event.duration_s:
            label += f" · {event.duration_s * 1000:.0f} ms"
        self.events.append((t, event.kind, label))
        self._dirty = True  # drawn with the next tick: a burst of events is one redraw, not one each

    # -- drawing ---------------------------------------------------------------------------------------

    def should_draw(self) -> bool:
        """Whether drawing would be seen: not paused, shown (an open, front dock tab), not minimised."""
        win = self.window()
        return not self.paused and self.isVisible() and not (win is not None and win.isMinimized())

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.redraw_timer.start()
        if self._dirty:  # catch up at once with what arrived while hidden
            self.redraw()

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self.redraw_timer.stop()

    @Slot()
    def _on_redraw_timer(self) -> None:
        due = time.monotonic() - self._last_draw >= self.redraw_interval_s() - 0.01
        if self._dirty and due and self.should_draw():
            self.redraw()

    def redraw_interval_s(self) -> float:
        """Seconds between redraws while following: the time the view takes to scroll SCROLL_STEP_PX,
        between one tick and MAX_REDRAW_INTERVAL_S. Panned or zoomed by hand the view stands still and
        new samples land at its edge, if in view at all: the longest interval."""
        tick = REDRAW_TICK_MS / 1000
        if not self.follow:
            return MAX_REDRAW_INTERVAL_S
        span = self.window_s or (float(self.history.t[-1]) if len(self.history) else 0.0)
        width = max(1, self.plot.getViewBox().width())
        return min(MAX_REDRAW_INTERVAL_S, max(tick, span * SCROLL_STEP_PX / width))

    def redraw(self, force: bool = False) -> None:
        """Draw what is kept now, unless paused; `force` draws even while hidden (export, controls)."""
        if self.paused or not len(self.history) or not (force or self.should_draw()):
            return
        self._dirty = False
        self._last_draw = time.monotonic()
        self.draws += 1
        h = self.history
        x = h.t
        lo = 0
        if self.follow and self.window_s:
            # Following: hand pyqtgraph only the samples in view (and one before, so the lines reach the edge).
            lo = max(0, int(np.searchsorted(x, x[-1] - self.window_s * 1.02)) - 1)
        xs = x[lo:]
        # Following a window, the data handed over is already clipped, and small: pyqtgraph's own
        # clip-to-view and downsampling would only redo every curve again when the range moves.
        decimate = not (self.follow and self.window_s) or len(xs) > 4 * self.plot.getViewBox().width()
        self._draw_lines(xs, lo, decimate)
        self._draw_areas(xs, lo, decimate)
        ymax = self._ymax()
        if self.events and self._markers_drawn != (len(self.events), ymax):
            self._markers_drawn = (len(self.events), ymax)
            self._draw_events(ymax * 1.02)
        if self.follow:
            self._set_ranges(float(x[-1]), ymax)
        last = {k: float(h.line(k)[-1]) for k in ("used", "total", "ram")}
        text = (f"{self.device_label}: {last['used']:.2f} of {last['total']:.2f} GiB · "
                f"RAM {last['ram']:.2f} GiB")  # fmt: skip
        if text != self._info_text:
            self._info_text = text
            self.info.setText(text)

    def _draw_lines(self, xs: np.ndarray, lo: int, decimate: bool) -> None:
        h = self.history
        for k, c in self.curves.items():
            if not c.isVisible():  # device lines switched off: set when switched on (a forced redraw)
                continue
            c.setClipToView(decimate)
            c.setDownsampling(auto=decimate)
            y = h.line(k)[lo:]
            if k in ("allocated", "reserved") and h.line_max[k] == 0.0 and not np.isfinite(y).any():
                if c.xData is not None and len(c.xData):  # unknown here (no torch allocator): nothing to draw
                    c.setData([], [])
            elif k in ("allocated", "reserved"):
                c.setData(*runs_compressed(xs, y), connect="finite")
            else:
                c.setData(*runs_compressed(xs, y), connect="all", skipFiniteCheck=True)

    def _draw_areas(self, xs: np.ndarray, lo: int, decimate: bool) -> None:
        """Stacked bands, bottom-up in the order components first appeared; items are made once."""
        base = np.zeros(len(xs))
        for i, (key, label, col) in enumerate(self.history.bands()):
            top = base + col[lo:]
            item = self.area_items.get(key)
            if item is None:
                color = pg.mkColor(AREA_COLORS[i % len(AREA_COLORS)])
                fill = pg.mkColor(color)
                fill.setAlpha(110)
                item = self.area_items[key] = pg.PlotDataItem(
                    pen=pg.mkPen(color, width=1), brush=fill, name=label, fillLevel=0.0
                )
                item.setZValue(-10 - i)  # earlier components in front, stacked bottom-up
                self.plot.addItem(item)
                self._rebuild_legend()
            elif item.name() != label:  # a second file's component of the same name: both get its file's
                item.opts["name"] = label
                self._rebuild_legend()
            item.setClipToView(decimate)
            item.setDownsampling(auto=decimate)
            item.setData(*runs_compressed(xs, top), connect="all", skipFiniteCheck=True)
            base = top

    def _draw_events(self, y: float) -> None:
        """The hoverable markers at height `y` and, per kind, dotted lines from 0 up to them."""
        ev = self.events
        self.markers.setData([e[0] for e in ev], [y] * len(ev), data=[e[2] for e in ev],
                             brush=[pg.mkBrush(EVENT_COLORS.get(e[1], "#2d3436")) for e in ev])  # fmt: skip
        by_kind: dict[str, list[float]] = {}
        for t, kind, _ in ev:
            by_kind.setdefault(kind, []).append(t)
        for kind, ts in by_kind.items():
            item = self.marker_lines.get(kind)
            if item is None:
                pen = pg.mkPen(EVENT_COLORS.get(kind, "#2d3436"), width=1, style=Qt.PenStyle.DotLine)
                item = self.marker_lines[kind] = pg.PlotCurveItem(pen=pen)
                item.setZValue(-1)
                self.plot.addItem(item)
            xs = np.repeat(np.asarray(ts), 2)
            ys = np.tile([0.0, y], len(ts))
            item.setData(xs, ys, connect="pairs", skipFiniteCheck=True)

    def _ymax(self) -> float:
        """The highest value any shown line or the stacked bands reached in the kept history (GiB),
        rounded up to an eighth of its power of two: while memory climbs (a load) the y range, the
        left axis and the event markers change every ~12 %, not at every redraw."""
        h = self.history
        shown = ["ram", "reserved"] + (["total", "used"] if self.device_box.isChecked() else [])
        v = max(0.01, h.stack_max, *(h.line_max[k] for k in shown))
        step = 2.0 ** (math.floor(math.log2(v)) - 3)
        return math.ceil(v / step) * step

    def _set_ranges(self, right: float, ymax: float) -> None:
        left = max(0.0, right - self.window_s) if self.window_s else 0.0
        vb = self.plot.getViewBox()
        top = ymax * Y_HEADROOM
        if top != self._y_top:
            self._y_top = top
            vb.setRange(xRange=(left, max(right, left + 1)), yRange=(0.0, top), padding=0.0)
        else:
            vb.setXRange(left, max(right, left + 1), padding=0.0)
        # Apply the new range to the view transform now: left to pyqtgraph's prepare-for-paint, the
        # transform change lands during the paint and schedules a second full repaint of the plot.
        vb.updateMatrix()

    def area_top_bytes(self, label: str) -> float:
        """The newest height of `label`'s band in bytes (tests compare it with the ledger)."""
        col = self.history.areas.get(label)
        return float(col[-1]) * GIB if col is not None and len(col) else 0.0

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
        self._rebuild_legend()

    def _rebuild_legend(self) -> None:
        """List only what is drawn: hidden device lines would keep an entry with a crossed-out eye (it
        reads as a broken icon), and torch's allocated/reserved have no values when the device is the
        machine's RAM. Rebuilt whole, as pyqtgraph leaves a hole where an entry is removed."""
        self.legend.clear()
        for k, curve in self.curves.items():
            if k in ("reserved", "allocated") and self._device_is_ram:
                continue
            if curve.isVisible():
                self.legend.addItem(curve, curve.name())
        for item in self.area_items.values():
            self.legend.addItem(item, item.name())
        self._fit_legend()

    def _fit_legend(self) -> None:
        """As many entries a row as the plot's width holds (all in one row when they fit)."""
        entries = self.legend.items
        if not entries:
            self.plot.getPlotItem().layout.setRowFixedHeight(0, 0)
            return
        # the labels' natural widths, not their widths now: the layout stretches those to their column
        gap = 2 * self.legend.layout.horizontalSpacing()  # sample to label, then to the next entry
        widest = max(s.boundingRect().width() + lab.minimumWidth() for s, lab in entries) + gap
        room = self.plot.getPlotItem().vb.width() or self.plot.width()
        cols = max(1, min(len(entries), int(room // widest)))
        self.legend.columnCount = 0  # setColumnCount only lays out again on a change
        self.legend.setColumnCount(cols)
        rows = math.ceil(len(entries) / cols)
        row_h = max(max(s.boundingRect().height(), lab.boundingRect().height()) for s, lab in entries)
        self.plot.getPlotItem().layout.setRowFixedHeight(0, rows * row_h)  # the title's row: 0 until now

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
        self._y_top = 0.0  # the user may have zoomed y: set it again
        self.redraw(force=True)

    @Slot(object)
    def _on_range_changed_manually(self, *_):
        if self.follow:
            self.follow = False
            self.redraw()  # hand pyqtgraph the whole history at once, to pan and zoom through

    def _ask_export(self, fmt: str) -> None:
        path, _ = QFileDialog.getSaveFileName(self, f"Export the graph as {fmt.upper()}", f"loadout-memory.{fmt}",
                                              f"{fmt.upper()} (*.{fmt})")  # fmt: skip
        if path:
            (self.export_csv if fmt == "csv" else self.export_png)(path)

    def export_csv(self, path: str) -> None:
        """Every sample kept: time and each line and component band, in bytes."""
        h = self.history
        areas = h.areas
        cols = [np.rint(h.line(k) * GIB) for k in LINES] + [np.rint(a * GIB) for a in areas.values()]
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["t_s", "device_used", "device_total", "torch_allocated", "torch_reserved", "process_rss",
                        *areas])  # fmt: skip
            for i, t in enumerate(h.t.tolist()):
                w.writerow([f"{t:.3f}", *("" if v != v else int(v) for v in (c[i] for c in cols))])
            for t, kind, label in self.events:
                w.writerow([f"# event {t:.3f}", kind, label])
        self.exported.emit(path)

    def export_png(self, path: str) -> None:
        self.redraw(force=True)
        self.plot.grab().save(path, "PNG")
        self.exported.emit(path)
