"""What the Decode panel's inputs are, from names and headers: an image or clip to encode, a latent to decode (a
picture's, a clip's, or a sound's), and which VAE files can take each; and the drawing of a decoded sound."""

from __future__ import annotations

import os

from PySide6.QtGui import QColor, QImage, QPainter, QPen

from engine.vae.clips import VIDEO_FILE_SUFFIXES

LATENT_SUFFIXES = (".latent", ".safetensors")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")
CLIP_SUFFIXES = VIDEO_FILE_SUFFIXES + (
    ".gif",
)  # encoded with a video VAE (an animated WebP is an image suffix)
# a sound to encode with an audio VAE's encoder (engine.formats.audio_in reads what FFmpeg reads)
SOUND_SUFFIXES = (".wav", ".flac", ".mp3", ".ogg", ".oga", ".opus", ".m4a", ".aac")
BROWSE_FILTER = "Latents, images, clips and sounds ({})".format(
    " ".join("*" + x for x in (*LATENT_SUFFIXES, *IMAGE_SUFFIXES, *CLIP_SUFFIXES, *SOUND_SUFFIXES))
)


def input_kind(path: str) -> str | None:
    """'image' for pixels to encode (an image, or a clip: a video file, an animated GIF / WebP, a folder of
    frames, engine.vae.clips), 'sound' for a sound to encode, 'audio' for a sound's latent (its header says so:
    engine.formats.latent), 'latent' for another latent to decode, None for anything else."""
    p = path.lower()
    if p.endswith(IMAGE_SUFFIXES + CLIP_SUFFIXES) or os.path.isdir(path):
        return "image"
    if p.endswith(SOUND_SUFFIXES):
        return "sound"
    if p.endswith(LATENT_SUFFIXES):
        return "audio" if _audio(path) else "latent"
    return None


_HEADS: dict[tuple[str, int, int, str], bool] = {}  # (path, size, mtime, question) -> the header's answer


def _audio(path: str) -> bool:
    from engine.formats.latent import audio_latent_key

    return _asked(path, "audio", lambda: audio_latent_key(path) is not None)


def _encodes_sound(path: str) -> bool:
    from engine.detect.audio_vaes import encodes_sound
    from engine.formats.safetensors import read_header

    return _asked(path, "encoder", lambda: encodes_sound(read_header(path).tensors))


