"""The HunyuanVideo 1.5 VAE's encoder (engine.vae.hunyuan_video15 builds it where the file holds it): clips in
[-1, 1] to the posterior mean, as diffusers' AutoencoderKLHunyuanVideo15.encode(x).latent_dist.mode().

Architecture facts (diffusers `autoencoder_kl_hunyuanvideo15.py`, HunyuanVideo15Encoder3D):
  * `conv_in`, then down blocks of `layers_per_block` resnets (the decoder's: RMS norms, causal convolutions),
    block i ending in a space-to-depth downsample where i < log2(16) -- a causal conv to the next width / 4
    (/ 8 where it also halves time: i >= log2(16 / 4)), folded 2x2 (2x2x2; the clip's first frame 1x2x2, its
    channels then doubled) into channels, plus the input folded the same way and averaged over the groups of
    channels that land on one output channel;
  * the decoder's middle block (attention causal over frames), then RMS norm, SiLU, a causal conv to 2 z
    channels, plus the middle block's output averaged over groups of width / 2 z channels. No quant_conv; the
    mean is the first z channels.

Every op is per position or causal, so the clip runs in chunks of frames through a `Stream` (1, then 4 at a
time: each later chunk folds into one latent frame), and the result equals diffusers' encode of the whole
clip, which its `_encode` runs in one pass.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import Stream
from .hunyuan_video15 import MidBlock, Resnet, _Causal


def fold_down(x: torch.Tensor, rt: int) -> torch.Tensor:
    """(B, C, rt T, 2H, 2W) -> (B, rt*2*2*C, T, H, W), the inverse of hunyuan_video15.unfold_up: the pixel at
    (frame t*rt + it, row 2y + ih, column 2x + iw) lands in channel ((it*2 + ih)*2 + iw)*C + c."""
    b, c, tt, hh, ww = x.shape
    x = x.reshape(b, c, tt // rt, rt, hh // 2, 2, ww // 2, 2).permute(0, 3, 5, 7, 1, 2, 4, 6)
    return x.reshape(b, rt * 4 * c, tt // rt, hh // 2, ww // 2)


def group_mean(x: torch.Tensor, cout: int) -> torch.Tensor:
    """x's channels averaged over consecutive groups down to `cout` channels."""
    b, c, t, h, w = x.shape
    return x.reshape(b, cout, c // cout, t, h, w).mean(dim=2)


class Downsample(nn.Module):
    def __init__(self, cin: int, cout: int, time: bool):
        super().__init__()
        self.time, self.cout = time, cout
        self.conv = _Causal(cin, cout // (8 if time else 4))

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        h = self.conv.step(x, stream)
        if not self.time:
            return fold_down(h, 1) + group_mean(fold_down(x, 1), self.cout)
        first = id(self) not in stream.started
        stream.started.add(id(self))
        parts = []
        if first:  # the clip's first frame: space only, its folded channels twice over
            hf = fold_down(h[:, :, :1], 1)
            parts.append(torch.cat([hf, hf], dim=1) + group_mean(fold_down(x[:, :, :1], 1), self.cout))
            h, x = h[:, :, 1:], x[:, :, 1:]
        if x.shape[2]:
            parts.append(fold_down(h, 2) + group_mean(fold_down(x, 2), self.cout))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, down: tuple[int, bool] | None):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout) for i in range(layers)])
        self.downsamplers = nn.ModuleList([Downsample(cout, *down)]) if down is not None else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for r in self.resnets:
            x = r.step(x, stream)
        return x if self.downsamplers is None else self.downsamplers[0].step(x, stream)


class Encoder(nn.Module):
    """Names as diffusers' HunyuanVideo15Encoder3D. `blocks`: per down block (input width, width, its
    downsample's (output width, halves time) or None)."""

    def __init__(self, image_channels: int, z: int, layers: int, blocks):
        super().__init__()
        self.conv_in = _Causal(image_channels, blocks[0][0])
        self.down_blocks = nn.ModuleList(DownBlock(cin, cout, layers, down) for cin, cout, down in blocks)
        mid = blocks[-1][2][0] if blocks[-1][2] is not None else blocks[-1][1]
        self.mid_block = MidBlock(mid)
        self.norm_out = ops.ChannelRMSNorm(mid)
        self.conv_out = _Causal(mid, 2 * z)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.conv_in.step(x, stream)
        for blk in self.down_blocks:
            x = blk.step(x, stream)
        x = self.mid_block.step(x, stream)
        out = self.conv_out.step(x, stream, self.norm_out)
        out += group_mean(x, out.shape[1])
        return out


def encoder_blocks(sd: dict, path: str):
    """(layers, blocks) of the file's encoder (Encoder's arguments), from its shapes."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in sd:
            raise FormatError(f"{path}: a HunyuanVideo 1.5 VAE encoder without {key}", path=path)
        return tuple(sd[key].shape)

    n = len({int(k.split(".")[2]) for k in sd if k.startswith("encoder.down_blocks.")})
    layers = len({int(k.split(".")[4]) for k in sd if k.startswith("encoder.down_blocks.0.resnets.")})
    blocks = []
    for i in range(n):
        cout, cin = shape(f"encoder.down_blocks.{i}.resnets.0.conv1.conv.weight")[:2]
        key = f"encoder.down_blocks.{i}.downsamplers.0.conv.conv.weight"
        down = None
        if key in sd:  # its output width: the next block's input, or the middle block's
            nxt = f"encoder.down_blocks.{i + 1}.resnets.0.conv1.conv.weight"
            out = shape(nxt)[1] if i + 1 < n else shape("encoder.mid_block.resnets.0.conv1.conv.weight")[1]
            factor = out // shape(key)[0]
            if factor not in (4, 8) or out % shape(key)[0]:
                raise FormatError(
                    f"{path}: {key} of {shape(key)[0]} channels: not {out} / 4 or / 8", path=path
                )
            down = (out, factor == 8)
        blocks.append((cin, cout, down))
    if not blocks or not layers:
        raise FormatError(
            f"{path}: a HunyuanVideo 1.5 VAE encoder without encoder.down_blocks.0.resnets.0", path=path
        )
    return layers, tuple(blocks)


def encode(vae, x: torch.Tensor) -> torch.Tensor:
    """Clip (B, 3, 1 + 4k, H, W) in [-1, 1] -> posterior mean (B, z, 1 + k, H/16, W/16): the first frame, then
    4 frames at a time, the causal state carried in one `Stream` (see the module's docstring)."""
    from .hunyuan_video_encoder import check_clip

    check_clip(x, vae.time_factor, vae.downscale)
    stream = Stream()
    t, step = x.shape[2], vae.time_factor
    bounds = [0, 1, *range(1 + step, t + 1, step)]
    outs = []
    for a, b in zip(bounds[:-1], bounds[1:], strict=True):
        stream.keep = b < t  # the last chunk keeps no frames for a chunk after it
        outs.append(vae.encoder.step(x[:, :, a:b], stream)[:, : vae.cfg.z])
    return torch.cat(outs, dim=2)
