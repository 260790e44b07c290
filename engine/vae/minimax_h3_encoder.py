"""MiniMax-H3's video VAE encoder: a causal 3-D CNN, run clip by clip, chunk by chunk and tile by tile as the release
defines its output (engine.vae.minimax_h3 holds the decoder and builds this beside it where the file has it).

Facts (diffusers `autoencoder_kl_minimax_h3.py`, AutoencoderKLMiniMaxH3; learned, not copied):
* Network: `conv_in` (3 -> c0, 3x3x3), then per level `down_blocks.i`: `resnets.j` (norm1, SiLU, conv1, norm2,
  SiLU, conv2, plus a 1x1x1 `conv_shortcut` where the width changes), then, where the level downsamples,
  `downsamplers.0.conv` (3x3x3, stride (t, s, s), no padding of its own: a stride-2 level first mirrors one row
  and column onto the bottom and right, so the size becomes ceil(n / 2)); `norm_out`, SiLU, `conv_out` (-> 2 z);
  `quant_conv` (1x1x1, 2 z -> 2 z). The posterior's mean is its first z channels.
* Every 3x3x3 convolution mirrors one row / column on each side ("reflect") and is causal in time: 2 zero frames
  before the clip, none after (a stride-2 one reads frames 2j - 2 .. 2j). The norms are GroupNorms (32 groups, eps
  1e-6, affine) over each frame alone (`use_t_isolated_gn`): nothing mixes across frames but the convolutions.
* The strides are not in the weights: the release's 16x in space (2 at each of the 4 downsampling levels) and 4x
  in time (2 at the second and third of them) are the ones known.
* Pixels: ImageNet-normalised RGB (mean 0.485 0.456 0.406, std 0.229 0.224 0.225), from Loadout's [-1, 1].
* Time: one frame is encoded alone (one latent frame). A longer clip is padded with copies of its last frame to
  whole clips of 17 (`clip_length`), each clip encoded from zero history (nothing carried between clips), their
  latents joined and the last 3 (`token_drop`) latent frames of the whole dropped: 17 frames make 5 latent
  frames, 17 n make 5 n - 3 (any frame count is taken, as diffusers takes it).
* Space: the released output is the tiled one (diffusers keeps tiling on for the encode too): the decoder's
  256-px tiles with overlaps of at least 64 widened in 16-px steps, each tile's latent blended linearly into the
  one above and to its left over overlap / 16 latent pixels, then cut at its next overlap. `tile` None encodes
  each clip whole (diffusers' `disable_tiling`).
* Run here inside a clip in chunks of 1, 4, 4, 4, 4 frames (each a whole latent frame), every causal convolution
  keeping the input frames its next output reads in a `Stream`: the same sums as the whole clip, a chunk's memory.
  The release pins the encoder to float32 (`_keep_in_fp32_modules`): it computes in float32 here too.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError, UnsupportedModel
from .causal_conv import Stream, _conv_layout, _onednn
from .choice import release_tiles

GROUPS, EPS = 32, 1e-6
TIME_LEVELS = (1, 2)  # the downsampling levels that halve time too (the release's; not in the weights)
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class EncoderConfig:
    widths: tuple[int, ...]
    layers: int
    strides: tuple[tuple[int, int] | None, ...]  # per level: (time, space) of its downsampler, or None
    z: int
    image_channels: int = 3


def has_encoder(sd: dict) -> bool:
    return any(k.startswith(("encoder.", "quant_conv.")) for k in sd)


def encoder_config(sd: dict, z: int, patch: int, patch_t: int, path: str) -> EncoderConfig | None:
    """The encoder's widths from its weights; None where its widths cannot take the release's 32 groups (their count
    is not in the file: such an encoder is left unread, and the VAE only decodes)."""
    pre = "encoder.down_blocks."
    levels = 1 + max((int(k.split(".")[2]) for k in sd if k.startswith(pre)), default=-1)
    need = ["encoder.conv_in.weight", "encoder.conv_out.weight"]
    need += [f"{pre}{i}.resnets.0.conv1.weight" for i in range(levels)]
    missing = next((k for k in need if k not in sd or sd[k].dim() != 5), None)
    if levels == 0 or missing is not None:
        key = missing or f"{pre}0.resnets.0.conv1.weight"
        raise FormatError(f"{path}: a MiniMax-H3 VAE encoder without {key} (or misshapen)", path=path)
    widths = tuple(sd[f"{pre}{i}.resnets.0.conv1.weight"].shape[0] for i in range(levels))
    layers = 1 + max(int(k.split(".")[4]) for k in sd if k.startswith(f"{pre}0.resnets."))
    down = [i for i in range(levels) if any(k.startswith(f"{pre}{i}.downsamplers.") for k in sd)]
    if 2 ** len(down) != patch or patch_t != 2 ** len(TIME_LEVELS) or len(down) <= max(TIME_LEVELS):
        raise UnsupportedModel(
            f"{path}: a MiniMax-H3 VAE encoder downsampling at levels {down}: the strides are not in the weights, "
            "and the release's (2 at each of 4 levels, 2 in time at the second and third) do not make "
            f"{patch}x / {patch_t}x",
            path=path,
        )
    strides = tuple(
        ((2 if down.index(i) in TIME_LEVELS else 1), 2) if i in down else None for i in range(levels)
    )
    if any(w % GROUPS for w in widths):
        return None
    return EncoderConfig(widths, layers, strides, z, sd["encoder.conv_in.weight"].shape[1])


class _Conv(ops.Conv3d):
    """A causal convolution: kt - 1 zero frames before the clip (the stream's frames after), `space` = (left,
    right, top, bottom) rows and columns (0 or 1) mirrored onto the frame."""

    def __init__(self, cin: int, cout: int, stride=(1, 1, 1), space=(1, 1, 1, 1)):
        super().__init__(cin, cout, 3, stride=stride)
        self.space = (*space, 0, 0)

    def _conv_forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if _onednn(x):  # conv_in's 3 channels: torch's native path would unfold 27 copies of the frames
            return torch.mkldnn_convolution(x, w, b, self.padding, self.stride, self.dilation, self.groups)
        return super()._conv_forward(x, w, b)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        kt, st = self.kernel_size[0], self.stride[0]
        left, right, top, bottom = self.space[:4]
        prev = stream.frames.get(id(self))
        hist = kt - 1 if prev is None else prev.shape[2]
        (b, c, t, h, w), total = x.shape, hist + x.shape[2]
        n = (total - kt) // st + 1  # output frames: each chunk makes at least one (1, then multiples of 4)
        used = (n - 1) * st + kt
        # history, frames and mirrored borders in one buffer (a cat, then a pad, held two copies of the chunk)
        buf = torch.empty(b, c, used, top + h + bottom, left + w + right, dtype=x.dtype, device=x.device,
                          memory_format=_conv_layout(x))  # fmt: skip
        inner = buf[:, :, :, top : top + h, left : left + w]
        if prev is None:
            inner[:, :, :hist].zero_()
        else:
            inner[:, :, :hist] = prev
        inner[:, :, hist:] = x[:, :, : used - hist]
        keep = total - n * st  # the frames the next output reads first
        if keep > t:
            tail = inner[:, :, hist - (keep - t) : hist] if prev is None else prev[:, :, hist - (keep - t) :]
            stream.frames[id(self)] = torch.cat([tail, x], dim=2)
        else:
            stream.frames[id(self)] = x[:, :, t - keep :].clone()
        if (
            top
        ):  # "reflect" by one: the row / column inside the edge one (the corners: the rows' mirrored columns)
            buf[:, :, :, 0, left : left + w] = buf[:, :, :, top + 1, left : left + w]
        if bottom:
            buf[:, :, :, top + h, left : left + w] = buf[:, :, :, top + h - 2, left : left + w]
        if left:
            buf[..., 0] = buf[..., left + 1]
        if right:
            buf[..., left + w] = buf[..., left + w - 2]
        return self(buf)


class _FrameNorm(ops.GroupNorm):
    """GroupNorm over each frame alone, then SiLU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Frame by frame into one output, SiLU in place (the frames folded into the batch were two more copies)."""
        w, b = self.cast_params(x)
        out = torch.empty_like(x)
        for i in range(x.shape[2]):
            out[:, :, i] = ops.group_norm(x[:, :, i], self.num_groups, w, b, self.eps)
        return F.silu(out, inplace=True)


class _Resnet(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1, self.conv1 = _FrameNorm(GROUPS, cin, EPS), _Conv(cin, cout)
        self.norm2, self.conv2 = _FrameNorm(GROUPS, cout, EPS), _Conv(cout, cout)
        self.conv_shortcut = ops.Conv3d(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        h = self.conv2.step(self.norm2(self.conv1.step(self.norm1(x), stream)), stream)
        return h.add_(x if self.conv_shortcut is None else self.conv_shortcut(x))


class _Down(nn.Module):
    def __init__(self, c: int, time: int, space: int):
        super().__init__()
        self.conv = _Conv(c, c, (time, space, space), (0, 1, 0, 1) if space == 2 else (0, 0, 0, 0))


class _Level(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, stride: tuple[int, int] | None):
        super().__init__()
        self.resnets = nn.ModuleList([_Resnet(cin if j == 0 else cout, cout) for j in range(layers)])
        self.downsamplers = None if stride is None else nn.ModuleList([_Down(cout, *stride)])

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for r in self.resnets:
            x = r.step(x, stream)
        return x if self.downsamplers is None else self.downsamplers[0].conv.step(x, stream)


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        w = cfg.widths
        self.conv_in = _Conv(cfg.image_channels, w[0])
        self.down_blocks = nn.ModuleList(
            [_Level(w[max(i - 1, 0)], w[i], cfg.layers, s) for i, s in enumerate(cfg.strides)]
        )
        self.norm_out = _FrameNorm(GROUPS, w[-1], EPS)
        self.conv_out = _Conv(w[-1], 2 * cfg.z)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.conv_in.step(x, stream)
        for level in self.down_blocks:
            x = level.step(x, stream)
        return self.conv_out.step(self.norm_out(x), stream)


def encode(vae, x: torch.Tensor, tile: tuple[int, int] | None) -> torch.Tensor:
    """(B, 3, F, H, W) in [-1, 1] -> the posterior's mean (B, z, T, ceil(H / 16), ceil(W / 16)), float32, as the
    release encodes it: T = 1 for one frame, 5 ceil(F / 17) - 3 otherwise."""
    cfg = vae.cfg
    f = x.shape[2]
    if x.dim() != 5 or f < 1 or x.shape[1] != vae.encoder.conv_in.in_channels:
        raise FormatError(f"MiniMax-H3's VAE encodes RGB clips (B, 3, F >= 1, H, W), got {tuple(x.shape)}")
    mean = torch.tensor(IMAGENET_MEAN, device=x.device)[None, :, None, None, None]
    std = torch.tensor(IMAGENET_STD, device=x.device)[None, :, None, None, None]
    n = cfg.clip_length
    outs = []
    with _float32(vae.encoder, vae.quant_conv):
        for a in range(0, f, n) if f > 1 else [0]:
            clip = x[:, :, a : a + n] if f > 1 else x
            if clip.shape[2] < n and f > 1:  # the last clip, padded with copies of the clip's last frame
                clip = torch.cat([clip, clip[:, :, -1:].expand(-1, -1, n - clip.shape[2], -1, -1)], dim=2)
            clip = ((clip.float() + 1) / 2 - mean) / std
            outs.append(_clip(vae, clip, tile))
    z = torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]
    if f > 1 and cfg.token_drop:
        z = z[:, :, : z.shape[2] - cfg.token_drop]
    return z


@contextlib.contextmanager
def _float32(*roots: nn.Module):
    """The encoder computes in float32 whatever the run's dtype (the release keeps it float32)."""
    saved = [(m, m.compute_dtype) for r in roots for _, m in ops.castable_modules(r)]
    for m, _ in saved:
        m.compute_dtype = torch.float32
    try:
        yield
    finally:
        for m, d in saved:
            m.compute_dtype = d


