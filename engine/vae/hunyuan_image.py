"""HunyuanImage 2.1's VAE: 32x spatial compression to 64 latent channels, built from castable ops under
diffusers' `AutoencoderKLHunyuanImage` key names (the original Tencent names are renamed onto them in
`rename_original`).

Architecture facts (diffusers `models/autoencoders/autoencoder_kl_hunyuanimage.py`):
- GroupNorm with 32 groups, eps 1e-6, SiLU; a ResnetBlock is norm1, SiLU, conv1 3x3, norm2, SiLU, conv2 3x3
  plus the block's input. diffusers applies its `conv_shortcut` (present only where a block changes width) to
  the block's *output*, a shape no release has (with `downsample_match_channel` / `upsample_match_channel`,
  the released config, every block keeps its width), so a file holding one is refused.
- The mid block: ResnetBlock, single-head self-attention (norm, to_q / to_k / to_v / proj as 1x1 convs,
  SDPA's scale C^-1/2), ResnetBlock.
- Downsample: a 3x3 conv to out/4 channels, then space-to-depth with the channels ordered (r1, r2, c); its
  shortcut is the input space-to-depth'd the same way, averaged over consecutive groups of 4*in/out channels.
  Since that average takes channels of one (r1, r2) cell only, it is the average of the input's consecutive
  channel groups, space-to-depth'd: here s2d(conv(x) + group_mean(x)), the form the tiled path needs.
- Upsample: a 3x3 conv to 4*out channels, then depth-to-space, channels read as (r1, r2, c); its shortcut the
  input's channels repeated (repeat_interleave) 4*out/in times, depth-to-space'd: here d2s(conv(x) + repeat(x)).
- Encoder: conv_in, `down_blocks` (a flat list: `layers_per_block` ResnetBlocks a level, then a Downsample
  while the level is below log2(spatial_compression_ratio) and not the last), mid block, norm_out, SiLU,
  conv_out to 2*z channels, plus a shortcut: the mid block's output averaged over consecutive channel groups
  of width/(2z). The posterior's mode is the first z channels.
- Decoder: conv_in(z) plus z's channels repeated width/z times, mid block, `up_blocks` (flat: layers+1
  ResnetBlocks a level, then an Upsample), norm_out, SiLU, conv_out.
- The release (diffusers' `scripts/convert_hunyuan_image_to_diffusers.py`, hunyuanimage2.1): block_out_channels
  (128, 256, 512, 512, 1024, 1024), layers_per_block 2, latent_channels 64, spatial_compression_ratio 32,
  sample_size 384, scaling_factor 0.75289. Widths, blocks, z and the resamplers are read from the weights here.

Original names (the converter's mapping): `encoder.down.{i}.block.{j}.*`, `encoder.down.{i}.downsample.conv`,
`{encoder,decoder}.mid.block_1/attn_1/block_2` (attention `q`, `k`, `v`, `proj_out`), `decoder.up.{i}.block.{j}`
and `decoder.up.{i}.upsample.conv` with `up.{i}` in the order they run, under a `vae.` prefix (read off by
`loading.vae_component`); their conv weights may be 5-D with one frame (the converter squeezes them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError, UnsupportedModel
from .autoencoder_kl import attention

EPS = 1e-6
GROUPS = 32
SCALING_FACTOR = 0.75289  # the release's vae config (diffusers' converter); latents here are VAE space


@dataclass(frozen=True)
class HYIConfig:
    """`enc` / `dec`: per entry of the flat block list, ("res", width) or ("down"/"up", out width)."""

    z: int = 64
    in_channels: int = 3
    out_channels: int = 3
    enc: tuple[tuple[str, int], ...] | None = None
    dec: tuple[tuple[str, int], ...] | None = None
    enc_in: int = 128  # encoder conv_in's width
    dec_in: int = 1024  # decoder conv_in's width (its mid block's)

    @classmethod
    def of(cls, widths: tuple[int, ...], layers: int, z: int = 64, ratio: int = 32) -> HYIConfig:
        """The layout diffusers' AutoencoderKLHunyuanImage builds from its config (`block_out_channels`,
        `layers_per_block`, `latent_channels`, `spatial_compression_ratio`; matched resampler channels)."""
        n = len(widths)
        resample = [i < math.log2(ratio) and i != n - 1 for i in range(n)]
        enc: list[tuple[str, int]] = []
        for i, w in enumerate(widths):
            enc += [("res", w)] * layers + ([("down", widths[i + 1])] if resample[i] else [])
        back = widths[::-1]
        dec: list[tuple[str, int]] = []
        for i, w in enumerate(back):
            dec += [("res", w)] * (layers + 1) + ([("up", back[i + 1])] if resample[i] else [])
        return cls(z, 3, 3, tuple(enc), tuple(dec), widths[0], back[0])

    @property
    def downscale(self) -> int:
        steps = self.enc if self.enc is not None else self.dec
        return 2 ** sum(1 for kind, _ in steps if kind != "res")


def norm(c: int) -> ops.GroupNorm:
    return ops.GroupNorm(GROUPS, c, eps=EPS)


def space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """(B, C, 2H, 2W) -> (B, 4C, H, W), channel (r1, r2, c) = x[c, 2i + r1, 2j + r2] (diffusers' order)."""
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 3, 5, 1, 2, 4).reshape(b, 4 * c, h // 2, w // 2)


def depth_to_space(x: torch.Tensor) -> torch.Tensor:
    """The inverse: (B, 4C, H, W), channels read as (r1, r2, c) -> (B, C, 2H, 2W)."""
    b, c4, h, w = x.shape
    return x.reshape(b, 2, 2, c4 // 4, h, w).permute(0, 3, 4, 1, 5, 2).reshape(b, c4 // 4, 2 * h, 2 * w)


class RepeatChannels(nn.Module):
    """Each channel repeated `n` times in place (repeat_interleave): pointwise, so a tiled step."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(self.n, dim=1) if self.n > 1 else x


class ChannelMean(nn.Module):
    """The mean of each `n` consecutive channels: pointwise, so a tiled step."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        return x.reshape(b, c // self.n, self.n, h, w).mean(dim=2) if self.n > 1 else x


class ResnetBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm1 = norm(c)
        self.conv1 = ops.Conv2d(c, c, 3, padding=1)
        self.norm2 = norm(c)
        self.conv2 = ops.Conv2d(c, c, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        return x + self.conv2(F.silu(self.norm2(h)))

    def steps(self) -> list[tuple]:
        return [("push",), ("gn", self.norm1), ("silu",), ("module", self.conv1),
                ("gn", self.norm2), ("silu",), ("module", self.conv2), ("pop_add", None)]  # fmt: skip


class AttentionBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = norm(c)
        self.to_q = ops.Conv2d(c, c, 1)
        self.to_k = ops.Conv2d(c, c, 1)
        self.to_v = ops.Conv2d(c, c, 1)
        self.proj = ops.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, hh, ww = x.shape
        h = self.norm(x)
        q, k, v = (m(h).flatten(2).transpose(1, 2) for m in (self.to_q, self.to_k, self.to_v))
        del h
        a = attention(q, k, v).transpose(1, 2).reshape(b, c, hh, ww)
        del q, k, v
        return x + self.proj(a)


class MidBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock(c), ResnetBlock(c)])
        self.attentions = nn.ModuleList([AttentionBlock(c)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class Downsample(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        if cout % 4 or (4 * cin) % cout:
            raise ValueError(f"a downsample from {cin} to {cout} channels")
        self.conv = ops.Conv2d(cin, cout // 4, 3, padding=1)
        self.mean = ChannelMean(4 * cin // cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return space_to_depth(self.conv(x) + self.mean(x))

    def steps(self) -> list[tuple]:
        return [("push",), ("module", self.conv), ("pop_add", self.mean), ("s2d", space_to_depth)]


class Upsample(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        if (4 * cout) % cin:
            raise ValueError(f"an upsample from {cin} to {cout} channels")
        self.conv = ops.Conv2d(cin, 4 * cout, 3, padding=1)
        self.repeat = RepeatChannels(4 * cout // cin)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return depth_to_space(self.conv(x) + self.repeat(x))

    def steps(self) -> list[tuple]:
        return [("push",), ("module", self.conv), ("pop_add", self.repeat), ("d2s", depth_to_space)]


def _blocks(layout, cin: int, resample) -> nn.ModuleList:
    out = []
    for kind, c in layout:
        out.append(ResnetBlock(c) if kind == "res" else resample(cin, c))
        cin = c
    return nn.ModuleList(out)


class Encoder(nn.Module):
    def __init__(self, cfg: HYIConfig):
        super().__init__()
        self.conv_in = ops.Conv2d(cfg.in_channels, cfg.enc_in, 3, padding=1)
        self.down_blocks = _blocks(cfg.enc, cfg.enc_in, Downsample)
        c = cfg.enc[-1][1]
        if c % (2 * cfg.z):
            raise ValueError(f"the encoder's last width {c} is no multiple of 2 x {cfg.z} latent channels")
        self.mid_block = MidBlock(c)
        self.norm_out = norm(c)
        self.conv_out = ops.Conv2d(c, 2 * cfg.z, 3, padding=1)
        self.out_mean = ChannelMean(c // (2 * cfg.z))

    def down_path(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv_in(x)
        for blk in self.down_blocks:
            x = blk(x)
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Mid block and output: at latent resolution, its attention over the whole latent (run whole)."""
        x = self.mid_block(x)
        return self.conv_out(F.silu(self.norm_out(x))) + self.out_mean(x)

    def tiled_steps(self) -> list[tuple]:
        steps: list[tuple] = [("module", self.conv_in)]
        for blk in self.down_blocks:
            steps += blk.steps()
        return steps


class Decoder(nn.Module):
    def __init__(self, cfg: HYIConfig):
        super().__init__()
        if cfg.dec_in % cfg.z:
            raise ValueError(
                f"the decoder's first width {cfg.dec_in} is no multiple of {cfg.z} latent channels"
            )
        self.conv_in = ops.Conv2d(cfg.z, cfg.dec_in, 3, padding=1)
        self.repeat_in = RepeatChannels(cfg.dec_in // cfg.z)
        self.mid_block = MidBlock(cfg.dec_in)
        self.up_blocks = _blocks(cfg.dec, cfg.dec_in, Upsample)
        c = cfg.dec[-1][1]
        self.norm_out = norm(c)
        self.conv_out = ops.Conv2d(c, cfg.out_channels, 3, padding=1)

    def head(self, z: torch.Tensor) -> torch.Tensor:
        """conv_in with its channel-repeat shortcut and the mid block (attention): run once, whole."""
        return self.mid_block(self.conv_in(z) + self.repeat_in(z))

    def up_path(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.up_blocks:
            x = blk(x)
        return self.conv_out(F.silu(self.norm_out(x)))

    def tiled_steps(self) -> list[tuple]:
        steps: list[tuple] = []
        for blk in self.up_blocks:
            steps += blk.steps()
        return steps + [("gn", self.norm_out), ("silu",), ("module", self.conv_out)]


class HunyuanImageVAE(nn.Module):
    """`decode` takes VAE-space latents (B, z, h, w) and returns images in [-1, 1]; `encode` returns the
    posterior mean (diffusers' `latent_dist.mode()`)."""

    kind = "vae"
    family = "hunyuan_image21"
    image_range = (-1.0, 1.0)

    def __init__(self, cfg: HYIConfig):
        super().__init__()
        self.config = cfg
        self.downscale = cfg.downscale
        if cfg.enc is not None:
            self.encoder = Encoder(cfg)
        if cfg.dec is not None:
            self.decoder = Decoder(cfg)

    @property
    def latent_channels(self) -> int:
        return self.config.z

    @property
    def encode_channels(self) -> int:
        """Channels of the encoder's tiled output (what `encode_tail` takes)."""
        return self.config.enc[-1][1]

    @property
    def ch(self) -> int:
        """The full-resolution width: the estimate's unit."""
        return (self.config.dec or self.config.enc)[-1 if self.config.dec else 0][1]

    def vae_spec(self):
        """The memory estimate's view (engine.vae.estimate: kind "hunyuan_image21", per unit of `ch`)."""
        from .estimate import VaeSpec

        wbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        return VaeSpec("hunyuan_image21", self.config.z, wbytes, self.ch, downscale=self.downscale)

    def decode_head(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder.head(z)

    def decode_steps(self) -> list[tuple]:
        return self.decoder.tiled_steps()

    def decode_tail(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def encode_head(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def encode_steps(self) -> list[tuple]:
        return self.encoder.tiled_steps()

    def encode_tail(self, h: torch.Tensor) -> torch.Tensor:
        return self.encoder.head(h)[:, : self.config.z]

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder.up_path(self.decode_head(z))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_tail(self.encoder.down_path(x))


# -- recognising and reading a file ------------------------------------------------------------------


def is_hunyuan_image_vae(keys) -> bool:
    """diffusers' naming: ResnetBlocks and resamplers straight in `down_blocks.N` / `up_blocks.N` (no
    `.resnets.`), attention's `proj`; or the original: a decoder resampler's conv wider than its input
    (4x the next width; an AutoencoderKL's is square) -- `is_original` checks that on the shapes."""
    keys = set(keys)
    return any(
        re.fullmatch(r"(encoder\.down|decoder\.up)_blocks\.\d+\.(norm1\.weight|conv\.weight)", k)
        for k in keys
    )


def is_original(sd: dict) -> bool:
    """Tencent's own names (LDM-like), told from an AutoencoderKL's by a resampler conv that is not square."""
    pat = re.compile(r"(encoder\.down|decoder\.up)\.\d+\.(downsample|upsample)\.conv\.weight")
    return any(pat.fullmatch(k) and len(v.shape) >= 4 and v.shape[0] != v.shape[1] for k, v in sd.items())


def rename_original(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Tencent's names onto diffusers' (the mapping of diffusers' converter), 5-D one-frame convs as 2-D."""

    def flat(prefix: str, resample: str) -> dict[tuple[int, int], int]:
        pat = rf"{prefix}\.(\d+)\.(?:block\.(\d+)|{resample})\."
        found = {(int(m.group(1)), int(m.group(2)) if m.group(2) is not None else 1 << 20)
                 for k in sd if (m := re.match(pat, k))}  # fmt: skip
        return {key: i for i, key in enumerate(sorted(found))}

    enc, dec = flat("encoder.down", "downsample"), flat("decoder.up", "upsample")
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        new = re.sub(r"\.mid\.block_(\d)\.", lambda m: f".mid_block.resnets.{int(m.group(1)) - 1}.", k)
        new = re.sub(r"\.mid\.attn_1\.(q|k|v)\.", r".mid_block.attentions.0.to_\1.", new)
        new = new.replace(".mid.attn_1.proj_out.", ".mid_block.attentions.0.proj.")
        new = new.replace(".mid.attn_1.norm.", ".mid_block.attentions.0.norm.")
        for prefix, table, resample, flat_name in (("encoder.down", enc, "downsample", "encoder.down_blocks"),
                                                   ("decoder.up", dec, "upsample", "decoder.up_blocks")):  # fmt: skip
            m = re.match(rf"{prefix}\.(\d+)\.(?:block\.(\d+)|{resample})\.(.*)$", new)
            if m:
                j = int(m.group(2)) if m.group(2) is not None else 1 << 20
                new = f"{flat_name}.{table[int(m.group(1)), j]}.{m.group(3)}"
        if v.dim() == 5 and v.shape[2] == 1:
            v = v.squeeze(2)
        out[new] = v
    return out


def _layout(sd: dict, prefix: str, path: str) -> tuple[tuple[str, int], ...] | None:
    idx = sorted({int(m.group(1)) for k in sd if (m := re.match(rf"{prefix}\.(\d+)\.", k))})
    if not idx:
        return None
    if idx != list(range(len(idx))):
        raise FormatError(f"{path}: {prefix}.{min(set(range(len(idx))) - set(idx))} is missing", path=path)
    out = []
    for i in idx:
        p = f"{prefix}.{i}"
        if f"{p}.conv_shortcut.weight" in sd:
            raise UnsupportedModel(
                f"{path}: {p} changes width (a conv_shortcut): a HunyuanImage VAE without matched resampler "
                "channels, which no release has; give the released HunyuanImage 2.1 VAE", path=path)  # fmt: skip
        if f"{p}.conv.weight" in sd:
            w = sd[f"{p}.conv.weight"].shape[0]
            out.append(("down", 4 * w) if "encoder" in prefix else ("up", w // 4))
        elif f"{p}.conv2.weight" in sd:
            out.append(("res", sd[f"{p}.conv2.weight"].shape[0]))
        else:
            raise FormatError(
                f"{path}: {p} holds neither a ResnetBlock (conv2) nor a resampler (conv)", path=path
            )
    return tuple(out)


def hyi_config(sd: dict[str, torch.Tensor], path: str) -> HYIConfig:
    """The network's shape, read off the tensors' shapes (diffusers' names)."""
    enc, dec = _layout(sd, "encoder.down_blocks", path), _layout(sd, "decoder.up_blocks", path)
    if enc is None and dec is None:
        raise FormatError(
            f"{path}: no encoder.down_blocks or decoder.up_blocks tensors: not a VAE", path=path
        )
    try:
        if dec is not None:
            z, dec_in = sd["decoder.conv_in.weight"].shape[1], sd["decoder.conv_in.weight"].shape[0]
            out_ch = sd["decoder.conv_out.weight"].shape[0]
        if enc is not None:
            z, enc_in = sd["encoder.conv_out.weight"].shape[0] // 2, sd["encoder.conv_in.weight"].shape[0]
            in_ch = sd["encoder.conv_in.weight"].shape[1]
    except KeyError as e:
        raise FormatError(f"{path}: incomplete VAE, tensor {e.args[0]} is missing", path=path) from e
    return HYIConfig(z, in_ch if enc else 3, out_ch if dec else 3, enc, dec,
                     enc_in if enc else 128, dec_in if dec else 1024)  # fmt: skip


def build(sd: dict[str, torch.Tensor], path: str, strict_load, made) -> HunyuanImageVAE:
    """A HunyuanImage 2.1 VAE in either naming, loaded strictly (engine.vae.loading's `strict_load`, `_made`)."""
    if not is_hunyuan_image_vae(sd):
        sd = rename_original(sd)
    cfg = hyi_config(sd, path)
    with torch.device("meta"):
        model = made(path, lambda: HunyuanImageVAE(cfg))
    strict_load(model, sd, path)
    model.source = path
    return model
