"""Reading clips to encode: a video file (MP4, MOV, MKV, WebM, AVI through PyAV's bundled FFmpeg), an animated
WebP or GIF (Pillow), or a folder of frames (PNG / JPEG / WebP, in natural name order: `frame_2.png` before
`frame_10.png`, as the folders `loadout decode --out DIR/` and ComfyUI write). The counterpart of
engine.formats.video_out.

`clip_info` answers from headers only (the window's estimate asks it before anything runs); `read_clip`
decodes at most `max_frames` frames from the start, so a long film is not read to encode its first seconds.
Frames are 8-bit RGB (alpha dropped, greyscale expanded, EXIF orientation applied to a folder's frames, as for
one image); every frame of a clip must have the first one's size. Anything unreadable is a FormatError that
says which file and why."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import FormatError

VIDEO_FILE_SUFFIXES = (".mp4", ".mov", ".mkv", ".webm", ".avi", ".m4v")
ANIMATED_SUFFIXES = (".webp", ".gif")  # a clip when they hold more than one frame
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


@dataclass(frozen=True)
class ClipInfo:
    width: int
    height: int
    frames: int  # frames the clip holds (a video file's from its header: 0 when the header does not say)
    fps: float | None  # None: a folder of frames says no rate


def _natural(name: str) -> list:
    return [int(s) if s.isdigit() else s.lower() for s in re.split(r"(\d+)", name)]


def frame_files(folder: str) -> list[str]:
    """The folder's image files in natural name order (hidden files and other files skipped)."""
    try:
        names = os.listdir(folder)
    except OSError as e:
        raise FormatError(f"{folder}: cannot list the folder ({e.strerror or e})", path=folder) from e
    names = [n for n in names if not n.startswith(".") and n.lower().endswith(FRAME_SUFFIXES)]
    if not names:
        raise FormatError(f"{folder}: no frames in the folder (PNG, JPEG or WebP files)", path=folder)
    return [os.path.join(folder, n) for n in sorted(names, key=_natural)]


def is_clip(path: str) -> bool:
    """A folder, a video file, or an animated WebP / GIF of more than one frame (header only)."""
    if os.path.isdir(path):
        return True
    suffix = Path(path).suffix.lower()
    if suffix in VIDEO_FILE_SUFFIXES:
        return True
    if suffix in ANIMATED_SUFFIXES:
        from PIL import Image

        try:
            with Image.open(path) as im:
                return getattr(im, "n_frames", 1) > 1
        except (OSError, ValueError):
            return False  # not readable: reading it as an image says why
    return False


def clip_info(path: str) -> ClipInfo:
    """Size, frame count and rate from headers (no frame is decoded)."""
    if os.path.isdir(path):
        from .images import image_size

        files = frame_files(path)
        w, h = image_size(files[0])
        return ClipInfo(w, h, len(files), None)
    if Path(path).suffix.lower() in VIDEO_FILE_SUFFIXES:
        with _open_av(path) as box:
            s = _video_stream(box, path)
            rate = float(s.average_rate) if s.average_rate else None
            return ClipInfo(s.codec_context.width, s.codec_context.height, int(s.frames or 0), rate)
    from PIL import Image

    try:
        with Image.open(path) as im:
            ms = im.info.get("duration") or 0
            return ClipInfo(im.size[0], im.size[1], getattr(im, "n_frames", 1), 1000.0 / ms if ms else None)
    except (OSError, ValueError) as e:
        raise FormatError(f"{os.path.basename(path)}: cannot read the clip ({e})", path=path) from e


def read_clip(path: str, max_frames: int | None = None):
    """(frames (F, H, W, 3) uint8 numpy array, fps or None): the clip's first `max_frames` frames (all if None)."""
    import numpy as np

    limit = max_frames if max_frames is not None else 1 << 31
    if os.path.isdir(path):
        from .images import read_rgb

        frames = [np.asarray(read_rgb(p)) for p in frame_files(path)[:limit]]
        return _stack(frames, path), None
    if Path(path).suffix.lower() in VIDEO_FILE_SUFFIXES:
        frames = []
        with _open_av(path) as box:
            s = _video_stream(box, path)
            rate = float(s.average_rate) if s.average_rate else None
            try:
                for frame in box.decode(s):
                    if len(frames) >= limit:
                        break
                    frames.append(frame.to_ndarray(format="rgb24"))
            except Exception as e:  # av.error.FFmpegError and its kin: a damaged stream
                if not frames:
                    raise FormatError(
                        f"{os.path.basename(path)}: cannot decode the video ({e})", path=path
                    ) from e
                # a truncated file: the frames before the damage are the clip (as players show them)
        return _stack(frames, path), rate
    from PIL import Image, ImageSequence

    try:
        with Image.open(path) as im:
            ms = im.info.get("duration") or 0
            frames = []
            for frame in ImageSequence.Iterator(im):
                if len(frames) >= limit:
                    break
                frames.append(np.asarray(frame.convert("RGB")))
    except (OSError, ValueError) as e:
        raise FormatError(f"{os.path.basename(path)}: cannot read the clip ({e})", path=path) from e
    return _stack(frames, path), (1000.0 / ms if ms else None)


def _stack(frames, path):
    import numpy as np

    if not frames:
        raise FormatError(f"{os.path.basename(path.rstrip(os.sep))}: the clip holds no frame", path=path)
    h, w = frames[0].shape[:2]
    for i, a in enumerate(frames):
        if a.shape[:2] != (h, w):
            raise FormatError(
                f"{os.path.basename(path.rstrip(os.sep))}: frame {i} is {a.shape[1]}x{a.shape[0]}, the first "
                f"{w}x{h}: every frame of a clip must have one size",
                path=path,
            )
    return np.stack(frames)


def _open_av(path: str):
    import av

    try:
        return av.open(path)
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise FormatError(f"{os.path.basename(path)}: cannot open the video ({e})", path=path) from e


def _video_stream(box, path):
    if not box.streams.video:
        raise FormatError(f"{os.path.basename(path)}: the file has no video stream", path=path)
    return box.streams.video[0]
