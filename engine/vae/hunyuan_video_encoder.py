"""The HunyuanVideo VAE's encoder (engine.vae.hunyuan_video builds it where the file holds it): clips in
[-1, 1] to the posterior mean, as diffusers' AutoencoderKLHunyuanVideo.encode(x).latent_dist.mode().

Architecture facts (diffusers `autoencoder_kl_hunyuan_video.py`, HunyuanVideoEncoder3D):
  * `conv_in` (causal 3x3x3, replicate padding), then down blocks of `layers_per_block` resnets (the
    decoder's resnet), block i ending in a causal 3x3x3 convolution of stride 2 in space where the
    decoder's up block of the same index doubles space and 2 in time where it doubles time (no padding
    besides the causal one: T frames become 1 + (T - 1) / 2);
  * the decoder's middle block (resnet, attention causal over frames, resnet) at the last width, then
    GroupNorm, SiLU, a causal 3x3x3 `conv_out` to 2 z channels, and the 1x1x1 `quant_conv`; the mean is
    its first z channels.

Not causal: the GroupNorms take their statistics over every frame they are given, so an encode in chunks
of frames is not the whole one. A clip therefore runs as diffusers runs it: whole up to 16 frames, and a
longer one in diffusers' temporal tiles (`_temporal_tiled_encode`: 17 frames every 12, each tile's first
latent frame dropped and the one after it replaced by the previous tile's last), whose memory is a 17-frame
tile's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import CausalConv3d, Stream
from .hunyuan_video import EPS, GROUPS, MidBlock, Resnet, _Causal

TILE_FRAMES = 16  # diffusers' tile_sample_min_num_frames: a longer clip is encoded in tiles of 17 frames
TILE_STRIDE = 12  # tile_sample_stride_num_frames


class Downsample(nn.Module):
    """diffusers' HunyuanVideoDownsampleCausal3D: a causal 3x3x3 convolution of stride (t, 2, 2), run over
    the whole chunk at once (a frame-by-frame slice would break the time stride)."""

    def __init__(self, dim: int, space: bool, time: bool):
        super().__init__()
        stride = (2 if time else 1, 2 if space else 1, 2 if space else 1)
        self.conv = nn.Module()
        self.conv.conv = CausalConv3d(dim, dim, 3, stride=stride, padding=1, pad="replicate")

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        return self.conv.conv.step(x, stream)


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, space: bool, time: bool):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout) for i in range(layers)])
        self.downsamplers = nn.ModuleList([Downsample(cout, space, time)]) if space or time else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for r in self.resnets:
            x = r.step(x, stream)
        return x if self.downsamplers is None else self.downsamplers[0].step(x, stream)


class Encoder(nn.Module):
    """Names as diffusers' HunyuanVideoEncoder3D (the Tencent release's)."""

    def __init__(self, cfg, layers: int):
        super().__init__()
        w = cfg.widths
        self.conv_in = _Causal(cfg.image_channels, w[0])
        self.down_blocks = nn.ModuleList(
            DownBlock(w[max(i - 1, 0)], w[i], layers, cfg.space_up(i), cfg.time_up(i))
            for i in range(cfg.blocks)
        )
        self.mid_block = MidBlock(w[-1])
        self.conv_norm_out = ops.GroupNorm(GROUPS, w[-1], eps=EPS)
        self.conv_out = _Causal(w[-1], 2 * cfg.z)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.conv_in.step(x, stream)
        for blk in self.down_blocks:
            x = blk.step(x, stream)
        x = self.mid_block.step(x, stream)
        return self.conv_out.step(F.silu(self.conv_norm_out(x), inplace=True), stream)


def check_clip(x: torch.Tensor, time_factor: int, downscale: int) -> None:
    """The clips the encoder takes: (B, C, 1 + k time_factor, H, W), H and W multiples of `downscale`."""
    if x.dim() != 5:
        raise FormatError(f"expected a clip (B, C, F, H, W), got {tuple(x.shape)}")
    t, h, w = x.shape[2:]
    if (t - 1) % time_factor:
        raise FormatError(f"a clip of {t} frames: this VAE encodes 1 + {time_factor} k frames (1, 5, 9, ...)")
    if h % downscale or w % downscale:
        raise FormatError(f"a {w}x{h} clip: this VAE encodes sizes that are multiples of {downscale}")


def encode_whole(vae, x: torch.Tensor) -> torch.Tensor:
    """The mean of clip `x` in one pass (diffusers' encoder and quant_conv on the whole clip)."""
    stream = Stream()
    stream.keep = False  # nothing follows: the convolutions and the attention keep no frames
    return vae.quant_conv(vae.encoder.step(x, stream))[:, : vae.cfg.z]


def encode(vae, x: torch.Tensor) -> torch.Tensor:
    """Clip (B, C, 1 + 4k, H, W) in [-1, 1] -> posterior mean (B, z, 1 + k, H/8, W/8), as diffusers'
    encode with its default frame-wise tiles (see the module's docstring)."""
    check_clip(x, vae.time_factor, vae.downscale)
    t = x.shape[2]
    if t <= TILE_FRAMES:
        return encode_whole(vae, x)
    keep = TILE_STRIDE // vae.time_factor  # latent frames each tile contributes (the first: one more)
    outs: list[torch.Tensor] = []
    last = None  # the previous tile's last latent frame
    for a in range(0, t, TILE_STRIDE):
        m = encode_whole(vae, x[:, :, a : a + TILE_FRAMES + 1])
        if a:
            m = m[:, :, 1:]  # the tile's first frame stands alone: its latent frame repeats the last tile's
        if a and last is not None and m.shape[2]:
            m[:, :, :1] = last  # diffusers' blend over one latent frame: the previous tile's frame whole
        last = m[:, :, -1:].clone() if m.shape[2] else None
        outs.append(m[:, :, : keep if a else keep + 1])
    return torch.cat(outs, dim=2)[:, :, : 1 + (t - 1) // vae.time_factor]
