"""ComfyUI `.latent` files: a safetensors file holding `latent_tensor`, in the VAE's own space.

Facts from ComfyUI `nodes.py` (SaveLatent / LoadLatent): SaveLatent writes the samples as
`latent_tensor` beside an empty `latent_format_version_0` tensor, with the prompt and workflow as string
metadata; LoadLatent multiplies by 1 when that marker is present and by 1 / 0.18215 when it is absent
(files from before the marker stored SD1-scaled latents). We read both and always write the marker.
Also accepted on read: a safetensors file whose latent is under `latent` or `samples`, or which holds
exactly one 4-D/5-D tensor (other tools' layouts, taken to be in VAE space).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import FormatError
from .safetensors import SafetensorsFile, read_header, save_tensors

MARKER = "latent_format_version_0"
LATENT_DTYPES = ("F16", "BF16", "F32", "F64")
OLD_FORMAT_SCALE = 1.0 / 0.18215  # ComfyUI LoadLatent, files without the marker


@dataclass(frozen=True)
class LatentInfo:
    """Header facts about a latent file: which key, its shape and dtype, and whether it is rescaled."""

    key: str
    shape: tuple[int, ...]
    dtype: str
    scale: float  # multiplier applied on read (1.0, or 1/0.18215 for the old ComfyUI format)


def latent_info(path: str | os.PathLike) -> LatentInfo:
    """Which tensor of the file is the latent, from the header alone."""
    h = read_header(path)
    p = h.path
    if "latent_tensor" in h.tensors:
        key = "latent_tensor"
        scale = 1.0 if MARKER in h.tensors else OLD_FORMAT_SCALE
    else:
        scale = 1.0
        named = [k for k in ("latent", "samples") if k in h.tensors]
        candidates = named or [k for k, t in h.tensors.items() if len(t.shape) in (4, 5)]
        if len(candidates) != 1:
            raise FormatError(
                f"{p}: no latent in this file (expected `latent_tensor` as ComfyUI writes it, `latent`, "
                f"`samples`, or a single 4-D tensor; found {len(h.tensors)} tensors)",
                path=p,
            )
        key = candidates[0]
    t = h.tensors[key]
    if len(t.shape) not in (4, 5) or 0 in t.shape:
        raise FormatError(
            f"{p}: the latent {key!r} has shape {list(t.shape)}; a latent is [batch, channels, height, "
            "width] (or 5-D for video) with no empty dimension",
            path=p,
        )
    if t.dtype not in LATENT_DTYPES:
        raise FormatError(f"{p}: the latent {key!r} is {t.dtype}, not a float16/32/64 or bfloat16 tensor")
    return LatentInfo(key, t.shape, t.dtype, scale)


def read_latent(path: str | os.PathLike):
    """The latent as a float32 tensor in the VAE's space (old-format files rescaled as ComfyUI does)."""
    import torch

    info = latent_info(path)
    with SafetensorsFile(path) as f:
        t = f.tensor(info.key).float()
    if not torch.isfinite(t).all():  # decoded, it would be a black or garbled picture, silently
        raise FormatError(
            f"{os.fspath(path)}: the latent holds NaN or infinite values (a sampler that diverged, or a "
            "damaged file): there is no picture to decode in it"
        )
    if info.scale != 1.0:
        return t * info.scale
    return t.clone()  # detach from the file mapping


# LTX-2's and MiniMax-H3's names for the audio latent in a `step` inputs file, then the latent files' names
AUDIO_KEYS = ("audio_latent", "audio_hidden_states", "latent_tensor", "latent", "samples")


def audio_latent_key(path: str | os.PathLike) -> str | None:
    """The audio latent's key when the header says the file holds one (an audio name, or a single 3-D tensor, or
    LTX-2's [B, 8, T, 16]), else None: an image or video latent, or no latent."""
    t = read_header(path).tensors
    key = next((k for k in AUDIO_KEYS[:2] if k in t), None)
    if key is not None:
        return key
    named = [k for k in AUDIO_KEYS[2:] if k in t]
    shapes = [(k, tuple(t[k].shape)) for k in (named or list(t))]
    if len(shapes) == 1 or (named and len(named) == 1):
        k, s = shapes[0]
        if len(s) == 3 or (len(s) == 4 and s[1] == 8 and s[3] == 16):
            return k
    return None


def read_audio_latent(path: str | os.PathLike):
    """An audio latent as float32: `audio_latent` / `audio_hidden_states` (`step` inputs of LTX-2 / MiniMax-H3),
    ComfyUI's `latent_tensor`,
    `latent` or `samples`, else the file's one 3-D or 4-D tensor ([B, T, features] tokens or [B, C, T, bins])."""
    import torch

    h = read_header(path)
    p = h.path
    key = next((k for k in AUDIO_KEYS if k in h.tensors), None)
    if key is None:
        candidates = [k for k, t in h.tensors.items() if len(t.shape) in (3, 4)]
        if len(candidates) != 1:
            raise FormatError(f"{p}: no audio latent in this file (expected `audio_latent`, `latent_tensor`, `latent`, "
                              f"`samples` or one 3-D / 4-D tensor; found {len(h.tensors)} tensors)", path=p)  # fmt: skip
        key = candidates[0]
    t = h.tensors[key]
    if len(t.shape) not in (3, 4) or 0 in t.shape or t.dtype not in LATENT_DTYPES:
        raise FormatError(f"{p}: {key!r} is {t.dtype} {list(t.shape)}, not an audio latent ([B, T, features] or "
                          "[B, C, T, bins] floats)", path=p)  # fmt: skip
    with SafetensorsFile(path) as f:
        x = f.tensor(key).float().clone()
    if not torch.isfinite(x).all():
        raise FormatError(f"{p}: the audio latent holds NaN or infinite values (a diverged sampler?)", path=p)
    return x


def write_latent(path: str | os.PathLike, tensor, metadata: Mapping[str, str] | None = None) -> None:
    """Write a ComfyUI-compatible `.latent` atomically: `latent_tensor` plus the VAE-space marker."""
    import torch

    if not isinstance(tensor, torch.Tensor) or tensor.dim() not in (4, 5) or not tensor.is_floating_point():
        raise ValueError("a latent is a 4-D (or 5-D video) floating-point tensor")
    save_tensors(path, {"latent_tensor": tensor, MARKER: torch.tensor([])}, metadata)
