"""The Loaded panel: the residency ledger live (device / RAM bytes, % resident, pinned, unload, free
N MB) and the layer map of the selected component. It sends its own Load / Unload / Pin requests and
shows their results; between them it follows the ledger through the client's snapshot().

"Try a step" runs N forward passes of the selected file's denoiser at a chosen size with random inputs
(the engine's Step request, as `loadout step`): s/step, peak memory and bytes streamed per step, full or
partial; the memory graph marks it (StepFinished), and Stop interrupts it between ops."""

from __future__ import annotations

import os
import time

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.widgets.layer_map import TIER_COLORS, LayerMap
from engine.catalog.layout import display_name
from engine.catalog.step_families import step_refusal
from engine.formatting import human_bytes
from engine.requests import Load, Pin, Step, Unload, UnloadAll

STEP_SIZES = (256, 512, 768, 1024)
STEP_TIP = ("Run the selected model's denoiser on random inputs at this size: seconds per step, peak memory and bytes "
            "streamed per step (Stop interrupts it)")  # fmt: skip

COLUMNS = ("Component", "File", "Device", "On device", "In RAM", "Resident", "Keep in VRAM")
REFRESH_S = 0.5  # while a job runs, the table follows the ledger at most twice a second


class LoadedPanel(QWidget):
    message = Signal(str, str)  # text, level
    patches_dropped = Signal(str)  # a base path none of whose components is loaded any more

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = None  # app.bridge.EngineClient, once attached
        self.snapshot = None
        self._dirty = False
        self._last_refresh = 0.0
        self.patched: dict[tuple[str, str], frozenset[str]] = {}
        self._filling = False
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().hide()
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.table.itemChanged.connect(self._on_item_changed)
        self.table.currentCellChanged.connect(lambda *_: self._show_layers())
        self.unload_button = QPushButton("Unload")
        self.free_spin = QSpinBox(suffix=" MB", minimum=1, maximum=1_000_000, value=256)
        self.free_button = QPushButton("Free")
        self.free_button.setToolTip("Move this many MB of the component off the device (partial offload)")
        self.unload_button.clicked.connect(self._on_unload_clicked)
        self.free_button.clicked.connect(self._on_free_clicked)
        self.empty = QLabel("Nothing loaded. Select a checkpoint or VAE in the library and press Load.")
        self.empty.setStyleSheet("color: gray")
        self.empty.setWordWrap(True)  # its own row, wrapping: the panel must fit beside the graph on a laptop
        legend = QLabel(" ".join(f"<span style='color:{c.name()}'>■</span> {t}" for t, c in TIER_COLORS.items())
                        + " <span style='color:#e84393'>□</span> patched")  # fmt: skip
        self.layer_map = LayerMap()
        self.step_button = QPushButton("Try a step")
        self.step_button.clicked.connect(self._on_step_clicked)
        self.steps_spin = QSpinBox(minimum=1, maximum=100, value=3, suffix=" steps")
        self.size_box = QComboBox()
        for px in STEP_SIZES:
            self.size_box.addItem(f"{px}×{px}", px)
        self.size_box.setCurrentIndex(STEP_SIZES.index(512))
        self.step_label = QLabel("")
        self.step_label.setWordWrap(True)
        self.step_job: int | None = None
        self.step_result = None
        self.entries: dict = {}  # path -> LibraryEntry: what detection says each file can step
        self._refusal_shown = False
        step_row = QHBoxLayout()
        step_row.addWidget(self.step_button)
        step_row.addWidget(self.steps_spin)
        step_row.addWidget(self.size_box)
        step_row.addWidget(self.step_label, 1)
        row = QHBoxLayout()
        row.addWidget(legend)
        row.addStretch(1)
        row.addWidget(self.unload_button)
        row.addWidget(self.free_spin)
        row.addWidget(self.free_button)
        top = QWidget()
        tl = QVBoxLayout(top)
        tl.setContentsMargins(0, 0, 0, 0)
        tl.addWidget(self.table)
        tl.addWidget(self.empty)
        tl.addLayout(row)
        tl.addLayout(step_row)
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(top)
        split.addWidget(self.layer_map)
        split.setSizes([150, 140])
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addWidget(split)
        self._update_buttons()

    # -- requests and results ----------------------------------------------------------------------------

    def attach(self, client) -> None:
        """Send this panel's requests through `client`; an engine event marks the table stale."""
        self.client = client
        client.event.connect(self._on_engine_event)
        client.job_cancelled.connect(self._on_job_cancelled)
        client.job_progress.connect(self._on_progress)

    # -- Try a step ---------------------------------------------------------------------------------------

    @Slot(list)
    def set_library(self, entries) -> None:
        """The library's entries: a file whose denoiser has no forward pass gets a greyed-out "Try a step"
        that says so."""
        self.entries = {os.path.abspath(e.path): e for e in entries}
        self._update_buttons()

    def _step_refusal(self) -> str | None:
        key = self.selected()
        entry = self.entries.get(os.path.abspath(key[0])) if key else None
        return step_refusal(entry.detection) if entry is not None else None

    def try_step(self, path: str | None = None) -> int | None:
        """Step the denoiser of `path` (default: the selected component's file) with the chosen steps and
        size; returns the job id."""
        key = self.selected()
        path = path or (key[0] if key else None)
        if path is None or self.client is None:
            return None
        entry = self.entries.get(os.path.abspath(path))
        refusal = step_refusal(entry.detection) if entry is not None else None
        if refusal is not None:
            self.step_label.setText(refusal)
            return None
        px = self.size_box.currentData()
        req = Step(path, size=(px, px), steps=self.steps_spin.value())
        self.step_result = None
        self.step_label.setText(f"stepping {display_name(path)} at {px}×{px}…")
        self.step_job = self.client.submit(req, self._on_stepped, self._on_step_failed,
                                           on_cancelled=self._on_step_cancelled)  # fmt: skip
        self._update_buttons()
        return self.step_job

    def _on_progress(self, job, p) -> None:
        if job.id == self.step_job and p.stage == "step" and p.total:
            self.step_label.setText(f"step {p.done}/{p.total} · {p.detail}")

    def _on_stepped(self, r) -> None:
        self.step_job = None
        self.step_result = r
        streamed = (
            f" · streamed {human_bytes(r.streamed_bytes_per_step)}/step" if r.streamed_bytes_per_step else ""
        )
        self.step_label.setText(
            f"<b>{r.s_per_step:.2f} s/step</b> {display_name(r.model)} ({r.mode}, {r.steps} steps, first "
            f"{r.first_step_s:.2f} s) · peak "
            f"{human_bytes(r.peak_device_bytes)} · resident {human_bytes(r.resident_bytes)}{streamed} on {r.device}"
        )  # fmt: skip
        if r.snapshot is not None:
            self.set_snapshot(r.snapshot)
        self._update_buttons()

    def _on_step_failed(self, info) -> None:
        self.step_job = None
        self.step_label.setText("the step failed")
        self._update_buttons()
        self.client.report_error(info)

    def _on_step_cancelled(self) -> None:
        self.step_job = None
        self.step_label.setText("stopped")
        self.refresh()
        self._update_buttons()

    @Slot()
    def _on_step_clicked(self) -> None:
        self.try_step()

    def load(self, path: str) -> None:
        self.client.submit(Load(path), self._on_loaded)

    def unload(self, path: str, name: str, nbytes: int | None = None) -> None:
        self.client.submit(Unload(path, name, nbytes), self._on_unloaded)

    def unload_all(self) -> None:
        self.client.submit(UnloadAll(), self._on_unloaded_all)

    def unload_selected(self) -> bool:
        key = self.selected()
        if key is not None:
            self.unload(*key)
        return key is not None

    def _on_loaded(self, result) -> None:
        self.set_snapshot(result.snapshot)
        self.message.emit(f"{result.message}: {human_bytes(result.bytes)} placed on the device.", "info")

    def _on_unloaded(self, result) -> None:
        self.set_snapshot(result.snapshot)
        self.message.emit(f"{result.message}: {human_bytes(result.bytes)} released.", "info")
        self.forget_patches()

    def _on_unloaded_all(self, result) -> None:
        self.set_snapshot(result.snapshot)
        self.forget_patches()

    @Slot(object)
    def on_configured(self, result) -> None:
        """New device options were applied: the ledger after them (maybe emptied, maybe offloaded)."""
        self.set_snapshot(result.snapshot)
        self.forget_patches()

    def forget_patches(self) -> None:
        """Drop the patch marks of bases that are no longer loaded (patches_dropped tells the stack)."""
        snap = self.client.snapshot()
        loaded = {c.path for c in snap.components} if snap else set()
        for base in {k[0] for k in self.patched}:
            if base not in loaded:
                self.set_patched(base, {})
                self.patches_dropped.emit(base)

    def refresh(self) -> None:
        snap = self.client.snapshot()
        if snap is not None and snap is not self.snapshot:
            self.set_snapshot(snap)

    @Slot(object)
    def on_sample(self, _sample) -> None:
        """The sampler's tick: follow the ledger after an event, and while a job runs."""
        now = time.monotonic()
        if self._dirty or (self.client.busy and now - self._last_refresh >= REFRESH_S):
            self._dirty = False
            self._last_refresh = now
            self.refresh()

    @Slot(object)
    def _on_engine_event(self, _event) -> None:
        self._dirty = True

    @Slot(object)
    def _on_job_cancelled(self, _job) -> None:
        self.refresh()

    # -- contents ----------------------------------------------------------------------------------------

    def set_snapshot(self, snap) -> None:
        """Show a LedgerSnapshot (frozen), keeping the selected row."""
        keep = self.selected()
        self.snapshot = snap
        comps = list(snap.components) if snap is not None else []
        self._filling = True
        self.table.setRowCount(len(comps))
        for r, c in enumerate(comps):
            vals = (c.name, display_name(c.path), c.device, human_bytes(c.device_bytes),
                    human_bytes(c.ram_bytes), f"{100 * c.resident:.0f} %")  # fmt: skip
            for col, v in enumerate(vals):
                it = QTableWidgetItem(v)
                it.setData(Qt.ItemDataRole.UserRole, (c.path, c.name))
                if col in (3, 4, 5):
                    it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if col == 5 and c.resident < 0.999:
                    it.setForeground(QColor("#d35400"))
                self.table.setItem(r, col, it)
            pin = QTableWidgetItem("pinned" if c.pinned else "")
            pin.setFlags(
                Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable
            )
            pin.setCheckState(Qt.CheckState.Checked if c.pinned else Qt.CheckState.Unchecked)
            pin.setData(Qt.ItemDataRole.UserRole, (c.path, c.name))
            self.table.setItem(r, 6, pin)
        self._filling = False
        if keep is not None:
            self.select(*keep)
        elif comps and self.table.currentRow() < 0:
            self.table.selectRow(0)
        self._show_layers()
        self._update_buttons()

    def set_patched(self, base: str, units: dict) -> None:
        for k in [k for k in self.patched if k[0] == base]:
            del self.patched[k]
        for comp, paths in units.items():
            self.patched[(base, comp)] = frozenset(paths)
        self._show_layers()

    def selected(self) -> tuple[str, str] | None:
        it = self.table.item(self.table.currentRow(), 0) if self.table.currentRow() >= 0 else None
        return it.data(Qt.ItemDataRole.UserRole) if it else None

    def select(self, path: str, name: str) -> bool:
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.ItemDataRole.UserRole) == (path, name):
                self.table.selectRow(r)
                return True
        return False

    def row_texts(self) -> list[list[str]]:
        return [[self.table.item(r, c).text() for c in range(6)] for r in range(self.table.rowCount())]

    def _state(self, key):
        if self.snapshot is None or key is None:
            return None
        return next((c for c in self.snapshot.components if (c.path, c.name) == tuple(key)), None)

    def _show_layers(self) -> None:
        c = self._state(self.selected())
        if c is None:
            self.layer_map.set_layers("", ())
        else:
            self.layer_map.set_layers(f"{c.name} ({display_name(c.path)})", c.layers,
                                      self.patched.get((c.path, c.name), frozenset()))  # fmt: skip
        self._update_buttons()

    def _update_buttons(self) -> None:
        has = self.selected() is not None
        for w in (self.unload_button, self.free_button, self.free_spin):
            w.setEnabled(has)
        refusal = self._step_refusal()
        self.step_button.setEnabled(has and self.step_job is None and refusal is None)
        self.step_button.setToolTip(refusal or STEP_TIP)
        if self.step_job is None and (refusal is not None or self._refusal_shown):
            self.step_label.setText(
                refusal or ""
            )  # beside the greyed-out button: why (cleared on another row)
            self._refusal_shown = refusal is not None
        n = self.table.rowCount()
        self.empty.setText(f"{n} component{'s' if n != 1 else ''} loaded" if n else
                           "Nothing loaded. Select a checkpoint or VAE in the library and press Load.")  # fmt: skip

    @Slot()
    def _on_unload_clicked(self) -> None:
        self.unload_selected()

    @Slot()
    def _on_free_clicked(self) -> None:
        key = self.selected()
        if key:
            self.unload(key[0], key[1], self.free_spin.value() * 1024 * 1024)

    @Slot(QTableWidgetItem)
    def _on_item_changed(self, it: QTableWidgetItem) -> None:
        if self._filling or it.column() != 6:
            return
        path, name = it.data(Qt.ItemDataRole.UserRole)
        self.client.submit(Pin(path, name, it.checkState() == Qt.CheckState.Checked), self._on_pinned)

    def _on_pinned(self, result) -> None:
        self.set_snapshot(result.snapshot)
