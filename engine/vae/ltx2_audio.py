"""LTX-2's audio VAE decoder: a latent spectrogram [B, 8, T, 16] to a stereo mel spectrogram [B, 2, 4T - 3, 64],
on castable ops, in the release's names (Lightricks' `audio_vae.decoder.*`; diffusers' AutoencoderKLLTX2Audio keeps
them). engine.vae.vocoder turns the spectrogram into a waveform; engine.vae.audio_loading reads both from a file.

Architecture facts (diffusers `autoencoder_kl_ltx2_audio.py`, ComfyUI `comfy/ldm/lightricks/vae/audio_vae.py` and
its causal audio autoencoder; diffusers `convert_ltx2_to_diffusers.py` for the release's config):
  * a 2-D LDM-style decoder over (time, mel) "images": conv_in, a middle block (resnet, optional attention, resnet),
    levels from the narrowest up, each of `num_res_blocks + 1` resnets (an attention after each where the level has
    one), an upsampler on every level but the first, then norm, SiLU and conv_out to the audio channels;
  * every convolution is causal along one axis (the release: "height", time): a k x k kernel sees k - 1 earlier rows
    and is centred on the columns, the borders zero. The axis is not in the weights: the release's config says it;
  * norms: per-position RMS over the channels ("pixel", eps 1e-6: the release) or GroupNorm(32, eps 1e-6);
  * an upsampler = nearest x2 on both axes, the causal conv, then the first row (the axis's) dropped -- so T latent
    frames give 2T - 1, then 4T - 3 mel frames; the decoder's output is cropped (or zero-padded) to that length and
    to the config's mel bins (64);
  * the latent the denoiser makes is normalised per (channel, mel bin): `per_channel_statistics.mean-of-means` /
    `std-of-means` (diffusers `latents_mean` / `latents_std`), 128 values over the latent patchified channels outer,
    bins inner; ComfyUI's audio VAE un-normalises inside its decode, diffusers' pipeline before calling it.
  * the release (LTX-2.0 and 2.3 alike): z 8, base 128, ch_mult (1, 2, 4), 2 resnets a level, pixel norms, no
    attention, 2 output channels (stereo), 16 kHz mel frames of hop 160 (100 a second: 25 latent frames a second).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

EPS = 1e-6
AXES = ("height", "width", "width-compatibility", "none")


@dataclass(frozen=True)
class Block:
    cin: int
    cout: int
    shortcut: str | None  # "nin" (1x1), "conv" (3x3) or None (same width)


@dataclass(frozen=True)
class AudioDecoderConfig:
    """What the decoder's weights say, and what only the release's config says (`axis`, `mel_bins`)."""

    z: int
    top: int  # conv_in's output width (the middle block's)
    levels: tuple[
        tuple[tuple[Block, ...], int, bool], ...
    ]  # per level, from the output end: (blocks, attentions, up)
    mid_attn: bool
    norm: str  # pixel | group
    out_ch: int
    causal: bool = (
        True  # the convolutions are wrapped (`.conv.`): False only for diffusers' causality_axis None
    )
    axis: str = "height"
    mel_bins: int = 64
    sample_rate: int = 16000
    hop: int = 160

    @property
    def ups(self) -> int:
        return sum(1 for _, _, up in self.levels if up)


class CausalConv2d(nn.Module):
    """A k x k convolution padded on one side along the causal axis (`conv` holds the weights, as in the file)."""

    def __init__(self, cin: int, cout: int, k: int, axis: str | None):
        super().__init__()
        self.conv = ops.Conv2d(cin, cout, k)
        p = k - 1
        centred = (p // 2, p - p // 2)
        if axis in (None, "none"):
            self.pad = (*centred, *centred)
        elif axis == "height":
            self.pad = (*centred, p, 0)
        else:  # width, width-compatibility
            self.pad = (p, 0, *centred)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.pad) if any(self.pad) else x)


def _conv(cfg: AudioDecoderConfig, cin: int, cout: int, k: int) -> nn.Module:
    if cfg.causal:
        return CausalConv2d(cin, cout, k, cfg.axis)
    return ops.Conv2d(cin, cout, k, padding=k // 2)


class PixelNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True) + EPS)


def _norm(cfg: AudioDecoderConfig, c: int) -> nn.Module:
    return PixelNorm() if cfg.norm == "pixel" else ops.GroupNorm(32, c, eps=EPS)


class Resnet(nn.Module):
    def __init__(self, cfg: AudioDecoderConfig, b: Block):
        super().__init__()
        self.norm1 = _norm(cfg, b.cin)
        self.conv1 = _conv(cfg, b.cin, b.cout, 3)
        self.norm2 = _norm(cfg, b.cout)
        self.conv2 = _conv(cfg, b.cout, b.cout, 3)
        if b.shortcut == "nin":
            self.nin_shortcut = _conv(cfg, b.cin, b.cout, 1)
        elif b.shortcut == "conv":
            self.conv_shortcut = _conv(cfg, b.cin, b.cout, 3)
        self.shortcut = b.shortcut

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        if self.shortcut == "nin":
            x = self.nin_shortcut(x)
        elif self.shortcut == "conv":
            x = self.conv_shortcut(x)
        return x + h


class Attention(nn.Module):
    """One head over every (time, mel) position, 1x1 q / k / v / proj_out."""

    def __init__(self, cfg: AudioDecoderConfig, c: int):
        super().__init__()
        self.norm = _norm(cfg, c)
        self.q, self.k, self.v, self.proj_out = (ops.Conv2d(c, c, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        n = self.norm(x)
        q, k, v = (m(n).reshape(b, 1, c, h * w).transpose(2, 3) for m in (self.q, self.k, self.v))
        o = F.scaled_dot_product_attention(q, k, v)
        return x + self.proj_out(o.transpose(2, 3).reshape(b, c, h, w))


class Upsample(nn.Module):
    def __init__(self, cfg: AudioDecoderConfig, c: int):
        super().__init__()
        self.conv = _conv(cfg, c, c, 3)
        self.drop = cfg.axis if cfg.causal and cfg.axis in ("height", "width") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        if self.drop == "height":
            return x[:, :, 1:]
        return x[:, :, :, 1:] if self.drop == "width" else x


class Level(nn.Module):
    def __init__(self, cfg: AudioDecoderConfig, blocks: tuple[Block, ...], attns: int, up: bool):
        super().__init__()
        self.block = nn.ModuleList(Resnet(cfg, b) for b in blocks)
        self.attn = nn.ModuleList(Attention(cfg, blocks[i].cout) for i in range(attns))
        if up:
            self.upsample = Upsample(cfg, blocks[-1].cout)


def run_blocks(level: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """A level's resnets, each followed by its attention where the level has them (the decoder's and the encoder's)."""
    for i, block in enumerate(level.block):
        h = block(h)
        if len(level.attn):
            h = level.attn[i](h)
    return h


