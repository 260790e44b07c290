"""The deep-compression autoencoder (DC-AE; Sana's and PRX's VAE), built from castable ops under diffusers'
`AutoencoderDC` key names (`encoder.*`, `decoder.*`; the original mit-han-lab/efficientvit naming is renamed
onto them in engine.vae.dc_ae_loading, which reads the config off the weights' shapes).

Architecture facts (diffusers `models/autoencoders/autoencoder_dc.py`, `attention_processor.py`
SanaMultiscaleLinearAttention / SanaMultiscaleAttnProcessor2_0, `transformers/sana_transformer.py` GLUMBConv,
`normalization.py` RMSNorm / get_normalization):

* every norm is an RMSNorm over the channels of each pixel, with a weight and a bias, eps 1e-5
  (get_normalization's default; the decoder's `norm_out` and GLUMBConv's name 1e-5 themselves);
* ResBlock: conv1 3x3 (bias), SiLU, conv2 3x3 (no bias), norm, plus the input;
* EfficientViTBlock: `attn` -- q, k, v by bias-free linears, concatenated, plus per multi-scale kernel a
  depthwise k x k conv and a 1x1 conv grouped by 3 x heads over them; the channels read as groups of 3 x
  head_dim (q, k, v of each group: ReLU on q and k); linear attention in float32 (v padded with a row of
  ones, the last row the normaliser, eps 1e-15) where h x w > head_dim, else the quadratic form; `to_out`,
  norm, plus the input -- then `conv_out`, a GLUMBConv: 1x1 to 2 x 4c (bias), SiLU, depthwise 3x3 (bias),
  half x SiLU(other half), 1x1 (no bias), norm, plus the input;
* the decoder: conv_in 3x3 plus the latent repeated channel-wise to its width (`in_shortcut`, default True),
  its stages from the deepest: an up block (a nearest 2x upsample then a 3x3 conv, or a conv then a pixel
  shuffle; plus the input repeated channel-wise and pixel-shuffled), then the stage's blocks; `norm_out`,
  ReLU (`decoder_conv_act_fn` default), conv_out 3x3;
* the encoder: conv_in 3x3, each stage's blocks then a down block (a stride-2 3x3 conv, or a conv then a
  pixel unshuffle; plus the input pixel-unshuffled and averaged over channel groups), conv_out 3x3 plus the
  last stage averaged over channel groups down to the latent's (`out_shortcut`, default True).

The released f32c32 files (dc-ae-f32c32-sana-1.0 / 1.1; diffusers' `scripts/convert_dcae_to_diffusers.py`
`get_ae_config`) have widths 128, 256, 512, 512, 1024, 1024, ResBlocks in the first three stages and
EfficientViT blocks (one 5x5 multi-scale kernel) in the last three, 32 latent channels, a stride-2 conv down
and an interpolating up block, and scale their latents by 0.41407 (SCALING_FACTOR: the pipeline's, not the
VAE's: `decode` takes VAE-space latents).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

EPS = 1e-5  # diffusers get_normalization / RMSNorm(…, 1e-5)
ATTN_EPS = 1e-15  # SanaMultiscaleLinearAttention's eps
SCALING_FACTOR = 0.41407  # get_ae_config("dc-ae-f32c32-sana-1.0")["scaling_factor"]


@dataclass(frozen=True)
class Half:
    """One side (encoder or decoder): per stage, its width, block count, block kind ("res" / "vit") and
    the attention's multi-scale kernels."""

    widths: tuple[int, ...]
    layers: tuple[int, ...]
    kinds: tuple[str, ...]
    scales: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class DCConfig:
    latent: int
    decoder: Half | None
    encoder: Half | None
    head_dim: int = 32  # AutoencoderDC's attention_head_dim default (no release sets another)
    up_interpolate: bool = True  # "interpolate" (the Sana releases) or "pixel_shuffle"
    down_conv: bool = True  # "conv" (the Sana releases) or "pixel_unshuffle"
    in_channels: int = 3
    expand: int = 4  # GLUMBConv's expand_ratio


