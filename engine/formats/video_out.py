"""Writing decoded clips: H.264 MP4 (PyAV's bundled FFmpeg), animated WebP (Pillow), or one PNG per frame
in a folder (`000000.png`, `000001.png`, ...). Every output is written atomically: a file through a
temporary sibling renamed into place, a folder of frames built beside its target and renamed in whole,
so an interrupted write never leaves a half video or a half-filled folder behind.

Frames are RGB 8-bit, row-major `height * width * 3` bytes (DecodeResult.frames).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ..errors import EngineError
from .atomic import atomic_output, atomic_path

VIDEO_SUFFIXES = (".mp4", ".webp")
# A clip's sound: float32 samples in [-1, 1] interleaved frame by frame, the channel count, the sample rate
Audio = tuple[bytes, int, int]


def kind_of(out: str) -> str:
    """'frames' for a folder (ends with a slash), 'mp4', 'webp', 'png' or 'wav' (a sound) from the suffix."""
    if out.endswith(("/", os.sep)):
        return "frames"
    suffix = Path(out).suffix.lower()
    if suffix in (".mp4", ".webp", ".png", ".wav"):
        return suffix[1:]
    raise EngineError(
        f"{out}: write a .png, .mp4, .webp, a folder ending with '/' for one PNG per frame, or .wav for an audio latent"
    )


def write_clip(
    out: str, frames: Sequence[bytes], width: int, height: int, fps: float, audio: Audio | None = None
) -> list[str]:
    """Write `frames` to `out` as its suffix says (`audio`, the clip's sound, into an MP4 only); returns the paths
    written."""
    kind = kind_of(out)
    if not frames:
        raise EngineError("nothing to write: the decode returned no frames")
    if audio is not None and kind != "mp4":
        raise EngineError(f"{out}: a clip with sound goes to a .mp4 (its sound alone to a .wav)")
    if kind == "frames":
        return write_png_frames(out, frames, width, height)
    if kind == "webp":
        write_webp(out, frames, width, height, fps)
    elif kind == "mp4":
        write_mp4(out, frames, width, height, fps, audio=audio)
    else:
        if len(frames) != 1:
            raise EngineError(f"{out}: a clip of {len(frames)} frames goes to a .mp4, a .webp or a folder/")
        _png(out, frames[0], width, height)
    return [out]


def _image(rgb: bytes, width: int, height: int):
    from PIL import Image

    return Image.frombytes("RGB", (width, height), rgb)


def _png(path, rgb: bytes, width: int, height: int) -> None:
    with atomic_output(path) as f:
        _image(rgb, width, height).save(f, format="PNG")


def write_png_frames(folder: str, frames: Sequence[bytes], width: int, height: int) -> list[str]:
    """`folder`/000000.png ...: built in a temporary folder beside it, then renamed into place (a folder
    that exists is replaced only when the new one is complete)."""
    target = Path(folder.rstrip("/" + os.sep))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for i, rgb in enumerate(frames):
            _image(rgb, width, height).save(tmp / f"{i:06d}.png", format="PNG")
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old.", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return [str(target / f"{i:06d}.png") for i in range(len(frames))]


def write_webp(path: str, frames: Sequence[bytes], width: int, height: int, fps: float) -> None:
    """Animated WebP, lossless, looping, each frame shown 1000 / fps ms."""
    images = [_image(rgb, width, height) for rgb in frames]
    with atomic_output(path) as f:
        images[0].save(f, format="WEBP", save_all=True, append_images=images[1:], duration=round(1000 / fps),
                       loop=0, lossless=True)  # fmt: skip


def write_mp4(
    path: str,
    frames: Sequence[bytes],
    width: int,
    height: int,
    fps: float,
    crf: int = 18,
    audio: Audio | None = None,
) -> None:
    """H.264 in MP4 (yuv420p, so every player takes it: odd sizes are padded by one pixel, as H.264's
    4:2:0 chroma needs even ones), with `audio` as an AAC track beside it. FFmpeg writes a temporary file by its
    path (not through a Python file object: PyAV's Python-IO bridge leaves buffers for the garbage collector),
    renamed into place."""
    from fractions import Fraction

    import av
    import numpy as np

    ew, eh = width + width % 2, height + height % 2
    with atomic_path(path, ".part.mp4") as tmp, av.open(tmp, mode="w", format="mp4") as box:
        stream = box.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
        stream.width, stream.height, stream.pix_fmt = ew, eh, "yuv420p"
        stream.options = {"crf": str(crf)}
        sound = (
            _audio_stream(box, audio[1], audio[2]) if audio is not None else None
        )  # before the header is written
        for rgb in frames:
            a = np.frombuffer(rgb, dtype=np.uint8).reshape(height, width, 3)
            if (ew, eh) != (width, height):
                a = np.pad(a, ((0, eh - height), (0, ew - width), (0, 0)), mode="edge")
            for packet in stream.encode(av.VideoFrame.from_ndarray(a, format="rgb24")):
                box.mux(packet)
        for packet in stream.encode():
            box.mux(packet)
        if sound is not None:
            _mux_audio(box, sound, audio[0], audio[1], audio[2])


def _audio_stream(box, channels: int, rate: int):
    layout = {1: "mono", 2: "stereo"}.get(channels)
    if layout is None:
        raise EngineError(f"{channels} audio channels: an MP4's sound here is mono or stereo")
    return box.add_stream("aac", rate=rate, layout=layout)


def _mux_audio(box, stream, samples: bytes, channels: int, rate: int) -> None:
    """AAC (FFmpeg's encoder, which frames the samples itself) of planar float samples."""
    import av
    import numpy as np

    planar = np.frombuffer(samples, dtype="<f4").reshape(-1, channels).T.copy()
    frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout=stream.layout.name)
    frame.sample_rate, frame.pts = rate, 0
    for packet in (*stream.encode(frame), *stream.encode()):
        box.mux(packet)