def _clip(vae, x: torch.Tensor, tile: tuple[int, int] | None) -> torch.Tensor:
    """One clip's mean: whole, or tile by tile, each row of tiles blended into the one above (kept raw until the
    next row is done) and the one to its left."""
    from .minimax_h3 import _blend

    if tile is None:
        return _chunks(vae, x)
    p = vae.cfg.patch
    ys, xs = release_tiles(x.shape[-2], *tile, p), release_tiles(x.shape[-1], *tile, p)
    oy, ox = [o // p for o in ys[2]], [o // p for o in xs[2]]
    rows, above = [], None
    for a, (y0, ly) in enumerate(zip(ys[0], ys[1], strict=True)):
        row = [_chunks(vae, x[..., y0 : y0 + ly, x0 : x0 + lx]) for x0, lx in zip(xs[0], xs[1], strict=True)]
        cut = []
        for c, t in enumerate(row):
            if above is not None:
                t = _blend(above[c], t, oy[a - 1], -2)
            if c > 0:
                t = _blend(row[c - 1], t, ox[c - 1], -1)
            t = t[..., : t.shape[-2] - (oy[a] if a < len(oy) else 0), :]
            cut.append(t[..., : t.shape[-1] - (ox[c] if c < len(ox) else 0)])
        rows.append(torch.cat(cut, dim=-1))
        above = row
    return torch.cat(rows, dim=-2)


def _chunks(vae, x: torch.Tensor) -> torch.Tensor:
    """One clip (or tile of it) through the encoder in chunks of 1, 4, 4, ... frames, the causal state carried."""
    stream, t, z = Stream(), x.shape[2], vae.cfg.z
    step = vae.cfg.patch_t
    bounds = [0, *range(1, t, step), t]
    w, b = vae.quant_conv.cast_params(x)
    outs = []
    for s, e in zip(bounds[:-1], bounds[1:], strict=True):
        h = vae.encoder.step(x[:, :, s:e], stream)
        outs.append(F.conv3d(h, w[:z], None if b is None else b[:z]))  # quant_conv's mean half
        del h
    return torch.cat(outs, dim=2).float().cpu() if len(outs) > 1 else outs[0].float().cpu()
