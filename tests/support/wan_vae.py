"""Small Wan-family VAE files with random weights, for tests that run the decode end to end: diffusers'
AutoencoderKLWan at reduced width (its own naming), or the same weights in the original naming (the
module paths of engine.vae.wan, which tests/engine/test_vae_wan.py checks against diffusers' converter)."""

from __future__ import annotations

import math
from pathlib import Path

SMALL = dict(base_dim=16, z_dim=16)


def write_wan_vae(path: str | Path, *, naming: str = "original", seed: int = 0, dtype=None) -> str:
    import torch
    from diffusers import AutoencoderKLWan
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    ref = AutoencoderKLWan(**SMALL)
    sd = {}
    for n, p in ref.state_dict().items():
        r = torch.randn(p.shape, generator=g)
        sd[n] = 1 + 0.1 * r if n.endswith("gamma") else r * (0.5 / math.sqrt(p[0].numel()))
    if naming == "original":
        from engine.vae.loading import _build_wan

        sd = dict(_build_wan(sd, "diffusers").state_dict())
    sd = {k: v.contiguous().to(dtype or torch.float32) for k, v in sd.items()}
    save_file(sd, str(path))
    return str(path)
