"""The HunyuanVideo 1.5 VAE's decoder, on castable ops and `CausalConv3d`, so `engine.vae.video` chunks and
tiles it as it does Wan's (its encoder, built where the file holds one: engine.vae.hunyuan_video15_encoder).

Architecture facts (diffusers `autoencoder_kl_hunyuanvideo15.py`, AutoencoderKLHunyuanVideo15):
  * causal 3-D convolutions wrapped as `<name>.conv`, padded by replication (history frames = copies of the
    clip's first, borders = edge copies), as HunyuanVideo's (engine.vae.hunyuan_video);
  * RMS norms over channels with a `gamma` (Wan's: x / ||x||_C * sqrt(C) * gamma), so every op is per
    position or causal and a clip decoded chunk by chunk equals the whole pass;
  * `conv_in` adds the latent itself, its channels repeated to the width; resnet = norm, SiLU, conv, norm,
    SiLU, conv, plus a plain 1x1x1 `conv_shortcut` when the width changes; the middle block = resnet,
    attention, resnet, the attention one head with 1x1x1 `to_q` / `to_k` / `to_v` / `proj_out`, causal
    over frames (the keys and values of earlier chunks kept in the stream);
  * upsampling is depth-to-space: a causal conv to `factor` x the next width, unfolded into 2x2 (1x2x2 for
    the clip's first frame, which keeps the first half of the channels) or 2x2x2 patches, plus the input
    unfolded the same way with its channels repeated. Up block i doubles space where i < log2(16) and time
    where i < log2(4);
  * release config (diffusers AutoencoderKLHunyuanVideo15's defaults): latent 32, widths (128, 256, 512,
    1024, 1024), 2 layers per block, 16x / 4x, scaling factor 1.03682. No post-quant convolution.

Naming: diffusers' (hunyuanvideo-community/HunyuanVideo-1.5 `vae/`); the only one this module reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import CausalConv3d, Stream, VideoShape
from .hunyuan_video import causal_frames

SLICE_FRAMES = 1


class _Causal(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv = CausalConv3d(cin, cout, 3, padding=1, pad="replicate")

    def step(self, x: torch.Tensor, stream: Stream, norm: ops.ChannelRMSNorm | None = None) -> torch.Tensor:
        return self.conv.step(x, stream, norm=norm, frames=SLICE_FRAMES)


class Resnet(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = ops.ChannelRMSNorm(cin)
        self.conv1 = _Causal(cin, cout)
        self.norm2 = ops.ChannelRMSNorm(cout)
        self.conv2 = _Causal(cout, cout)
        self.conv_shortcut = ops.Conv3d(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        h = self.conv1.step(x, stream, self.norm1)
        h = self.conv2.step(h, stream, self.norm2)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        h += x
        return h


class CausalAttention(nn.Module):
    """One head over the chunk's tokens, each frame's queries seeing their own and earlier frames' keys."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = ops.ChannelRMSNorm(dim)
        self.to_q, self.to_k, self.to_v, self.proj_out = (ops.Conv3d(dim, dim, 1) for _ in range(4))

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        b, c, t, h, w = x.shape
        n = h * w
        y = self.norm(x)
        q, k, v = (f(y).flatten(2).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        del y
        out = causal_frames(self, q, k, v, stream, t, n)
        y = self.proj_out(out.transpose(1, 2).reshape(b, c, t, h, w))
        y += x
        return y


class MidBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(dim, dim), Resnet(dim, dim)])
        self.attentions = nn.ModuleList([CausalAttention(dim)])

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.resnets[0].step(x, stream)
        x = self.attentions[0].step(x, stream)
        return self.resnets[1].step(x, stream)


def unfold_up(x: torch.Tensor, rt: int) -> torch.Tensor:
    """(B, rt*2*2*C, T, H, W) -> (B, C, rt T, 2H, 2W): channel ((it*2 + ih)*2 + iw)*C + c lands at
    (frame t*rt + it, row 2y + ih, column 2x + iw)."""
    b, packed, t, h, w = x.shape
    c = packed // (rt * 4)
    x = x.reshape(b, rt, 2, 2, c, t, h, w).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return x.reshape(b, c, t * rt, h * 2, w * 2)


class Upsample(nn.Module):
    def __init__(self, cin: int, cout: int, time: bool):
        super().__init__()
        self.time = time
        self.factor = 8 if time else 4
        self.repeats = self.factor * cout // cin
        self.conv = _Causal(cin, cout * self.factor)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        h = self.conv.step(x, stream)
        if not self.time:
            return unfold_up(h, 1) + unfold_up(x.repeat_interleave(self.repeats, dim=1), 1)
        first = id(self) not in stream.started
        stream.started.add(id(self))
        parts = []
        if first:  # the clip's first frame: space only, the first half of the channels
            hf = unfold_up(h[:, :, :1], 1)
            hf = hf[:, : hf.shape[1] // 2]
            parts.append(hf + unfold_up(x[:, :, :1], 1).repeat_interleave(self.repeats // 2, dim=1))
            h, x = h[:, :, 1:], x[:, :, 1:]
        if x.shape[2]:
            parts.append(unfold_up(h, 2) + unfold_up(x, 2).repeat_interleave(self.repeats, dim=1))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, up: tuple[int, bool] | None):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout) for i in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample(cout, up[0], up[1])]) if up is not None else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for r in self.resnets:
            x = r.step(x, stream)
        return x if self.upsamplers is None else self.upsamplers[0].step(x, stream)


