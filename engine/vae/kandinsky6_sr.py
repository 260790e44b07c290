"""Kandinsky 6 SR's video VAE decoder: a causal 3-D K-VAE whose decoder norms are conditioned on the latent.

Facts (diffusers `autoencoder_kandinsky6_sr.py`, Kandinsky6SRVAE; learned, not copied):
* Every convolution with a time extent is causal: `kernel - 1` history frames, at the clip's start copies of
  its first frame, and zero spatial borders (`Kandinsky6SRCausalConv3d`: CausalConv3d's pad="replicate_time");
  the 1x1x1 and 1x3x3 ones are plain Conv3d.
* RMS norms over channels with a learned `gamma` ([C, 1, 1, 1]), the norm in float32.
* Decoder: `conv_in` (3x3x3, z -> the last level's width), `mid.block_1` / `mid.block_2`, then the levels from
  the last to the first (`up.I.block.J`, layers_per_block + 1 resnets each, `up.I.upsample` on every level but
  level 0), `norm_out`, SiLU, `conv_out` (3x3x3 -> RGB).
* Resnet: norm1 -> SiLU -> conv1 -> norm2 -> SiLU -> conv2, plus the input (a 1x1x1 `nin_shortcut` when the
  width changes). Every decoder norm (`norm1`, `norm2`, `norm_out`) is a spatial norm: rms(x) * conv_y(zq) +
  conv_b(zq) (1x1x1 convolutions of the latent), zq nearest-upsampled to the features' grid -- the clip's first
  latent frame to its first frame, the rest to the rest. A 1x1x1 convolution commutes with a nearest upsample,
  so here it runs at latent resolution and its result is upsampled.
* Upsample: where the level is temporal, every frame twice (at the clip's start the first frame once), plus a
  (3, 1, 1) causal convolution of that; then nearest 2x in space, plus a 1x3x3 convolution of that; then a
  1x1x1 `linear`. Temporal levels: `log2(temporal_compression_ratio)` of them from
  `temporal_compression_start_level`, counted from the top: the weights say which (`upsample.temporal_conv`).
* Release defaults: latent_channels 64, decoder_block_out_channels (16, 256, 512, 1024, 2048), layers_per_block
  2, temporal_compression_ratio 4, start level 1 -> 16x spatial, 4x temporal (T latent frames give 1 + 4 (T - 1)),
  scaling_factor 0.910344 (the pipeline divides by it before decode: the latent goes in as is).
* Encoder (`Kandinsky6SREncoder3D`): `conv_in` (3x3x3, RGB -> level 0's width), the levels from the first
  (`down.I.block.J`, layers_per_block resnets with plain RMS norms `norm1.gamma` / `norm2.gamma`;
  `down.I.downsample` on every level but the last), `mid.block_1` / `mid.block_2`, `norm_out`, SiLU, `conv_out`
  (3x3x3 -> 2 z: the posterior's mean, then its log-variance). A level's first resnet takes twice the previous
  level's width (the downsample doubles it); the release's widths are (16, 128, 256, 512, 1024).
* Downsample (width c -> 2c): a (1, 3, 3) convolution of stride 2 in space, plus the parameter-free average of
  each 2x2 patch's horizontal pairs (pixel-unshuffle's channel order: output channel 2k + row is input channel k's
  row of the patch, its two columns averaged); then a 1x1x1 `linear`. Where the level is temporal, before the
  linear: two causal (2, 1, 1) convolutions (`temporal_conv.0` stride 1, `temporal_conv.1` stride 2 in time), plus
  the average of frame pairs -- at the clip's start the first frame alone, as its history is a copy of itself.
  Temporal levels: `log2(temporal_compression_ratio)` from `temporal_compression_start_level`: the weights say
  which (`downsample.temporal_conv`). 1 + 4k frames encode to 1 + k latent frames (diffusers' SR pipeline
  refuses other counts; so does `encode`).
The encoder is built only where the file holds its tensors (a decoder-only file still decodes). Diffusers' naming
is the only one known (the release's own is not stated anywhere we found), and the modules here bear it, so keys
map 1:1.

Tiling: nothing in the decoder spans a frame (no attention), so `decode_head` runs conv_in and the middle blocks
at latent resolution and hands on their output with the latent itself appended (the norms of every tile need the
latent's matching crop); `decode_up` splits them again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError, UnsupportedModel
from .causal_conv import CausalConv3d, Stream, VideoShape

SLICE_FRAMES = 1  # input frames per causal 3x3x3 convolution call (CausalConv3d.sliced)
ENCODE_CHUNK = 4  # frames the encoder takes at a time after the clip's first
RELEASE_Z = 64


def is_kandinsky6_sr(sd) -> bool:
    """Kandinsky6SRVAE's decoder: RMS-norm `gamma`s inside the latent-conditioned norms (the KVAEs' are GroupNorms
    with weight / bias) and a 3-D conv_in (the image KVAE's is 2-D)."""
    w = sd.get("decoder.conv_in.conv.weight")
    return "decoder.mid.block_1.norm1.norm_layer.gamma" in sd and w is not None and w.dim() == 5


@dataclass(frozen=True)
class K6Config:
    z: int = RELEASE_Z
    dims: tuple[int, ...] = (16, 256, 512, 1024, 2048)  # each level's width, level 0 (full resolution) first
    temporal: tuple[bool, ...] = (False, False, True, True, False)  # per level: its upsample doubles time
    layers_per_block: int = 2
    image_channels: int = 3
    enc_dims: tuple[int, ...] = ()  # the encoder's resnet widths per level, level 0 first (() without one)
    enc_temporal: tuple[bool, ...] = ()  # per encoder level: its downsample halves time
    enc_layers: int = 2  # resnets per encoder level

    @property
    def downscale(self) -> int:
        return 2 ** (len(self.dims) - 1)

    @property
    def time_factor(self) -> int:
        return 2 ** sum(self.temporal)


class _Causal(nn.Module):
    """Kandinsky6SRCausalConv3d: the convolution under `.conv`, history = the first frame replicated."""

    def __init__(self, cin: int, cout: int, kernel):
        super().__init__()
        k = (kernel,) * 3 if isinstance(kernel, int) else kernel
        self.conv = CausalConv3d(cin, cout, k, padding=tuple(n // 2 for n in k), pad="replicate_time")

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        return self.conv.step(x, stream, frames=SLICE_FRAMES)


def _expand(y: torch.Tensor, size, first: bool) -> torch.Tensor:
    """y (B, C, t, h, w) nearest-upsampled to `size` (T, H, W) as F.interpolate's "nearest" picks (source index
    floor(i * in / out)); with `first` the first frame maps to the first frame alone and the rest to the rest."""
    t, h, w = y.shape[2:]
    tt, hh, ww = size
    if first:
        rest = [1 + i * (t - 1) // (tt - 1) for i in range(tt - 1)] if t > 1 else [0] * (tt - 1)
        idx = [0, *rest]
    else:
        idx = [i * t // tt for i in range(tt)]
    if idx != list(range(t)):
        y = y.index_select(2, torch.tensor(idx, device=y.device))
    if (hh, ww) != (h, w):
        sh, sw = hh // h, ww // w
        b, c, n = y.shape[:3]
        y = y[:, :, :, :, None, :, None].expand(b, c, n, h, sh, w, sw).reshape(b, c, n, hh, ww)
    return y


class SpatialNorm(nn.Module):
    def __init__(self, c: int, zc: int):
        super().__init__()
        self.norm_layer = ops.ChannelRMSNorm(c)
        self.conv_y = ops.Conv3d(zc, c, 1)
        self.conv_b = ops.Conv3d(zc, c, 1)

    def forward(self, x: torch.Tensor, zq: torch.Tensor, first: bool) -> torch.Tensor:
        size = x.shape[2:]
        out = self.norm_layer(x)
        out.mul_(_expand(self.conv_y(zq), size, first))
        out.add_(_expand(self.conv_b(zq), size, first))
        return out


class ResnetBlock(nn.Module):
    def __init__(self, cin: int, cout: int, zc: int):
        super().__init__()
        self.norm1 = SpatialNorm(cin, zc)
        self.conv1 = _Causal(cin, cout, 3)
        self.norm2 = SpatialNorm(cout, zc)
        self.conv2 = _Causal(cout, cout, 3)
        self.nin_shortcut = ops.Conv3d(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, zq: torch.Tensor, stream: Stream, first: bool) -> torch.Tensor:
        h = self.conv1.step(F.silu(self.norm1(x, zq, first), inplace=True), stream)
        h = self.conv2.step(F.silu(self.norm2(h, zq, first), inplace=True), stream)
        if self.nin_shortcut is not None:
            x = self.nin_shortcut(x)
        h += x
        return h


class Upsample(nn.Module):
    def __init__(self, c: int, temporal: bool):
        super().__init__()
        self.spatial_conv = ops.Conv3d(c, c, (1, 3, 3), padding=(0, 1, 1))
        self.temporal_conv = _Causal(c, c, (3, 1, 1)) if temporal else None
        self.linear = ops.Conv3d(c, c, 1)

    def step(self, x: torch.Tensor, stream: Stream, first: bool) -> torch.Tensor:
        if self.temporal_conv is not None:
            x = x.repeat_interleave(2, dim=2)
            if first:  # T + 1 frames become 2T + 1: the first one is not doubled
                x = x[:, :, 1:]
            y = self.temporal_conv.step(x, stream)
            y += x  # into the fresh output (the same sum): one tensor of this size fewer at once
            x = y
            del y
        b, c, t, h, w = x.shape
        x = x[:, :, :, :, None, :, None].expand(b, c, t, h, 2, w, 2).reshape(b, c, t, 2 * h, 2 * w)
        y = self.spatial_conv(x)
        y += x
        del x  # at level 1 these are 256 channels at full resolution: the largest tensors of the pass
        return self.linear(y)


class _Level(nn.Module):
    def __init__(self, blocks: list[ResnetBlock], upsample: Upsample | None):
        super().__init__()
        self.block = nn.ModuleList(blocks)
        if upsample is not None:
            self.upsample = upsample


class Decoder(nn.Module):
    def __init__(self, cfg: K6Config):
        super().__init__()
        z, dims = cfg.z, cfg.dims
        top = dims[-1]
        self.conv_in = _Causal(z, top, 3)
        self.mid = nn.Module()
        self.mid.block_1 = ResnetBlock(top, top, z)
        self.mid.block_2 = ResnetBlock(top, top, z)
        levels: list[_Level] = []
        cin = top
        for i in reversed(range(len(dims))):
            blocks = [
                ResnetBlock(cin if j == 0 else dims[i], dims[i], z) for j in range(cfg.layers_per_block + 1)
            ]
            levels.insert(0, _Level(blocks, Upsample(dims[i], cfg.temporal[i]) if i else None))
            cin = dims[i]
        self.up = nn.ModuleList(levels)
        self.norm_out = SpatialNorm(dims[0], z)
        self.conv_out = _Causal(dims[0], cfg.image_channels, 3)


class Kandinsky6SRVAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, z, T, h, w) and returns clips (B, 3, 1 + 4 (T - 1), H, W) in [-1, 1];
    `encode` (where the file holds the encoder) the posterior mean of clips of 1 + 4k frames."""

    kind = "vae"
    video = True
    image_range = (-1.0, 1.0)
    encodes = True  # a file of this family without the encoder is a decoder-only file (engine.vae.run)

    def __init__(self, cfg: K6Config):
        super().__init__()
        self.cfg = cfg
        if cfg.enc_dims:
            from .kandinsky6_sr_encoder import Encoder  # that module builds on this one's pieces

            self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)

    def vae_spec(self):
        """The estimate's view (engine.vae.estimate.spec_of): the full-resolution width as `ch`, the head's
        channels (the middle block's and the latent's) as `mid`."""
        from .estimate import VaeSpec

        wbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        c = self.cfg
        return VaeSpec("kandinsky6_sr", c.z, wbytes, c.dims[0], c.dims[-1] + c.z, c.time_factor, c.downscale)

    def _first(self, stream: Stream) -> bool:
        """Whether this call holds the clip's first frame (for the norms and the temporal upsamples); marked."""
        first = id(self) not in stream.started
        stream.started.add(id(self))
        return first

    # -- pieces the chunked runner composes (engine.vae.video) ----------------------------------
    def decode_head(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        """conv_in and the middle blocks (latent resolution), the latent appended for the tiles' norms."""
        d, first = self.decoder, self._first(stream)
        h = d.conv_in.step(z, stream)
        h = d.mid.block_1.step(h, z, stream, first)
        h = d.mid.block_2.step(h, z, stream, first)
        return torch.cat([h, z], dim=1)

    def decode_up(self, x: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        """The levels, norm_out and conv_out over one tile's crop of decode_head's output. `frames_at_once` is
        not used: every chunk runs whole (the norms map the latent's frames onto the chunk's)."""
        d, first = self.decoder, self._first(stream)
        h, zq = x[:, : -self.cfg.z], x[:, -self.cfg.z :]
        for level in reversed(d.up):
            for block in level.block:
                h = block.step(h, zq, stream, first)
            if hasattr(level, "upsample"):
                h = level.upsample.step(h, stream, first)
        h = F.silu(d.norm_out(h, zq, first), inplace=True)
        return d.conv_out.step(h, stream)

    # -- whole passes ----------------------------------------------------------------------------
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Whole-clip decode, one latent frame at a time (any chunking gives the same result)."""
        head, up = Stream(), Stream()
        out = [self.decode_up(self.decode_head(z[:, :, i : i + 1], head), up) for i in range(z.shape[2])]
        return torch.cat(out, dim=2).clamp_(-1, 1)

    def encode(self, x: torch.Tensor, chunk_frames: int = ENCODE_CHUNK) -> torch.Tensor:
        """Clip (B, 3, 1 + 4k, H, W) in [-1, 1], H and W multiples of 16 -> latent mean (B, z, 1 + k, H/16, W/16).
        The first frame runs alone, then `chunk_frames` (a multiple of the time factor) at a time: the network is
        causal, its history carried in a Stream, so any such chunking gives the whole clip's result (diffusers
        runs 17 frames, then 16) and a long clip holds one chunk's activations. The mean is raw VAE space, as the
        decode takes it: the SR pipeline (pipeline_kandinsky6_sr.py) maps its clip to (x + 1) 127.5 / 128 - 1
        before encoding and multiplies the mean by scaling_factor -- its own steps, not the VAE's."""
        if not hasattr(self, "encoder"):
            raise UnsupportedModel(f"{getattr(self, 'source', 'this VAE')}: the file holds no encoder")
        tf, f = self.cfg.time_factor, self.cfg.downscale
        t, hh, ww = x.shape[2:]
        if (t - 1) % tf or chunk_frames % tf or chunk_frames <= 0:
            raise FormatError(
                f"Kandinsky 6 SR's VAE encodes clips of 1 + {tf}k frames (in chunks of {tf}k), not {t} "
                f"(chunks of {chunk_frames})"
            )
        if hh % f or ww % f:
            raise FormatError(
                f"Kandinsky 6 SR's VAE encodes frames whose sides are multiples of {f}, not {ww}x{hh}"
            )
        stream, enc = Stream(), self.encoder
        bounds = [0, 1, *range(1 + chunk_frames, t, chunk_frames), t] if t > 1 else [0, 1]
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            stream.keep = b < t  # the last chunk's convolutions keep no history (an image: none at all)
            outs.append(enc.step(x[:, :, a:b], stream, a == 0))
        return torch.cat(outs, dim=2)[:, : self.cfg.z]


# -- from the file's tensors ----------------------------------------------------------------------
def model_keys(sd: dict) -> dict:
    """The tensors the model loads: the decoder's, and the encoder's where the file has them."""
    return {k: v for k, v in sd.items() if k.startswith(("decoder.", "encoder."))}


def _encoder_config(sd: dict, path: str) -> dict:
    """The encoder's part of K6Config, from its shapes ({} for a decoder-only file)."""
    levels = sorted({int(m[1]) for k in sd if (m := re.match(r"encoder\.down\.(\d+)\.", k))})
    if not any(k.startswith("encoder.") for k in sd):
        return {}
    if not levels or levels != list(range(len(levels))):
        raise FormatError(
            f"{path}: a Kandinsky 6 SR VAE encoder without its levels (encoder.down.N)", path=path
        )
    dims = tuple(_shape(sd, f"encoder.down.{i}.block.0.conv2.conv.weight", path, 5)[0] for i in levels)
    blocks = {int(m[1]) for k in sd if (m := re.match(r"encoder\.down\.0\.block\.(\d+)\.", k))}
    temporal = tuple(f"encoder.down.{i}.downsample.temporal_conv.0.conv.weight" in sd for i in levels)
    return dict(enc_dims=dims, enc_temporal=temporal, enc_layers=len(blocks))


def _shape(sd: dict, key: str, path: str, dims: int) -> tuple[int, ...]:
    t = sd.get(key)
    if t is None:
        raise FormatError(f"{path}: incomplete Kandinsky 6 SR VAE, tensor {key} is missing", path=path)
    if t.dim() != dims:
        raise FormatError(
            f"{path}: {key} has shape {list(t.shape)}, not {dims}-D: a damaged or edited file?", path=path
        )
    return tuple(t.shape)


def k6_config(sd: dict, path: str) -> K6Config:
    """The configuration the decoder's shapes describe; a FormatError names what is missing."""
    z = _shape(sd, "decoder.conv_in.conv.weight", path, 5)[1]
    levels = sorted({int(m[1]) for k in sd if (m := re.match(r"decoder\.up\.(\d+)\.", k))})
    if not levels or levels != list(range(len(levels))):
        raise FormatError(
            f"{path}: a Kandinsky 6 SR VAE decoder without its levels (decoder.up.N)", path=path
        )
    dims = tuple(_shape(sd, f"decoder.up.{i}.block.0.conv2.conv.weight", path, 5)[0] for i in levels)
    blocks = {int(m[1]) for k in sd if (m := re.match(r"decoder\.up\.0\.block\.(\d+)\.", k))}
    temporal = tuple(f"decoder.up.{i}.upsample.temporal_conv.conv.weight" in sd for i in levels)
    image = _shape(sd, "decoder.conv_out.conv.weight", path, 5)[0]
    if image != 3:
        raise UnsupportedModel(
            f"{path}: a Kandinsky 6 SR-style VAE decoding {image} image channels: Loadout runs the RGB release only",
            path=path,
        )
    return K6Config(z=z, dims=dims, temporal=temporal, layers_per_block=len(blocks) - 1, image_channels=image,
                    **_encoder_config(sd, path))  # fmt: skip


def build(sd: dict, path: str, strict_load, made) -> Kandinsky6SRVAE:
    """The decoder and, where the file has it, the encoder, loaded strictly (engine.vae.loading's strict_load and
    _made, passed in: that module imports this one)."""
    cfg = k6_config(sd, path)
    with torch.device("meta"):
        model = made(path, lambda: Kandinsky6SRVAE(cfg))
    strict_load(model, model_keys(sd), path)
    model.source = path
    return model
