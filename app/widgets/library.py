"""The Library panel: the catalog as a sortable, filterable table with thumbnails and a context menu."""

from __future__ import annotations

import os

from PySide6.QtCore import QItemSelectionModel, QModelIndex, QPoint, Qt, QUrl, Signal, Slot
from PySide6.QtGui import QAction, QDesktopServices, QGuiApplication
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QProgressBar,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from app.models.library_model import COLUMNS, ENTRY_ROLE, THUMB, LibraryFilter, LibraryModel


class LibraryPanel(QWidget):
    """Emits what the user asks for; the window turns it into engine requests."""

    selected = Signal(object)  # LibraryEntry
    load_requested = Signal(object)
    add_to_stack_requested = Signal(object)
    message = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = LibraryModel(self)
        self.proxy = LibraryFilter(self)
        self.proxy.setSourceModel(self.model)
        self.filter_edit = QLineEdit(
            placeholderText="Filter by name, path, architecture…", clearButtonEnabled=True
        )
        self.kind_box = QComboBox()
        self.arch_box = QComboBox()
        self.kind_box.setToolTip("Kind")
        self.arch_box.setToolTip("Architecture")
        for box, label in ((self.kind_box, "All kinds"), (self.arch_box, "All architectures")):
            box.addItem(label, "")
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.filter_edit.textChanged.connect(self._on_filter_changed)
        self.kind_box.currentIndexChanged.connect(self._on_filter_changed)
        self.arch_box.currentIndexChanged.connect(self._on_filter_changed)

        self.view = QTableView()
        self.view.setModel(self.proxy)
        self.view.setSortingEnabled(True)
        self.view.sortByColumn(COLUMNS.index("Kind"), Qt.SortOrder.AscendingOrder)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.view.setAlternatingRowColors(True)
        self.view.setShowGrid(False)
        self.view.setWordWrap(False)
        self.view.verticalHeader().hide()
        self.view.verticalHeader().setDefaultSectionSize(THUMB + 4)
        self.view.setIconSize(self.view.iconSize().expandedTo(self.view.iconSize().__class__(THUMB, THUMB)))
        h = self.view.horizontalHeader()
        h.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        h.setStretchLastSection(True)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._on_context_menu)
        self.view.selectionModel().currentRowChanged.connect(self._on_current_changed)
        self.view.doubleClicked.connect(lambda ix: self.load_requested.emit(ix.data(ENTRY_ROLE)))

        self.empty = QLabel(
            "No library yet — drop model files or folders anywhere on the window, "
            "or add library folders in Settings.",
            alignment=Qt.AlignmentFlag.AlignCenter,
            wordWrap=True,
        )
        self.empty.setStyleSheet("border: 2px dashed palette(mid); border-radius: 8px; padding: 18px;")
        self.progress = QProgressBar()
        self.progress.setMaximumHeight(14)
        self.progress.setTextVisible(True)
        self.progress.hide()
        self.count_label = QLabel("")

        top = QHBoxLayout()
        top.addWidget(self.filter_edit, 1)
        top.addWidget(self.kind_box)
        top.addWidget(self.arch_box)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(top)
        lay.addWidget(self.empty)
        lay.addWidget(self.view, 1)
        bottom = QHBoxLayout()
        bottom.addWidget(self.count_label)
        bottom.addWidget(self.progress, 1)
        lay.addLayout(bottom)
        self._update_empty()

    # -- data -----------------------------------------------------------------------------------------

    def merge(self, entries) -> list[str]:
        added = self.model.merge(entries)
        self._refill(self.kind_box, sorted({e.kind for e in self.model.entries if e.kind}))
        self._refill(self.arch_box, sorted({e.architecture for e in self.model.entries if e.architecture}))
        if added:
            self.view.resizeColumnsToContents()
            self.view.setColumnWidth(
                0, min(self.view.columnWidth(0), 250)
            )  # long names elide; keep Size in view
        self._update_empty()
        return added

    def remove_under(self, roots: list[str]) -> int:
        n = self.model.remove_under(roots)
        self._update_empty()
        return n

    def _refill(self, box: QComboBox, values: list[str]) -> None:
        have = {box.itemData(i) for i in range(box.count())}
        for v in values:
            if v not in have:
                box.addItem(v, v)

    def _update_empty(self) -> None:
        n = self.model.rowCount()
        self.empty.setVisible(n == 0)
        self.view.setVisible(n > 0)
        shown = self.proxy.rowCount()
        self.count_label.setText(f"{shown} of {n} files" if shown != n else f"{n} files" if n else "")

    def select_path(self, path: str) -> bool:
        """Select the row of `path` (clearing filters that hide it) and scroll to it."""
        row = self.model.row_of(path)
        if row is None:
            return False
        src = self.model.index(row, 0)
        ix = self.proxy.mapFromSource(src)
        if not ix.isValid():
            self.filter_edit.clear()
            self.kind_box.setCurrentIndex(0)
            self.arch_box.setCurrentIndex(0)
            ix = self.proxy.mapFromSource(src)
        flags = QItemSelectionModel.SelectionFlag.ClearAndSelect | QItemSelectionModel.SelectionFlag.Rows
        self.view.selectionModel().setCurrentIndex(ix, flags)
        self.view.scrollTo(ix)
        return True

    def current_entry(self):
        ix = self.view.currentIndex()
        return ix.data(ENTRY_ROLE) if ix.isValid() else None

    def set_progress(self, stage: str, done: int, total: int) -> None:
        self.progress.show()
        self.progress.setRange(0, total if total else 0)
        if total:
            self.progress.setValue(min(done, total))
        self.progress.setFormat(f"{stage} %p%" if total else stage)

    def hide_progress(self) -> None:
        self.progress.hide()

    # -- slots ------------------------------------------------------------------------------------------

    @Slot()
    def _on_filter_changed(self) -> None:
        self.proxy.set_filters(self.filter_edit.text(), self.kind_box.currentData() or "",
                               self.arch_box.currentData() or "")  # fmt: skip
        self._update_empty()

    @Slot(QModelIndex, QModelIndex)
    def _on_current_changed(self, current: QModelIndex, _previous: QModelIndex) -> None:
        if current.isValid():
            self.selected.emit(current.data(ENTRY_ROLE))

    @Slot(QPoint)
    def _on_context_menu(self, pos: QPoint) -> None:
        ix = self.view.indexAt(pos)
        if not ix.isValid():
            return
        menu = self.context_menu(ix.data(ENTRY_ROLE))
        menu.popup(self.view.viewport().mapToGlobal(pos))

    def context_menu(self, e) -> QMenu:
        """The row's menu (built per entry; tests trigger its actions by text)."""
        menu = QMenu(self)
        menu.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        inspect = QAction("Inspect", menu)
        inspect.triggered.connect(lambda: self.selected.emit(e))
        load = QAction("Load", menu)
        load.setEnabled(
            e.kind in ("checkpoint", "diffusion_model", "vae", "vae_approx", "text_encoder") and not e.error
        )
        load.triggered.connect(lambda: self.load_requested.emit(e))
        stack = QAction("Add to LoRA stack", menu)
        stack.setEnabled(e.kind == "lora")
        stack.triggered.connect(lambda: self.add_to_stack_requested.emit(e))
        reveal = QAction("Reveal in file manager", menu)
        reveal.triggered.connect(lambda: self._reveal(e.path))
        sha = self.model.sha256(e)
        copy = QAction("Copy hash" if sha else "Copy hash (not hashed yet)", menu)
        copy.setEnabled(bool(sha))
        copy.triggered.connect(lambda: self._copy_hash(sha))
        for a in (inspect, load, stack):
            menu.addAction(a)
        menu.addSeparator()
        menu.addAction(reveal)
        menu.addAction(copy)
        return menu

    def _reveal(self, path: str) -> None:
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        if not QDesktopServices.openUrl(QUrl.fromLocalFile(folder)):
            self.message.emit(f"Could not open a file manager for {folder}")

    def _copy_hash(self, sha: str | None) -> None:
        if sha:
            QGuiApplication.clipboard().setText(sha)
            self.message.emit(f"Copied SHA-256 {sha[:10]}… to the clipboard")
