"""The Mochi 1 video VAE's encoder, in the Genmo release's module names (genmoai/mochi `models.py`'s Encoder:
`encoder.layers.N...`, as in ComfyUI's repackaged file; engine.vae.mochi renames diffusers' MochiEncoder3D onto
them). engine.vae.mochi builds it where the file holds its tensors.

Architecture facts (both sources; the release's config: widths 64/128/256/384, residual blocks 3/3/4/6/3,
time / 1, 2, 3 and space / 2 per down block, attention in every stage but the first):
  * the input: each RGB value with sin and cos of it at 2^6 and 2^7 cycles (Fourier features: the 3 values,
    then sin of (c0 f6, c0 f7, c1 f6, ...), then cos in the same order -- 15 channels), then a 1x1x1
    convolution (`layers.0`; diffusers' Linear `proj_in`);
  * residual blocks as the decoder's (engine.vae.mochi.ResBlock: per-frame GroupNorms, causal 3x3x3
    convolutions padded by replication), each followed, where its stage has attention, by `attn_block`:
    x + out(attention(norm(x))) -- a per-frame GroupNorm, then attention over time at each pixel on its own
    (`qkv` a Linear without bias, heads of 32 channels, queries and keys L2-normalised, causal: each frame sees
    itself and the frames before), `out` a Linear; over a single frame it is out(v);
  * a down block (`layers.N.layers.0`): a (t, 2, 2) convolution of stride (t, 2, 2), its history the first
    frame repeated t - 1 times, then residual blocks (`layers.N.layers.1...`);
  * then `output_norm` (GroupNorm), SiLU and `output_proj` (a Linear without bias) to 2 z channels: the
    posterior's mean, then its log-variance.
1 + 6k frames encode to 1 + k latent frames. Causal throughout: `Encoder.step` takes a chunk of frames and
carries each convolution's history and each attention's keys and values in a `Stream`, so a clip encoded
chunk by chunk equals the whole pass (diffusers refuses frame-wise encoding because of the attention; its
keys and values carried make it exact). Each attention keeps every earlier frame's keys and values: a
clip's last chunk holds 2 x the block's width per pixel for every earlier frame at its resolution.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError
from .causal_conv import Stream
from .mochi import GROUPS, ResBlock, _blocks, _linear, _resnet
from .wan import _Indexed

HEAD_DIM = 32  # channels per attention head (the release's head_dim)
FOURIER = (6, 7)  # the release's frequencies: 2^6 and 2^7 cycles per unit
# pixels per attention call (projections included): larger batches break CUDA's launch configuration (the
# release's chunk), and smaller ones bound the projections' transient tensors
ROWS = 1 << 15


@dataclass(frozen=True)
class EncoderConfig:
    widths: tuple[int, ...]  # the first stage's width, then each down block's
    res_blocks: tuple[int, ...]  # per stage: the first, each down block, the last
    time: tuple[int, ...]  # each down block's time reduction
    attention: tuple[bool, ...]  # per stage
    space: int = 2

    @property
    def channels_in(self) -> int:
        return 3 * (1 + 2 * len(FOURIER))


def fourier(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, T, H, W) -> (B, 15, T, H, W): x, then sin and cos of x at each frequency, in float32."""
    dtype = x.dtype
    x = x.float()
    w = torch.tensor([2.0**f * 2 * math.pi for f in FOURIER], device=x.device).repeat(x.shape[1])
    h = x.repeat_interleave(len(FOURIER), dim=1) * w[None, :, None, None, None]
    return torch.cat([x, torch.sin(h), torch.cos(h)], dim=1).to(dtype)