class PixelRMSNorm(ops.RMSNorm):
    """diffusers' RMSNorm with a bias, over the channels of each pixel of an (N, C, H, W) tensor: the mean
    square in float32, x * rsqrt(ms + eps) * weight + bias."""

    def __init__(self, dim: int, eps: float = EPS):
        super().__init__(dim, eps)
        self.bias = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = ops._input_dtype(self, x)
        w, b = self.cast_params(x)
        ms = x.float().square().mean(1, keepdim=True)
        y = (x.float() * torch.rsqrt(ms + self.eps)).to(x.dtype)
        return torch.addcmul(b[:, None, None], y, w[:, None, None])


def _pointwise(lin: ops.Linear, x: torch.Tensor) -> torch.Tensor:
    """A linear over the channels of each pixel of (N, C, H, W)."""
    return lin(x.movedim(1, -1)).movedim(-1, 1)


class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = ops.Conv2d(c, c, 3, padding=1)
        self.conv2 = ops.Conv2d(c, c, 3, padding=1, bias=False)
        self.norm = PixelRMSNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv2(F.silu(self.conv1(x)))) + x

    def steps(self) -> list[tuple]:
        return [("push",), ("module", self.conv1), ("silu",), ("module", self.conv2), ("module", self.norm),
                ("pop_add", None)]  # fmt: skip


