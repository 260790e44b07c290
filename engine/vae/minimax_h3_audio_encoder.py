"""MiniMax-H3's audio VAE encoder: a soundtrack to the normalised audio rows its denoiser conditions on (a reference
clip's sound). diffusers' AutoencoderKLMiniMaxH3Audio names (`encoder.block.*`, `pre_block.*`, `mean_proj`).

Facts (diffusers `autoencoder_kl_minimax_h3_audio.py`, `modular_pipelines/minimax_h3/before_encoder.py` and
`encoders.py`):
  * the waveform at 32 kHz (resampled once, torchaudio's Hann sinc), stereo (a mono track repeated), each channel a
    batch item of the mono VAE, right-padded to whole latent frames (800 samples);
  * a DAC encoder: a 7-tap convolution to 64, five blocks (three residual units at dilations 1, 3, 9 -- Snake, dilated
    7-tap conv, Snake, 1x1 -- then Snake and a strided convolution of kernel 2s doubling the width; strides 2, 4, 4, 5,
    5), Snake and a 3-tap convolution to 2048; every convolution weight-normalised (folded at load); its Snake's alpha
    is linear, not log-scale;
  * `pre_block` narrows 2048 to the latent's 32 channels: proj(norm3(x)) + a causal attention of norm1(x) whose 8 heads
    are averaged and whose 256 features are average-pooled to 32 (qkv without a key bias), then a pre-norm GeGLU MLP
    (tanh GELU) added; `mean_proj` (1x1) gives the posterior's mean, which the pipeline takes;
  * the rows: (latent - mean) / std with the config's statistics, channel-major (the left channel's frames, then the
    right's), 32 features each.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

RATE, HOP = 32000, 800


class Snake(nn.Module):
    """x + sin^2(a x) / (a + 1e-9), `alpha` [1, C, 1] (linear)."""

    def __init__(self, c: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(1, c, 1), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha.to(x)
        return x + torch.sin(a * x).pow(2) / (a + 1e-9)


def _unit(c: int, dilation: int) -> nn.Sequential:
    return nn.Sequential(
        Snake(c), ops.Conv1d(c, c, 7, dilation=dilation, padding=3 * dilation), Snake(c), ops.Conv1d(c, c, 1)
    )


class Residual(nn.Module):
    def __init__(self, c: int, dilation: int):
        super().__init__()
        self.block = _unit(c, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class Down(nn.Module):
    """Three residual units at half the width, Snake, then the strided convolution that doubles it."""

    def __init__(self, c: int, stride: int):
        super().__init__()
        h = c // 2
        self.block = nn.Sequential(*(Residual(h, d) for d in (1, 3, 9)), Snake(h),
                                   ops.Conv1d(h, c, 2 * stride, stride=stride, padding=math.ceil(stride / 2)))  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Encoder(nn.Module):
    def __init__(self, width: int, strides: tuple[int, ...], latent: int):
        super().__init__()
        layers: list[nn.Module] = [ops.Conv1d(1, width, 7, padding=3)]
        for s in strides:
            width *= 2
            layers.append(Down(width, s))
        layers += [Snake(width), ops.Conv1d(width, latent, 3, padding=1)]
        self.block = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


class Attention(nn.Module):
    def __init__(self, width: int, out: int, heads: int):
        super().__init__()
        self.heads, self.out = heads, out
        self.qkv = ops.Linear(width, 3 * width, bias=False)
        self.q_bias = nn.Parameter(torch.empty(width), requires_grad=False)
        self.v_bias = nn.Parameter(torch.empty(width), requires_grad=False)
        self.register_buffer("zero_k_bias", torch.empty(width))
        self.proj = ops.Linear(out, out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        bias = torch.cat((self.q_bias, torch.zeros_like(self.q_bias), self.v_bias)).to(x)
        q, k, v = (self.qkv(x) + bias).reshape(b, s, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).mean(
            dim=1
        )  # the heads averaged: [B, S, D]
        return self.proj(F.adaptive_avg_pool1d(o, self.out))


class Mlp(nn.Module):
    def __init__(self, c: int, hidden: int):
        super().__init__()
        self.norm = ops.LayerNorm(c)
        self.w0, self.w1, self.w2 = ops.Linear(c, hidden), ops.Linear(c, hidden), ops.Linear(hidden, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x)
        return self.w2(F.gelu(self.w0(x), approximate="tanh") * self.w1(x))


class PreBlock(nn.Module):
    def __init__(self, width: int, out: int, heads: int):
        super().__init__()
        self.norm1, self.norm3, self.norm2 = ops.LayerNorm(width), ops.LayerNorm(width), ops.LayerNorm(out)
        self.attn = Attention(width, out, heads)
        self.proj = ops.Linear(width, out)
        self.mlp = Mlp(out, 2 * out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm3(x)) + self.attn(self.norm1(x))
        return h + self.mlp(self.norm2(h))


class MiniMaxH3AudioEncoder(nn.Module):
    def __init__(self, width: int, strides: tuple[int, ...], latent: int, z: int, heads: int):
        super().__init__()
        self.encoder = Encoder(width, strides, latent)
        self.pre_block = PreBlock(latent, z, heads)
        self.mean_proj = ops.Conv1d(z, z, 1)
        self.hop = math.prod(strides)
        self.rate = RATE
        self.latent_stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self.notes: list[str] = []

    def mels(self, wave: torch.Tensor, rate: int) -> torch.Tensor:
        """The encoder's input: [1, C, N] at `rate` -> stereo at 32 kHz as a batch of two mono tracks, whole frames."""
        from .ltx2_audio_encoder import resample

        if wave.shape[1] == 1:
            wave = wave.expand(-1, 2, -1)
        x = resample(wave[0, :2].float(), rate, self.rate)[:, None]
        return F.pad(x, (0, -x.shape[-1] % self.hop))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[2, 1, samples] -> the rows [1, 2 T, z]: normalised means, the left channel's frames then the right's."""
        h = self.pre_block(self.encoder(x).transpose(1, 2)).transpose(1, 2)
        mean = self.mean_proj(h).transpose(1, 2)  # [2, T, z]
        if self.latent_stats is not None:
            mu, sd = self.latent_stats
            mean = (mean - mu.to(mean)) / sd.to(mean)
        return mean.reshape(1, -1, mean.shape[-1])


def build_encoder(sd: dict, cfg: dict, path: str, strict_load, made) -> MiniMaxH3AudioEncoder:
    """The encoder, `pre_block` and `mean_proj` of diffusers' file (weight norms folded), loaded strictly; the strides,
    heads and statistics from its config.json, else the release's."""
    from ..errors import FormatError
    from .minimax_h3_audio import _fold, config_stats

    part = _fold({k: v for k, v in sd.items() if k.startswith(("encoder.", "pre_block.", "mean_proj."))})
    if "encoder.block.0.weight" not in part:
        raise FormatError(f"{path}: MiniMax-H3's audio encoder is not in this file", path=path)
    width = part["encoder.block.0.weight"].shape[0]
    strides = tuple(int(s) for s in cfg.get("encoder_rates", (2, 4, 4, 5, 5)))
    latent = part["pre_block.proj.weight"].shape[1]
    z = part["mean_proj.weight"].shape[0]
    heads = int(cfg.get("num_attention_heads", 8))
    with torch.device("meta"):
        model = made(path, lambda: MiniMaxH3AudioEncoder(width, strides, latent, z, heads))
    strict_load(model, part, path)
    ops.set_compute_dtype(model, torch.float32)
    model.rate = int(cfg.get("sampling_rate", RATE))
    config_stats(model, cfg, z, "the rows are not normalised")
    return model
