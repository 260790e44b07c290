"""The LTX-Video VAE's encoder (0.9.0, 0.9.5+ and LTX-2's video VAE), under Lightricks' single-file names.

Architecture facts (diffusers LTXVideoEncoder3d / LTX2VideoEncoder3d; names from its
`convert_ltx_vae_checkpoint_to_diffusers` / `convert_ltx2_vae_to_diffusers`, inverted):
  * the clip is cut into 4x4 pixel patches (48 channels, Wan 2.2's channel order: engine.vae.wan.patchify)
    and `conv_in` widens them; `encoder.down_blocks` is one flat sequence -- groups of residual blocks
    (`res_blocks.M`, as the decoder's, without timestep), 0.9.0's width-changing lone block, 0.9.0's
    downsampler (`conv`: a 3x3x3 convolution with stride 2 in time and space) or 0.9.5's / LTX-2's
    space-to-depth downsampler (`conv.conv`: a 3x3x3 convolution to width / s channels, s the stride's
    volume, its output and the input each folded s-to-1 into channels, the input's groups of channels
    averaged to the width and added; a stride 2 in time first repeats the clip's first frame); the last
    group is the middle block;
  * every convolution pads time with two copies of the clip's first frame (causal: `encoder_causal`, the
    default of both diffusers classes; a non-causal config pads one copy of the first and of the last
    frame) and space with zeros (LTX-2's config may say `encoder_spatial_padding_mode` "reflect");
  * the head is a parameter-free RMS norm, SiLU and `conv_out` to z + 1 channels (z means and one log
    variance shared by all of them): the posterior's mean -- diffusers' `latent_dist.mode()` -- is the
    first z channels.
The time downsampling is 8x: clips of 1 + 8k frames. Causal, the encoder runs in chunks (the first 1 + 8
frames, then 8 at a time: engine.vae.ltx.LTXVideoVAE.encode), each convolution's last input frames carried
in a `Stream`: a chunk after the first always holds a whole number of every downsampler's time stride, so
each strided output reads the same frames it reads in the whole clip, and the chunked encode equals the
whole one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import CausalConv3d, Stream
from .ltx import LAYER_NORM_EPS, pixel_norm

# a space-to-depth downsampler's stride (time, rows, columns) from its volume: how 0.9.5 and LTX-2 use them
# (diffusers' downsample_type "temporal", "spatial", "spatiotemporal")
STRIDES = {2: (2, 1, 1), 4: (1, 2, 2), 8: (2, 2, 2)}


@dataclass(frozen=True)
class EncoderConfig:
    """What the encoder's tensors say: `blocks` is encoder.down_blocks in order, each ("res", width,
    layers), ("lone", cin, cout), ("conv", cin, cin) (0.9.0's strided convolution) or ("down", cin, cout,
    volume) (the space-to-depth downsampler); `width` conv_in's output, `out` conv_out's."""

    width: int
    blocks: tuple[tuple, ...]
    out: int
    causal: bool = True
    reflect: bool = False
    patch: int = 4
    image_channels: int = 3

    @property
    def time_factor(self) -> int:
        return 2 ** sum(b[0] == "conv" or (b[0] == "down" and STRIDES[b[3]][0] == 2) for b in self.blocks)

    @property
    def downscale(self) -> int:
        return self.patch * 2 ** sum(
            b[0] == "conv" or (b[0] == "down" and STRIDES[b[3]][1] == 2) for b in self.blocks
        )


class EncConv(nn.Module):
    """A 3x3x3 convolution under `.conv`: causal (two copies of the first frame at the clip's start, the
    stream's last frames after) or, where the config says so, one copy of the first and last frame."""

    def __init__(self, cin: int, cout: int, cfg: EncoderConfig, stride: int = 1):
        super().__init__()
        self.causal, self.reflect = cfg.causal, cfg.reflect
        # zero borders: the convolution's own buffer pads them; mirrored ones are padded here
        self.conv = CausalConv3d(cin, cout, 3, stride=stride, padding=(1, 0, 0) if cfg.reflect else 1,
                                 pad="replicate_time")  # fmt: skip

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        c = self.conv
        if not self.causal:  # the whole clip: one copy of its first and last frame
            x = torch.cat([x[:, :, :1], x, x[:, :, -1:]], dim=2)
            return c(F.pad(x, (1, 1, 1, 1, 0, 0), mode="reflect" if self.reflect else "constant"))
        if self.reflect:
            x = F.pad(x, (1, 1, 1, 1, 0, 0), mode="reflect")
        if c.stride[0] == 1:
            return c.step(x, stream)
        # stride 2 in time: the clip's start reads two copies of the first frame; a later chunk (an even
        # number of frames) reads only the previous chunk's last frame before its own, as in the whole clip
        start = stream is None or id(c) not in stream.frames
        buf = c.pad(x, stream)
        return c(buf if start else buf[:, :, 1:])


class EncBlock(nn.Module):
    """A residual block: RMS norm, SiLU, conv1, RMS norm, SiLU, conv2, plus the input (through a
    LayerNorm and a 1x1x1 convolution where the width changes: 0.9.0's lone block)."""

    def __init__(self, cin: int, cout: int, cfg: EncoderConfig):
        super().__init__()
        self.conv1 = EncConv(cin, cout, cfg)
        self.conv2 = EncConv(cout, cout, cfg)
        if cin != cout:
            self.norm3 = nn.Module()
            self.norm3.norm = ops.LayerNorm(cin, eps=LAYER_NORM_EPS)
            self.conv_shortcut = ops.Conv3d(cin, cout, 1)

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        h = self.conv1.step(F.silu(pixel_norm(x), inplace=True), stream)  # the norm's own output
        h = self.conv2.step(F.silu(pixel_norm(h), inplace=True), stream)
        if hasattr(self, "conv_shortcut"):
            x = self.conv_shortcut(self.norm3.norm(x.movedim(1, -1)).movedim(-1, 1))
        return h.add_(x)


class EncGroup(nn.Module):
    def __init__(self, dim: int, layers: int, cfg: EncoderConfig):
        super().__init__()
        self.res_blocks = nn.ModuleList(EncBlock(dim, dim, cfg) for _ in range(layers))

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        for b in self.res_blocks:
            x = b.step(x, stream)
        return x


def fold(x: torch.Tensor, stride: tuple[int, int, int]) -> torch.Tensor:
    """(B, C, T, H, W) -> (B, C st sh sw, T/st, H/sh, W/sw): channel c st sh sw + (i sh + j) sw + k holds
    frame st t + i, row sh y + j, column sw x + k."""
    b, c, t, h, w = x.shape
    st, sh, sw = stride
    x = x.reshape(b, c, t // st, st, h // sh, sh, w // sw, sw).permute(0, 1, 3, 5, 7, 2, 4, 6)
    return x.reshape(b, c * st * sh * sw, t // st, h // sh, w // sw)


class SpaceToDepth(nn.Module):
    """0.9.5's and LTX-2's downsampler (`conv.conv`), cin -> cout channels at `volume` times fewer positions."""

    def __init__(self, cin: int, cout: int, volume: int, cfg: EncoderConfig):
        super().__init__()
        self.stride = STRIDES[volume]
        self.group = cin * volume // cout
        self.conv = EncConv(cin, cout // volume, cfg)

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        if self.stride[0] > 1 and (stream is None or id(self) not in stream.started):
            x = torch.cat([x[:, :, :1], x], dim=2)  # the clip's first frame, repeated: an even count
        if stream is not None:
            stream.started.add(id(self))
        short = fold(x, self.stride).unflatten(1, (-1, self.group)).mean(dim=2)
        return fold(self.conv.step(x, stream), self.stride).add_(short)


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        self.conv_in = EncConv(cfg.image_channels * cfg.patch**2, cfg.width, cfg)
        items: list[nn.Module] = []
        for b in cfg.blocks:
            if b[0] == "res":
                items.append(EncGroup(b[1], b[2], cfg))
            elif b[0] == "lone":
                items.append(EncBlock(b[1], b[2], cfg))
            elif b[0] == "conv":  # 0.9.0's downsampler: the strided convolution itself
                items.append(EncConv(b[1], b[2], cfg, stride=2))
            else:
                items.append(SpaceToDepth(b[1], b[2], b[3], cfg))
        self.down_blocks = nn.ModuleList(items)
        last = cfg.blocks[-1]
        self.conv_out = EncConv(last[2] if last[0] == "lone" else last[1], cfg.out, cfg)

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        """Patchified pixels (B, 48, T, H/4, W/4) -> conv_out's channels (B, z + 1, ...)."""
        x = self.conv_in.step(x, stream)
        for m in self.down_blocks:
            x = m.step(x, stream)
        return self.conv_out.step(F.silu(pixel_norm(x), inplace=True), stream)


def read_blocks(sd, path: str, half: str, shape) -> list[tuple]:
    """The blocks of the `half`'s (encoder / decoder) down_blocks / up_blocks in order, from their keys (in
    Lightricks' names): ("res", width, residual blocks), ("lone", in, out) for a conv-only block, ("down" / "up",
    in, out) for a resampler's convolution, ("conv", in, out) for the encoder's plain strided one (0.9.0);
    `shape(sd, key, path)` reads (and checks) a tensor's shape."""
    group, sampler = ("down_blocks", "down") if half == "encoder" else ("up_blocks", "up")
    idx = sorted({int(m[1]) for k in sd if (m := re.match(rf"{half}\.{group}\.(\d+)\.", k))})
    if not idx or idx != list(range(len(idx))):
        raise FormatError(f"{path}: LTX-Video {half} blocks {idx}: not a sequence from 0", path=path)
    raw: list[tuple] = []
    for i in idx:
        p = f"{half}.{group}.{i}."
        if f"{p}res_blocks.0.conv1.conv.weight" in sd:
            n = len({int(m[1]) for k in sd if (m := re.match(rf"{re.escape(p)}res_blocks\.(\d+)\.", k))})
            raw.append(("res", shape(sd, f"{p}res_blocks.0.conv1.conv.weight", path)[0], n))
        elif f"{p}conv1.conv.weight" in sd:
            s = shape(sd, f"{p}conv1.conv.weight", path)
            raw.append(("lone", s[1], s[0]))
        elif f"{p}conv.conv.weight" in sd:
            s = shape(sd, f"{p}conv.conv.weight", path)
            raw.append((sampler, s[1], s[0]))
        elif half == "encoder" and f"{p}conv.weight" in sd:
            s = shape(sd, f"{p}conv.weight", path)
            raw.append(("conv", s[1], s[0]))
        else:
            what = "a downsampler" if half == "encoder" else "an upsampler"
            raise FormatError(
                f"{path}: LTX-Video {half} block {i} is neither residual blocks nor {what}", path=path
            )
    return raw


def _shape(sd, key: str, path: str) -> tuple[int, ...]:
    t = sd.get(key)
    if t is None:
        raise FormatError(f"{path}: incomplete LTX-Video VAE encoder, tensor {key} is missing", path=path)
    if len(t.shape) != 5:
        raise FormatError(f"{path}: {key} has shape {list(t.shape)}; the encoder's convolutions are 3-D",
                          path=path)  # fmt: skip
    return tuple(t.shape)


def encoder_config(sd: dict[str, torch.Tensor], z: int, path: str, causal: bool = True,
                   reflect: bool = False) -> EncoderConfig:  # fmt: skip
    """The encoder the (Lightricks-named) `encoder.*` tensors describe, for a latent of z channels."""
    cin = _shape(sd, "encoder.conv_in.conv.weight", path)
    if cin[1] % 16:
        raise FormatError(f"{path}: encoder.conv_in takes {cin[1]} channels, not 4x4 pixels of a colour",
                          path=path)  # fmt: skip
    raw = read_blocks(sd, path, "encoder", _shape)
    out = _shape(sd, "encoder.conv_out.conv.weight", path)
    blocks: list[tuple] = []
    for j, b in enumerate(raw):
        if b[0] != "down":
            blocks.append(b)
            continue
        after = out[1] if j + 1 == len(raw) else raw[j + 1][1]  # what the next block takes in: the width
        if after % b[2] or after // b[2] not in STRIDES:
            raise FormatError(
                f"{path}: LTX-Video encoder block {j} folds {b[1]} -> {b[2]} channels before a block of {after}: "
                "not a 2x downsampler in time, space or both",
                path=path,
            )
        blocks.append(("down", b[1], after, after // b[2]))
    if out[0] < z:
        raise FormatError(f"{path}: encoder.conv_out gives {out[0]} channels, fewer than the {z} latent ones",
                          path=path)  # fmt: skip
    return EncoderConfig(cin[0], tuple(blocks), out[0], causal, reflect, 4, cin[1] // 16)
