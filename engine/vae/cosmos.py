"""Cosmos 1.0's continuous video tokenizer (Cosmos-Tokenize1 CV8x8x8, the VAE of Cosmos Predict1 / 1.0 Diffusion) as
a chunked, tiled video VAE on castable ops and `CausalConv3d`, in diffusers' names (AutoencoderKLCosmos); NVIDIA's
own names (its JIT tokenizer's state dict, as ComfyUI's repackaged `cosmos_cv8x8x8_1.0.safetensors` keeps them) are
renamed onto these by engine.vae.cosmos_loading.

Architecture facts (diffusers `autoencoder_kl_cosmos.py`; NVIDIA's Cosmos-Tokenizer `modules/layers3d.py` as
ComfyUI's `cosmos_tokenizer/layers3d.py` has it, DecoderFactorized; diffusers `scripts/convert_cosmos_to_diffusers.py`
for the release's config and names):
  * every convolution is "factorized": a 1x3x3 spatial one (`conv_s`, zero borders) then a 3x1x1 temporal one
    (`conv_t`), causal in time -- its two history frames at the clip's start are copies of the first frame;
  * residual block = GroupNorm(1 group, eps 1e-6) of each frame on its own (over its channels and pixels), SiLU,
    conv, the same again, plus a 1x1x1 `conv_shortcut` where the width changes;
  * the middle block = resnet, attention over each frame's pixels (one head, the frame's GroupNorm, 1x1x1 q / k / v /
    out), attention over each pixel's frames (causal: a frame sees itself and the frames before), resnet;
  * an up block = resnets (each followed by the two attentions where the block has them: none in the release), then
    its upsampler: in time each frame twice, the clip's first once, then a causal 3x1x1 conv added to its input
    (`conv1`); in space nearest x2 then a 1x3x3 conv added to its input (`conv2`); then a 1x1x1 `conv3`. Which of
    the two an upsampler does is read from the weights (`conv1` / `conv2` present);
  * the decoder ends in GroupNorm, SiLU, a factorized conv to image channels x p^3, then the inverse of the
    encoder's patching: p = 4 by a two-level inverse 3-D Haar wavelet transform (each level: 8 sub-bands of g
    channels, ordered time-band, height-band, width-band, to a clip of twice the frames, rows and columns; its
    1/sqrt(2) per axis and the sqrt(8) rescale cancel to sums and differences), then the clip's first p - 1
    frames are dropped. The "rearrange" patching (depth-to-space by p) is the other method NVIDIA's code names.
  * the release (CV8x8x8-1.0): latent 16, decoder widths 512 -> 256, 3 up blocks of 3 resnets, the second up block
    up in time and space, p = 4: 8x in space, T latent frames give 1 + 8 (T - 1) frames.

Everything is causal or per frame, so a clip decoded chunk by chunk equals the whole pass: the temporal attention
keeps every earlier frame's keys and values in the head's `Stream`, the upsampler's first-frame rule and the
unpatching's dropped frames apply once per stream. A spatial tile normalises with its own statistics: tiles are
close to, not equal to, the whole frame (as Mochi's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .autoencoder_kl import attention
from .causal_conv import CausalConv3d, Stream, VideoShape

GROUPS = 1  # every norm of the tokenizer normalises each frame as one group (num_groups=1)
EPS = 1e-6
SLICE_FRAMES = 1  # input frames per temporal convolution call (CausalConv3d.sliced)
METHODS = ("haar", "rearrange")
KIND = "cosmos_predict1"  # the estimate's kind and the detected architecture: the family that introduced the layout
SIGMA_DATA = (
    0.5  # Cosmos 1.0's EDM sigma_data: the scale of the normalised latents (its pipelines and ComfyUI's VAE)
)


@dataclass(frozen=True)
class CosmosConfig:
    """What the decoder's weights say; `method` (the patching) is read from the file's wavelet buffer where it keeps one,
    else the continuous tokenizers' haar."""

    z: int = 16
    mid: int = 512  # conv_in's width: the middle block's
    widths: tuple[int, ...] = (512, 512, 256)  # each up block's output width
    layers: tuple[int, ...] = (3, 3, 3)  # resnets per up block
    time_up: tuple[bool, ...] = (False, True, False)
    space_up: tuple[bool, ...] = (False, True, False)
    attention: tuple[bool, ...] = (False, False, False)  # up blocks with the two attentions after each resnet
    patch: int = 4
    method: str = "haar"
    image_channels: int = 3
    encoder: object | None = None  # engine.vae.cosmos_encoder.EncoderConfig, where the file holds the encoder

    @property
    def downscale(self) -> int:
        return self.patch * 2 ** sum(self.space_up)

    @property
    def time_factor(self) -> int:
        return self.patch * 2 ** sum(self.time_up)


