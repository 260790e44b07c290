"""The non-modal message bar: errors a user can act on (a bad file, nothing loaded, out of memory)
and notices, shown above the panels without stopping anything; the last ones are kept in a list."""

from __future__ import annotations

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QSizePolicy, QToolBar, QToolButton, QWidget

STYLES = {
    "error": "background:#fdecea; color:#7b1d14; border:1px solid #f5c6cb;",
    "warning": "background:#fff4e5; color:#6b4300; border:1px solid #ffd8a8;",
    "info": "background:#e8f4fd; color:#0b3d62; border:1px solid #b6dcfb;",
}


class MessageBar(QFrame):
    HIDE_AFTER_MS = {"info": 6000, "warning": 15000, "error": 0}  # errors stay until closed
    visibility_changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.history: list[tuple[str, str]] = []  # (level, text)
        self.label = QLabel(wordWrap=True, textInteractionFlags=Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        close = QToolButton(text="✕", autoRaise=True)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.clear)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(8, 3, 4, 3)
        lay.addWidget(self.label, 1)
        lay.addWidget(close)
        self._timer = QTimer(self, singleShot=True)
        self._timer.timeout.connect(self.clear)
        self.shown = False

    def toolbar(self, window: QWidget) -> QToolBar:
        """The window's toolbar holding this bar, shown exactly while a message is (its menu entry hidden).
        The window's saved state restores toolbars' visibility too: the window sets it from `shown` after
        restoring, or a window closed while it showed a message would open with an empty bar."""
        tb = QToolBar("Messages", window)
        tb.setObjectName("toolbar-messages")
        tb.setMovable(False)
        tb.addWidget(self)
        self.visibility_changed.connect(tb.setVisible)
        tb.toggleViewAction().setVisible(False)
        return tb

    @property
    def text(self) -> str:
        return self.label.text()

    def show_message(self, text: str, level: str = "info") -> None:
        self.history.append((level, text))
        del self.history[:-200]
        self.setStyleSheet(f"MessageBar {{{STYLES.get(level, STYLES['info'])} border-radius:4px;}}")
        self.label.setText(text)
        self.shown = True
        self.visibility_changed.emit(True)
        ms = self.HIDE_AFTER_MS.get(level, 6000)
        if ms:
            self._timer.start(ms)
        else:
            self._timer.stop()

    @Slot()
    def clear(self) -> None:
        self.shown = False
        self.visibility_changed.emit(False)
