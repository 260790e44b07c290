"""AutoencoderKL in the LDM layout (`encoder.*`, `decoder.*`, `quant_conv`, `post_quant_conv`), built
from castable ops so weights can stay fp16 on disk (mmap) and be cast, moved or patched per forward.

Architecture facts (CompVis latent-diffusion `ldm/modules/diffusionmodules/model.py`, mirrored by
diffusers' `AutoencoderKL` with `DownEncoderBlock2D`/`UpDecoderBlock2D`): GroupNorm with 32 groups and
eps 1e-6, SiLU ("swish"); ResnetBlock = norm1, swish, conv1 3x3, norm2, swish, conv2 3x3, plus a 1x1
`nin_shortcut` when channels change; Downsample = zero pad (0, 1, 0, 1) then a 3x3 stride-2 conv with
no padding; Upsample = nearest x2 then a 3x3 conv; the mid block = ResnetBlock, single-head
self-attention (q, k, v, proj_out as 1x1 convs, scale C^-1/2), ResnetBlock. Channel multipliers
(1, 2, 4, 4) over ch = 128, 2 res blocks per encoder level and 3 per decoder level for every SD/SDXL/
SD3/FLUX VAE; all of it is read from the weights' shapes here, not assumed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

EPS = 1e-6
GROUPS = 32


@dataclass(frozen=True)
class KLConfig:
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    z_channels: int = 4
    in_channels: int = 3
    has_encoder: bool = True
    has_decoder: bool = True
    quant_conv: bool = True


def norm(c: int) -> ops.GroupNorm:
    return ops.GroupNorm(GROUPS, c, eps=EPS)


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = norm(cin)
        self.conv1 = ops.Conv2d(cin, cout, 3, padding=1)
        self.norm2 = norm(cout)
        self.conv2 = ops.Conv2d(cout, cout, 3, padding=1)
        self.nin_shortcut = ops.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.nin_shortcut(x) if self.nin_shortcut is not None else x) + h

    def steps(self) -> list[tuple]:
        """The same computation as a list of steps for the tiled executor (GroupNorms are sync points)."""
        return [
            ("push",),
            ("gn", self.norm1),
            ("silu",),
            ("module", self.conv1),
            ("gn", self.norm2),
            ("silu",),
            ("module", self.conv2),
            ("pop_add", self.nin_shortcut),
        ]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, max_score_bytes: int = 32 << 20):
    """Single-head attention (B, N, C) through scaled_dot_product_attention, in query chunks so the
    score matrix never exceeds `max_score_bytes` even where SDPA falls back to the naive kernel."""
    b, n, c = q.shape
    rows = max(1, max_score_bytes // max(1, n * q.element_size() * b))
    if rows >= n:
        return F.scaled_dot_product_attention(q, k, v)
    out = torch.empty_like(q)
    for i in range(0, n, rows):
        ops.check_cancelled()
        out[:, i : i + rows] = F.scaled_dot_product_attention(q[:, i : i + rows], k, v)
    return out


class AttnBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = norm(c)
        self.q = ops.Conv2d(c, c, 1)
        self.k = ops.Conv2d(c, c, 1)
        self.v = ops.Conv2d(c, c, 1)
        self.proj_out = ops.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        h = self.norm(x)
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.q, self.k, self.v))
        del h
        a = attention(q, k, v).transpose(1, 2).reshape(b, c, hh, ww)
        del q, k, v
        return x + self.proj_out(a)


class Downsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = ops.Conv2d(c, c, 3, stride=2, padding=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = ops.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class Mid(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1 = ResnetBlock(c, c)
        self.attn_1 = AttnBlock(c)
        self.block_2 = ResnetBlock(c, c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block_2(self.attn_1(self.block_1(x)))


class Level(nn.Module):
    """One resolution level: `block` ResnetBlocks, then `downsample` or `upsample` (or neither)."""

    def __init__(self, blocks: list[ResnetBlock], resample: nn.Module | None, name: str):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        if resample is not None:
            setattr(self, name, resample)


class Encoder(nn.Module):
    def __init__(self, cfg: KLConfig):
        super().__init__()
        ch, mult = cfg.ch, cfg.ch_mult
        self.conv_in = ops.Conv2d(cfg.in_channels, ch, 3, padding=1)
        self.down = nn.ModuleList()
        cin = ch
        for i, m in enumerate(mult):
            cout = ch * m
            blocks = [ResnetBlock(cin if j == 0 else cout, cout) for j in range(cfg.num_res_blocks)]
            last = i == len(mult) - 1
            self.down.append(Level(blocks, None if last else Downsample(cout), "downsample"))
            cin = cout
        self.mid = Mid(cin)
        self.norm_out = norm(cin)
        self.conv_out = ops.Conv2d(cin, 2 * cfg.z_channels, 3, padding=1)

    def down_path(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for level in self.down:
            for blk in level.block:
                x = blk(x)
            if hasattr(level, "downsample"):
                x = level.downsample(x)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Mid block and output conv: everything at latent resolution (run whole when tiling)."""
        return self.conv_out(F.silu(self.norm_out(self.mid(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.down_path(x))

    def tiled_steps(self) -> list[tuple]:
        steps: list[tuple] = [("module", self.conv_in)]
        for level in self.down:
            for blk in level.block:
                steps += blk.steps()
            if hasattr(level, "downsample"):
                steps += [("pad_br",), ("module", level.downsample.conv), ("scale", 0.5)]
        return steps


class Decoder(nn.Module):
    def __init__(self, cfg: KLConfig):
        super().__init__()
        ch, mult = cfg.ch, cfg.ch_mult
        cin = ch * mult[-1]
        self.conv_in = ops.Conv2d(cfg.z_channels, cin, 3, padding=1)
        self.mid = Mid(cin)
        levels: list[Level | None] = [None] * len(mult)
        for i in reversed(range(len(mult))):
            cout = ch * mult[i]
            blocks = [ResnetBlock(cin if j == 0 else cout, cout) for j in range(cfg.num_res_blocks + 1)]
            levels[i] = Level(blocks, Upsample(cout) if i != 0 else None, "upsample")
            cin = cout
        self.up = nn.ModuleList(levels)
        self.norm_out = norm(cin)
        self.conv_out = ops.Conv2d(cin, 3, 3, padding=1)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        """conv_in and the mid block (with attention over the whole latent): run once, whole."""
        return self.mid(self.conv_in(z))

    def up_path(self, x: torch.Tensor) -> torch.Tensor:
        for level in reversed(self.up):
            for blk in level.block:
                x = blk(x)
            if hasattr(level, "upsample"):
                x = level.upsample(x)
        return self.conv_out(F.silu(self.norm_out(x)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.up_path(self.head(z))

    def tiled_steps(self) -> list[tuple]:
        steps: list[tuple] = []
        for level in reversed(self.up):
            for blk in level.block:
                steps += blk.steps()
            if hasattr(level, "upsample"):
                steps += [("up2",), ("module", level.upsample.conv)]
        return steps + [("gn", self.norm_out), ("silu",), ("module", self.conv_out)]


class AutoencoderKL(nn.Module):
    """The KL autoencoder. `decode` takes VAE-space latents and returns images in [-1, 1];
    `encode` returns the posterior mean (deterministic, as ComfyUI's encode does)."""

    kind = "vae"
    downscale = 8

    def __init__(self, cfg: KLConfig):
        super().__init__()
        self.cfg = cfg
        z = cfg.z_channels
        if cfg.has_encoder:
            self.encoder = Encoder(cfg)
        if cfg.has_decoder:
            self.decoder = Decoder(cfg)
        if cfg.quant_conv:
            if cfg.has_encoder:
                self.quant_conv = ops.Conv2d(2 * z, 2 * z, 1)
            if cfg.has_decoder:
                self.post_quant_conv = ops.Conv2d(z, z, 1)

    @property
    def latent_channels(self) -> int:
        return self.cfg.z_channels

    # -- pieces the tiled runner composes -------------------------------------------------------
    def decode_head(self, z: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "post_quant_conv"):
            z = self.post_quant_conv(z)
        return self.decoder.head(z)

    def decode_steps(self) -> list[tuple]:
        return self.decoder.tiled_steps()

    def decode_tail(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def encode_steps(self) -> list[tuple]:
        return self.encoder.tiled_steps()

    def encode_tail(self, h: torch.Tensor) -> torch.Tensor:
        moments = self.encoder.head(h)
        if hasattr(self, "quant_conv"):
            moments = self.quant_conv(moments)
        return moments[:, : self.cfg.z_channels]

    def encode_head(self, x: torch.Tensor) -> torch.Tensor:
        return x

    # -- whole-image forward passes --------------------------------------------------------------
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder.up_path(self.decode_head(z))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_tail(self.encoder.down_path(x))

    # pixels in [-1, 1]
    image_range = (-1.0, 1.0)
