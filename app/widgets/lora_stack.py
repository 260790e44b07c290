"""The LoRA stack editor: add by drop or from the library, reorder by drag, enable, strengths for the
model and the text encoder (slider + spin box), the coverage badge with the unmatched list on click,
apply / revert, bake to a new file. It sends its own coverage, apply and bake requests through the
engine client and shows their results; the window only hears what other panels need (patches, a bake)."""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

from PySide6.QtCore import QSize, Qt, Signal, Slot
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMessageBox,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from app.widgets.elided_check_box import ElidedCheckBox
from engine.catalog.layout import display_name
from engine.formatting import human_bytes
from engine.requests import Bake, LoraCoverage, SetLoras, StackItem

ROLE = Qt.ItemDataRole.UserRole


class Strength(QWidget):
    """A slider (−2..2 in 0.05 steps) bound to a spin box."""

    changed = Signal(float)

    def __init__(self, label: str, value: float, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.slider = QSlider(Qt.Orientation.Horizontal, minimum=-40, maximum=40)
        self.slider.setMinimumWidth(70)
        self.spin = QDoubleSpinBox(minimum=-10.0, maximum=10.0, singleStep=0.05, decimals=2)
        self.spin.setValue(value)
        self.slider.setValue(round(value * 20))
        self.slider.valueChanged.connect(lambda v: self.spin.setValue(v / 20))
        self.spin.valueChanged.connect(self._on_spin_changed)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(QLabel(label))
        lay.addWidget(self.slider, 1)
        lay.addWidget(self.spin)

    @Slot(float)
    def _on_spin_changed(self, v: float) -> None:
        self.slider.blockSignals(True)
        self.slider.setValue(round(max(-2.0, min(2.0, v)) * 20))
        self.slider.blockSignals(False)
        self.changed.emit(v)


class StackRow(QWidget):
    changed = Signal()
    coverage_clicked = Signal()

    def __init__(self, item: StackItem, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.item = item
        name = display_name(item.file)
        self.enabled = ElidedCheckBox(name.removesuffix(".safetensors"))  # the file kind goes without saying
        self.enabled.setChecked(item.enabled)
        self.enabled.setToolTip(item.file)
        self.model = Strength("model", item.strength_model)
        self.clip = Strength("clip", item.strength_clip)
        self.badge = QPushButton("coverage …")
        self.badge.setFlat(True)
        self.badge.setToolTip("Adapter modules that land on the base (click for the unmatched list)")
        self.badge.clicked.connect(self.coverage_clicked)
        for w in (self.enabled,):
            w.toggled.connect(self._on_edit)
        self.model.changed.connect(self._on_edit)
        self.clip.changed.connect(self._on_edit)
        top = QHBoxLayout()
        top.addWidget(self.enabled, 1)
        top.addWidget(self.badge)
        bottom = QHBoxLayout()
        bottom.addWidget(self.model)
        bottom.addWidget(self.clip)
        # The engine's sentence when the LoRA does not fit the base (engine.lora.coverage.fit_warning).
        self.warning = QLabel("")
        self.warning.setWordWrap(True)
        self.warning.setStyleSheet("color: #c0392b")
        self.warning.hide()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 2, 4, 2)
        lay.setSpacing(0)
        lay.addLayout(top)
        lay.addLayout(bottom)
        lay.addWidget(self.warning)

    def current(self) -> StackItem:
        return replace(self.item, enabled=self.enabled.isChecked(), strength_model=self.model.spin.value(),
                       strength_clip=self.clip.spin.value())  # fmt: skip

    @Slot()
    def _on_edit(self, *_):
        self.item = self.current()
        self.changed.emit()

    def set_coverage(self, cov: dict | None, error: str | None = None) -> None:
        if error:
            self.badge.setText("coverage ✗")
            self.badge.setStyleSheet("color: #c0392b")
            self.badge.setToolTip(error)
            return
        warning = cov.get("warning")
        self.warning.setText(f"⚠ {warning}" if warning else "")
        self.warning.setVisible(bool(warning))
        m, n = cov.get("mapped", 0), cov.get("modules", 0)
        self.badge.setText(f"{m}/{n} modules")  # the units of the coverage JSON and of the total below
        self.badge.setStyleSheet(
            "color: #27ae60; font-weight: bold" if m == n and n else "color: #d35400; font-weight: bold"
        )


class StackList(QListWidget):
    """Internal drag reorders; files dropped from outside are handed to the panel."""

    files_dropped = Signal(list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setDragDropMode(QAbstractItemView.DragDropMode.InternalMove)
        self.setDefaultDropAction(Qt.DropAction.MoveAction)
        self.setAcceptDrops(True)
        self.setSpacing(1)

    def dragEnterEvent(self, e: QDragEnterEvent) -> None:
        if e.mimeData().hasUrls():
            e.acceptProposedAction()
        else:
            super().dragEnterEvent(e)

    def dragMoveEvent(self, e) -> None:
        if e.mimeData().hasUrls():
            e.acceptProposedAction()
        else:
            super().dragMoveEvent(e)

    def dropEvent(self, e: QDropEvent) -> None:
        if e.mimeData().hasUrls():
            self.files_dropped.emit([u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()])
            e.acceptProposedAction()
            return
        super().dropEvent(e)


class LoraStackPanel(QWidget):
    message = Signal(str, str)  # text, level
    files_to_scan = Signal(list)  # dropped files the library does not know yet
    patches_changed = Signal(str, object)  # base, {component: module paths patched} (for the layer map)
    baked = Signal(str)  # the new checkpoint (it joins the library)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = None  # app.bridge.EngineClient, once attached
        self.coverages: dict[tuple[str, str], dict] = {}
        self.library: dict[str, object] = {}  # path -> LibraryEntry, as the library knows them
        self._dropped: set[str] = set()  # dropped files waiting for the library's scan
        self.applied: tuple[StackItem, ...] | None = None
        self.base_box = QComboBox()
        self.base_box.setToolTip("The model the stack applies to")
        self.base_box.setPlaceholderText("no checkpoint in the library")
        self.base_box.currentIndexChanged.connect(self._on_base_changed)
        self.list = StackList()
        self.list.files_dropped.connect(self._on_files_dropped)
        self.list.model().rowsMoved.connect(self._on_rows_moved)
        self.hint = QLabel("Drop LoRA files here, or right-click a LoRA in the library → Add to LoRA stack.")
        self.hint.setWordWrap(True)
        self.hint.setStyleSheet("color: gray")
        self.total = QLabel("")
        self.apply_button = QPushButton("Apply")
        self.revert_button = QPushButton("Revert")
        self.remove_button = QPushButton("Remove")
        self.bake_button = QPushButton("Bake…")
        self.bake_button.setToolTip("Merge the enabled LoRAs into a new .safetensors checkpoint")
        self.apply_button.clicked.connect(self._on_apply_clicked)
        self.revert_button.clicked.connect(self._on_revert_clicked)
        self.remove_button.clicked.connect(self._on_remove_clicked)
        self.bake_button.clicked.connect(self._on_bake_clicked)
        self.state = QLabel("")
        base_row = QHBoxLayout()
        base_row.addWidget(QLabel("Base"))
        base_row.addWidget(self.base_box, 1)
        buttons = QHBoxLayout()
        for b in (self.apply_button, self.revert_button, self.remove_button, self.bake_button):
            buttons.addWidget(b)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(base_row)
        lay.addWidget(self.list, 1)
        lay.addWidget(self.hint)
        lay.addWidget(self.total)
        lay.addLayout(buttons)
        lay.addWidget(self.state)
        self._update()

    # -- contents -------------------------------------------------------------------------------------

    @Slot(list)
    def on_library_changed(self, entries) -> None:
        """The library merged a scan: new bases to offer, and dropped files it now knows."""
        self.library = {e.path: e for e in entries}
        self.set_bases(entries)
        for p in [p for p in self._dropped if p in self.library]:
            self._dropped.discard(p)
            self._add_dropped(self.library[p])

    @Slot(list)
    def _on_files_dropped(self, paths: list[str]) -> None:
        todo = []
        for p in map(os.path.abspath, paths):
            if p in self.library:
                self._add_dropped(self.library[p])
            else:
                todo.append(p)
        if todo:  # unknown files join the library first; once scanned, the LoRAs among them join the stack
            self._dropped.update(todo)
            self.files_to_scan.emit(todo)

    def _add_dropped(self, e) -> None:
        if e.kind == "lora":
            self.add(e.path)
        else:
            self.message.emit(
                f"{e.name} is a {e.kind}, not a LoRA: it was not added to the stack.", "warning"
            )

    def set_bases(self, entries) -> None:
        """Offer checkpoints / diffusion models of the library as bases (keeps the current one)."""
        cur = self.base()
        have = {self.base_box.itemData(i) for i in range(self.base_box.count())}
        for e in entries:
            if e.kind in ("checkpoint", "diffusion_model") and not e.error and e.path not in have:
                self.base_box.addItem(f"{e.name} ({e.architecture or '?'})", e.path)
        if cur:
            self.set_base(cur)
        elif self.base_box.currentIndex() < 0 and self.base_box.count():
            # With a placeholder text Qt leaves the box on "no checkpoint" even once items exist.
            self.base_box.setCurrentIndex(0)

    def set_base(self, path: str) -> None:
        i = self.base_box.findData(path)
        if i >= 0:
            self.base_box.setCurrentIndex(i)

    def base(self) -> str:
        return self.base_box.currentData() or ""

    def add(self, path: str, strength_model: float = 1.0, strength_clip: float = 1.0) -> bool:
        path = os.path.abspath(path)
        if path in [it.file for it in self.stack()]:
            self.message.emit(f"{display_name(path)} is already in the stack", "info")
            return False
        self._add_item(StackItem(path, strength_model, strength_clip, True))
        if self.base():
            self.request_coverage(path, self.base())
        self._update()
        return True

    def _add_item(self, s: StackItem, row: int | None = None) -> None:
        it = QListWidgetItem()
        it.setData(ROLE, s)
        it.setFlags(it.flags() | Qt.ItemFlag.ItemIsDragEnabled)
        if row is None:
            self.list.addItem(it)
        else:
            self.list.insertItem(row, it)
        self._attach(it)

    def _attach(self, it: QListWidgetItem) -> None:
        s = it.data(ROLE)
        w = StackRow(s)
        w.changed.connect(self._on_row_changed)
        w.coverage_clicked.connect(lambda f=s.file: self.show_unmatched(f))
        cov = self.coverages.get((s.file, self.base()))
        if cov is not None:
            w.set_coverage(cov)
        it.setSizeHint(QSize(200, w.sizeHint().height()))
        self.list.setItemWidget(it, w)

    def row_widget(self, row: int) -> StackRow:
        return self.list.itemWidget(self.list.item(row))

    def stack(self) -> tuple[StackItem, ...]:
        out = []
        for r in range(self.list.count()):
            w = self.list.itemWidget(self.list.item(r))
            out.append(w.current() if w is not None else self.list.item(r).data(ROLE))
        return tuple(out)

    def move(self, src: int, dst: int) -> None:
        """Reorder (what a drag does), keeping each row's edits."""
        items = list(self.stack())
        items.insert(dst, items.pop(src))
        self.list.clear()
        for s in items:
            self._add_item(s)
        self._update()

    # -- requests and results ----------------------------------------------------------------------------

    def attach(self, client) -> None:
        self.client = client

    def request_coverage(self, lora: str, base: str) -> None:
        if self.client is not None:
            self.client.submit(
                LoraCoverage(lora, base), self._on_coverage, partial(self._on_coverage_failed, lora)
            )

    def apply(self, base: str, stack: tuple[StackItem, ...]) -> None:
        """Patch the loaded `base` with `stack` (an empty stack reverts)."""
        self.client.submit(SetLoras(base, stack), self._on_applied)

    def bake(self, base: str, stack: tuple[StackItem, ...], out: str) -> None:
        self.client.submit(Bake(base, stack, out), self._on_baked)

    def _on_coverage(self, result) -> None:
        self.set_coverage(result.lora, result.base, result.coverage)

    def _on_coverage_failed(self, lora: str, info) -> None:
        self.set_coverage_error(lora, info.message)
        self.client.report_error(info)

    def _on_applied(self, result) -> None:
        for c in result.coverages:
            self.set_coverage(c.lora, c.base, c.coverage)
        self.set_applied(result.stack, result.patched)
        self.patches_changed.emit(result.base, result.patched_units)

    def _on_baked(self, result) -> None:
        name = os.path.basename(result.out)
        self.message.emit(f"Baked {name} ({human_bytes(result.bytes)}); it joins the library.", "info")
        self.baked.emit(result.out)

    @Slot(str)
    def on_base_unloaded(self, base: str) -> None:
        """Nothing of `base` is loaded any more: its patches went with it."""
        if self.base() == base:
            self.set_applied((), 0)

    # -- coverage ---------------------------------------------------------------------------------------

    def set_coverage(self, lora: str, base: str, cov: dict) -> None:
        self.coverages[(lora, base)] = cov
        if base != self.base():
            return
        for r in range(self.list.count()):
            w = self.row_widget(r)
            if w is not None and w.item.file == lora:
                w.set_coverage(cov)
                self.list.item(r).setSizeHint(QSize(200, w.sizeHint().height()))
        self._update()

    def set_coverage_error(self, lora: str, message: str) -> None:
        for r in range(self.list.count()):
            w = self.row_widget(r)
            if w is not None and w.item.file == lora:
                w.set_coverage(None, message)

    def unmatched(self, lora: str) -> list[str]:
        cov = self.coverages.get((lora, self.base())) or {}
        out = []
        for t in (cov.get("targets") or {}).values():
            out += t.get("unmatched") or []
            out += [f"{m['module']} (shape {m.get('lora_shape')} vs {m.get('base_shape')})"
                    for m in t.get("shape_mismatch") or []]  # fmt: skip
        return out

    def show_unmatched(self, lora: str) -> QMessageBox | None:
        cov = self.coverages.get((lora, self.base()))
        if cov is None:
            self.message.emit("Coverage is not known yet: choose a base model.", "info")
            return None
        miss = self.unmatched(lora)
        box = QMessageBox(QMessageBox.Icon.Information, "Coverage",
                          f"{display_name(lora)} on {display_name(self.base())}: "
                          f"{cov.get('mapped')}/{cov.get('modules')} modules land on base weights.", parent=self)  # fmt: skip
        per = "\n".join(
            f"{k}: {t.get('mapped')}/{t.get('modules')}" for k, t in (cov.get("targets") or {}).items()
        )
        box.setInformativeText(per + ("\n\nUnmatched modules are listed in the details." if miss else
                                      "\n\nEvery module is matched."))  # fmt: skip
        if miss:
            box.setDetailedText("\n".join(miss))
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        box.open()
        return box

    # -- slots -------------------------------------------------------------------------------------------

    def _update(self) -> None:
        n = self.list.count()
        self.hint.setVisible(n == 0)
        for b in (self.apply_button, self.bake_button):
            b.setEnabled(n > 0 and bool(self.base()))
        self.remove_button.setEnabled(n > 0)
        self.revert_button.setEnabled(bool(self.applied))
        covs = [self.coverages.get((s.file, self.base())) for s in self.stack() if s.enabled]
        if covs and all(covs):
            m, t = sum(c["mapped"] for c in covs), sum(c["modules"] for c in covs)
            self.total.setText(f"coverage {m}/{t} modules · {len(covs)} enabled")
        else:
            self.total.setText("")
        dirty = self.applied is not None and self.applied != self.stack()
        self.apply_button.setText("Apply*" if dirty else "Apply")

    @Slot(int)
    def _on_base_changed(self, _i: int) -> None:
        base = self.base()
        for r in range(self.list.count()):
            w = self.row_widget(r)
            if w is None:
                continue
            cov = self.coverages.get((w.item.file, base))
            if cov is not None:
                w.set_coverage(cov)
            elif base:
                self.request_coverage(w.item.file, base)
        self._update()

    @Slot()
    def _on_rows_moved(self, *_):
        # Qt drops item widgets on an internal move: rebuild them from the items' data.
        for r in range(self.list.count()):
            it = self.list.item(r)
            if self.list.itemWidget(it) is None:
                self._attach(it)
        self._update()

    @Slot()
    def _on_row_changed(self) -> None:
        for r in range(self.list.count()):
            w = self.row_widget(r)
            if w is not None:
                self.list.item(r).setData(ROLE, w.current())
        self._update()

    @Slot()
    def _on_apply_clicked(self) -> None:
        if self.base():
            self.apply(self.base(), self.stack())

    @Slot()
    def _on_revert_clicked(self) -> None:
        if self.base():
            self.apply(self.base(), ())

    @Slot()
    def _on_remove_clicked(self) -> None:
        r = self.list.currentRow()
        if r < 0:
            r = self.list.count() - 1
        if r >= 0:
            self.list.takeItem(r)
        self._update()

    @Slot()
    def _on_bake_clicked(self) -> None:
        base = self.base()
        start = os.path.join(
            os.path.dirname(base), os.path.splitext(os.path.basename(base))[0] + "_baked.safetensors"
        )
        out, _ = QFileDialog.getSaveFileName(
            self, "Bake into a new checkpoint", start, "safetensors (*.safetensors)"
        )
        if out:
            self.bake(base, self.stack(), out)

    def set_applied(self, stack: tuple[StackItem, ...], patched: int) -> None:
        self.applied = stack if stack else None
        enabled = sum(1 for s in stack if s.enabled)
        self.state.setText(f"Applied: {enabled} LoRA(s), {patched} weights patched on the fly" if stack
                           else "No LoRA applied")  # fmt: skip
        self._update()
