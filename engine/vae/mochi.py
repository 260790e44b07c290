"""The Mochi 1 video VAE's decoder, in the original Genmo release's module names (genmoai/mochi
`src/genmo/mochi_preview/vae/models.py`: `decoder.blocks.N...`, also ComfyUI's repackaged
`mochi_preview_vae` files); diffusers' names (AutoencoderKLMochi, `autoencoder_kl_mochi.py`:
`decoder.conv_in`, `block_in`, `up_blocks.N`, `block_out`, `proj_out`) are renamed onto them here.

Architecture facts (both sources; the release's config: latent 12, widths 128/256/512/768, residual blocks
per block 3/6/4/3/3 from the top, time x3, x2, x1 and space x2 per up block, no attention in the decoder):
  * blocks.0 = a 1x1x1 Conv3d from the 12 latent channels, then residual blocks; blocks.1..3 = up blocks
    (`blocks.J` residual blocks, `proj` a Linear to out * st * 2 * 2 channels, then depth-to-space: channel
    (c, st, sh, sw) lands at frame t * st + st_i, pixel (h * 2 + sh, w * 2 + sw)); the last block residual
    blocks; then SiLU and `output_proj` (a Linear) to RGB in [-1, 1];
  * residual block = stack.{0 GroupNorm, 2 conv 3x3x3, 3 GroupNorm, 5 conv 3x3x3} plus the input; each
    GroupNorm (32 groups) normalises every frame on its own (per-frame statistics over the whole frame);
  * every 3x3x3 convolution is causal and pads by replication (`padding_mode="replicate"`): two history
    frames that are copies of the clip's first frame, edge copies for the borders (CausalConv3d's
    pad="replicate"; diffusers' CogVideoXCausalConv3d with pad_mode "replicate" is the same padding);
  * frames: T latent frames decode to 6T - 5 = 1 + 6 (T - 1), the count engine.vae.video already makes
    with time_factor 6 (the first latent frame gives one frame, each later one six). The original's depth-to-space drops the first st - 1
    frames of the clip after each up block that expands time (`drop="levels"`: the network the release
    was trained as, and ComfyUI's); diffusers' decoder keeps them and drops the first 5 output frames
    instead (`drop_last_temporal_frames`; `drop="end"`, the default here: the decode Loadout checks itself
    against, as for every other VAE). The two differ in the clip's first frames.

The encoder (engine.vae.mochi_encoder) is built where the file holds its tensors: a combined file with the
release's names under `encoder.` (ComfyUI's repackaged file) or diffusers' (`encoder.proj_in`, `block_in`,
`down_blocks.N`, `block_out`, `proj_out`, renamed onto the release's here). Genmo's own `encoder.safetensors`
is a file of its own, without the prefix, beside its `decoder.safetensors`: loading the decoder file reads it too
(`with_sibling_encoder`); the encoder's file alone holds no decoder and is not loaded.

Everything is causal or per frame, so a clip decoded chunk by chunk equals the whole pass; the frames
dropped at the clip's start are dropped once per `Stream` (per clip or tile), never per chunk. A spatial
tile normalises with its own frame statistics, so tiled output is close to, not equal to, the full pass.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError, UnsupportedModel
from .causal_conv import CausalConv3d, Stream, VideoShape
from .wan import _Indexed

if TYPE_CHECKING:
    from .mochi_encoder import EncoderConfig

GROUPS = 32  # the release's GroupNorm groups (norm_fn: num_groups=32)
SPACE = 2  # spatial expansion of every up block (the release's spatial_expansions (2, 2, 2))
RELEASE_TIME = (3, 2, 1)  # temporal expansion per up block, first to last (the release's config)
DROPS = ("levels", "end")
SLICE_FRAMES = 1  # input frames per convolution call in the residual blocks (CausalConv3d.sliced)


@dataclass(frozen=True)
class MochiConfig:
    """What the weights say: widths per block from the latent end, residual blocks per block, the time
    expansion of each up block."""

    z: int
    widths: tuple[int, ...]  # blocks.0 first (768 in the release), the last block's last (128)
    res_blocks: tuple[int, ...]  # per block: blocks.0, each up block, the last block
    time: tuple[int, ...]  # per up block
    drop: str = "end"
    image_channels: int = 3
    encoder: EncoderConfig | None = None  # where the file holds the encoder

    @property
    def downscale(self) -> int:
        return SPACE ** len(self.time)

    @property
    def time_factor(self) -> int:
        n = 1
        for t in self.time:
            n *= t
        return n


class ResBlock(nn.Module):
    def __init__(self, ch: int):
        super().__init__()
        self.stack = _Indexed(
            {
                0: ops.GroupNorm(GROUPS, ch),
                2: CausalConv3d(ch, ch, 3, padding=1, pad="replicate"),
                3: ops.GroupNorm(GROUPS, ch),
                5: CausalConv3d(ch, ch, 3, padding=1, pad="replicate"),
            }
        )

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        s = self.stack
        # Each convolution a frame at a time over its own (fresh) input, its output written over the
        # frames it has read (CausalConv3d.sliced, inplace): x, h and one frame's buffers at most
        h = s[2].sliced(_norm_silu(s[0], x), stream, frames=SLICE_FRAMES, inplace=True)
        h = s[5].sliced(_norm_silu(s[3], h), stream, frames=SLICE_FRAMES, inplace=True)
        h += x
        return h


def _norm_silu(norm: ops.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    """SiLU of the GroupNorm of every frame on its own, frame by frame into one output (the whole chunk's
    reshaped copy and its normalised copy were two tensors of x's size at once)."""
    out = torch.empty_like(x)
    for i in range(x.shape[2]):
        out[:, :, i] = F.silu(norm(x[:, :, i]), inplace=True)
    return out


def _linear(proj: ops.Linear, x: torch.Tensor) -> torch.Tensor:
    """A Linear over the channels of (B, C, T, H, W) (the original's Conv1x1)."""
    return proj(x.movedim(1, -1)).movedim(-1, 1)


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, n: int, time: int):
        super().__init__()
        self.blocks = _Indexed({j: ResBlock(cin) for j in range(n)})
        self.proj = ops.Linear(cin, cout * time * SPACE * SPACE)
        self.time = time

    def step(self, x: torch.Tensor, stream: Stream, drop: bool) -> torch.Tensor:
        for m in self.blocks._modules.values():
            x = m.step(x, stream)
        y = _linear(self.proj, x)
        del x
        b, _, t, h, w = y.shape
        st = self.time
        y = y.reshape(b, -1, st, SPACE, SPACE, t, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
        y = y.reshape(b, -1, t * st, h * SPACE, w * SPACE)
        if drop and st > 1 and id(self) not in stream.started:
            stream.started.add(id(self))  # the clip's first frame: its st - 1 leading copies go, once
            y = y[:, :, st - 1 :]
        return y.contiguous()


class Decoder(nn.Module):
    def __init__(self, cfg: MochiConfig):
        super().__init__()
        w, n = cfg.widths, cfg.res_blocks
        first: dict[int, nn.Module] = {0: ops.Conv3d(cfg.z, w[0], 1)}
        first.update({j + 1: ResBlock(w[0]) for j in range(n[0])})
        blocks: dict[int, nn.Module] = {0: _Indexed(first)}
        for i, st in enumerate(cfg.time):
            blocks[i + 1] = UpBlock(w[i], w[i + 1], n[i + 1], st)
        blocks[len(cfg.time) + 1] = _Indexed({j: ResBlock(w[-1]) for j in range(n[-1])})
        self.blocks = _Indexed(blocks)
        self.output_proj = ops.Linear(w[-1], cfg.image_channels)


class MochiVAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, 12, T, h, w) and returns clips (B, 3, 6T - 5, 8h, 8w) in
    [-1, 1]; `encode` (where the file holds the encoder) the posterior mean of clips of 1 + 6k frames."""

    kind = "vae"
    video = True
    image_range = (-1.0, 1.0)
    spec_kind = "mochi"  # engine.vae.estimate's kind
    encodes = True  # a file of this family without the encoder is a decoder-only file (engine.vae.run)

    def __init__(self, cfg: MochiConfig):
        super().__init__()
        if cfg.drop not in DROPS:
            raise ValueError(f"drop {cfg.drop!r}: one of {DROPS}")
        self.cfg = cfg
        self.decoder = Decoder(cfg)
        if cfg.encoder is not None:
            from .mochi_encoder import Encoder  # that module builds on this one's residual block

            self.encoder = Encoder(cfg.encoder, cfg.z)

    @property
    def spec_widths(self) -> tuple[int, int]:
        """(ch, mid) for the memory estimate: the last block's width, the first block's."""
        return self.cfg.widths[-1], self.cfg.widths[0]

    # -- pieces the chunked runner composes (engine.vae.video) ----------------------------------
    def decode_head(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        """The input conv and blocks.0's residual blocks, at latent resolution."""
        first = self.decoder.blocks[0]
        x = first[0](z)
        for j in range(1, len(first._modules)):
            x = first[j].step(x, stream)
        return x

    def decode_up(self, h: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        """The up blocks, the last block and the output projection (`frames_at_once`: unused, the
        chunks are the unit here)."""
        blocks = list(self.decoder.blocks._modules.values())
        levels = self.cfg.drop == "levels"
        x = h
        for m in blocks[1:-1]:
            x = m.step(x, stream, levels)
        for m in blocks[-1]._modules.values():
            x = m.step(x, stream)
        x = _linear(self.decoder.output_proj, F.silu(x, inplace=True))  # x: the last block's fresh sum
        cut = self.time_factor - 1
        if not levels and cut and id(self) not in stream.started:
            stream.started.add(id(self))  # diffusers' drop: the clip's first output frames, once
            x = x[:, :, cut:]
        return x

    # -- whole passes ----------------------------------------------------------------------------
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """Whole-clip decode, one latent frame at a time (any chunking gives the same result)."""
        head, up = Stream(), Stream()
        out = [self.decode_up(self.decode_head(z[:, :, i : i + 1], head), up) for i in range(z.shape[2])]
        return torch.cat(out, dim=2).clamp_(-1, 1)

    def encode(self, x: torch.Tensor, chunk_frames: int = 6) -> torch.Tensor:
        """Clip (B, 3, 1 + 6k, H, W) in [-1, 1], H and W multiples of 8 -> latent mean (B, 12, 1 + k, H/8, W/8).
        The first frame runs alone, then `chunk_frames` (a multiple of 6) at a time over one Stream: causal
        throughout, so any such chunking gives the whole clip's result and a chunk's activations are the peak."""
        if not hasattr(self, "encoder"):
            raise FormatError(
                f"{getattr(self, 'source', 'this VAE')}: this file holds the decoder only: give the VAE file with its "
                "encoder"
            )
        tf, f = self.time_factor, self.downscale
        t, hh, ww = x.shape[2:]
        if (t - 1) % tf or chunk_frames % tf or chunk_frames <= 0:
            raise FormatError(
                f"Mochi's VAE encodes clips of 1 + {tf}k frames (in chunks of {tf}k), not {t} (chunks of {chunk_frames})"
            )
        if hh % f or ww % f:
            raise FormatError(f"Mochi's VAE encodes frames whose sides are multiples of {f}, not {ww}x{hh}")
        stream = Stream()
        bounds = [0, 1, *range(1 + chunk_frames, t, chunk_frames), t] if t > 1 else [0, 1]
        outs = []
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            stream.keep = b < t  # the last chunk keeps no history (an image: none at all)
            outs.append(self.encoder.step(x[:, :, a:b], stream))
        return torch.cat(outs, dim=2)[:, : self.cfg.z]


# -- loading -------------------------------------------------------------------------------------


def is_mochi_vae(keys) -> bool:
    """Mochi's decoder in the release's names (`blocks.0.0.weight`, `blocks.1.proj.weight`, with or
    without `decoder.`) or diffusers' (`decoder.block_in.resnets.0.conv1.conv.weight`)."""
    keys = set(keys)
    return any(k.endswith("decoder.block_in.resnets.0.conv1.conv.weight") for k in keys) or any(
        k.removeprefix("decoder.") == "blocks.1.proj.weight" for k in keys
    )


_RESNET = {"norm1.norm_layer.": "stack.0.", "conv1.conv.": "stack.2.", "norm2.norm_layer.": "stack.3.",
           "conv2.conv.": "stack.5."}  # fmt: skip


def _resnet(rest: str) -> str:
    for a, b in _RESNET.items():
        if rest.startswith(a):
            return b + rest[len(a) :]
    return rest


def diffusers_to_original(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' names (AutoencoderKLMochi's decoder) -> the release's; keys no rule knows stay as they
    are (the strict load names them)."""
    ups = {int(m[1]) for k in sd if (m := re.match(r"decoder\.up_blocks\.(\d+)\.", k))}
    last = len(ups) + 1
    out = {}
    for k, v in sd.items():
        new = k
        if m := re.match(r"decoder\.block_in\.resnets\.(\d+)\.(.*)$", k):
            new = f"decoder.blocks.0.{int(m[1]) + 1}.{_resnet(m[2])}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$", k):
            new = f"decoder.blocks.{int(m[1]) + 1}.blocks.{m[2]}.{_resnet(m[3])}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.proj\.(.*)$", k):
            new = f"decoder.blocks.{int(m[1]) + 1}.proj.{m[2]}"
        elif m := re.match(r"decoder\.block_out\.resnets\.(\d+)\.(.*)$", k):
            new = f"decoder.blocks.{last}.{m[1]}.{_resnet(m[2])}"
        elif k.startswith("decoder.conv_in."):
            new = "decoder.blocks.0.0." + k.removeprefix("decoder.conv_in.")
        elif k.startswith("decoder.proj_out."):
            new = "decoder.output_proj." + k.removeprefix("decoder.proj_out.")
        out[new] = v
    return out


def model_part(sd: dict[str, torch.Tensor], path: str) -> dict[str, torch.Tensor]:
    """The decoder's tensors under `decoder.` and the encoder's under `encoder.` (where the file has them), in
    the release's names: the release's own decoder file has no prefix."""
    if any(k.startswith("decoder.block_in.") for k in sd):
        sd = diffusers_to_original(sd)
    if any(k.startswith(("encoder.proj_in.", "encoder.block_in.")) for k in sd):
        from .mochi_encoder import diffusers_to_original as encoder_to_original

        sd = encoder_to_original(sd, path)
    if not any(k.startswith("decoder.") for k in sd):
        sd = {"decoder." + k: v for k, v in sd.items()}
    return {k: v for k, v in sd.items() if k.startswith(("decoder.", "encoder."))}


def with_sibling_encoder(sd: dict[str, torch.Tensor], path: str, read) -> dict[str, torch.Tensor]:
    """Genmo's release: a decoder file without the `decoder.` prefix and the encoder in a file of its own beside
    it, its name the decoder's with "encoder" for "decoder" (`decoder.safetensors` / `encoder.safetensors`). With
    that file there, the two as one state dict under `decoder.` and `encoder.`; else `sd` as it is. `read` reads
    a state dict (engine.vae.loading.read_state_dict)."""
    from pathlib import Path

    name = Path(path).name
    if "decoder" not in name or any(k.startswith(("decoder.", "encoder.")) for k in sd):
        return sd
    sib = Path(path).with_name(name.replace("decoder", "encoder"))
    if not sib.is_file():
        return sd
    enc = read(str(sib))
    if "layers.0.weight" not in enc or "output_proj.weight" not in enc:  # not the release's encoder
        return sd
    return {**{"decoder." + k: v for k, v in sd.items()}, **{"encoder." + k: v for k, v in enc.items()}}


def _blocks(sd, pattern: str) -> int:
    got = {int(m[1]) for k in sd if (m := re.match(pattern, k))}
    return max(got) + 1 if got else 0


def mochi_config(sd: dict[str, torch.Tensor], path: str, drop: str = "end") -> MochiConfig:
    """The configuration the (release-named) decoder tensors describe; a FormatError names what is
    missing or does not fit."""

    def shape(key: str) -> tuple[int, ...]:
        if key not in sd:
            raise FormatError(f"{path}: incomplete Mochi VAE decoder, tensor {key} is missing", path=path)
        return tuple(sd[key].shape)

    top = shape("decoder.blocks.0.0.weight")
    if len(top) != 5:
        raise FormatError(f"{path}: decoder.blocks.0.0.weight {top}: a Mochi VAE's is 5-D", path=path)
    n_blocks = _blocks(sd, r"decoder\.blocks\.(\d+)\.")
    if n_blocks < 3:
        raise FormatError(f"{path}: a Mochi VAE decoder has an input block, up blocks and a last block",
                          path=path)  # fmt: skip
    widths, res, time = [top[0]], [_blocks(sd, r"decoder\.blocks\.0\.(\d+)\.") - 1], []
    for i in range(1, n_blocks - 1):
        res.append(_blocks(sd, rf"decoder\.blocks\.{i}\.blocks\.(\d+)\."))
        nxt = (shape(f"decoder.blocks.{i + 1}.blocks.0.stack.2.weight") if i + 1 < n_blocks - 1
               else shape(f"decoder.blocks.{i + 1}.0.stack.2.weight"))[0]  # fmt: skip
        out = shape(f"decoder.blocks.{i}.proj.weight")[0]
        st, rem = divmod(out, nxt * SPACE * SPACE)
        if rem or st < 1:
            raise FormatError(f"{path}: decoder.blocks.{i}.proj.weight has {out} outputs, not a whole "
                              f"number of {nxt}-wide 2x2 patches per frame", path=path)  # fmt: skip
        widths.append(nxt)
        time.append(st)
    res.append(_blocks(sd, rf"decoder\.blocks\.{n_blocks - 1}\.(\d+)\."))
    image = shape("decoder.output_proj.weight")[0]
    return MochiConfig(top[1], tuple(widths), tuple(res), tuple(time), drop, image)


def build(sd: dict[str, torch.Tensor], path: str, drop: str = "end") -> MochiVAE:
    """A Mochi VAE decoder in either naming, and its encoder where the file holds it, loaded strictly
    (engine.vae.loading.strict_load)."""
    from .loading import _made, strict_load
    from .mochi_encoder import HEAD_DIM, encoder_config

    sd = model_part(sd, path)
    cfg = mochi_config(sd, path, drop)
    enc = encoder_config(sd, path)
    if enc is not None:
        if any(c % GROUPS for c in enc.widths) or any(c % HEAD_DIM for c in enc.widths):
            raise UnsupportedModel(f"{path}: a Mochi VAE encoder with widths {enc.widths}: its GroupNorms take "
                                   f"{GROUPS} groups, its attention heads {HEAD_DIM} channels", path=path)  # fmt: skip
        cfg = dataclasses.replace(cfg, encoder=enc)
    if any(c % GROUPS for c in cfg.widths):
        raise UnsupportedModel(f"{path}: a Mochi VAE with widths {cfg.widths}: its GroupNorms take "
                               f"{GROUPS} groups", path=path)  # fmt: skip
    with torch.device("meta"):
        model = _made(path, lambda: MochiVAE(cfg))
    strict_load(model, sd, path)
    model.source = path
    return model