@dataclass(frozen=True)
class HV15Config:
    z: int = 32
    widths: tuple[int, ...] = (1024, 1024, 512, 256, 128)  # the decoder's order
    layers: int = 3  # resnets per up block
    ups: tuple[tuple[int, bool] | None, ...] = ((1024, True), (512, True), (256, False), (128, False), None)
    image_channels: int = 3

    @property
    def downscale(self) -> int:
        return 2 ** sum(u is not None for u in self.ups)

    @property
    def time_factor(self) -> int:
        return 2 ** sum(u is not None and u[1] for u in self.ups)


class Decoder(nn.Module):
    def __init__(self, cfg: HV15Config):
        super().__init__()
        w = cfg.widths
        self.conv_in = _Causal(cfg.z, w[0])
        self.mid_block = MidBlock(w[0])
        blocks, cin = [], w[0]
        for i, up in enumerate(cfg.ups):
            blocks.append(UpBlock(cin, w[i], cfg.layers, up))
            cin = up[0] if up is not None else w[i]
        self.up_blocks = nn.ModuleList(blocks)
        self.norm_out = ops.ChannelRMSNorm(w[-1])
        self.conv_out = _Causal(w[-1], cfg.image_channels)


class HunyuanVideo15VAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, 32, T, h, w) and returns clips (B, 3, 1 + 4 (T - 1), 16h, 16w) in
    [-1, 1]; `encode` clips of 1 + 4k frames to the posterior mean, where the file holds the encoder
    (engine.vae.hunyuan_video15_encoder, `encoder` built from `enc`: its layers and blocks)."""

    kind = "vae"
    video = True
    encodes = True  # a file of this family without the encoder is a decoder-only file (engine.vae.run)
    image_range = (-1.0, 1.0)
    fps = 24.0  # HunyuanVideo 1.5's pipelines export at 24 fps

    def __init__(self, cfg: HV15Config, enc=None):
        super().__init__()
        self.cfg = cfg
        self.decoder = Decoder(cfg)
        if enc is not None:
            from .hunyuan_video15_encoder import Encoder

            self.encoder = Encoder(cfg.image_channels, cfg.z, *enc)

    def vae_spec(self):
        from .estimate import VaeSpec

        wbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        c = self.cfg
        return VaeSpec("hunyuan_video15", c.z, wbytes, c.widths[-1], c.widths[0], c.time_factor, c.downscale)

    def decode_head(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        d = self.decoder
        h = d.conv_in.step(z, stream)
        h += z.repeat_interleave(h.shape[1] // z.shape[1], dim=1)
        return d.mid_block.step(h, stream)

    def decode_up(self, h: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        """The up path over the chunk's frames (`frames_at_once` unused: chunks are exact already)."""
        d = self.decoder
        for blk in d.up_blocks:
            h = blk.step(h, stream)
        return d.conv_out.step(h, stream, d.norm_out)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Whole-clip decode, one latent frame at a time (any chunking gives the same result)."""
        head, up = Stream(), Stream()
        out = [self.decode_up(self.decode_head(z[:, :, i : i + 1], head), up) for i in range(z.shape[2])]
        return torch.cat(out, dim=2).clamp_(-1, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Clip (B, 3, 1 + 4k, H, W) in [-1, 1] -> posterior mean (B, z, 1 + k, H/16, W/16), chunk by chunk."""
        from .hunyuan_video15_encoder import encode

        return encode(self, x)


def hv15_config(sd: dict, path: str) -> HV15Config:
    def shape(key: str) -> tuple[int, ...]:
        if key not in sd:
            raise FormatError(f"{path}: a HunyuanVideo 1.5 VAE without {key}", path=path)
        return tuple(sd[key].shape)

    z = shape("decoder.conv_in.conv.weight")[1]
    blocks = len({int(k.split(".")[2]) for k in sd if k.startswith("decoder.up_blocks.")})
    widths = tuple(shape(f"decoder.up_blocks.{i}.resnets.0.conv1.conv.weight")[0] for i in range(blocks))
    layers = len({int(k.split(".")[4]) for k in sd if k.startswith("decoder.up_blocks.0.resnets.")})
    ups = []
    for i in range(blocks):
        key = f"decoder.up_blocks.{i}.upsamplers.0.conv.conv.weight"
        if key not in sd:
            ups.append(None)
            continue
        nxt = widths[i + 1] if i + 1 < blocks else widths[i]
        factor = shape(key)[0] // nxt
        if factor not in (4, 8):
            raise FormatError(f"{path}: {key} of {shape(key)[0]} channels: not 4 or 8 x {nxt}", path=path)
        ups.append((nxt, factor == 8))
    image = shape("decoder.conv_out.conv.weight")[0]
    return HV15Config(z=z, widths=widths, layers=layers, ups=tuple(ups), image_channels=image)


def build(sd: dict, path: str, strict_load, made) -> HunyuanVideo15VAE:
    """The decoder of a HunyuanVideo 1.5 VAE file, and its encoder where the file holds one, loaded strictly."""
    cfg = hv15_config(sd, path)
    enc = None
    if any(k.startswith("encoder.") for k in sd):
        from .hunyuan_video15_encoder import encoder_blocks

        enc = encoder_blocks(sd, path)
    with torch.device("meta"):
        model = made(path, lambda: HunyuanVideo15VAE(cfg, enc))
    strict_load(
        model, sd if enc is not None else {k: v for k, v in sd.items() if not k.startswith("encoder.")}, path
    )
    model.source = path
    return model
