"""Cosmos 1.0's tokenizer encoder (engine.vae.cosmos builds it where the file holds it): clips of 1 + 8k frames to the
latent, causal, chunk by chunk.

Architecture facts (diffusers `autoencoder_kl_cosmos.py`, CosmosEncoder3d; NVIDIA's EncoderFactorized):
  * the patching: the clip's first frame repeated p times, then log2(p) levels of the 3-D Haar transform (pairs of
    frames, rows and columns into 8 sub-bands of the channels, ordered time-band, height-band, width-band; the
    1/sqrt(2) per axis and the 1/sqrt(8) rescale make each band 1/8 of a sum and difference); "rearrange" is
    space-to-depth by p;
  * `conv_in` a factorized conv, down blocks of resnets (and the two attentions where a block has them), each but the
    last with a downsampler: in space zero-pad one row and column at the end, a 1x3x3 stride-2 conv plus a 2x2 average;
    in time the first frame repeated once, a 3x1x1 stride-2 conv (one more copy as its causal history) plus a 2-frame
    average; then a 1x1x1 conv. The release's first down block halves both, the others neither;
  * the middle block as the decoder's, GroupNorm, SiLU, a factorized conv to the latent channels, `quant_conv`: the
    latent itself (diffusers' IdentityDistribution: no mean and variance split).

Chunks: the first frame alone, then 8 frames at a time -- a chunk's frames pair up whole in every patching level and
every time downsample, each downsample keeps the last frame before its pairs in the stream, the convolutions their
history and the attention over frames its keys and values, so the chunked encode equals the whole one.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import Stream
from .cosmos import Attention, MidBlock, Norm, Projection, Resnet, haar_signs

CHUNK_FRAMES = 8  # clip frames a chunk takes after the first (the release's 8x in time: one latent frame)


@dataclass(frozen=True)
class EncoderConfig:
    widths: tuple[int, ...]  # conv_in's, then each down block's output width
    layers: tuple[int, ...]  # resnets per down block
    space_down: tuple[bool, ...]
    time_down: tuple[bool, ...]
    attention: tuple[bool, ...]


def encoder_config(sd: dict, path: str, patch: int) -> EncoderConfig:
    from .cosmos_loading import _shape, patch_of, read_blocks

    first = _shape(sd, "encoder.conv_in.conv_s.weight", path)
    if patch_of(sd, "encoder", first[1], path) != patch:
        raise FormatError(f"{path}: the encoder patches {first[1] // 3} values a pixel, the decoder {patch**3}",
                          path=path)  # fmt: skip
    widths, layers, space, time, attn = read_blocks(sd, "encoder.down_blocks", "downsamplers", path)
    widths = [first[0], *widths]
    return EncoderConfig(tuple(widths), tuple(layers), tuple(space), tuple(time), tuple(attn))


class Downsample(nn.Module):
    def __init__(self, c: int, space: bool, time: bool):
        super().__init__()
        self.conv1 = ops.Conv3d(c, c, (1, 3, 3), stride=(1, 2, 2)) if space else None
        self.conv2 = ops.Conv3d(c, c, (3, 1, 1), stride=(2, 1, 1)) if time else None
        self.conv3 = ops.Conv3d(c, c, 1)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        if self.conv1 is not None:
            x = F.pad(x, (0, 1, 0, 1))
            y = self.conv1(x)
            y += F.avg_pool3d(x, (1, 2, 2), (1, 2, 2))
            x = y
        if self.conv2 is not None:
            x = self._time(x, stream)
        return self.conv3(x)

    def _time(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        """The clip's first frame alone (three copies under the conv, two under the average), then pairs of frames,
        each read with the frame before it: the carried last frame of the chunk before."""
        prev = stream.frames.get(id(self))
        if (
            prev is None
        ):  # the clip's start: its first frame, repeated as the release's cat and causal pad make it
            head = x[:, :, :1]
            conv_in, pool_in = torch.cat([head, head, x], dim=2), torch.cat([head, x], dim=2)
        else:
            conv_in, pool_in = torch.cat([prev, x], dim=2), x
        if pool_in.shape[2] % 2:
            raise FormatError(
                "a Cosmos tokenizer's time downsample takes the first frame, then pairs of frames"
            )
        if stream.keep:
            stream.frames[id(self)] = x[:, :, -1:].clone()
        y = self.conv2(conv_in)
        y += F.avg_pool3d(pool_in, (2, 1, 1), (2, 1, 1))
        return y


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, attn: bool, space: bool, time: bool):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout) for i in range(layers)])
        if attn:
            self.attentions = nn.ModuleList([Attention(cout, temporal=False) for _ in range(layers)])
            self.temp_attentions = nn.ModuleList([Attention(cout, temporal=True) for _ in range(layers)])
        # diffusers builds a downsampler for every block but the last, one of neither kind without weights
        self.downsamplers = nn.ModuleList([Downsample(cout, space, time)]) if space or time else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for i, r in enumerate(self.resnets):
            x = r.step(x, stream)
            if hasattr(self, "attentions"):
                x = self.temp_attentions[i].step(self.attentions[i].step(x, stream), stream)
        return x if self.downsamplers is None else self.downsamplers[0].step(x, stream)


class Encoder(nn.Module):
    def __init__(self, ecfg: EncoderConfig, cfg):
        super().__init__()
        w = ecfg.widths
        self.patch, self.method = cfg.patch, cfg.method
        self.conv_in = Projection(cfg.image_channels * cfg.patch**3, w[0])
        n = len(ecfg.layers)
        self.down_blocks = nn.ModuleList(
            DownBlock(
                w[i], w[i + 1], ecfg.layers[i], ecfg.attention[i], ecfg.space_down[i], ecfg.time_down[i]
            )
            for i in range(n)
        )
        self.mid_block = MidBlock(w[-1])
        self.norm_out = Norm(w[-1])
        self.conv_out = Projection(w[-1], cfg.z)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        """A chunk of the clip (the first frame, or a multiple of 8 frames after it) -> its latent frames."""
        first = id(self) not in stream.started
        stream.started.add(id(self))
        if first:  # the patching's first frame: p copies
            x = torch.cat([x[:, :, :1].expand(-1, -1, self.patch, -1, -1), x[:, :, 1:]], dim=2)
        x = self.conv_in.step(patch(x, self.patch, self.method), stream)
        for blk in self.down_blocks:
            x = blk.step(x, stream)
        x = self.mid_block.step(x, stream)
        return self.conv_out.step(self.norm_out.frames(x, silu=True), stream)


def patch(x: torch.Tensor, p: int, method: str) -> torch.Tensor:
    """(B, C, T, H, W), T, H, W multiples of p -> (B, C p^3, T/p, H/p, W/p): the decoder's `unpatch` inverted."""
    if method == "rearrange":
        b, c, t, h, w = x.shape
        x = x.reshape(b, c, t // p, p, h // p, p, w // p, p).permute(0, 1, 3, 5, 7, 2, 4, 6)
        return x.reshape(b, c * p**3, t // p, h // p, w // p)
    for _ in range(p.bit_length() - 1):
        x = _haar(x)
    return x


def _haar(x: torch.Tensor) -> torch.Tensor:
    """One level of the 3-D Haar transform with the tokenizer's rescale: band b = 4 bt + 2 bh + bw of g = C channels is
    1/8 of the sum over the 2x2x2 offsets d of (-1)^popcount(b & d) times the pixel at d."""
    b, g, t, h, w = x.shape
    y = x.reshape(b, g, t // 2, 2, h // 2, 2, w // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6).reshape(b, 8, g, t // 2,
                                                                                              h // 2, w // 2)  # fmt: skip
    y = torch.einsum("bd,ndgthw->nbgthw", haar_signs().to(x) / 8, y)
    return y.reshape(b, 8 * g, t // 2, h // 2, w // 2)


def check_clip(x: torch.Tensor, time_factor: int, downscale: int) -> None:
    if x.dim() != 5 or x.shape[1] != 3:
        raise FormatError(f"expected an RGB clip (B, 3, F, H, W), got {tuple(x.shape)}")
    t, h, w = x.shape[2:]
    if (t - 1) % time_factor:
        raise FormatError(
            f"a clip of {t} frames: the Cosmos tokenizer encodes 1 + {time_factor} k frames (1, 9, 17, ...)"
        )
    if h % downscale or w % downscale:
        raise FormatError(
            f"a {w}x{h} clip: the Cosmos tokenizer encodes sizes that are multiples of {downscale}"
        )


def encode(vae, x: torch.Tensor, chunk_frames: int = CHUNK_FRAMES) -> torch.Tensor:
    """Clip (B, 3, 1 + k tf, H, W) in [-1, 1] -> latent (B, z, 1 + k, H/f, W/f): the first frame alone, then
    `chunk_frames` (a multiple of the time factor) at a time over one Stream, so a chunk's activations are the peak."""
    if not hasattr(vae, "encoder"):
        raise FormatError(
            f"{getattr(vae, 'source', 'this VAE')}: this file holds the decoder only: give the VAE file with its encoder"
        )
    tf = vae.time_factor
    check_clip(x, tf, vae.downscale)
    if chunk_frames <= 0 or chunk_frames % tf:
        raise FormatError(f"chunks of {chunk_frames} frames: the Cosmos tokenizer's are multiples of {tf}")
    t = x.shape[2]
    stream = Stream()
    bounds = [0, 1, *range(1 + chunk_frames, t, chunk_frames), t] if t > 1 else [0, 1]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        stream.keep = b < t  # the last chunk keeps no history (an image: none at all)
        outs.append(
            vae.normalise(vae.quant_conv(vae.encoder.step(x[:, :, a:b], stream)), stream, inverse=False)
        )
    return torch.cat(outs, dim=2)