class Norm(nn.Module):
    """CosmosCausalGroupNorm: its GroupNorm as the child `norm`, each frame normalised on its own."""

    def __init__(self, c: int):
        super().__init__()
        self.norm = ops.GroupNorm(GROUPS, c, eps=EPS)

    def frames(self, x: torch.Tensor, silu: bool) -> torch.Tensor:
        """The norm (and SiLU) of every frame of x (B, C, T, H, W), frame by frame into one output."""
        out = torch.empty_like(x)
        for i in range(x.shape[2]):
            y = self.norm(x[:, :, i])
            out[:, :, i] = F.silu(y, inplace=True) if silu else y
        return out


def spatial_conv(cin: int, cout: int) -> CausalConv3d:
    return CausalConv3d(cin, cout, (1, 3, 3), padding=(0, 1, 1), pad="replicate_time")


def temporal_conv(cin: int, cout: int, stride: int = 1) -> CausalConv3d:
    return CausalConv3d(cin, cout, (3, 1, 1), stride=(stride, 1, 1), padding=(1, 0, 0), pad="replicate_time")


class Projection(nn.Module):
    """CosmosConvProjection3d: a 1x3x3 convolution then a causal 3x1x1 one."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv_s = spatial_conv(cin, cout)
        self.conv_t = temporal_conv(cout, cout)

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        h = self.conv_s.step(x, None)
        # frame by frame through the rolling buffer, each output over its own (fresh) input frame
        return self.conv_t.sliced(h, stream, frames=SLICE_FRAMES, inplace=True)


class Resnet(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = Norm(cin)
        self.conv1 = Projection(cin, cout)
        self.norm2 = Norm(cout)
        self.conv2 = Projection(cout, cout)
        self.conv_shortcut = ops.Conv3d(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        h = self.conv1.step(self.norm1.frames(x, silu=True), stream)
        h = self.conv2.step(self.norm2.frames(h, silu=True), stream)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        h += x  # the same sum as x + h, into the convolution's fresh output
        return h


class Attention(nn.Module):
    """One head, the frame's GroupNorm, 1x1x1 q / k / v / out convolutions and a residual: over each frame's pixels
    (`temporal` False) or, causal, over each pixel's frames (`temporal` True; the frames of earlier chunks through the
    stream's keys and values)."""

    def __init__(self, c: int, temporal: bool):
        super().__init__()
        self.norm = Norm(c)
        self.to_q, self.to_k, self.to_v = (ops.Conv3d(c, c, 1) for _ in range(3))
        self.to_out = nn.ModuleList([ops.Conv3d(c, c, 1)])
        self.temporal = temporal

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        b, c, t, h, w = x.shape
        n = self.norm.frames(x, silu=False)
        if self.temporal:  # (B h w, T, C)
            q, k, v = (
                m(n).permute(0, 3, 4, 2, 1).reshape(b * h * w, t, c)
                for m in (self.to_q, self.to_k, self.to_v)
            )
            del n
            a = _causal_over_frames(self, q, k, v, stream).reshape(b, h, w, t, c).permute(0, 4, 3, 1, 2)
        else:  # (B T, h w, C)
            q, k, v = (
                m(n).permute(0, 2, 3, 4, 1).reshape(b * t, h * w, c)
                for m in (self.to_q, self.to_k, self.to_v)
            )
            del n
            a = attention(q.contiguous(), k, v).reshape(b, t, h, w, c).permute(0, 4, 1, 2, 3)
        del q, k, v
        y = self.to_out[0](a.contiguous())
        y += x
        return y


def _causal_over_frames(owner: nn.Module, q, k, v, stream: Stream | None) -> torch.Tensor:
    """Each pixel's frames (N, t, C) against its keys up to their own frame, earlier chunks' keys and values kept in
    the stream under `owner` (one stacked tensor, as the stream's other entries: video.Snapshots copies them)."""
    past = stream.frames.get(id(owner)) if stream is not None else None
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    if stream is not None and stream.keep:
        stream.frames[id(owner)] = torch.stack([k, v])
    elif stream is not None:
        stream.frames.pop(id(owner), None)
    t, total = q.shape[1], k.shape[1]
    before = total - t
    mask = (
        torch.arange(total, device=q.device)[None, :] <= (before + torch.arange(t, device=q.device))[:, None]
    )
    out = torch.empty_like(q)
    rows = max(
        1, (32 << 20) // max(1, t * total * q.element_size())
    )  # pixels a call: its scores within 32 MiB
    for i in range(0, q.shape[0], rows):
        ops.check_cancelled()
        out[i : i + rows] = F.scaled_dot_product_attention(
            q[i : i + rows], k[i : i + rows], v[i : i + rows], mask
        )
    return out


class MidBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(c, c), Resnet(c, c)])
        self.attentions = nn.ModuleList([Attention(c, temporal=False)])
        self.temp_attentions = nn.ModuleList([Attention(c, temporal=True)])

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.resnets[0].step(x, stream)
        x = self.attentions[0].step(x, stream)
        x = self.temp_attentions[0].step(x, stream)
        return self.resnets[1].step(x, stream)


class Upsample(nn.Module):
    def __init__(self, c: int, time: bool, space: bool):
        super().__init__()
        self.conv1 = temporal_conv(c, c) if time else None
        self.conv2 = spatial_conv(c, c) if space else None
        self.conv3 = ops.Conv3d(c, c, 1)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        if self.conv1 is not None:
            first = id(self) not in stream.started
            stream.started.add(id(self))  # the clip's first frame once, every later frame twice
            rest = (x[:, :, 1:] if first else x).repeat_interleave(2, dim=2)
            x = torch.cat([x[:, :, :1], rest], dim=2) if first else rest
            del rest
            y = self.conv1.step(x, stream, frames=SLICE_FRAMES)
            y += x
            x = y
        if self.conv2 is not None:
            x = x.repeat_interleave(2, dim=3).repeat_interleave(2, dim=4)
            y = self.conv2.step(x, None)
            y += x
            x = y
        return self.conv3(x)


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, attn: bool, time: bool, space: bool):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout) for i in range(layers)])
        if attn:
            self.attentions = nn.ModuleList([Attention(cout, temporal=False) for _ in range(layers)])
            self.temp_attentions = nn.ModuleList([Attention(cout, temporal=True) for _ in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample(cout, time, space)]) if time or space else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for i, r in enumerate(self.resnets):
            x = r.step(x, stream)
            if hasattr(self, "attentions"):
                x = self.temp_attentions[i].step(self.attentions[i].step(x, stream), stream)
        return x if self.upsamplers is None else self.upsamplers[0].step(x, stream)


class Decoder(nn.Module):
    def __init__(self, cfg: CosmosConfig):
        super().__init__()
        self.conv_in = Projection(cfg.z, cfg.mid)
        self.mid_block = MidBlock(cfg.mid)
        cins = (cfg.mid, *cfg.widths[:-1])
        self.up_blocks = nn.ModuleList(
            UpBlock(cins[i], cfg.widths[i], cfg.layers[i], cfg.attention[i], cfg.time_up[i], cfg.space_up[i])
            for i in range(len(cfg.widths))
        )
        self.norm_out = Norm(cfg.widths[-1])
        self.conv_out = Projection(cfg.widths[-1], cfg.image_channels * cfg.patch**3)


def unpatch(x: torch.Tensor, p: int, method: str) -> torch.Tensor:
    """(B, C p^3, T, H, W) -> (B, C, p T, p H, p W): the inverse of the encoder's patching (the clip's first p - 1
    frames are the caller's to drop)."""
    if method == "rearrange":
        b, _, t, h, w = x.shape
        x = x.unflatten(1, (-1, p, p, p)).permute(0, 1, 5, 2, 6, 3, 7, 4)
        return x.reshape(b, -1, t * p, h * p, w * p)
    for _ in range(p.bit_length() - 1):
        x = _inverse_haar(x)
    return x


def haar_signs() -> torch.Tensor:
    """(8, 8): (-1)^popcount(b & d) for sub-band b and offset d (both 4 t + 2 h + w): the 3-D Haar transform's signs
    (with the tokenizer's rescales the transform is this matrix over 8, its inverse the matrix itself)."""
    bits = torch.arange(8)
    odd = ((bits[:, None] & bits[None, :]).view(8, 8, 1) >> torch.arange(3)) & 1
    return 1.0 - 2.0 * odd.sum(-1).remainder(2)


