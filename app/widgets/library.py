"""The Library panel: the catalog as a sortable, filterable table with thumbnails and a context menu.
It scans its roots (app.library_paths) and hashes new files through the engine client, and merges the
results itself."""

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

from app.library_paths import LibraryPaths
from app.models.library_model import COLUMNS, ENTRY_ROLE, THUMB, LibraryFilter, LibraryModel
from engine.requests import HashFiles, Scan

LOADABLE = ("checkpoint", "diffusion_model", "vae", "vae_approx", "text_encoder")


class LibraryPanel(QWidget):
    """Scans and hashes on its own; emits what the user asks of other panels (load, add to the stack)."""

    selected = Signal(object)  # LibraryEntry
    load_file = Signal(str)  # a checkpoint, diffusion model, text encoder or VAE to load
    lora_opened = Signal(str)  # a LoRA the user asked to load: it goes to the stack
    add_to_stack_requested = Signal(object)
    message = Signal(str, str)  # text, level
    status = Signal(str)  # a passing note for the status bar
    entries_changed = Signal(list)  # every LibraryEntry, after a scan merged new ones
    hashed = Signal()  # hashes arrived (the inspector may show one now)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = None  # app.bridge.EngineClient, once attached
        self.roots = LibraryPaths()
        self.select_after_scan: str | None = None
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
        self.view.doubleClicked.connect(self._on_double_clicked)

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

    # -- roots, scans and hashes ------------------------------------------------------------------------

    def attach(self, client) -> None:
        self.client = client

    def add_paths(self, paths, *, persist: bool = True, select_first: bool = True) -> list[str]:
        """Add files/folders to the library and scan them; `select_first` selects the first file once
        scanned (`loadout FILE`, a double-click, a drop)."""
        found, missing = self.roots.add(paths, persist=persist)
        if missing:
            self.message.emit(f"Not found: {', '.join(missing)}", "warning")
        first = next((p for p in found if os.path.isfile(p)), None)
        if select_first and first:
            self.select_after_scan = first
        if found:
            self.client.submit(Scan(tuple(found)), self._on_scanned, self._on_scan_failed,
                               on_progress=self._on_progress, on_cancelled=self.hide_progress)  # fmt: skip
        return found

    def keep_folders(self, folders: list[str], listed: list[str]) -> None:
        """Settings saved this folder list (it listed `listed` when opened): forget the roots taken out,
        scan the ones added."""
        removed = self.roots.keep_folders(folders, listed)
        if removed:
            self.remove_under(removed)
        if removed or any(p not in self.roots for p in folders):
            self.add_paths(folders, persist=False, select_first=False)  # a rescan; the cache keeps it quick

    def _on_progress(self, p) -> None:
        self.set_progress(p.stage, p.done, p.total)

    def _on_scan_failed(self, info) -> None:
        self.hide_progress()
        self.client.report_error(info)

    def _on_scanned(self, lib) -> None:
        added = self.merge(lib.entries)
        self.hide_progress()
        self.entries_changed.emit(self.model.entries)
        bad = [e for e in lib.entries if e.error and e.error.type != "unsupported"]
        for e in bad[:1]:
            more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
            self.message.emit(f"{e.name}: {e.error.message}{more}", "error")
        if not lib.entries and not bad:
            roots = ", ".join(os.path.basename(r.path) for r in lib.roots)
            self.message.emit(f"No model files found in {roots}. Loadout reads .safetensors, .ckpt, .pt, .pth, "
                              ".bin and .gguf files and folders of them.", "warning")  # fmt: skip
        elif added:
            self.status.emit(f"{len(added)} file(s) added to the library")
        target = self.select_after_scan
        if not target and self.current_entry() is None and lib.entries:
            # Nothing chosen yet: show the first file (sorted as the user sees it) so the Inspector
            # explains something on first sight instead of an empty pane.
            first = self.proxy.index(0, 0).data(ENTRY_ROLE)
            target = first.path if first is not None else None
        if target and any(e.path == target for e in lib.entries):
            self.select_after_scan = None
            self.select_path(target)
            e = self.current_entry()
            if e is not None:
                self.selected.emit(e)
        items = tuple((e.path, e.size, e.mtime_ns) for e in lib.entries
                      if not e.sha256 and not e.is_dir and not e.error and e.path not in self.model.hashes)  # fmt: skip
        if items:
            self.client.submit(HashFiles(items), self._on_hashed, self._on_scan_failed,
                               on_progress=self._on_progress, on_cancelled=self.hide_progress)  # fmt: skip

    def _on_hashed(self, result) -> None:
        for path, sha in result.hashed:
            self.model.set_hash(path, sha)
        self.hashed.emit()
        self.hide_progress()
        if result.failed:
            self.message.emit(
                f"Could not hash {len(result.failed)} file(s): {result.failed[0][1]}", "warning"
            )

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
        # In permille: QProgressBar counts in 32-bit ints, and a scan hashing a 3.4 GB file counts bytes
        self.progress.setRange(0, 1000 if total else 0)
        if total:
            self.progress.setValue(min(1000, done * 1000 // total))
        self.progress.setFormat(f"{stage} %p%" if total else stage)

    def hide_progress(self) -> None:
        self.progress.hide()

    # -- loading ----------------------------------------------------------------------------------------

    def load_current(self) -> None:
        """The toolbar's Load: the selected file."""
        e = self.current_entry()
        if e is None:
            self.message.emit(
                "Select a checkpoint, diffusion model, text encoder or VAE in the library first.", "warning"
            )
        else:
            self.load(e)

    def load(self, entry) -> None:
        """Load a file the engine can load; a LoRA goes to the stack; anything else is explained."""
        if entry is None:
            return
        if entry.error:
            self.message.emit(f"{entry.name} cannot be loaded: {entry.error.message}", "error")
        elif entry.kind == "lora":
            self.lora_opened.emit(entry.path)
        elif entry.kind not in LOADABLE:
            self.message.emit(f"{entry.name} is a {entry.kind}: Loadout loads checkpoints, diffusion models, "
                              "text encoders and VAEs.", "warning")  # fmt: skip
        else:
            self.load_file.emit(entry.path)

    # -- slots ------------------------------------------------------------------------------------------

    @Slot(QModelIndex)
    def _on_double_clicked(self, ix: QModelIndex) -> None:
        self.load(ix.data(ENTRY_ROLE))

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
        load.setEnabled(e.kind in LOADABLE and not e.error)
        load.triggered.connect(lambda: self.load(e))
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
            self.message.emit(f"Could not open a file manager for {folder}", "info")

    def _copy_hash(self, sha: str | None) -> None:
        if sha:
            QGuiApplication.clipboard().setText(sha)
            self.message.emit(f"Copied SHA-256 {sha[:10]}… to the clipboard", "info")
