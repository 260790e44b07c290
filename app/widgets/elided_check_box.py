"""A check box whose label is elided to its width."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QCheckBox, QSizePolicy, QStyle, QWidget


class ElidedCheckBox(QCheckBox):
    """A check box whose label is elided in the middle to the width it is given (a LoRA's name can be
    long and the stack shares its dock with the badge): the start and the end of a name are what
    tell two versions of a LoRA apart. The whole name stays in `full_text`."""

    def __init__(self, text: str, parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.full_text = text
        self.setSizePolicy(QSizePolicy.Policy.Ignored, self.sizePolicy().verticalPolicy())
        self.setMinimumWidth(self.fontMetrics().horizontalAdvance("M" * 8))

    def resizeEvent(self, e) -> None:
        super().resizeEvent(e)
        st = self.style()
        room = (self.width() - st.pixelMetric(QStyle.PixelMetric.PM_IndicatorWidth, None, self)
                - st.pixelMetric(QStyle.PixelMetric.PM_CheckBoxLabelSpacing, None, self) - 4)  # fmt: skip
        self.setText(
            self.fontMetrics().elidedText(self.full_text, Qt.TextElideMode.ElideMiddle, max(room, 0))
        )
