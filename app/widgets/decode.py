"""The Decode panel: a VAE and a latent (or an image to encode), full / tiled / auto, tile size and
overlap, the memory estimate before running, progress with ETA, the tiles drawn over the canvas as
they finish, the result with zoom, save. A video latent's clip plays in place: a frame slider and a
Play button (a QSlider and a QTimer at the family's frame rate; PySide6-Essentials has no QtMultimedia),
saved as MP4, animated WebP or a folder of PNG frames. The panel sends its own requests: the estimate
(header reads, answered by a background thread of the engine client), the decode or encode itself, and
the clip's save (an IO request: the GUI thread never writes files). A sound's latent (LTX-2's, MiniMax-H3's,
Kandinsky 6's) decodes through a sound decoder of the library, drawn as its waveform and saved as WAV; a dropped
sound encodes through an audio VAE whose file holds its encoder (LTX-2's, MiniMax-H3's) to a latent beside it, which
then becomes the input: Decode plays back what a model would get."""

from __future__ import annotations

import os
import time
from functools import partial

from PySide6.QtCore import QRectF, Qt, Signal, Slot
from PySide6.QtGui import QBrush, QColor, QImage, QPen, QPixmap
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGraphicsPixmapItem,
    QGraphicsRectItem,
    QGraphicsScene,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from app.widgets import decode_inputs as di
from app.widgets.clip_player import ClipPlayer
from app.widgets.zoom_view import ZoomView
from engine.detect.audio_vaes import sound_part
from engine.events import EventKind
from engine.formatting import tiles_text
from engine.requests import (
    AudioResult,
    Decode,
    DecodeAudio,
    DecodeEstimate,
    Encode,
    EncodeAudio,
    EncodedAudio,
    EstimateDecode,
)