def _inverse_haar(x: torch.Tensor) -> torch.Tensor:
    """One level of the inverse 3-D Haar transform with the tokenizer's rescale: 8 sub-bands (band b = 4 bt + 2 bh +
    bw, of g channels each) to a clip of 2x the frames, rows and columns; output offset d = 4 dt + 2 dh + dw gets the
    sum over bands of (-1)^popcount(b & d) times the band."""
    b, c8, t, h, w = x.shape
    g = c8 // 8
    y = torch.einsum("db,nbgthw->ndgthw", haar_signs().to(x), x.reshape(b, 8, g, t, h, w))
    y = y.reshape(b, 2, 2, 2, g, t, h, w).permute(0, 4, 5, 1, 6, 2, 7, 3)
    return y.reshape(b, g, 2 * t, 2 * h, 2 * w)


class CosmosVAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, 16, T, h, w) and returns clips (B, 3, 1 + 8 (T - 1), 8h, 8w) in [-1, 1]."""

    kind = "vae"
    video = True
    image_range = (-1.0, 1.0)
    encodes = True  # a file of this family without the encoder is a decoder-only file (engine.vae.run)
    fps = 30.0  # Cosmos 1.0's pipelines export at 30 fps (diffusers' Cosmos examples)

    def __init__(self, cfg: CosmosConfig):
        super().__init__()
        if cfg.method not in METHODS:
            raise ValueError(f"method {cfg.method!r}: one of {METHODS}")
        self.cfg = cfg
        # (mean, std), each (z, frames), where the file holds its latent statistics (ComfyUI's repackaged file:
        # `latent_mean` / `latent_std`, 16 frames): its latents are then the normalised ones (see `normalise`)
        self.latent_stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self.post_quant_conv = ops.Conv3d(cfg.z, cfg.z, 1)
        self.decoder = Decoder(cfg)
        if cfg.encoder is not None:
            from .cosmos_encoder import Encoder

            self.encoder = Encoder(cfg.encoder, cfg)
            self.quant_conv = ops.Conv3d(cfg.z, cfg.z, 1)

    def vae_spec(self):
        """The estimate's view (engine.vae.estimate.spec_of): the last up block's width per output pixel of a frame
        (it runs at 1/p of the output's size, as LTX's last level), the middle block's width."""
        from .estimate import VaeSpec

        wbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        c = self.cfg
        return VaeSpec(
            KIND, c.z, wbytes, max(1, c.widths[-1] // c.patch**2), c.mid, c.time_factor, c.downscale
        )

    # -- pieces the chunked runner composes (engine.vae.video) ----------------------------------
    def normalise(self, z: torch.Tensor, stream: Stream, inverse: bool) -> torch.Tensor:
        """The latent statistics a file holds, applied as ComfyUI's VAE applies them with that file (comfy/ldm/cosmos
        vae.py): encode gives (z - mean) / std * sigma_data, decode takes that back, latent frame i reading the
        statistics' frame i mod their count. The stream counts the chunk's first frame, so chunks see the clip's."""
        if self.latent_stats is None:
            return z
        key = id(self.latent_stats)
        t0 = int(stream.frames[key]) if key in stream.frames else 0
        stream.frames[key] = torch.tensor(t0 + z.shape[2])
        mean, std = self.latent_stats
        idx = torch.arange(t0, t0 + z.shape[2]) % mean.shape[1]
        mean, std = (s[:, idx].to(z)[None, :, :, None, None] for s in (mean, std))
        return (z / SIGMA_DATA) * std + mean if inverse else (z - mean) / std * SIGMA_DATA

    def decode_head(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        d = self.decoder
        x = self.post_quant_conv(self.normalise(z, stream, inverse=True))
        return d.mid_block.step(d.conv_in.step(x, stream), stream)

    def decode_up(self, h: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        """The up blocks, the output conv and the unpatching (`frames_at_once`: unused, the chunks are the unit)."""
        d = self.decoder
        for blk in d.up_blocks:
            h = blk.step(h, stream)
        x = unpatch(d.conv_out.step(d.norm_out.frames(h, silu=True), stream), self.cfg.patch, self.cfg.method)
        if id(self) not in stream.started:
            stream.started.add(id(self))  # the patching's repeated first frame: its p - 1 copies go, once
            x = x[:, :, self.cfg.patch - 1 :]
        return x

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The whole clip in one pass."""
        return self.decode_up(self.decode_head(z, Stream()), Stream()).clamp_(-1, 1)

    def encode(self, x: torch.Tensor, chunk_frames: int | None = None) -> torch.Tensor:
        """Clip (B, 3, 1 + 8k, H, W) in [-1, 1] -> latent (B, 16, 1 + k, H/8, W/8), chunk by chunk
        (engine.vae.cosmos_encoder; `chunk_frames` a multiple of the time factor, default one latent frame's)."""
        from .cosmos_encoder import encode

        return encode(self, x, chunk_frames or self.time_factor)
