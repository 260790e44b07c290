"""Images in and out: PNG/JPEG to a float tensor in [0, 1], and PNGs written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import FormatError
from ..formats.atomic import atomic_output


def _unreadable(p: str, e: Exception) -> FormatError:
    """The one message for an image Loadout cannot take, by what went wrong."""
    from PIL import Image, UnidentifiedImageError

    name = os.path.basename(p)
    if isinstance(e, UnidentifiedImageError):  # a file, but no image format Pillow knows: say what it is
        from ..formats.magic import what_file_is

        return FormatError(f"{name}: this is {what_file_is(p)}, not an image Loadout can read", path=p)
    if isinstance(e, Image.DecompressionBombError):  # a header claiming billions of pixels
        return FormatError(f"{name}: too large to decode safely, or a damaged header ({e})", path=p)
    return FormatError(f"{name}: cannot read the image ({getattr(e, 'strerror', None) or e})", path=p)


def image_size(path: str | os.PathLike) -> tuple[int, int]:
    """(width, height) from the header only: no pixel is decoded."""
    from PIL import Image

    p = os.fspath(path)
    try:
        with Image.open(p) as im:
            return im.size
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        raise _unreadable(p, e) from e


def read_rgb(path: str | os.PathLike):
    """The image as 8-bit RGB, upright, decoded in full with the file closed; a FormatError that says
    why otherwise. Alpha is dropped, greyscale and palettes expanded; the EXIF orientation a camera
    writes is applied (as ComfyUI's LoadImage does); 16-bit greyscale (a 16-bit PNG opens as I;16 or I)
    is scaled to 8 bits and a float image taken as 0..1, where Pillow's own conversion would clip
    them to white and black."""
    from PIL import Image, ImageOps

    p = os.fspath(path)
    try:
        with Image.open(p) as im:
            return _rgb8(ImageOps.exif_transpose(im))
    except (OSError, ValueError, Image.DecompressionBombError) as e:  # UnidentifiedImageError is an OSError
        raise _unreadable(p, e) from e


def _rgb8(im):
    import numpy as np
    from PIL import Image

    if im.mode not in ("I", "F") and not im.mode.startswith("I;16"):
        return im.convert("RGB")
    a = np.asarray(im, dtype=np.float64)
    if im.mode == "F":  # float samples: 0..1 as written by float pipelines; 0..255 if larger
        a = a * (255.0 if a.size and np.nanmax(a) <= 1.0 else 1.0)
    else:  # 16-bit samples
        a = a / 257.0
    a = np.nan_to_num(a, nan=0.0, posinf=255.0, neginf=0.0).clip(0, 255).round().astype(np.uint8)
    return Image.fromarray(a, "L").convert("RGB")


def load_image(path: str | os.PathLike) -> torch.Tensor:
    """(1, 3, H, W) float32 in [0, 1]; alpha is dropped, greyscale expanded."""
    im = read_rgb(path)
    data = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
    w, h = im.size
    return data.view(h, w, 3).permute(2, 0, 1).unsqueeze(0).float().div_(255)


def save_png(images: torch.Tensor, path: str | os.PathLike) -> list[str]:
    """Write (N, 3, H, W) in [0, 1] as PNG(s), atomically; a batch becomes NAME_0.png, NAME_1.png, ..."""
    from PIL import Image

    target = Path(path)
    arr = images.clamp(0, 1).mul(255).round().to(torch.uint8).permute(0, 2, 3, 1).contiguous().numpy()
    paths = (
        [target]
        if len(arr) == 1
        else [target.with_name(f"{target.stem}_{i}{target.suffix}") for i in range(len(arr))]
    )
    for a, p in zip(arr, paths, strict=True):
        with atomic_output(p) as f:
            Image.fromarray(a, "RGB").save(f, format="PNG")
    return [str(p) for p in paths]