class DecodePanel(QWidget):
    message = Signal(str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.client = None  # app.bridge.EngineClient, once attached
        self.job_id: int | None = None
        self._estimate: DecodeEstimate | str | None = None  # the engine's answer, or why it has none
        self._estimates = 0  # estimates asked for: an answer to an older one is dropped
        self.started = 0.0
        self.tiles: list[tuple[int, int, int, int]] = []
        self.tiles_done = 0
        self.result = None
        self.free_bytes: int | None = None
        self.setAcceptDrops(True)

        self.vae_box = QComboBox()
        self.vae_box.setPlaceholderText("no VAE in the library")
        self.input_edit = QLineEdit(placeholderText="a .latent file, or an image to encode — drop it here")
        browse = QPushButton("…")
        browse.setMaximumWidth(30)
        browse.clicked.connect(self._on_browse_clicked)
        self.mode_box = QComboBox()
        for m in ("auto", "full", "tiled"):
            self.mode_box.addItem(m, m)
        self.tile_spin = QSpinBox(minimum=64, maximum=4096, singleStep=64, value=512, suffix=" px")
        self.overlap_spin = QSpinBox(minimum=0, maximum=128, singleStep=8, value=64, suffix=" px")
        self.estimate = QLabel("")
        self.estimate.setWordWrap(True)
        self.run_button = QPushButton("Decode")
        self.run_button.setDefault(True)
        self.progress = QProgressBar()
        self.progress.setMaximumHeight(14)
        self.eta = QLabel("")
        self.save_button = QPushButton("Save…")
        self.save_button.setEnabled(False)
        fit, one = QPushButton("Fit"), QPushButton("100 %")
        self.tiles_box = QCheckBox("Tiles")
        self.tiles_box.setChecked(True)
        self.tiles_box.setToolTip("Outline the tiles over the image (to look for seams at their borders)")
        self.tiles_box.toggled.connect(self._on_tiles_toggled)
        self.scene = QGraphicsScene(self)
        self.view = ZoomView(self.scene)
        self.pixmap_item = QGraphicsPixmapItem()
        self.scene.addItem(self.pixmap_item)
        self.tile_items: list[QGraphicsRectItem] = []
        self.player = ClipPlayer(self.pixmap_item.setPixmap)  # a clip: Play and a frame slider
        self.video = False  # the running decode is a video's (tiles finish one after another)

        for w in (self.input_edit,):
            w.textChanged.connect(self._on_inputs_changed)
        for w in (self.vae_box, self.mode_box):
            w.currentIndexChanged.connect(self._on_inputs_changed)
        self.overlap_spin.setToolTip(
            "How much of each tile is shared with its neighbours (at most a quarter of the tile). Image "
            "VAEs exchange tile borders, so the result is the full decode's whatever the overlap; a "
            "video VAE's tiles borrow it as context and blend across it"
        )
        # Past tile/4 a tile is mostly overlap: for a video VAE, whose tiles carry it as context, the
        # work grows with its square; image tiles only get smaller. ComfyUI's tiled nodes cap it alike.
        self.tile_spin.valueChanged.connect(lambda v: self.overlap_spin.setMaximum(v // 4))
        for w in (self.tile_spin, self.overlap_spin):
            w.valueChanged.connect(self._on_inputs_changed)
        self.run_button.clicked.connect(self._on_run_clicked)
        self.save_button.clicked.connect(self._on_save_clicked)
        fit.clicked.connect(self.fit)
        one.clicked.connect(self.view.actual_size)

        form = QFormLayout()
        form.addRow("VAE", self.vae_box)
        row = QHBoxLayout()
        row.addWidget(self.input_edit, 1)
        row.addWidget(browse)
        form.addRow("Input", row)
        opts = QHBoxLayout()
        opts.addWidget(self.mode_box)
        opts.addWidget(QLabel("tile"))
        opts.addWidget(self.tile_spin)
        opts.addWidget(QLabel("overlap"))
        opts.addWidget(self.overlap_spin)
        opts.addStretch(1)
        form.addRow("Mode", opts)
        run = QHBoxLayout()
        run.addWidget(self.run_button)
        run.addWidget(self.progress, 1)
        run.addWidget(self.eta)
        tools = QHBoxLayout()
        tools.addWidget(fit)
        tools.addWidget(one)
        tools.addWidget(self.tiles_box)
        tools.addStretch(1)
        tools.addWidget(self.save_button)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(4, 4, 4, 4)
        lay.addLayout(form)
        lay.addWidget(self.estimate)
        lay.addLayout(run)
        lay.addWidget(self.view, 1)
        lay.addWidget(self.player)
        lay.addLayout(tools)
        self._on_inputs_changed()

    # -- wiring ---------------------------------------------------------------------------------------

    def attach(self, client) -> None:
        """Send this panel's requests through `client`; follow its decode events and tile progress."""
        self.client = client
        client.event.connect(self.on_event)
        client.job_progress.connect(self.on_progress)
        self._on_inputs_changed()

    def set_library(self, entries) -> None:
        cur = self.vae_box.currentData()
        have = {self.vae_box.itemData(i) for i in range(self.vae_box.count())}
        for e in entries:  # a vocoder alone decodes no latent: the audio VAE beside it brings it
            if (
                e.kind in ("vae", "vae_approx")
                and not e.error
                and e.path not in have
                and sound_part(e.detection) != "vocoder"
            ):
                self.vae_box.addItem(f"{e.name} ({e.architecture or e.kind})", e.path)
                self.vae_box.setItemData(self.vae_box.count() - 1, e, Qt.ItemDataRole.UserRole + 1)
        if cur:
            self.vae_box.setCurrentIndex(self.vae_box.findData(cur))
        self.pick_vae()
        self._on_inputs_changed()

    def pick_vae(self) -> None:
        """Keep the chosen VAE if it can take the input; else choose one that can (one that holds its
        weights first, then a full VAE before a TAESD approximation). Without this the box showed no
        choice at all until the user picked one."""
        need = di.input_kind(self.input_edit.text().strip()) or "latent"
        cur = self.vae_box.currentData()
        if cur and di.suits(cur, need, self._is_sound(cur)):
            return
        paths = [self.vae_box.itemData(i) for i in range(self.vae_box.count())]
        fit = [p for p in paths if di.suits(p, need, self._is_sound(p))]
        if fit:
            best = max(fit, key=lambda p: (di.holds_weights(p), not self._is_approx(p)))
            self.vae_box.setCurrentIndex(self.vae_box.findData(best))

    def _is_approx(self, path: str) -> bool:
        e = self.vae_box.itemData(self.vae_box.findData(path), Qt.ItemDataRole.UserRole + 1)
        return e is not None and e.kind == "vae_approx"

    def _is_sound(self, path: str) -> bool:
        e = self.vae_box.itemData(self.vae_box.findData(path), Qt.ItemDataRole.UserRole + 1)
        return e is not None and sound_part(e.detection) == "vae"

    def set_vae(self, path: str) -> bool:
        i = self.vae_box.findData(os.path.abspath(path))
        if i >= 0:
            self.vae_box.setCurrentIndex(i)
        return i >= 0

    def set_input(self, path: str) -> bool:
        """A dropped or chosen file becomes the input if it is a latent or an image."""
        if di.input_kind(path) is None:
            self.message.emit(f"{os.path.basename(path)} is neither a latent (.latent, .safetensors) nor an "
                              "image (.png, .jpg, .webp), a clip (.mp4, .webm, .gif, a folder of frames) or a sound "
                              "(.wav, .flac, .mp3, ...): Decode cannot use it.", "warning")  # fmt: skip
            return False
        self.input_edit.setText(os.path.abspath(path))
        self.pick_vae()
        return True

    def dragEnterEvent(self, e) -> None:
        if e.mimeData().hasUrls():
            e.acceptProposedAction()

    def dropEvent(self, e) -> None:
        paths = [u.toLocalFile() for u in e.mimeData().urls() if u.isLocalFile()]
        if paths:
            self.set_input(paths[0])
            e.acceptProposedAction()

    # -- estimate -----------------------------------------------------------------------------------------

    def request(self) -> Decode | Encode | DecodeAudio | EncodeAudio | None:
        vae, src = self.vae_box.currentData(), self.input_edit.text().strip()
        if not vae or not src:
            return None
        return di.request_for(
            vae, src, self.mode_box.currentData(), self.tile_spin.value(), self.overlap_spin.value()
        )

    def ask_estimate(self) -> None:
        """Ask the engine for the inputs' estimate (header reads, off the GUI thread)."""
        req = self.request()
        self._estimates += 1
        self._estimate = None
        if req is None or self.client is None or isinstance(req, EncodeAudio):
            self.estimate.setText(self.estimate_text())
            return
        source = req.latent if isinstance(req, (Decode, DecodeAudio)) else req.image
        n = self._estimates
        self.client.submit(EstimateDecode(req.vae, source, self.tile_spin.value()),
                           partial(self._on_estimated, n), partial(self._on_estimate_failed, n))  # fmt: skip
        if isinstance(req, DecodeAudio):  # what runs is said at once; its memory follows
            self.estimate.setText(self.estimate_text())

    def _on_estimated(self, n: int, est: DecodeEstimate) -> None:
        if n == self._estimates:
            self._estimate = est
            self.estimate.setText(self.estimate_text())

    def _on_estimate_failed(self, n: int, info) -> None:
        if n == self._estimates:  # a bad input is reported here, before anything runs
            self._estimate = info.message
            self.estimate.setText(self.estimate_text())

    def estimate_text(self) -> str:
        """'will it fit?': the engine's estimate for the inputs against the free memory now."""
        est = self._estimate
        req = self.request()
        if req is None:
            return "Choose a VAE and a latent (or an image to encode)."
        if isinstance(req, EncodeAudio):  # run whole, said without an estimate
            return di.sound_line(req, di.suits(req.vae, "sound", self._is_sound(req.vae)))
        if est is None:  # the answer is on its way: keep what is shown (a sound's line says what runs)
            return di.sound_line(req, True) if isinstance(req, DecodeAudio) else self.estimate.text()
        if isinstance(est, str):
            return f"<span style='color:#c0392b'>{os.path.basename(self.input_edit.text())}: {est}</span>"
        if isinstance(req, DecodeAudio):
            return di.sound_line(req, True, est, self.free_bytes)
        return di.estimate_line(est, self.free_bytes, self.mode_box.currentData())

    def set_free_bytes(self, free: int) -> None:
        changed = self.free_bytes is None or abs(free - self.free_bytes) > 64 * 2**20
        self.free_bytes = free
        if changed:
            self.estimate.setText(self.estimate_text())

    @Slot()
    def _on_inputs_changed(self, *_):
        req = self.request()
        self.run_button.setText("Encode" if isinstance(req, (Encode, EncodeAudio)) else "Decode")
        self.run_button.setEnabled(req is not None and self.job_id is None)
        sound = isinstance(req, (DecodeAudio, EncodeAudio))  # run whole: no mode, no tiles
        tiled = self.mode_box.currentData() == "tiled" and not sound
        self.mode_box.setEnabled(not sound)
        self.tile_spin.setEnabled(tiled)
        self.overlap_spin.setEnabled(tiled)
        self.ask_estimate()

    # -- running ---------------------------------------------------------------------------------------------

    @Slot()
    def _on_run_clicked(self) -> None:
        req = self.request()
        if req is None:
            return
        self.started = time.monotonic()
        self.tiles, self.tiles_done = [], 0
        self.player.clear()
        self.progress.setRange(0, 0)
        self.eta.setText("")
        self.run_button.setEnabled(False)
        self.job_id = self.client.submit(req, self._on_done, self._on_failed, on_cancelled=self._on_cancelled)

    def on_event(self, event) -> None:
        """The engine's own tiling: outline the tiles it will run (and again if a retry changes them)."""
        if event.kind == EventKind.DECODE_STARTED and event.direction == "decode" and event.media != "sound":
            self.tiles, self.tiles_done = list(event.tiling.rects), 0
            self.video = event.tiling.tile_frames > 0
            shape = event.latent_shape or (1, 4, 64, 64)
            f = getattr(event, "downscale", 8) or 8
            self._canvas(shape[-1] * f, shape[-2] * f)
        elif event.kind == EventKind.TILING_CHANGED and self.job_id is not None:
            self.tiles, self.tiles_done = list(event.tiling.rects), 0
            r = self.scene.sceneRect()
            self._canvas(int(r.width()), int(r.height()))

    def _canvas(self, w: int, h: int) -> None:
        """A dark canvas of the output size with every tile outlined (filled as it finishes)."""
        pm = QPixmap(w, h)
        pm.fill(QColor("#3d4548"))
        self.pixmap_item.setPixmap(pm)
        for it in self.tile_items:
            self.scene.removeItem(it)
        self.tile_items = []
        for y0, y1, x0, x1 in self.tiles:
            it = QGraphicsRectItem(QRectF(x0, y0, x1 - x0, y1 - y0))
            it.setPen(QPen(QColor("#74b9ff"), 0))
            it.setVisible(self.tiles_box.isChecked())
            self.scene.addItem(it)
            self.tile_items.append(it)
        self.scene.setSceneRect(0, 0, w, h)
        self.fit()

    @Slot(bool)
    def _on_tiles_toggled(self, on: bool) -> None:
        for it in self.tile_items:
            it.setVisible(on)

    def on_progress(self, job, p) -> None:
        if job.id != self.job_id:
            return
        if p.total:
            self.progress.setRange(0, p.total)
            self.progress.setValue(p.done)
            el = time.monotonic() - self.started
            frac = p.done / p.total
            self.eta.setText(f"{el:.1f} s" + (f" · ETA {el / frac - el:.1f} s" if 0 < frac < 1 else ""))
            self.eta.setToolTip(p.detail)  # e.g. "tile 3/8, latent frames 4-7 of 21"
        t = p.tile
        if t is not None and t.count == len(self.tile_items) and 0 <= t.index < t.count:
            it = self.tile_items[t.index]
            if t.pass_index == t.passes:  # the last pass writes the tile's pixels: it is finished
                it.setBrush(QBrush(QColor(46, 204, 113, 120)))
                # reports are throttled (some never arrive): count finished tiles from `done`; a video's
                # tiles run one after another through all their temporal chunks
                done = t.index + 1 if self.video else p.done - (t.passes - 1) * t.count
                self.tiles_done = max(self.tiles_done, done)
            else:
                it.setBrush(QBrush(QColor(116, 185, 255, 40 + 120 * t.pass_index // max(t.passes, 1))))

    def _on_done(self, result) -> None:
        self.job_id = None
        self.result = result
        if isinstance(result, (AudioResult, EncodedAudio)):
            return self._on_sound(result)
        img = QImage(
            result.rgb, result.width, result.height, result.width * 3, QImage.Format.Format_RGB888
        ).copy()
        self.pixmap_item.setPixmap(QPixmap.fromImage(img))
        for it in self.tile_items:  # keep the tile grid as thin outlines over the result
            it.setBrush(QBrush(Qt.BrushStyle.NoBrush))
            it.setPen(QPen(QColor(255, 255, 255, 60), 0))
        self.scene.setSceneRect(0, 0, result.width, result.height)
        self.fit()
        info = result.info
        mode = f"{info.get('mode')}" + (
            f", {tiles_text(info.get('tiles'), info.get('tile_px'))}" if info.get("mode") == "tiled" else ""
        )
        wrote = f" · wrote {os.path.basename(result.source)}" if info.get("out") else ""  # an encode's latent
        if info.get("encoded_size") and info.get("image_size") != info.get("encoded_size"):
            (w, h), (ew, eh) = info["image_size"], info["encoded_size"]
            wrote += f" · {w}×{h} cropped to {ew}×{eh} (whole latent pixels)"
        frames = getattr(result, "frames", ())
        if frames:
            chunks = info.get("tile_frames")  # a decode's; an encode's round trip says its frames only
            mode += f", {len(frames)} frames" + (f" in chunks of {chunks} latent frames" if chunks else "")
            mode += ", retry snapshots in host RAM" if info.get("snapshot") == "host" else ""
        self.player.set_result(result)
        self.eta.setText(f"done in {result.seconds:.2f} s ({mode}){wrote}")
        self.eta.setToolTip(result.source)
        if info.get(
            "notes"
        ):  # what the run had to decide for the user (frames left out, an fp32 re-run, ...)
            self.message.emit("; ".join(info["notes"]), "info")
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.save_button.setEnabled(True)
        self._on_inputs_changed()

    def _on_sound(self, r: AudioResult | EncodedAudio) -> None:
        """A decoded sound's waveform (Save writes it as WAV); an encoded one's latent becomes the input."""
        encoded = isinstance(r, EncodedAudio)
        # an encode shows an empty canvas: nothing stale beside its text
        img = QImage() if encoded else di.waveform_image(r.samples, r.channels)
        self.pixmap_item.setPixmap(QPixmap.fromImage(img))
        self.scene.setSceneRect(0, 0, img.width(), img.height())
        self.fit()
        wrote = f" · wrote {os.path.basename(r.out)}" if encoded else ""
        self.eta.setText(f"done in {r.seconds:.2f} s ({di.sound_text(r)}){wrote}")
        self.progress.setRange(0, 1)
        self.progress.setValue(1)
        self.save_button.setEnabled(not encoded)  # the latent is written already
        if r.info.get("notes"):
            self.message.emit("; ".join(r.info["notes"]), "info")
        if encoded:
            self.set_input(r.out)  # Decode now plays back what a model would get
        self._on_inputs_changed()

    def _on_failed(self, info) -> None:
        self.job_id = None
        self.eta.setText("failed")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self._on_inputs_changed()
        self.client.report_error(info)  # the user hears why, as of any failed job

    def _on_cancelled(self) -> None:
        self.job_id = None
        self.eta.setText(
            f"stopped after {self.tiles_done} of {len(self.tiles)} tiles" if self.tiles else "stopped"
        )
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        for it in self.tile_items[self.tiles_done :]:
            it.setBrush(QBrush(Qt.BrushStyle.NoBrush))
        self._on_inputs_changed()

    @Slot()
    def fit(self) -> None:
        self.view.fit()

    @Slot()
    def _on_browse_clicked(self) -> None:
        folder = os.path.dirname(self.input_edit.text())
        path, _ = QFileDialog.getOpenFileName(
            self, "A latent, an image, a clip or a sound", folder, di.BROWSE_FILTER
        )
        if path:
            self.set_input(path)

    CLIP_FILTERS = "MP4 video (*.mp4);;Animated WebP (*.webp);;PNG frames (a folder)"

    @Slot()
    def _on_save_clicked(self) -> None:
        if self.result is None:
            return
        if isinstance(self.result, AudioResult):
            start = os.path.splitext(self.result.source)[0] + ".wav"
            path, _ = QFileDialog.getSaveFileName(self, "Save the sound", start, "WAV (*.wav)")
            if path:
                self.save(path)
            return
        if self.player.frame_count():
            start = os.path.splitext(self.result.source)[0] + ".mp4"
            path, chosen = QFileDialog.getSaveFileName(self, "Save the clip", start, self.CLIP_FILTERS)
            if path and chosen.startswith("PNG frames"):
                path = os.path.splitext(path)[0] + "/"
            if path:
                self.save(path)
            return
        start = os.path.splitext(self.result.source)[0] + ".png"
        path, _ = QFileDialog.getSaveFileName(self, "Save the image", start, "PNG (*.png)")
        if path:
            self.save(path)

    def save(self, path: str) -> None:
        """An image as PNG; a clip as .mp4 / .webp / folder/, a sound as .wav, through the engine's IO thread
        (atomically)."""
        saving = di.save_request(self.result, path, bool(self.player.frame_count()))
        if saving is not None:
            req, said = saving
            self.client.submit(req, lambda done: self.message.emit(said, "info"), self.client.report_error)
            return
        self.pixmap_item.pixmap().save(path, "PNG")
        self.message.emit(f"Saved {path}", "info")