class _Attention(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.qkv = ops.Linear(c, 3 * c, bias=False)
        self.out = ops.Linear(c, c)
        self.heads = c // HEAD_DIM

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        """x (B, C, t, H, W) normalised -> the attention's output over time at each pixel, the earlier chunks'
        keys and values (kept in `stream` as one tensor (2, pixels, heads, frames, 32)) included. ROWS pixels at
        a time from projection to output, so only the keys and values are ever whole-chunk tensors."""
        b, c, t, h, w = x.shape
        n = b * h * w
        rows = x.permute(0, 3, 4, 2, 1).reshape(n, t, c)  # (pixels, t, C)
        past = stream.frames.pop(id(self), None)
        before = 0 if past is None else past.shape[3]
        kv = x.new_empty(2, n, self.heads, before + t, HEAD_DIM)
        if past is not None:
            kv[:, :, :, :before] = past
            del past
        # frame i of the chunk sees the keys of every earlier chunk and of its own frames up to i
        keys = torch.arange(before + t, device=x.device)
        mask = keys[None] <= before + torch.arange(t, device=x.device)[:, None]
        out = torch.empty_like(rows)
        for a in range(0, n, ROWS):
            q, k, v = (
                self.qkv(rows[a : a + ROWS]).unflatten(2, (3, self.heads, HEAD_DIM)).permute(2, 0, 3, 1, 4)
            )
            kv[0, a : a + ROWS, :, before:] = F.normalize(k, dim=-1)
            kv[1, a : a + ROWS, :, before:] = v
            del k, v
            if before + t == 1:  # one key: its softmax weight is exactly 1, the output its value
                y = kv[1, a : a + ROWS]
            else:  # (CPU: batched matmuls of a few frames each, the attention's main cost)
                y = F.scaled_dot_product_attention(F.normalize(q, dim=-1).contiguous(), kv[0, a : a + ROWS], kv[1, a : a + ROWS],
                                                   attn_mask=mask)  # fmt: skip
            del q
            out[a : a + ROWS] = self.out(y.transpose(1, 2).reshape(-1, t, c))
            del y
        if stream.keep:
            stream.frames[id(self)] = kv
        del kv, rows
        return out.reshape(b, h, w, t, c).permute(0, 4, 3, 1, 2)


class AttnBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.norm = ops.GroupNorm(GROUPS, c)
        self.attn = _Attention(c)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        normed = torch.empty_like(x)
        for i in range(x.shape[2]):  # per-frame statistics
            normed[:, :, i] = self.norm(x[:, :, i])
        y = self.attn.step(normed, stream)
        del normed
        return x + y


class EncoderBlock(ResBlock):
    """The decoder's residual block, then (where the stage has attention) `attn_block`."""

    def __init__(self, c: int, attention: bool):
        super().__init__(c)
        if attention:
            self.attn_block = AttnBlock(c)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        x = super().step(x, stream)
        return self.attn_block.step(x, stream) if hasattr(self, "attn_block") else x


class DownConv(ops.Conv3d):
    """A (t, s, s) convolution of stride (t, s, s); at the clip's start its t - 1 history frames are copies of
    the first frame. A chunk after the first starts a window: its frame count is a multiple of t (the encode's
    chunks), so nothing is carried."""

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        t = self.kernel_size[0]
        if t > 1 and id(self) not in stream.started:
            stream.started.add(id(self))
            x = torch.cat([x[:, :, :1].expand(-1, -1, t - 1, -1, -1), x], dim=2)
        return self(x)


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, n: int, time: int, space: int, attention: bool):
        super().__init__()
        items: dict[int, nn.Module] = {
            0: DownConv(cin, cout, (time, space, space), stride=(time, space, space))
        }
        items.update({j + 1: EncoderBlock(cout, attention) for j in range(n)})
        self.layers = _Indexed(items)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        for m in self.layers._modules.values():
            x = m.step(x, stream)
        return x


class Encoder(nn.Module):
    def __init__(self, cfg: EncoderConfig, z: int):
        super().__init__()
        w, n, att = cfg.widths, cfg.res_blocks, cfg.attention
        items: dict[int, nn.Module] = {0: ops.Conv3d(cfg.channels_in, w[0], 1)}
        items.update({1 + j: EncoderBlock(w[0], att[0]) for j in range(n[0])})
        for i, st in enumerate(cfg.time):
            items[len(items)] = DownBlock(w[i], w[i + 1], n[i + 1], st, cfg.space, att[i + 1])
        for _ in range(n[-1]):
            items[len(items)] = EncoderBlock(w[-1], att[-1])
        self.layers = _Indexed(items)
        self.output_norm = ops.GroupNorm(GROUPS, w[-1])
        self.output_proj = ops.Linear(w[-1], 2 * z, bias=False)

    def step(self, x: torch.Tensor, stream: Stream) -> torch.Tensor:
        layers = list(self.layers._modules.values())
        x = layers[0](fourier(x))
        for m in layers[1:]:
            x = m.step(x, stream)
        out = torch.empty_like(x)
        for i in range(x.shape[2]):
            out[:, :, i] = F.silu(self.output_norm(x[:, :, i]), inplace=True)
        return _linear(self.output_proj, out)


# -- loading (engine.vae.mochi.build) -------------------------------------------------------------
def _stage_key(base: str, rest: str, qkv: dict) -> str:
    """The release's name of a diffusers stage's `resnets.J.*` / `norms.J.*` / `attentions.J.*` key (`rest` after
    the J), under `base` (the release's block J); an attention's q, k, v are gathered into `qkv`."""
    kind, _, tail = rest.partition(".")
    if kind == "resnets":
        return f"{base}.{_resnet(tail)}"
    if kind == "norms":
        return f"{base}.attn_block.norm.{tail.removeprefix('norm_layer.')}"
    if m := re.match(r"to_([qkv])\.weight$", tail):
        qkv.setdefault(f"{base}.attn_block.attn.qkv.weight", {})[m[1]] = True
        return f"{base}.attn_block.attn.to_{m[1]}"
    return f"{base}.attn_block.attn.out.{tail.removeprefix('to_out.0.')}"