class MultiScale(nn.Module):
    """One multi-scale branch: a depthwise k x k conv over q, k and v, then a 1x1 conv grouped by 3 x heads."""

    def __init__(self, inner: int, heads: int, k: int):
        super().__init__()
        self.proj_in = ops.Conv2d(3 * inner, 3 * inner, k, padding=k // 2, groups=3 * inner, bias=False)
        self.proj_out = ops.Conv2d(3 * inner, 3 * inner, 1, groups=3 * heads, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj_out(self.proj_in(x))


class LinearAttention(nn.Module):
    def __init__(self, c: int, head_dim: int, scales: tuple[int, ...]):
        super().__init__()
        self.head_dim = head_dim
        heads = c // head_dim
        inner = heads * head_dim
        self.to_q = ops.Linear(c, inner, bias=False)
        self.to_k = ops.Linear(c, inner, bias=False)
        self.to_v = ops.Linear(c, inner, bias=False)
        self.to_qkv_multiscale = nn.ModuleList(MultiScale(inner, heads, k) for k in scales)
        self.to_out = ops.Linear(inner * (1 + len(scales)), c, bias=False)
        self.norm_out = PixelRMSNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        qkv = torch.cat([_pointwise(m, x) for m in (self.to_q, self.to_k, self.to_v)], 1)
        qkv = torch.cat([qkv, *(m(qkv) for m in self.to_qkv_multiscale)], 1)
        linear = h * w > self.head_dim  # the processor's choice
        dtype = qkv.dtype
        g = (qkv.float() if linear else qkv).reshape(n, -1, 3 * self.head_dim, h * w)
        del qkv
        q, k, v = g.chunk(3, dim=2)
        q, k = F.relu(q), F.relu(k)
        if linear:
            v = F.pad(v, (0, 0, 0, 1), value=1.0)
            o = (v @ k.transpose(-1, -2)) @ q
            o = (o[:, :, :-1] / (o[:, :, -1:] + ATTN_EPS)).to(dtype)
        else:
            s = (k.transpose(-1, -2) @ q).float()
            s = s / (s.sum(dim=2, keepdim=True) + ATTN_EPS)
            o = v @ s.to(v.dtype)
        del q, k, v, g
        o = _pointwise(self.to_out, o.reshape(n, -1, h, w))
        return self.norm_out(o) + x


class GLUMBConv(nn.Module):
    def __init__(self, c: int, expand: int):
        super().__init__()
        hidden = expand * c
        self.conv_inverted = ops.Conv2d(c, 2 * hidden, 1)
        self.conv_depth = ops.Conv2d(2 * hidden, 2 * hidden, 3, padding=1, groups=2 * hidden)
        self.conv_point = ops.Conv2d(hidden, c, 1, bias=False)
        self.norm = PixelRMSNorm(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv_depth(F.silu(self.conv_inverted(x)))
        a, gate = h.chunk(2, dim=1)
        h = a * F.silu(gate)
        del a, gate
        return self.norm(self.conv_point(h)) + x


class EfficientViTBlock(nn.Module):
    def __init__(self, c: int, head_dim: int, scales: tuple[int, ...], expand: int):
        super().__init__()
        self.attn = LinearAttention(c, head_dim, scales)
        self.conv_out = GLUMBConv(c, expand)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv_out(self.attn(x))


class UpBlock(nn.Module):
    """DCUpBlock2d: a nearest 2x upsample then a 3x3 conv (`interpolate`), or a conv then a pixel shuffle;
    plus the input repeated channel-wise and pixel-shuffled (`shortcut`)."""

    def __init__(self, cin: int, cout: int, interpolate: bool, shortcut: bool = True):
        super().__init__()
        self.interpolate, self.shortcut = interpolate, shortcut
        self.repeats = cout * 4 // cin
        self.conv = ops.Conv2d(cin, cout if interpolate else 4 * cout, 3, padding=1)

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        return F.pixel_shuffle(x.repeat_interleave(self.repeats, dim=1), 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.interpolate:
            y = self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        else:
            y = F.pixel_shuffle(self.conv(x), 2)
        return y + self.skip(x) if self.shortcut else y


class _Upsampled(nn.Module):
    """An interpolating UpBlock as a tiled step over its nearest-upsampled input u (the executor's `up2`):
    conv(u) plus the shortcut of the input itself, u[::2, ::2] -- a tile's region at the upsampled
    resolution starts on an even pixel, so its 2x2 cells are the input's pixels."""

    def __init__(self, block: UpBlock):
        super().__init__()
        self.block = block

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        y = self.block.conv(u)
        return y.add_(self.block.skip(u[:, :, ::2, ::2])) if self.block.shortcut else y


class DownBlock(nn.Module):
    """DCDownBlock2d: a stride-2 3x3 conv (`conv`), or a conv then a pixel unshuffle; plus the input
    pixel-unshuffled and averaged over groups of channels (`shortcut`)."""

    def __init__(self, cin: int, cout: int, conv: bool, shortcut: bool = True):
        super().__init__()
        self.stride_conv, self.shortcut = conv, shortcut
        self.group = cin * 4 // cout
        self.conv = ops.Conv2d(cin, cout if conv else cout // 4, 3, stride=2 if conv else 1, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) if self.stride_conv else F.pixel_unshuffle(self.conv(x), 2)
        if not self.shortcut:
            return y
        s = F.pixel_unshuffle(x, 2)
        return y + s.unflatten(1, (-1, self.group)).mean(dim=2)


def _block(kind: str, c: int, cfg: DCConfig, scales: tuple[int, ...]) -> nn.Module:
    return ResBlock(c) if kind == "res" else EfficientViTBlock(c, cfg.head_dim, scales, cfg.expand)


class Decoder(nn.Module):
    def __init__(self, cfg: DCConfig):
        super().__init__()
        d = cfg.decoder
        n = len(d.widths)
        self.conv_in = ops.Conv2d(cfg.latent, d.widths[-1], 3, padding=1)
        self.repeats = d.widths[-1] // cfg.latent
        stages = []
        for i in range(n):
            mods: list[nn.Module] = []
            if i < n - 1:
                mods.append(UpBlock(d.widths[i + 1], d.widths[i], cfg.up_interpolate))
            mods += [_block(d.kinds[i], d.widths[i], cfg, d.scales[i]) for _ in range(d.layers[i])]
            stages.append(nn.Sequential(*mods))
        self.up_blocks = nn.ModuleList(stages)
        self.norm_out = PixelRMSNorm(d.widths[0])
        self.conv_out = ops.Conv2d(d.widths[0], cfg.in_channels, 3, padding=1)
        # The stages from the deepest down to the last one that mixes the whole image (attention) or
        # that the tiled executor cannot step (a pixel-shuffle up block) run whole, in `head`.
        whole = [i for i in range(n) if d.kinds[i] != "res" or (i < n - 1 and not cfg.up_interpolate)]
        self.split = min(whole, default=n - 1)  # stages >= split: the head's
        self.head_scale = 2 ** (n - 1 - self.split)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(z) + z.repeat_interleave(self.repeats, dim=1)
        for i in reversed(range(self.split, len(self.up_blocks))):
            x = self.up_blocks[i](x)
        return x

    def tail(self, x: torch.Tensor) -> torch.Tensor:
        for i in reversed(range(self.split)):
            x = self.up_blocks[i](x)
        return self.conv_out(F.relu(self.norm_out(x)))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.tail(self.head(z))

    def tiled_steps(self) -> list[tuple]:
        steps: list[tuple] = []
        for i in reversed(range(self.split)):
            for m in self.up_blocks[i]:
                if isinstance(m, UpBlock):
                    steps += [("up2",), ("module", _Upsampled(m))]
                else:
                    steps += m.steps()
        return steps + [("module", self.norm_out), ("relu",), ("module", self.conv_out)]


class Encoder(nn.Module):
    def __init__(self, cfg: DCConfig):
        super().__init__()
        e = cfg.encoder
        n = len(e.widths)
        self.conv_in = ops.Conv2d(cfg.in_channels, e.widths[0], 3, padding=1)
        stages = []
        for i in range(n):
            mods: list[nn.Module] = [
                _block(e.kinds[i], e.widths[i], cfg, e.scales[i]) for _ in range(e.layers[i])
            ]
            if i < n - 1:
                mods.append(DownBlock(e.widths[i], e.widths[i + 1], cfg.down_conv))
            stages.append(nn.Sequential(*mods))
        self.down_blocks = nn.ModuleList(stages)
        self.conv_out = ops.Conv2d(e.widths[-1], cfg.latent, 3, padding=1)
        self.group = e.widths[-1] // cfg.latent

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for stage in self.down_blocks:
            x = stage(x)
        return self.conv_out(x) + x.unflatten(1, (-1, self.group)).mean(dim=2)


class AutoencoderDC(nn.Module):
    """The DC-AE. `decode` takes VAE-space latents (B, C, h, w) and returns images (B, 3, 32h, 32w) in
    [-1, 1] (f32); `encode` returns the latent (the encoder is deterministic). A tiled decode runs
    `decode_head` whole (the attention stages) and `decode_steps()` in tiles, from `head_scale`."""

    kind = "vae"
    family = "dc_ae"
    image_range = (-1.0, 1.0)

    def __init__(self, cfg: DCConfig):
        super().__init__()
        self.cfg = cfg
        if cfg.encoder is not None:
            self.encoder = Encoder(cfg)
        if cfg.decoder is not None:
            self.decoder = Decoder(cfg)
        half = cfg.decoder or cfg.encoder
        self.downscale = 2 ** (len(half.widths) - 1)
        self.head_scale = self.decoder.head_scale if cfg.decoder is not None else 1
        # engine.vae.estimate's view: the first width, and the head output's values per latent pixel
        self.spec_width = half.widths[0]
        d = cfg.decoder
        self.head_px = self.head_scale**2 * d.widths[self.decoder.split] if d is not None else 0

    @property
    def latent_channels(self) -> int:
        return self.cfg.latent

    def vae_spec(self):
        """The memory estimate's view (engine.vae.estimate: kind "dc_ae", per unit of its first width; `mid` the
        head output's channels per latent pixel), through spec_of's hook as the other VAEs that describe themselves."""
        from .estimate import VaeSpec

        wbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        return VaeSpec(
            "dc_ae", self.latent_channels, wbytes, self.spec_width, self.head_px, downscale=self.downscale
        )

    def decode_head(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder.head(z)

    def decode_steps(self) -> list[tuple]:
        return self.decoder.tiled_steps()

    def decode_tail(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder(z)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)
