"""The HunyuanVideo VAE's decoder (also the VAE of Kandinsky 5 and SkyReels-V1), on castable ops and
`CausalConv3d`, so `engine.vae.video` chunks and tiles it as it does Wan's.

Architecture facts (diffusers `autoencoder_kl_hunyuan_video.py`, AutoencoderKLHunyuanVideo; Tencent's
HunyuanVideo `hyvideo/vae`):
  * every convolution but the 1x1x1 `post_quant_conv` is a causal 3-D convolution wrapped as `<name>.conv`,
    padded by replication: k - 1 history frames that are copies of the clip's first frame, (k - 1) / 2
    rows and columns of edge copies (F.pad mode "replicate");
  * resnet = GroupNorm(32, eps 1e-6), SiLU, conv 3x3x3, GroupNorm, SiLU, conv 3x3x3, plus a 1x1x1
    `conv_shortcut` when the width changes. The GroupNorms take their statistics over all the frames
    they are given (diffusers runs them on the whole clip up to 4 latent frames, and on overlapping
    5-frame tiles of a longer one): chunked decoding is therefore close to, not equal to, the whole pass;
  * the middle block = resnet, attention, resnet: one head as wide as the block, GroupNorm over the
    tokens, `to_q` / `to_k` / `to_v` / `to_out.0` linear layers, a residual; CAUSAL over frames (a
    frame's tokens see their own and earlier frames' tokens);
  * up block i upsamples space by 2 where i < log2(spatial ratio) and time by 2 where
    i >= blocks - 1 - log2(time ratio 4) but not in the last block; nearest copies, the clip's first
    frame only in space (T latent frames decode to 1 + 4 (T - 1)), then a 3x3x3 causal convolution;
  * release config (hunyuanvideo-community/HunyuanVideo `vae/config.json`): latent 16, widths
    (128, 256, 512, 512), 2 layers per block (3 resnets per up block), 32 groups, ratios 8 / 4,
    scaling factor 0.476986.

Naming: the Tencent release's VAE file and diffusers' share their names (diffusers'
`scripts/convert_hunyuan_video_to_diffusers.py` converts the VAE with an empty rename table), so this module
uses them. ComfyUI's repackaged `hunyuan_video_vae_bf16.safetensors` names them as LDM's AutoencoderKL
(`decoder.mid.attn_1.q`, `decoder.up.0.block.0.nin_shortcut.conv`: the key lists users posted in
kijai/ComfyUI-HunyuanVideoWrapper issues 186 and 307), renamed onto these by `ldm_to_diffusers`. HunyuanVideo 1.5's VAE (z 32, 16x, RMS norms and
`mid_block.attentions.0.norm.gamma`) is a different network: engine.vae.hunyuan_video15, which `build` hands it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError, UnsupportedModel
from .autoencoder_kl import attention
from .causal_conv import CausalConv3d, Stream, VideoShape

GROUPS = 32  # norm_num_groups of the release (not in the weights' shapes)
EPS = 1e-6
TIME_UPS = 2  # log2 of the decoder's time ratio 4, the only one diffusers' decoder builds
SLICE_FRAMES = 1  # input frames per 3x3x3 convolution call (CausalConv3d.sliced)


def is_hunyuan_video(sd) -> bool:
    """The HunyuanVideo family's causal 3-D VAE: 1.0 in either naming, or 1.5 (engine.vae.hunyuan_video15)."""
    return "decoder.conv_in.conv.weight" in sd and (
        "decoder.mid_block.attentions.0.group_norm.weight" in sd
        or "decoder.mid_block.attentions.0.norm.gamma" in sd
        or _is_ldm(sd)
    )


def _is_ldm(sd) -> bool:
    """ComfyUI's repackaged file: LDM names (a plain GroupNorm `norm1`, which Kandinsky's KVAE lacks)."""
    return "decoder.mid.attn_1.q.weight" in sd and "decoder.mid.block_1.norm1.weight" in sd


# LDM attention names -> diffusers' (ComfyUI's repackaged hunyuan_video_vae_bf16.safetensors names the
# decoder as LDM's AutoencoderKL: `mid.block_1`, `mid.attn_1.q`, `up.0` the full-resolution level)
_LDM_ATTN = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}


