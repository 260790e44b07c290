"""Kandinsky 6 SR's video VAE encoder (engine.vae.kandinsky6_sr builds it where the file holds its tensors; the
facts are listed there). Causal throughout: `Encoder.step` takes a chunk of frames and carries each causal
convolution's history in a `Stream`, so a clip encoded chunk by chunk equals the whole pass."""

from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import Stream
from .kandinsky6_sr import SLICE_FRAMES, K6Config, _Causal


class EncoderBlock(nn.Module):
    """The encoder's resnet: the same as the decoder's with plain RMS norms (no latent to condition on)."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = ops.ChannelRMSNorm(cin)
        self.conv1 = _Causal(cin, cout, 3)
        self.norm2 = ops.ChannelRMSNorm(cout)
        self.conv2 = _Causal(cout, cout, 3)
        self.nin_shortcut = ops.Conv3d(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        # SiLU(norm(.)) is written straight into each convolution's padded buffer (CausalConv3d.step's `norm`)
        h = self.conv1.conv.step(x, stream, norm=self.norm1, frames=SLICE_FRAMES)
        h = self.conv2.conv.step(h, stream, norm=self.norm2, frames=SLICE_FRAMES)
        if self.nin_shortcut is not None:
            x = self.nin_shortcut(x)
        h += x
        return h


class _TimeConv(nn.Module):
    """A causal (2, 1, 1) convolution under `.conv`, its history one frame (a copy of the first at the clip's
    start). With stride 2 each output reads a frame pair: the first chunk's (its first frame and its copy) and
    every later chunk's pairs start on the chunk's first frame, so nothing is carried (Downsample.step's chunks
    have an even frame count after the first)."""

    def __init__(self, c: int, stride: int):
        super().__init__()
        self.conv = ops.Conv3d(c, c, (2, 1, 1), stride=(stride, 1, 1))

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        key = id(self)
        prev = stream.frames.get(key)
        if self.conv.stride[0] == 1:
            if stream.keep:
                stream.frames[key] = x[:, :, -1:].clone()
            else:
                stream.frames.pop(key, None)
        elif prev is None:
            stream.frames[key] = x[:, :, :0]  # marks the clip started; nothing to carry
        if prev is None:
            prev = x[:, :, :1]
        elif not prev.shape[2]:
            return self.conv(x)
        return self.conv(torch.cat([prev, x], dim=2))


class Downsample(nn.Module):
    def __init__(self, c: int, temporal: bool):
        super().__init__()
        self.spatial_conv = ops.Conv3d(c, 2 * c, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1))
        if temporal:
            self.temporal_conv = nn.ModuleList([_TimeConv(2 * c, 1), _TimeConv(2 * c, 2)])
        self.linear = ops.Conv3d(2 * c, 2 * c, 1)

    def step(self, x: torch.Tensor, stream: Stream, first: bool) -> torch.Tensor:
        b, c, t, h, w = x.shape
        # each 2x2 patch's rows, their two columns averaged: channel 2k + row of the output is channel k's
        pairs = x.reshape(b, c, t, h // 2, 2, w // 2, 2).mean(dim=6)
        y = self.spatial_conv(x)
        del x
        y += pairs.permute(0, 1, 4, 2, 3, 5).reshape(b, 2 * c, t, h // 2, w // 2)
        del pairs
        if not hasattr(self, "temporal_conv"):
            return self.linear(y)
        if t % 2 != (1 if first else 0):
            raise FormatError(
                f"Kandinsky 6 SR's encoder halves time in frame pairs after the clip's first frame: a chunk of {t} "
                f"frames {'at' if first else 'after'} the clip's start cannot be halved"
            )
        # the frame pairs averaged (the first frame alone at the clip's start), plus the two convolutions
        rest = y[:, :, 1:] if first else y
        pooled = rest.reshape(b, 2 * c, rest.shape[2] // 2, 2, h // 2, w // 2).mean(dim=3)
        if first:
            pooled = torch.cat([y[:, :, :1], pooled], dim=2)
        out = self.temporal_conv[1].step(self.temporal_conv[0].step(y, stream), stream)
        del y
        out += pooled
        return self.linear(out)


class _DownLevel(nn.Module):
    def __init__(self, blocks: list[EncoderBlock], downsample: Downsample | None):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        if downsample is not None:
            self.downsample = downsample


class _Middle(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1 = EncoderBlock(c, c)
        self.block_2 = EncoderBlock(c, c)


class Encoder(nn.Module):
    def __init__(self, cfg: K6Config):
        super().__init__()
        dims = cfg.enc_dims
        self.conv_in = _Causal(cfg.image_channels, dims[0], 3)
        levels: list[_DownLevel] = []
        cin = dims[0]
        for i, c in enumerate(dims):
            blocks = [EncoderBlock(cin if j == 0 else c, c) for j in range(cfg.enc_layers)]
            last = i == len(dims) - 1
            levels.append(_DownLevel(blocks, None if last else Downsample(c, cfg.enc_temporal[i])))
            cin = c if last else 2 * c
        self.down = nn.ModuleList(levels)
        self.mid = _Middle(cin)
        self.norm_out = ops.ChannelRMSNorm(cin)
        self.conv_out = _Causal(cin, 2 * cfg.z, 3)

    def step(self, x: torch.Tensor, stream: Stream, first: bool) -> torch.Tensor:
        h = self.conv_in.step(x, stream)
        for level in self.down:
            for block in level.block:
                h = block.step(h, stream)
            if hasattr(level, "downsample"):
                h = level.downsample.step(h, stream, first)
        h = self.mid.block_1.step(h, stream)
        h = self.mid.block_2.step(h, stream)
        return self.conv_out.conv.step(h, stream, norm=self.norm_out, frames=SLICE_FRAMES)
