"""The LTX-Video VAE's decoder (Lightricks' 0.9.x releases; LTX-2's and LTX-2.3's video VAEs), built from castable ops under the names of
Lightricks' own single-file release (`ltx-video-2b-v0.9*.safetensors`, VAE keys under `vae.`), so those
files load as they are; diffusers-named files are renamed onto them (engine.vae.ltx_loading). Its encoder,
built where the file holds it, is engine.vae.ltx_encoder; `LTXVideoVAE.encode` runs it.

Architecture facts (Lightricks/LTX-Video `causal_video_autoencoder.py`, as diffusers' AutoencoderKLLTXVideo
re-implements it; its `convert_ltx_vae_checkpoint_to_diffusers` gives the name map):
  * `decoder.up_blocks` is one flat sequence: groups of residual blocks (`res_blocks.M`), a lone residual
    block that changes the width (0.9.0), and depth-to-space upsamplers (`conv.conv`: a 3x3x3 convolution
    to 8 / factor times the channels, each 2x2x2 group of channels unfolded into frames, rows, columns, the
    clip's first frame dropped; with `factor` 2 the input, unfolded the same way and its channels
    repeated, is added: the releases with a factor of 2 all have that residual, 0.9.0 neither);
  * every convolution pads time with copies of the clip's first and last frames, (k - 1) / 2 on each side
    -- NOT causal (diffusers' `decoder_causal=False`) -- and space with zeros;
  * norms are parameter-free RMS norms over channels (eps 1e-8), the width-changing block's shortcut a
    LayerNorm then a 1x1x1 convolution; SiLU;
  * 0.9.1 and later condition on the decode timestep: t * `timestep_scale_multiplier`, a 256-wide
    sinusoid (cos first) through `time_embedder.timestep_embedder.linear_1/2` per block group, giving each
    residual block's shift / scale (with its `scale_shift_table`) around both norms, and the last norm's
    (`last_time_embedder`, `last_scale_shift_table`);
  * conv_out gives 3 x 4 x 4 channels, unpacked into 4x4 pixels (Wan 2.2's channel order): 32x spatial,
    8x temporal (T latent frames -> 1 + 8 (T - 1)).
0.9.1's decoder adds random noise in its blocks (`per_channel_scale1/2`): refused by name.
LTX-2's video VAE (Lightricks/LTX-2; diffusers AutoencoderKLLTX2Video) has the same decoder -- the residual
layout of 0.9.5, timestep-conditioned -- with its spatial borders mirrored (`decoder_spatial_padding_mode`
"reflect") and, where its config says so, causal time padding (two copies of the first frame): `Pads`.
LTX-2.3's (Lightricks/LTX-2.3; diffusers convert_ltx2_to_diffusers, version "2.3") has four levels whose
upsamplers are 2x2x2 (factor 2), 2x2x2 (factor 1), in time only (2, 1, 1) and in space only (1, 2, 2), none
adding its input back, zero borders and no timestep: each upsampler's stride is read from its shapes (its
convolution gives volume x the next block's width), its residual from the release's config.

Chunked decoding: the decoder sees frames after the one it outputs, so a causal cache cannot make chunks
exact. The head (conv_in and the blocks before the first upsampler, at latent resolution) runs over the
whole clip at once; then each temporal chunk of the up path decodes as a clip of its own with
`time_context` latent frames of context on each side (their output discarded; engine.vae.video),
`time_context` being the up path's temporal reach -- every padded frame's influence then lies outside what
is kept, so the chunked decode equals the whole one. The reach is long for the released decoders (10
latent frames for 0.9.0's, 12 for 0.9.5's, 23 for a causal LTX-2 one), so a chunk of one latent frame
computes up to 25: on a clip of 16 latent frames (121 frames) the chunks mostly run whole, and the
spatial tiles are what bound the memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import CausalConv3d, Stream, VideoShape
from .wan import patchify, unpatchify

NORM_EPS = 1e-8  # the decoder's RMS norms (diffusers LTXVideoResnetBlock3d: RMSNorm(eps=1e-8))
LAYER_NORM_EPS = 1e-6  # the width-changing block's norm3 (resnet_norm_eps)
TIME_DIM = 256  # the sinusoid's width (PixArtAlphaCombinedTimestepSizeEmbeddings: Timesteps(256))
# The timestep the pipelines decode at, when the decoder is conditioned on one (0.9.1+): Lightricks'
# inference configs `decode_timestep: 0.05` (diffusers' LTXPipeline leaves it to the caller).
DECODE_TIMESTEP = 0.05


def pixel_norm(x: torch.Tensor) -> torch.Tensor:
    """x / RMS over channels (no learned scale)."""
    wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    return (wide * torch.rsqrt(wide.pow(2).mean(dim=1, keepdim=True) + NORM_EPS)).to(x.dtype)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale) + shift


@dataclass(frozen=True)
class Pads:
    """How the convolutions pad: time with copies of the first frame only (`causal`) or of the first and
    last; space with zeros, or mirrored (`reflect`: LTX-2's decoder)."""

    causal: bool = False
    reflect: bool = False


class Conv(nn.Module):
    """A 3x3x3 (or 1x1x1) convolution under `.conv`, time padded with copies of the chunk's end frames."""

    def __init__(self, cin: int, cout: int, k: int = 3, pads: Pads = Pads()):
        super().__init__()
        self.pads = pads
        p = 0 if pads.reflect else k // 2
        self.conv = CausalConv3d(cin, cout, k, padding=(0, p, p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.conv.kernel_size[0]
        if k > 1:
            first, last = (k - 1, 0) if self.pads.causal else ((k - 1) // 2, (k - 1) // 2)
            x = torch.cat([x[:, :, :1]] * first + [x] + [x[:, :, -1:]] * last, dim=2)
        if self.pads.reflect and self.conv.kernel_size[1] > 1:
            p = self.conv.kernel_size[1] // 2
            x = F.pad(x, (p, p, p, p, 0, 0), mode="reflect")
        return self.conv.step(x, None)


class TimeEmbedder(nn.Module):
    """`timestep_embedder.linear_1/2`: sinusoid(t) -> Linear, SiLU, Linear."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = nn.Module()
        self.timestep_embedder.linear_1 = ops.Linear(TIME_DIM, dim)
        self.timestep_embedder.linear_2 = ops.Linear(dim, dim)

    def forward(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        half = TIME_DIM // 2
        freq = torch.exp(
            torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(10000.0) / half)
        )
        arg = t.float()[:, None] * freq[None]
        e = torch.cat([arg.cos(), arg.sin()], dim=1).to(dtype)
        m = self.timestep_embedder
        return m.linear_2(F.silu(m.linear_1(e)))


class ResBlock(nn.Module):
    def __init__(self, cin: int, cout: int, timestep: bool, pads: Pads = Pads()):
        super().__init__()
        self.conv1 = Conv(cin, cout, 3, pads)
        self.conv2 = Conv(cout, cout, 3, pads)
        if cin != cout:
            self.norm3 = nn.Module()
            self.norm3.norm = ops.LayerNorm(cin, eps=LAYER_NORM_EPS)
            self.conv_shortcut = ops.Conv3d(cin, cout, 1)
        if timestep:
            self.scale_shift_table = nn.Parameter(torch.empty(4, cin))

    def forward(self, x: torch.Tensor, temb: torch.Tensor | None) -> torch.Tensor:
        h = pixel_norm(x)
        if temb is not None:
            mods = temb.unflatten(1, (4, -1)) + self.scale_shift_table.to(temb)[None]
            shift1, scale1, shift2, scale2 = (m[..., None, None, None] for m in mods.unbind(1))
            h = modulate(h, shift1, scale1)
        h = self.conv1(F.silu(h))
        h = pixel_norm(h)
        if temb is not None:
            h = modulate(h, shift2, scale2)
        h = self.conv2(F.silu(h))
        if hasattr(self, "conv_shortcut"):
            x = self.norm3.norm(x.movedim(1, -1)).movedim(-1, 1)
            x = self.conv_shortcut(x)
        return h + x


class ResGroup(nn.Module):
    """`res_blocks.M` of one width, with its own `time_embedder` when conditioned on the timestep."""

    def __init__(self, dim: int, layers: int, timestep: bool, pads: Pads = Pads()):
        super().__init__()
        self.res_blocks = nn.ModuleList(ResBlock(dim, dim, timestep, pads) for _ in range(layers))
        if timestep:
            self.time_embedder = TimeEmbedder(4 * dim)

    def forward(self, x: torch.Tensor, t: torch.Tensor | None) -> torch.Tensor:
        temb = self.time_embedder(t, x.dtype) if t is not None else None
        for b in self.res_blocks:
            x = b(x, temb)
        return x


class Lone(ResBlock):
    """0.9.0's width-changing residual block between levels (no timestep)."""

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        return super().forward(x, None)


def depth_to_space(x: torch.Tensor, stride: tuple[int, int, int] = (2, 2, 2)) -> torch.Tensor:
    """(B, C st sh sw, T, H, W) -> (B, C, st T - (st - 1), sh H, sw W): channel c st sh sw + (i sh + j) sw + k is
    frame st t + i, row sh y + j, column sw x + k; a time stride of 2 drops the first frame."""
    b, cv, t, h, w = x.shape
    st, sh, sw = stride
    c = cv // (st * sh * sw)
    x = x.reshape(b, c, st, sh, sw, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
    return x.reshape(b, c, st * t, sh * h, sw * w)[:, :, st - 1 :]


class Upsample(nn.Module):
    """A depth-to-space upsampler: `stride` (time, rows, columns) from diffusers' upsample_type
    ("spatiotemporal" (2, 2, 2), "temporal" (2, 1, 1), "spatial" (1, 2, 2)); the convolution gives the volume /
    `factor` times its input's channels; with `residual` the input, unfolded alike and its channels repeated to
    the output's width, is added (0.9.1 - LTX-2.0's upsamplers; neither 0.9.0's nor LTX-2.3's)."""

    def __init__(
        self, cin: int, factor: int, pads: Pads = Pads(), stride=(2, 2, 2), residual: bool | None = None
    ):
        super().__init__()
        self.factor, self.stride = factor, tuple(stride)
        self.residual = factor > 1 if residual is None else residual
        self.conv = Conv(cin, cin * math.prod(stride) // factor, 3, pads)

    def forward(self, x: torch.Tensor, t: torch.Tensor | None = None) -> torch.Tensor:
        y = depth_to_space(self.conv(x), self.stride)
        if self.residual:  # the input unfolded alike, its channels repeated to y's width
            y += depth_to_space(x, self.stride).repeat(1, math.prod(self.stride) // self.factor, 1, 1, 1)
        return y


@dataclass(frozen=True)
class LTXConfig:
    """What the weights say: `blocks` is decoder.up_blocks in order, each ("res", width, layers),
    ("lone", cin, cout) or ("up", cin, factor, stride, residual) (engine.vae.ltx.Upsample); `width` conv_in's
    output."""

    z: int
    width: int
    blocks: tuple[tuple, ...]
    timestep: bool
    patch: int = 4
    image_channels: int = 3
    pads: Pads = Pads()  # LTX-2's decoder: Pads(reflect=True)
    generation: str = "ltxv"  # or "ltx2"

    def _ups(self, axis: int) -> int:
        return sum(b[0] == "up" and b[3][axis] == 2 for b in self.blocks)

    @property
    def downscale(self) -> int:
        return self.patch * 2 ** self._ups(1)

    @property
    def time_factor(self) -> int:
        return 2 ** self._ups(0)

    @property
    def last_width(self) -> int:
        kind, a, b = self.blocks[-1][:3]
        return b if kind == "lone" else a // b if kind == "up" else a

    def reach(self) -> int:
        """Latent frames on each side an output frame depends on through the up path (from the first
        upsampler on; the head runs whole): each 3-tap convolution reaches one frame at its own rate
        (1 / 2^k latent frames after k upsamplers in time; two back where it is causal), plus one for the
        upsamplers' half-frame shifts, rounded up."""
        per = 2 if self.pads.causal else 1
        r, rate = 0.0, 1
        first = next((i for i, b in enumerate(self.blocks) if b[0] == "up"), len(self.blocks))
        for b in self.blocks[first:]:
            kind, n = b[0], b[2]
            r += per * {"res": 2 * n, "lone": 2, "up": 1}[kind] / rate
            if kind == "up":
                rate *= b[3][0]
        return math.ceil(r + per / rate) + 1  # conv_out


class Decoder(nn.Module):
    def __init__(self, cfg: LTXConfig):
        super().__init__()
        t, pads = cfg.timestep, cfg.pads
        self.conv_in = Conv(cfg.z, cfg.width, 3, pads)
        items: list[nn.Module] = []
        for kind, a, b, *up in cfg.blocks:
            if kind == "res":
                items.append(ResGroup(a, b, t, pads))
            elif kind == "lone":
                items.append(Lone(a, b, False, pads))
            else:
                items.append(Upsample(a, b, pads, *up))
        self.up_blocks = nn.ModuleList(items)
        c = cfg.last_width
        self.conv_out = Conv(c, cfg.image_channels * cfg.patch**2, 3, pads)
        if t:
            self.timestep_scale_multiplier = nn.Parameter(torch.empty(()))
            self.last_time_embedder = TimeEmbedder(2 * c)
            self.last_scale_shift_table = nn.Parameter(torch.empty(2, c))
        self.first_up = next((i for i, b in enumerate(cfg.blocks) if b[0] == "up"), len(cfg.blocks))


class LTXVideoVAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, 128, T, h, w) and returns clips (B, 3, 1 + 8 (T - 1), 32h, 32w)
    in [-1, 1]. `decode_timestep`: the timestep a conditioned decoder (0.9.1+) decodes at -- an input
    of the decode, not a weight (DECODE_TIMESTEP, the pipelines' value, unless the caller sets another);
    ignored by 0.9.0's. `encode` (only where the file holds the encoder: engine.vae.ltx_encoder) takes clips
    of 1 + 8k frames in [-1, 1] to the posterior mean in VAE space (B, 128, 1 + k, H/32, W/32)."""

    kind = "vae"
    video = True
    encodes = True  # a file of this family without the encoder is a decoder-only file (engine.vae.run)
    image_range = (-1.0, 1.0)
    fps = 24.0  # LTX-Video generates 24 frames a second (diffusers' LTX examples export at fps=24)

    def __init__(self, cfg: LTXConfig, enc=None):
        super().__init__()
        self.cfg = cfg
        self.decoder = Decoder(cfg)
        if enc is not None:  # an EncoderConfig: the file holds the encoder too
            from .ltx_encoder import Encoder

            self.enc_cfg = enc
            self.encoder = Encoder(enc)
        self.default_decode_timestep = self.decode_timestep = DECODE_TIMESTEP
        # engine.vae.video: each chunk decodes as a clip of its own with this many context frames a side
        self.time_context = cfg.reach()

    def _t(self, x: torch.Tensor) -> torch.Tensor | None:
        if not self.cfg.timestep:
            return None
        t = torch.full((x.shape[0],), float(self.decode_timestep), device=x.device, dtype=torch.float32)
        return t * self.decoder.timestep_scale_multiplier.float().to(x.device)

    # -- pieces the chunked runner composes (engine.vae.video); the stream is unused: nothing is causal
    def decode_head(self, z: torch.Tensor, stream: Stream | None = None) -> torch.Tensor:
        """conv_in and the blocks before the first upsampler, at latent resolution."""
        d, t = self.decoder, self._t(z)
        x = d.conv_in(z)
        for m in list(d.up_blocks)[: d.first_up]:
            x = m(x, t)
        return x

    def decode_up(
        self, x: torch.Tensor, stream: Stream | None = None, frames_at_once: int | None = None
    ) -> torch.Tensor:
        """The rest: upsamplers, their blocks and the output head, over a chunk decoded as a clip of its
        own (`frames_at_once` is not used: every convolution sees the frame after)."""
        d, t = self.decoder, self._t(x)
        for m in list(d.up_blocks)[d.first_up :]:
            x = m(x, t)
        x = pixel_norm(x)
        if t is not None:
            e = d.last_time_embedder(t, x.dtype).unflatten(1, (2, -1))
            shift, scale = (
                m[..., None, None, None] for m in (e + d.last_scale_shift_table.to(e)[None]).unbind(1)
            )
            x = modulate(x, shift, scale)
        return unpatchify(d.conv_out(F.silu(x)), self.cfg.patch)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The whole clip in one pass."""
        return self.decode_up(self.decode_head(z)).clamp_(-1, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Clip (B, 3, 1 + 8k, H, W) in [-1, 1], H and W multiples of 32 -> the posterior mean (B, z, 1 + k,
        H/32, W/32), raw VAE space (the latent statistics are the latent format's). A causal encoder runs
        the first 9 frames (two latent frames), then 8 at a time (one each), its state in a Stream: exact,
        and a long clip's memory is a chunk's; a non-causal one sees the next frames, so the clip runs whole.
        The first chunk takes 1 + 8 frames, not 1: what a chunk carries on (2 input frames of every
        convolution) outweighs 8 frames of activations (quarter-width 0.9.5 encoder, 512x512: 9 frames in
        chunks of 1 and 8 peaked at 214 MB, diffusers' whole pass at 126 MB), and an image or a 9-frame clip
        then carries nothing."""
        e = self.enc_cfg
        tf, f, t = e.time_factor, e.downscale, x.shape[2]
        if (t - 1) % tf:
            raise FormatError(
                f"LTX-Video's encoder takes clips of 1 + {tf}k frames (1, {1 + tf}, {1 + 2 * tf}, ...): {t} frames "
                "is not one of them"
            )
        if x.shape[3] % f or x.shape[4] % f:
            raise FormatError(
                f"LTX-Video's encoder takes frames whose sides are multiples of {f}: {x.shape[3]}x{x.shape[4]}"
            )
        z = self.cfg.z
        if not e.causal:
            return self.encoder.step(patchify(x, e.patch), None)[:, :z]
        stream = Stream()
        bounds = [0, *range(1 + tf, t + 1, tf)] if t > 1 else [0, 1]
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            # the last chunk carries nothing on: the frames every convolution would keep (2 of its input
            # each, all levels together ~85 % of a 512x512 image's encode peak) are not made for it.
            # Each chunk is patchified on its own: a copy of the whole clip's would grow with its length.
            stream.keep = b < t
            outs.append(self.encoder.step(patchify(x[:, :, a:b], e.patch), stream)[:, :z])
        return torch.cat(outs, dim=2)