class Mid(nn.Module):
    def __init__(self, cfg: AudioDecoderConfig):
        super().__init__()
        same = Block(cfg.top, cfg.top, None)
        self.block_1 = Resnet(cfg, same)
        if cfg.mid_attn:
            self.attn_1 = Attention(cfg, cfg.top)
        self.block_2 = Resnet(cfg, same)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block_1(x)
        if hasattr(self, "attn_1"):
            x = self.attn_1(x)
        return self.block_2(x)


class AudioDecoder(nn.Module):
    def __init__(self, cfg: AudioDecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.conv_in = _conv(cfg, cfg.z, cfg.top, 3)
        self.mid = Mid(cfg)
        self.up = nn.ModuleList(Level(cfg, *lv) for lv in cfg.levels)
        last = cfg.levels[0][0][-1].cout
        self.norm_out = _norm(cfg, last)
        self.conv_out = _conv(cfg, last, cfg.out_ch, 3)

    def frames_out(self, t: int) -> int:
        """Mel frames from `t` latent frames: 2^ups each, less the causal rows the upsamplers drop."""
        f = 2**self.cfg.ups
        return max(t * f - (f - 1), 1) if self.cfg.causal and self.cfg.axis != "none" else t * f

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        frames = self.frames_out(z.shape[2])
        h = self.mid(self.conv_in(z))
        for level in reversed(self.up):
            h = run_blocks(level, h)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
            ops.check_cancelled()
        h = self.conv_out(F.silu(self.norm_out(h)))
        h = h[:, :, :frames, : self.cfg.mel_bins]
        short_t, short_f = frames - h.shape[2], self.cfg.mel_bins - h.shape[3]
        return F.pad(h, (0, short_f, 0, short_t)) if short_t > 0 or short_f > 0 else h


def unpack(latent: torch.Tensor, z: int) -> torch.Tensor:
    """The denoiser's audio tokens [B, T, z * bins] (channels outer, bins inner) as the VAE's [B, z, T, bins]."""
    b, t, d = latent.shape
    if d % z:
        raise ValueError(f"{d} features per audio token are not {z} channels of whole mel bins")
    return latent.reshape(b, t, z, d // z).permute(0, 2, 1, 3)


def denormalise(latent: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """x * std + mean per (channel, bin) of a [B, z, T, bins] latent: the statistics run over the patchified
    features, channels outer (ComfyUI's AudioLatentNormalizer, diffusers' _denormalize_audio_latents)."""
    b, z, t, f = latent.shape
    flat = latent.permute(0, 2, 1, 3).reshape(b, t, z * f)
    flat = flat * std.to(flat) + mean.to(flat)
    return flat.reshape(b, t, z, f).permute(0, 2, 1, 3)