def ldm_to_diffusers(sd: dict) -> dict:
    """LDM names renamed onto this module's, the encoder's as the decoder's (`down.i` is down block i, in
    diffusers' order as in LDM's; `up.0` the last up block); the attention's 1x1 convolution weights viewed
    as the linear layers' (C, C)."""
    ups = {int(k.split(".")[2]) for k in sd if k.startswith("decoder.up.")}
    out = {}
    for k, v in sd.items():
        new = k
        side = k.split(".")[0]
        if side in ("encoder", "decoder"):
            new = new.replace(f"{side}.norm_out.", f"{side}.conv_norm_out.").replace(
                ".nin_shortcut.", ".conv_shortcut."
            )
            parts = new.split(".")
            if parts[1] == "mid" and parts[2].startswith("block_"):
                new = ".".join([f"{side}.mid_block.resnets", str(int(parts[2][6:]) - 1), *parts[3:]])
            elif parts[1] == "mid" and parts[2] == "attn_1" and parts[3] in _LDM_ATTN:
                new = ".".join([f"{side}.mid_block.attentions.0", _LDM_ATTN[parts[3]], *parts[4:]])
                if parts[3] != "norm" and parts[-1] == "weight" and v.dim() > 2:
                    v = v.reshape(v.shape[0], -1)
            elif parts[1] == "up" and ups:
                level = max(ups) - int(parts[2])
                if parts[3] == "block":
                    new = ".".join(["decoder.up_blocks", str(level), "resnets", *parts[4:]])
                elif parts[3] == "upsample":
                    new = ".".join(["decoder.up_blocks", str(level), "upsamplers.0", *parts[4:]])
            elif parts[1] == "down" and parts[3] in ("block", "downsample"):
                inner = "resnets" if parts[3] == "block" else "downsamplers.0"
                new = ".".join(["encoder.down_blocks", parts[2], inner, *parts[4:]])
        out[new] = v
    return out


