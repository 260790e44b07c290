"""Images in and out: PNG/JPEG to a float tensor in [0, 1], and PNGs written atomically."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ..errors import FormatError
from ..formats.atomic import atomic_output


def load_image(path: str | os.PathLike) -> torch.Tensor:
    """(1, 3, H, W) float32 in [0, 1]; alpha is dropped, greyscale expanded."""
    from PIL import Image, UnidentifiedImageError

    p = os.fspath(path)
    try:
        with Image.open(p) as im:
            im = im.convert("RGB")
            data = torch.frombuffer(bytearray(im.tobytes()), dtype=torch.uint8)
            w, h = im.size
    except FileNotFoundError as e:
        raise FormatError(f"{p}: no such file", path=p) from e
    except (UnidentifiedImageError, OSError) as e:
        raise FormatError(f"{p}: not an image Pillow can read ({e})", path=p) from e
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
