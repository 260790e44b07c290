"""A graphics view for looking at a decoded image: zoom with the wheel, pan by dragging, Fit and 100 %."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor, QPainter
from PySide6.QtWidgets import QGraphicsScene, QGraphicsView


class ZoomView(QGraphicsView):
    """Wheel zooms about the cursor; drag pans. Fitted (Fit, or a new image) it stays fitted as it is
    resized or first shown: a result that arrives while the Decode tab is hidden was fitted into a
    viewport of no real size and showed as a thumbnail until Fit was pressed."""

    def __init__(self, scene: QGraphicsScene) -> None:
        super().__init__(scene)
        self.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        self.setBackgroundBrush(QBrush(QColor("#2d3436")))
        self.fitted = True

    def fit(self) -> None:
        self.fitted = True
        self.fitInView(self.sceneRect(), Qt.AspectRatioMode.KeepAspectRatio)

    def actual_size(self) -> None:
        self.fitted = False
        self.resetTransform()

    def wheelEvent(self, e) -> None:
        self.fitted = False
        f = 1.25 if e.angleDelta().y() > 0 else 0.8
        self.scale(f, f)

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        if self.fitted:
            self.fitInView(self.sceneRect(), Qt.AspectRatioMode.KeepAspectRatio)

    def showEvent(self, e) -> None:
        super().showEvent(e)
        if self.fitted:
            self.fitInView(self.sceneRect(), Qt.AspectRatioMode.KeepAspectRatio)

    def zoom(self) -> float:
        return self.transform().m11()
