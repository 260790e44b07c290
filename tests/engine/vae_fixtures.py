"""Deterministic random VAEs for the VAE tests: real layouts, small widths, fixed seeds."""

from __future__ import annotations

import torch

from engine.vae.autoencoder_kl import AutoencoderKL, KLConfig
from engine.vae.taesd import TAESD


def randomize_(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Fill every parameter deterministically: fan-in scaled convs, norms near 1, small biases — so
    activations stay in a sane range through the whole network, as in a trained VAE."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.state_dict().items()):
            if p.dim() == 1 and name.endswith("weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            elif p.dim() == 1:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
    return model.eval().requires_grad_(False)


def small_kl(z: int = 4, ch: int = 32, quant: bool = True, seed: int = 0) -> AutoencoderKL:
    """The SD VAE layout (ch_mult 1,2,4,4; 2 res blocks) at a small width."""
    return randomize_(AutoencoderKL(KLConfig(ch=ch, z_channels=z, quant_conv=quant)), seed)


def small_taesd(name: str, channels: int, mid_gn: bool = False, seed: int = 0) -> TAESD:
    return randomize_(TAESD(name, channels, mid_gn, True, True), seed)


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 1.0) -> float:
    mse = torch.mean((a.double() - b.double()) ** 2).item()
    return float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(peak**2 / mse)).item()
