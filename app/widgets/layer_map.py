"""The layer map: a component's modules drawn by size, coloured by where they live (device, RAM or the
file on disk) and outlined when a LoRA patches them. Area is proportional to bytes."""

from __future__ import annotations

import math

from PySide6.QtCore import QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QPainter, QPen
from PySide6.QtWidgets import QSizePolicy, QToolTip, QWidget

from engine.formatting import human_bytes

TIER_COLORS = {"device": QColor("#2e86de"), "ram": QColor("#f39c12"), "disk": QColor("#95a5a6")}
PATCH_COLOR = QColor("#e84393")


class LayerMap(QWidget):
    """Modules are laid out in file order, row by row; each cell's area is its share of the bytes."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.layers: tuple[tuple[str, str, int], ...] = ()
        self.patched: frozenset[str] = frozenset()
        self.title = ""
        self._cells: list[tuple[QRectF, str, str, int]] = []
        self.setMouseTracking(True)
        self.setMinimumHeight(90)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)

    def sizeHint(self) -> QSize:
        return QSize(400, 140)

    def set_layers(self, title: str, layers, patched=frozenset()) -> None:
        self.title = title
        self.layers = tuple(layers)
        self.patched = frozenset(patched)
        self._cells = []
        self.update()

    def counts(self) -> dict[str, int]:
        """Bytes per tier as drawn (the ledger's layers)."""
        out = dict.fromkeys(TIER_COLORS, 0)
        for _, tier, n in self.layers:
            out[tier] = out.get(tier, 0) + n
        return out

    def _layout(self, area: QRectF) -> list[tuple[QRectF, str, str, int]]:
        # Disk-tier units hold 0 bytes now; draw every module at its full size so the map never jumps.
        sizes = [max(n, 1) for _, _, n in self.layers]
        if not sizes or area.width() < 4 or area.height() < 4:
            return []
        total = float(sum(sizes))
        # rows of equal height; module widths proportional to bytes, wrapping across rows
        rows = max(1, min(12, round(math.sqrt(len(sizes) * area.height() / max(area.width(), 1)))))
        row_h = area.height() / rows
        per_row = total / rows
        cells, x, y, row = [], 0.0, area.top(), 0
        for (path, tier, n), s in zip(self.layers, sizes, strict=True):
            left = s
            while left > 0 and row < rows:
                room = per_row - x
                take = min(left, room)
                w = take / per_row * area.width()
                cells.append((QRectF(area.left() + x / per_row * area.width(), y, w, row_h), path, tier, n))
                x += take
                left -= take
                if x >= per_row - 1e-6:
                    x, row, y = 0.0, row + 1, y + row_h
        return cells

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        r = QRectF(self.rect()).adjusted(2, 18, -2, -2)
        p.setPen(self.palette().text().color())
        if not self.layers:
            p.drawText(
                self.rect(), Qt.AlignmentFlag.AlignCenter, "Select a loaded component to see its layer map"
            )
            return
        c = self.counts()
        p.drawText(4, 13, f"{self.title}: {len(self.layers)} modules · device {human_bytes(c['device'])}"
                          f" · RAM {human_bytes(c['ram'])} · disk {human_bytes(c['disk'])}"
                          + (f" · {len(self.patched)} patched" if self.patched else ""))  # fmt: skip
        self._cells = self._layout(r)
        edge = QPen(self.palette().base().color())
        edge.setWidthF(0.5)
        for rect, _path, tier, _n in self._cells:
            p.fillRect(rect, QBrush(TIER_COLORS.get(tier, QColor("gray"))))
            if rect.width() > 2:
                p.setPen(edge)
                p.drawRect(rect)
        hatch = QPen(PATCH_COLOR)
        hatch.setWidthF(2.0)
        for rect, path, _tier, _n in self._cells:
            if path in self.patched:
                p.setPen(hatch)
                p.drawRect(rect.adjusted(1, 1, -1, -1))
        p.end()

    def mouseMoveEvent(self, event) -> None:
        pos = event.position()
        for rect, path, tier, n in self._cells:
            if rect.contains(pos):
                patched = " · patched by a LoRA" if path in self.patched else ""
                QToolTip.showText(event.globalPosition().toPoint(),
                                  f"{path or '(root)'}\n{tier} · {human_bytes(n)}{patched}", self)  # fmt: skip
                return
        QToolTip.hideText()