def diffusers_to_original(sd: dict[str, torch.Tensor], path: str) -> dict[str, torch.Tensor]:
    """diffusers' encoder names (MochiEncoder3D) -> the release's: `proj_in` -> `layers.0` (a 1x1x1
    convolution), `block_in` / `down_blocks.N` / `block_out` -> the numbered layers, each attention's separate
    q, k, v -> one `qkv` (q's rows first); other keys pass unchanged (the strict load names what does not fit)."""
    n0 = _blocks(sd, r"encoder\.block_in\.resnets\.(\d+)\.")
    downs = _blocks(sd, r"encoder\.down_blocks\.(\d+)\.")
    out: dict[str, torch.Tensor] = {}
    qkv: dict[str, dict] = {}
    for k, v in sd.items():
        new = k
        if k.startswith("encoder.proj_in."):
            new = "encoder.layers.0." + k.removeprefix("encoder.proj_in.")
            if v.dim() == 2:  # diffusers' Linear: the release's 1x1x1 convolution
                v = v[:, :, None, None, None]
        elif m := re.match(r"encoder\.block_in\.(resnets|norms|attentions)\.(\d+)\.(.*)$", k):
            new = _stage_key(f"encoder.layers.{1 + int(m[2])}", f"{m[1]}.{m[3]}", qkv)
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.conv_in\.conv\.(.*)$", k):
            new = f"encoder.layers.{1 + n0 + int(m[1])}.layers.0.{m[2]}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.(resnets|norms|attentions)\.(\d+)\.(.*)$", k):
            base = f"encoder.layers.{1 + n0 + int(m[1])}.layers.{1 + int(m[3])}"
            new = _stage_key(base, f"{m[2]}.{m[4]}", qkv)
        elif m := re.match(r"encoder\.block_out\.(resnets|norms|attentions)\.(\d+)\.(.*)$", k):
            new = _stage_key(f"encoder.layers.{1 + n0 + downs + int(m[2])}", f"{m[1]}.{m[3]}", qkv)
        elif k.startswith("encoder.norm_out.norm_layer."):
            new = "encoder.output_norm." + k.removeprefix("encoder.norm_out.norm_layer.")
        elif k.startswith("encoder.proj_out."):
            new = "encoder.output_proj." + k.removeprefix("encoder.proj_out.")
        out[new] = v
    for key in qkv:
        base = key.removesuffix("qkv.weight")
        parts = {x: out.pop(f"{base}to_{x}", None) for x in "qkv"}
        if missing := [x for x, t in parts.items() if t is None]:
            raise FormatError(f"{path}: incomplete Mochi VAE encoder: {base}to_{missing[0]} (diffusers' "
                              f"attentions...to_{missing[0]}.weight) is missing", path=path)  # fmt: skip
        out[key] = torch.cat(list(parts.values()), dim=0)
    return out


def encoder_config(sd: dict[str, torch.Tensor], path: str) -> EncoderConfig | None:
    """The encoder the (release-named) `encoder.` tensors describe; None without any."""
    if not any(k.startswith("encoder.") for k in sd):
        return None

    def shape(key: str) -> tuple[int, ...]:
        if key not in sd:
            raise FormatError(f"{path}: incomplete Mochi VAE encoder, tensor {key} is missing", path=path)
        return tuple(sd[key].shape)

    widths, time = [shape("encoder.layers.0.weight")[0]], []
    res, attention = [0], [False]  # the first stage's blocks, then each down block's, then the last stage's
    n = _blocks(sd, r"encoder\.layers\.(\d+)\.")
    for i in range(1, n):
        p = f"encoder.layers.{i}."
        if p + "layers.0.weight" in sd:  # a down block: its convolution, then its own residual blocks
            w = shape(p + "layers.0.weight")
            widths.append(w[0])
            time.append(w[2])
            res.append(_blocks(sd, rf"{re.escape(p)}layers\.(\d+)\.") - 1)
            attention.append(p + "layers.1.attn_block.attn.qkv.weight" in sd)
            res.append(0)  # the last stage's, counted after it
            attention.append(False)
        else:
            shape(p + "stack.2.weight")
            if res[-1] == 0:
                attention[-1] = p + "attn_block.attn.qkv.weight" in sd
            res[-1] += 1
    if not time:
        raise FormatError(f"{path}: a Mochi VAE encoder without its down blocks (encoder.layers.N.layers.0)",
                          path=path)  # fmt: skip
    # each down block appended a (0, False) for the blocks after it: only the last one's is a stage
    keep = [0] + [j for j in range(1, len(res)) if j % 2 == 1] + [len(res) - 1]
    return EncoderConfig(
        tuple(widths), tuple(res[j] for j in keep), tuple(time), tuple(attention[j] for j in keep)
    )