class _Causal(nn.Module):
    """diffusers' HunyuanVideoCausalConv3d: the convolution as its child `conv`."""

    def __init__(self, cin: int, cout: int, k: int = 3):
        super().__init__()
        self.conv = CausalConv3d(cin, cout, k, padding=k // 2, pad="replicate")

    def step(self, x: torch.Tensor, stream: Stream | None) -> torch.Tensor:
        return self.conv.step(x, stream, frames=SLICE_FRAMES)


def _norm_silu(norm: ops.GroupNorm, x: torch.Tensor) -> torch.Tensor:
    return F.silu(norm(x), inplace=True)


class Resnet(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.norm1 = ops.GroupNorm(GROUPS, cin, eps=EPS)
        self.conv1 = _Causal(cin, cout)
        self.norm2 = ops.GroupNorm(GROUPS, cout, eps=EPS)
        self.conv2 = _Causal(cout, cout)
        self.conv_shortcut = _Causal(cin, cout, 1) if cin != cout else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        h = self.conv1.step(_norm_silu(self.norm1, x), stream)
        h = self.conv2.step(_norm_silu(self.norm2, h), stream)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut.step(x, stream)
        h += x  # the same sum as x + h, into the convolution's fresh output
        return h


class CausalAttention(nn.Module):
    """One head over every token of the chunk, each frame's queries seeing the keys of their own and
    earlier frames. The keys and values of the frames before the chunk are kept in the stream (a
    frame's GroupNorm statistics are its chunk's: see the module's docstring)."""

    def __init__(self, dim: int):
        super().__init__()
        self.group_norm = ops.GroupNorm(GROUPS, dim, eps=EPS)
        self.to_q, self.to_k, self.to_v = (ops.Linear(dim, dim) for _ in range(3))
        self.to_out = nn.ModuleList([ops.Linear(dim, dim)])

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        b, c, t, h, w = x.shape
        n = h * w
        tokens = self.group_norm(x).flatten(2).transpose(1, 2)  # (B, T h w, C), frame-major
        q, k, v = self.to_q(tokens), self.to_k(tokens), self.to_v(tokens)
        del tokens
        out = causal_frames(self, q, k, v, stream, t, n)
        y = self.to_out[0](out).transpose(1, 2).reshape(b, c, t, h, w)
        y += x
        return y


def causal_frames(owner: nn.Module, q, k, v, stream: Stream, t: int, n: int) -> torch.Tensor:
    """Single-head attention of a chunk's `t` frames of `n` tokens each (B, t n, C), frame-major: each
    frame's queries see the keys of its own and earlier frames. The keys and values of the chunks before
    are kept in `stream` under `owner` (as one stacked tensor, as the stream's other entries: video.Snapshots
    copies them), so a clip decoded chunk by chunk attends as the whole one."""
    past = stream.frames.get(id(owner))
    if past is not None:
        k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
    if stream.keep:
        stream.frames[id(owner)] = torch.stack([k, v])
    else:
        stream.frames.pop(id(owner), None)
    before = k.shape[1] - t * n  # tokens of earlier chunks
    q = q.contiguous()
    out = torch.empty_like(q)
    for f in range(t):  # frame f's queries against every key up to its own frame's last
        end = before + (f + 1) * n
        # attention() sizes its row blocks by the query count: scaled so one block's scores over `end`
        # keys stay within 8 MiB
        rows = q[:, f * n : (f + 1) * n]
        out[:, f * n : (f + 1) * n] = attention(rows, k[:, :end], v[:, :end], max(1, (8 << 20) * n // end))
    return out


class MidBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(dim, dim), Resnet(dim, dim)])
        self.attentions = nn.ModuleList([CausalAttention(dim)])

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = self.resnets[0].step(x, stream)
        x = self.attentions[0].step(x, stream)
        return self.resnets[1].step(x, stream)


class Upsample(nn.Module):
    """Nearest x2 in space (and in time where `time`: each frame twice, but the clip's first once),
    then a causal 3x3x3 convolution."""

    def __init__(self, dim: int, space: bool, time: bool):
        super().__init__()
        self.space, self.time = space, time
        self.conv = _Causal(dim, dim)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        if self.space:
            x = F.interpolate(x, scale_factor=(1.0, 2.0, 2.0), mode="nearest")
        if self.time:
            first = id(self) not in stream.started
            stream.started.add(id(self))
            rest = x[:, :, 1:] if first else x
            rest = rest.repeat_interleave(2, dim=2)
            x = torch.cat([x[:, :, :1], rest], dim=2) if first else rest
        return self.conv.step(x, stream)


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, space: bool, time: bool):
        super().__init__()
        self.resnets = nn.ModuleList([Resnet(cin if i == 0 else cout, cout) for i in range(layers)])
        self.upsamplers = nn.ModuleList([Upsample(cout, space, time)]) if space or time else None

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for r in self.resnets:
            x = r.step(x, stream)
        return x if self.upsamplers is None else self.upsamplers[0].step(x, stream)


@dataclass(frozen=True)
class HVConfig:
    """What the weights say (widths, resnets per up block, latent and image channels); the ratios follow."""

    z: int = 16
    widths: tuple[int, ...] = (128, 256, 512, 512)  # block_out_channels, the encoder's order
    layers: int = 3  # resnets per up block (layers_per_block + 1)
    image_channels: int = 3
    enc_layers: int = 0  # resnets per down block (layers_per_block); 0: the file holds no encoder

    @property
    def blocks(self) -> int:
        return len(self.widths)

    def space_up(self, i: int) -> bool:
        # the release's spatial ratio is 2 ** (blocks - 1): every block but the last doubles space
        return i < self.blocks - 1

    def time_up(self, i: int) -> bool:
        return self.blocks - 1 - TIME_UPS <= i < self.blocks - 1

    @property
    def downscale(self) -> int:
        return 2 ** sum(self.space_up(i) for i in range(self.blocks))

    @property
    def time_factor(self) -> int:
        return 2 ** sum(self.time_up(i) for i in range(self.blocks))


class Decoder(nn.Module):
    def __init__(self, cfg: HVConfig):
        super().__init__()
        rev = cfg.widths[::-1]
        self.conv_in = _Causal(cfg.z, rev[0])
        self.mid_block = MidBlock(rev[0])
        self.up_blocks = nn.ModuleList(
            UpBlock(rev[max(i - 1, 0)], rev[i], cfg.layers, cfg.space_up(i), cfg.time_up(i))
            for i in range(cfg.blocks)
        )
        self.conv_norm_out = ops.GroupNorm(GROUPS, rev[-1], eps=EPS)
        self.conv_out = _Causal(rev[-1], cfg.image_channels)


class HunyuanVideoVAE(VideoShape, nn.Module):
    """`decode` takes VAE-space latents (B, 16, T, h, w) and returns clips (B, 3, 1 + 4 (T - 1), 8h, 8w) in
    [-1, 1]; `encode` clips of 1 + 4k frames to the posterior mean, where the file holds the encoder (then
    built with its `quant_conv`: engine.vae.hunyuan_video_encoder)."""

    kind = "vae"
    video = True
    encodes = True  # a file of this family without the encoder is a decoder-only file (engine.vae.run)
    image_range = (-1.0, 1.0)
    fps = 24.0  # HunyuanVideo's frame rate (its pipelines export at 24 fps)

    def __init__(self, cfg: HVConfig):
        super().__init__()
        self.cfg = cfg
        self.post_quant_conv = ops.Conv3d(cfg.z, cfg.z, 1)
        self.decoder = Decoder(cfg)
        if cfg.enc_layers:
            from .hunyuan_video_encoder import Encoder

            self.encoder = Encoder(cfg, cfg.enc_layers)
            self.quant_conv = ops.Conv3d(2 * cfg.z, 2 * cfg.z, 1)

    def vae_spec(self):
        """The estimate's view (engine.vae.estimate.spec_of): the last level's width per output pixel, the
        middle block's width; the weights the encoder's too where it is built."""
        from .estimate import VaeSpec

        wbytes = sum(p.numel() * p.element_size() for p in self.parameters())
        c = self.cfg
        return VaeSpec("hunyuan_video", c.z, wbytes, c.widths[0], c.widths[-1], c.time_factor, c.downscale)

    # -- pieces the chunked runner composes (engine.vae.video) ----------------------------------
    def decode_head(self, z: torch.Tensor, stream: Stream) -> torch.Tensor:
        d = self.decoder
        return d.mid_block.step(d.conv_in.step(self.post_quant_conv(z), stream), stream)

    def decode_up(self, h: torch.Tensor, stream: Stream, frames_at_once: int | None = None) -> torch.Tensor:
        """The up path over the chunk's frames at once (`frames_at_once` is not used: the GroupNorms'
        statistics span the frames they are given, so fewer frames would change the result)."""
        d = self.decoder
        for blk in d.up_blocks:
            h = blk.step(h, stream)
        return d.conv_out.step(_norm_silu(d.conv_norm_out, h), stream)

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        """The whole clip in one pass (diffusers' decoder on the whole latent)."""
        return self.decode_up(self.decode_head(z, Stream()), Stream()).clamp_(-1, 1)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Clip (B, 3, 1 + 4k, H, W) in [-1, 1] -> posterior mean (B, z, 1 + k, H/8, W/8)."""
        from .hunyuan_video_encoder import encode

        return encode(self, x)


def decoder_keys(sd: dict) -> dict:
    """The tensors the decoder reads (the encoder's and `quant_conv`'s left out)."""
    return {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}


def has_encoder(sd: dict) -> bool:
    return any(k.startswith("encoder.") for k in sd)


def _shape(sd: dict, key: str, path: str) -> tuple[int, ...]:
    if key not in sd:
        raise FormatError(f"{path}: a HunyuanVideo VAE without {key}", path=path)
    return tuple(sd[key].shape)


def hv_config(sd: dict, path: str) -> HVConfig:
    """The config from the weights' shapes (HunyuanVideo 1.5's VAE is not this network: refused by name)."""
    if "decoder.mid_block.attentions.0.norm.gamma" in sd:
        raise UnsupportedModel(
            f"{path}: the HunyuanVideo 1.5 VAE (32 latent channels, 16x): Loadout decodes the HunyuanVideo "
            "VAE, not this one yet",
            path=path,
        )
    z = _shape(sd, "decoder.conv_in.conv.weight", path)[1]
    blocks = len({int(k.split(".")[2]) for k in sd if k.startswith("decoder.up_blocks.")})
    if blocks < 2:
        raise FormatError(f"{path}: a HunyuanVideo VAE with {blocks} up blocks", path=path)
    # up block i's output width is widths[blocks - 1 - i]
    rev = [_shape(sd, f"decoder.up_blocks.{i}.resnets.0.conv1.conv.weight", path)[0] for i in range(blocks)]
    layers = len({int(k.split(".")[4]) for k in sd if k.startswith("decoder.up_blocks.0.resnets.")})
    image = _shape(sd, "decoder.conv_out.conv.weight", path)[0]
    # the encoder's widths are the decoder's (one block_out_channels): strict loading names a misfit
    enc = len({int(k.split(".")[4]) for k in sd if k.startswith("encoder.down_blocks.0.resnets.")})
    if has_encoder(sd) and not enc:
        raise FormatError(
            f"{path}: a HunyuanVideo VAE encoder without encoder.down_blocks.0.resnets.0", path=path
        )
    return HVConfig(z=z, widths=tuple(rev[::-1]), layers=layers, image_channels=image, enc_layers=enc)


def build(sd: dict, path: str, strict_load, made) -> HunyuanVideoVAE:
    """The decoder of a HunyuanVideo VAE file (either naming), and its encoder where the file holds one,
    loaded strictly with engine.vae.loading's `strict_load`, built through its `made`."""
    if "decoder.mid_block.attentions.0.norm.gamma" in sd:  # 1.5's RMS-norm network
        from . import hunyuan_video15

        return hunyuan_video15.build(sd, path, strict_load, made)
    if _is_ldm(sd):
        sd = ldm_to_diffusers(sd)
    cfg = hv_config(sd, path)
    with torch.device("meta"):
        model = made(path, lambda: HunyuanVideoVAE(cfg))
    strict_load(model, sd if cfg.enc_layers else decoder_keys(sd), path)
    model.source = path
    return model
