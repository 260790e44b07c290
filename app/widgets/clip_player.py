"""A decoded clip in the Decode panel: a Play / Pause button, a frame slider and the frame's number and
time; frames are shown on the panel's canvas. A QSlider and a QTimer at the clip's frame rate, looping
as the saved WebP does (PySide6-Essentials has no QtMultimedia)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtGui import QImage, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QSlider, QWidget


class ClipPlayer(QWidget):
    def __init__(self, show: Callable[[QPixmap], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._show = show  # puts a frame on the canvas
        self.result = None  # a DecodeResult with frames
        self.frame_slider = QSlider(Qt.Orientation.Horizontal)
        self.frame_slider.setMinimum(0)
        self.frame_slider.valueChanged.connect(self.show_frame)
        self.play_button = QPushButton("▶ Play")
        self.play_button.setCheckable(True)
        self.play_button.toggled.connect(self._on_play_toggled)
        self.frame_label = QLabel("")
        self.timer = QTimer(self)
        self.timer.timeout.connect(self._next_frame)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.play_button)
        row.addWidget(self.frame_slider, 1)
        row.addWidget(self.frame_label)
        self.setVisible(False)

    @property
    def fps(self) -> float:
        return getattr(self.result, "fps", 0) or 16.0

    def frame_count(self) -> int:
        return len(getattr(self.result, "frames", ()) or ())

    def set_result(self, result) -> None:
        """Show `result`'s first frame and the controls when it is a clip; hide them otherwise."""
        self.play_button.setChecked(False)
        self.result = result
        n = self.frame_count()
        self.setVisible(n > 0)
        if n:
            self.frame_slider.blockSignals(True)
            self.frame_slider.setMaximum(n - 1)
            self.frame_slider.setValue(0)
            self.frame_slider.blockSignals(False)
            self.show_frame(0)

    def clear(self) -> None:
        self.play_button.setChecked(False)
        self.result = None
        self.setVisible(False)

    @Slot(int)
    def show_frame(self, i: int) -> None:
        """Show frame `i` of the clip."""
        n = self.frame_count()
        if not n:
            return
        i = max(0, min(i, n - 1))
        r = self.result
        img = QImage(r.frames[i], r.width, r.height, r.width * 3, QImage.Format.Format_RGB888).copy()
        self._show(QPixmap.fromImage(img))
        self.frame_label.setText(f"{i + 1}/{n} · {i / self.fps:.2f} s")
        if self.frame_slider.value() != i:
            self.frame_slider.setValue(i)

    @Slot(bool)
    def _on_play_toggled(self, on: bool) -> None:
        self.play_button.setText("⏸ Pause" if on else "▶ Play")
        if on and self.frame_count():
            self.timer.start(max(1, round(1000 / self.fps)))
        else:
            self.timer.stop()

    @Slot()
    def _next_frame(self) -> None:
        n = self.frame_count()
        if n:
            self.show_frame((self.frame_slider.value() + 1) % n)
