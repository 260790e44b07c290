"""VAE decode and encode: AutoencoderKL (4-, 16- and 32-channel latents) and the TAESD family, full or
tiled with whole-image GroupNorm statistics; the Wan-family video VAEs (Wan 2.1 / 2.2, Qwen-Image) and
Mochi 1's decoder in temporal chunks that carry the causal cache, and spatial tiles; memory estimated
before running.

Torch-free at import (the memory estimates and latent formats are used by `loadout plan` and the GUI
thread); `load_vae`, `decode` and `encode` import torch when called.
"""

from __future__ import annotations

from .estimate import estimate_decode_bytes, estimate_encode_bytes
from .latent_formats import LATENT_FORMATS, LatentFormat

__all__ = [
    "LATENT_FORMATS",
    "LatentFormat",
    "decode",
    "encode",
    "estimate_decode_bytes",
    "estimate_encode_bytes",
    "load_vae",
]


def load_vae(path, **kw):
    """The VAE in a file (see engine.vae.loading.load_vae)."""
    from .loading import load_vae as _load

    return _load(path, **kw)


def decode(vae, latent, **kw):
    """VAE-space latent -> image in [0, 1] (see engine.vae.run.decode)."""
    from .run import decode as _decode

    return _decode(vae, latent, **kw)


def encode(vae, image, **kw):
    """Image in [0, 1] -> VAE-space latent (see engine.vae.run.encode)."""
    from .run import encode as _encode

    return _encode(vae, image, **kw)
