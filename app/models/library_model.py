"""The library as a Qt table model (one row per LibraryEntry) and a proxy that sorts by real values
and filters by text, kind and architecture."""

from __future__ import annotations

import os

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSortFilterProxyModel, Qt
from PySide6.QtGui import QColor, QIcon, QPixmap

from engine.formatting import algo_names, human_bytes

COLUMNS = ("Name", "Kind", "Architecture", "Size", "Params", "Dtype", "Hash", "LoRA base")
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
ENTRY_ROLE = Qt.ItemDataRole.UserRole + 2
THUMB = 36


def human_params(n: int | None) -> str:
    if not n:
        return ""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.2f} {unit}" if n < 10 * div else f"{n / div:.1f} {unit}"
    return str(n)


def entry_params(e) -> int:
    return e.detection.params


def entry_dtype(e) -> str:
    dts = [c.dtype for c in e.detection.components.values() if c.dtype]
    return "/".join(sorted(set(dts), key=dts.index)) if dts else ""


def lora_base(e) -> str:
    lora = e.detection.lora
    base = (lora and lora.base) or ""
    algos = lora.algos if lora else ()
    if algos and algos != ("lora",):  # the algorithm says what kind of adapter, base known or not
        return f"{base or '?'} ({algo_names(algos)})"
    return base


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


class LibraryModel(QAbstractTableModel):
    """Rows are engine.catalog.LibraryEntry objects (frozen); hashes found later are kept beside."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.entries: list = []
        self._row: dict[str, int] = {}
        self.hashes: dict[str, str] = {}
        self._thumbs: dict[str, QIcon] = {}

    def rowCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.entries)

    def columnCount(self, parent: QModelIndex | QPersistentModelIndex = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section]
        return None

    def merge(self, entries) -> list[str]:
        """Add or replace entries by path (a rescan updates rows in place). Returns the paths added."""
        added = []
        for e in entries:
            i = self._row.get(e.path)
            if i is None:
                self.beginInsertRows(QModelIndex(), len(self.entries), len(self.entries))
                self._row[e.path] = len(self.entries)
                self.entries.append(e)
                self.endInsertRows()
                added.append(e.path)
            else:
                self.entries[i] = e
                self._thumbs.pop(e.path, None)
                self.dataChanged.emit(self.index(i, 0), self.index(i, len(COLUMNS) - 1))
        return added

    def remove_under(self, roots: list[str]) -> int:
        """Drop the entries inside any of `roots` (library folders the user removed); returns how many."""
        keep = [e for e in self.entries if not any(_inside(e.path, r) for r in roots)]
        n = len(self.entries) - len(keep)
        if n:
            self.beginResetModel()
            self.entries = keep
            self._row = {e.path: i for i, e in enumerate(keep)}
            self.endResetModel()
        return n

    def set_hash(self, path: str, sha256: str) -> None:
        self.hashes[path] = sha256
        i = self._row.get(path)
        if i is not None:
            col = COLUMNS.index("Hash")
            self.dataChanged.emit(self.index(i, col), self.index(i, col))

    def row_of(self, path: str) -> int | None:
        return self._row.get(os.path.abspath(path))

    def entry(self, row: int):
        return self.entries[row]

    def sha256(self, e) -> str | None:
        return e.sha256 or self.hashes.get(e.path)

    def _thumb(self, e) -> QIcon | None:
        if not e.preview:
            return None
        icon = self._thumbs.get(e.path)
        if icon is None:
            pm = QPixmap(e.preview)
            if pm.isNull():
                return None
            icon = self._thumbs[e.path] = QIcon(
                pm.scaled(
                    THUMB,
                    THUMB,
                    Qt.AspectRatioMode.KeepAspectRatio,
                    Qt.TransformationMode.SmoothTransformation,
                )
            )
        return icon

    def _value(self, e, col: str):
        if col == "Name":
            return e.name
        if col == "Kind":
            return e.kind or ""
        if col == "Architecture":
            return e.architecture or ""
        if col == "Size":
            return e.size
        if col == "Params":
            return entry_params(e)
        if col == "Dtype":
            return entry_dtype(e)
        if col == "Hash":
            h = self.sha256(e)
            return h[:10] if h else ""
        if col == "LoRA base":
            return lora_base(e)
        return None

    def data(self, index: QModelIndex | QPersistentModelIndex, role: int = Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        e = self.entries[index.row()]
        col = COLUMNS[index.column()]
        if role == ENTRY_ROLE:
            return e
        if role == SORT_ROLE:
            v = self._value(e, col)
            return v.lower() if isinstance(v, str) else v
        if role == Qt.ItemDataRole.DisplayRole:
            v = self._value(e, col)
            if col == "Size":
                return human_bytes(v)
            if col == "Params":
                return human_params(v)
            if col == "Kind" and e.error:
                t = e.error.type
                return f"{v} ({'unsupported' if t == 'unsupported' else 'unreadable'})"
            if col == "Kind" and e.kind_mismatch:
                return f"{v} ⚠"
            return v
        if role == Qt.ItemDataRole.DecorationRole and col == "Name":
            return self._thumb(e)
        if role == Qt.ItemDataRole.ToolTipRole:
            if e.error:
                return e.error.message
            if col == "Kind" and e.kind_mismatch:
                return f"The folder says {e.declared_kind} but the file is a {e.kind}."
            if col == "Hash":
                h = self.sha256(e)
                return f"SHA-256 {h}" if h else "not hashed yet"
            return e.path if col == "Name" else None
        if role == Qt.ItemDataRole.ForegroundRole and e.error and e.error.type != "unsupported":
            return QColor("#c0392b")
        if role == Qt.ItemDataRole.TextAlignmentRole and col in ("Size", "Params"):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None


class LibraryFilter(QSortFilterProxyModel):
    """Filter by free text (name, path, architecture, tags), kind and architecture."""

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.text = ""
        self.kind = ""
        self.arch = ""
        self.setSortRole(SORT_ROLE)

    def set_filters(self, text: str | None = None, kind: str | None = None, arch: str | None = None) -> None:
        if text is not None:
            self.text = text.strip().lower()
        if kind is not None:
            self.kind = kind
        if arch is not None:
            self.arch = arch
        if hasattr(self, "beginFilterChange"):  # Qt 6.9+: invalidateFilter() is deprecated
            self.beginFilterChange()
            self.endFilterChange(QSortFilterProxyModel.Direction.Rows)
        else:  # pragma: no cover
            self.invalidateFilter()

    def filterAcceptsRow(self, row: int, parent) -> bool:
        e = self.sourceModel().entry(row)
        if self.kind and (e.kind or "") != self.kind:
            return False
        if self.arch and (e.architecture or "") != self.arch:
            return False
        if self.text:
            hay = " ".join([e.path, e.kind or "", e.architecture or "", lora_base(e)]).lower()
            return all(w in hay for w in self.text.split())
        return True

    def lessThan(self, a, b) -> bool:
        va, vb = a.data(SORT_ROLE), b.data(SORT_ROLE)
        if va is None or vb is None:
            return vb is not None
        try:
            return va < vb
        except TypeError:
            return str(va) < str(vb)