def _asked(path: str, question: str, answer) -> bool:
    """A question of a file's header, asked once per (path, size, mtime)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    key = (path, st.st_size, st.st_mtime_ns, question)
    if key not in _HEADS:
        try:
            _HEADS[key] = answer()
        except Exception:  # noqa: BLE001 -- an unreadable file answers no; the run says what is wrong
            _HEADS[key] = False
    return _HEADS[key]


def holds_a_latent(path: str) -> bool:
    """A .safetensors file whose header names a latent (ComfyUI's `latent_tensor`, `latent`, `samples`, a `step`
    inputs file's audio latent): dropped on the window, it is Decode's input, not a model for the library."""
    from engine.formats.latent import AUDIO_KEYS
    from engine.formats.safetensors import read_header

    if not path.lower().endswith(".safetensors") or not os.path.isfile(path):
        return False
    try:
        return any(k in read_header(path).tensors for k in AUDIO_KEYS)
    except Exception:  # noqa: BLE001 -- unreadable: the library reports what it is
        return False


def request_for(vae: str, src: str, mode: str, tile: int, overlap: int):
    """The job for the inputs: an image or clip to encode, a sound to encode (each to a .latent beside it), a sound's
    latent or another latent to decode."""
    from engine.requests import Decode, DecodeAudio, Encode, EncodeAudio

    kind = input_kind(src)
    out = os.path.splitext(src)[0] + ".latent"
    if kind == "image":
        return Encode(vae, src, out, mode, tile, overlap)
    if kind == "sound":
        return EncodeAudio(vae, src, out)
    return DecodeAudio(vae, src) if kind == "audio" else Decode(vae, src, mode, tile, overlap)


def sound_line(req, encodes: bool, est=None, free: int | None = None) -> str:
    """What a sound's job will do (it runs whole: no tiles) with a decode's estimate (`est`, a DecodeEstimate) against
    the free memory, or, for a sound to encode with a VAE that cannot (`encodes` False), what to choose instead."""
    if not hasattr(req, "out"):
        from engine.formatting import human_bytes

        line = "A sound's latent: decoded whole (the audio VAE, then its vocoder) in float32, shown as its waveform"
        if est is None:
            return line + "."
        return f"{line} ≈ {human_bytes(est.full_bytes)}{_verdict(est.full_bytes, free)}"
    if not encodes:
        return ("A sound: this VAE cannot encode it; choose an audio VAE whose file holds its encoder (LTX-2's, "
                "MiniMax-H3's).")  # fmt: skip
    return (f"A sound: encoded whole by the audio VAE's encoder in float32 to {os.path.basename(req.out)}, which then "
            "becomes the input (Decode plays back what a model gets).")  # fmt: skip


def suits(path: str, need: str, sound: bool = False) -> bool:
    """Whether the VAE file can take this input: a sound decoder (`sound`, from its detection) takes audio latents,
    and sounds where its file holds an encoder Loadout runs (engine.detect.audio_vaes.encodes_sound); a
    TAESD-family *_encoder file cannot decode, a *_decoder file cannot encode (their headers hold one half;
    the names say which, as madebyollin's taesd_decoder/taesd_encoder files and ComfyUI's vae_approx folder use
    them)."""
    if (need in ("audio", "sound")) != sound:
        return False
    if need == "sound":
        return _encodes_sound(path)
    name = os.path.basename(path).lower()
    return "decoder" not in name if need == "image" else "encoder" not in name


def holds_weights(path: str) -> bool:
    """False for a header-faithful sparse file (the demo's big models): its data region is a hole, so it
    would decode to nothing. The library's own test (it skips hashing such files) decides."""
    from engine.catalog.hashing import is_sparse

    try:
        return not is_sparse(os.stat(path))
    except OSError:
        return False


def waveform_image(samples: bytes, channels: int, width: int = 1200, lane: int = 120) -> QImage:
    """A decoded sound as a picture: each channel a lane, each column the lowest and highest sample it covers."""
    import numpy as np

    x = np.frombuffer(samples, dtype="<f4").reshape(-1, channels)
    n = max(1, len(x))
    edges = np.linspace(0, n, width + 1).astype(np.int64)
    img = QImage(width, lane * channels, QImage.Format.Format_RGB888)
    img.fill(QColor("#2d3436"))
    p = QPainter(img)
    for c in range(channels):
        mid = lane * c + lane // 2
        p.setPen(QPen(QColor("#636e72"), 1))
        p.drawLine(0, mid, width, mid)
        p.setPen(QPen(QColor("#74b9ff"), 1))
        for i in range(width):
            part = x[edges[i] : max(edges[i + 1], edges[i] + 1), c]
            if part.size:
                hi, lo = float(part.max()), float(part.min())
                p.drawLine(i, int(mid - hi * (lane // 2 - 4)), i, int(mid - lo * (lane // 2 - 4)))
    p.end()
    return img


def estimate_line(est, free: int | None, mode: str) -> str:
    """'will it fit?': a decode's or encode's estimate (engine.requests.DecodeEstimate) against the free memory."""
    from engine.formatting import human_bytes

    verdict = ""
    if free is not None:
        need = est.tiled_bytes if mode == "tiled" else est.full_bytes
        if mode == "auto" and est.full_bytes > free:
            verdict = f" · <b>will tile</b> ({human_bytes(free)} free)"
        else:
            verdict = _verdict(need, free)
    frames = f"×{est.frames} frames" if est.frames else ""
    one = " (one tile: the image is smaller)" if (est.tile or 0) >= max(est.width, est.height) else ""
    return (f"{est.width}×{est.height}{frames} {est.direction}: full ≈ {human_bytes(est.full_bytes)}, tiled at "
            f"{est.tile} px{one} ≈ {human_bytes(est.tiled_bytes)}{verdict}")  # fmt: skip


def _verdict(need: int, free: int | None) -> str:
    from engine.formatting import human_bytes

    if free is None:
        return ""
    if need > free:
        return f" · <b style='color:#c0392b'>will not fit</b> in {human_bytes(free)} free"
    return f" · <b style='color:#27ae60'>fits</b> ({human_bytes(free)} free)"


def sound_text(r) -> str:
    """'2.00 s of stereo at 48000 Hz, bwe' for an engine.requests.AudioResult; for an EncodedAudio
    '1.50 s of mono at 22050 Hz to a latent 1×8×38×16'."""
    if not hasattr(r, "channels"):  # an encode: its info says what was read and made
        i = r.info
        chans = {1: "mono", 2: "stereo"}.get(i["channels"], f"{i['channels']} channels")
        shape = "×".join(map(str, i["latent_shape"]))
        return f"{i['audio_seconds']:.2f} s of {chans} at {i['source_rate']} Hz to a latent {shape}"
    chans = {1: "mono", 2: "stereo"}.get(r.channels, f"{r.channels} channels")
    return f"{r.info['audio_seconds']:.2f} s of {chans} at {r.sample_rate} Hz, {r.info['vocoder']}"


def save_request(r, path: str, clip: bool):
    """(the IO request that saves result `r` at `path`, its suffix added where missing; what to say once saved):
    a sound as WAV, a clip as MP4 (or .webp, or a folder/ of PNGs); None for a still image (the panel saves its
    pixmap)."""
    from engine.requests import AudioResult, SaveAudio, SaveClip

    if isinstance(r, AudioResult):
        path = path if path.lower().endswith(".wav") else path + ".wav"
        return SaveAudio(path, r.samples, r.channels, r.sample_rate), f"Saved {path}"
    if clip:
        if not path.lower().endswith((".mp4", ".webp", "/")):
            path += ".mp4"
        req = SaveClip(path, r.frames, r.width, r.height, r.fps or 16.0)
        return req, f"Saved {path} ({len(r.frames)} frames)"
    return None
