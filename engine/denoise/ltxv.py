"""LTX-Video's transformer (Lightricks' LTX-Video 0.9.x: the 2B and 13B models, dev and distilled), run on the
component's own castable ops, in the file's own naming: the release's (`patchify_proj`, `adaln_single`,
`q_norm`: ComfyUI's files and the GGUFs) or diffusers' (`proj_in`, `time_embed`, `norm_q`, renamed onto them:
engine.lora.family_names.LTX).

Architecture facts, from Lightricks/LTX-Video `ltx_video/models/transformers/transformer3d.py`,
`attention.py`, `pipelines/pipeline_ltx_video.py` and diffusers' `LTXVideoTransformer3DModel` (written from
that description, nothing copied):

* x [B, 128, F, H, W] latents (a 32nd of the pixels, an 8th of the frames), one token per latent pixel in
  (frame, row, column) order → `patchify_proj`; out: `proj_out` back to 128 channels.
* t in 0–1 (sigma), × 1000 (`timestep_scale_multiplier`), its 256-wide sinusoidal embedding (cosines first) →
  `adaln_single.emb.timestep_embedder` (Linear, SiLU, Linear) = e; `adaln_single.linear`(SiLU(e)) = six
  modulations; t may be one per token ([B, S]: conditioning frames at t = 0).
* context [B, T, 4096] (T5-XXL states) → `caption_projection` (Linear, tanh-GELU, Linear).
* Block: (shift, scale, gate, shift₂, scale₂, gate₂) = its `scale_shift_table` [6, D] + the modulations;
  x += gate · attn1(RMS(x)·(1 + scale) + shift) (self-attention, RoPE); x += attn2(x, context) (cross-attention
  on the un-normalised x, the prompt's tokens only); x += gate₂ · ff(RMS(x)·(1 + scale₂) + shift₂) (Linear,
  tanh-GELU, Linear, 4× wide). RMS: affine-free, eps 1e-6. Attention: 32 heads (the 2B's of 64, the 13B's of
  128; the configs' fact, as the weights do not hold it); q and k RMS-normalised over the whole width
  (`q_norm`, `k_norm`, eps 1e-5) before RoPE.
* RoPE over the whole width: each token's pixel position (the frame's 8f + 1 − 8, clamped at 0, over the
  frame rate — 25 unless given —; 32·row; 32·column), each over its maximum (20, 2048, 2048), as p; D // 6
  frequencies f_j = theta^(j / (D//6 − 1)), theta 10000, times π/2; angle f_j · (2p − 1) for the three axes in
  turn per frequency, on interleaved pairs; the D mod 6 leading dimensions unrotated.
* Final: (shift, scale) = the root `scale_shift_table` [2, D] + e; `proj_out`(LN(x)·(1 + scale) + shift), LN
  affine-free (eps 1e-6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import NormedAttn as Attn
from .common import (
    Ops,
    held,
    held_shape,
    layer_norm,
    merge_heads,
    rms_norm_with,
    rope,
    split_heads,
    timestep_embedding,
    wshape,
)

HEADS = 32  # LTX-Video 2B and 13B (Lightricks' configs: num_attention_heads 32)
THETA = 10000.0
MAX_POS = (20.0, 2048.0, 2048.0)
SCALE = (8, 32, 32)  # the VAE's temporal and spatial compression: a latent position's pixel position
FRAME_RATE = 25.0
TIME_SCALE = 1000.0
QK_EPS = 1e-5
RMS_EPS = 1e-6


@dataclass
class Block:
    table: object  # the plain module holding the block's `scale_shift_table` [6, D]
    attn1: Attn
    attn2: Attn
    ff: tuple[object, object]


@dataclass
class LTXVideo:
    """A bound LTX-Video transformer: call it with x, timestep, context [, attention_mask] [, frame_rate]."""

    architecture: str
    proj_in: object
    t_embedder: tuple[object, object]
    adaln: object
    caption: tuple[object, object]
    blocks: list[Block]
    table: object  # the root module holding the final `scale_shift_table` [2, D]
    proj_out: object
    dtype: torch.dtype = torch.float32
    family = "ltxv"

    @property
    def in_channels(self) -> int:
        return wshape(self.proj_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.caption[0])[1]

    def __call__(self, x, timestep, context, attention_mask=None, frame_rate=None) -> torch.Tensor:
        dt = self.dtype
        b, c, f, h, w = x.shape
        tokens = self.proj_in(x.to(dt).flatten(2).transpose(1, 2))  # [B, F·H·W, D]
        t = timestep.float().reshape(b, -1)  # [B, 1] or one per token [B, S]
        e = mlp_silu(self.t_embedder, timestep_embedding(TIME_SCALE * t.flatten(), 256).to(dt))
        mods = self.adaln(F.silu(e)).reshape(b, t.shape[1], 6, -1)
        e = e.reshape(b, t.shape[1], -1)
        ctx = self.caption[1](F.gelu(self.caption[0](context.to(dt)), approximate="tanh"))
        keys = None
        if attention_mask is not None and not bool(attention_mask.all()):
            keys = attention_mask.bool()[:, None, None, :]
        rate = frame_rate.float() if frame_rate is not None else torch.full((b,), FRAME_RATE, device=x.device)
        pe = rope_table(positions(f, h, w, rate), tokens.shape[-1])
        for blk in self.blocks:
            tokens = self._block(blk, tokens, ctx, mods, pe, keys)
        table = held(self.table, "scale_shift_table", tokens.device).to(tokens.device, dt)
        shift, scale = (table[None, None] + e[:, :, None]).unbind(2)
        out = self.proj_out(layer_norm(tokens) * (1 + scale) + shift)
        return out.transpose(1, 2).reshape(b, -1, f, h, w)

    def _block(self, blk: Block, x, ctx, mods, pe, keys):
        table = held(blk.table, "scale_shift_table", x.device).to(x.device, x.dtype)
        shift, scale, gate, shift2, scale2, gate2 = (table[None, None] + mods).unbind(2)
        x = x + gate * self._attn(blk.attn1, _rms(x) * (1 + scale) + shift, None, pe, None)
        x = x + self._attn(blk.attn2, x, ctx, None, keys)
        y = _rms(x) * (1 + scale2) + shift2
        return x + gate2 * blk.ff[1](F.gelu(blk.ff[0](y), approximate="tanh"))

    @staticmethod
    def _attn(a: Attn, x, ctx, pe, keys):
        src = x if ctx is None else ctx
        q, k = rms_norm_with(a.q_norm, a.q(x), QK_EPS), rms_norm_with(a.k_norm, a.k(src), QK_EPS)
        v = a.v(src)
        if pe is not None:
            q, k = rope(q, pe).to(v.dtype), rope(k, pe).to(v.dtype)
        q, k, v = (split_heads(t, HEADS) for t in (q, k, v))
        return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=keys)))

    def op_order(self) -> list:
        order = [self.proj_in, *self.t_embedder, self.adaln, *self.caption]
        for blk in self.blocks:
            order += [*blk.attn1.ops(), *blk.attn2.ops(), *blk.ff]
        return [*order, self.proj_out]


def mlp_silu(pair, x: torch.Tensor) -> torch.Tensor:
    return pair[1](F.silu(pair[0](x)))


def _rms(x: torch.Tensor) -> torch.Tensor:
    """Affine-free RMSNorm over the last axis, computed in float32 (eps 1e-6)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=RMS_EPS).to(x.dtype)


def positions(f: int, h: int, w: int, frame_rate: torch.Tensor) -> torch.Tensor:
    """[B, F·H·W, 3] pixel positions of the latent's tokens: (frame time, row, column) as the original pipeline
    gives them (the causal first frame: 8f + 1 − 8 clamped at 0, over the frame rate)."""
    dev = frame_rate.device
    grid = torch.meshgrid(
        *(torch.arange(n, device=dev, dtype=torch.float32) for n in (f, h, w)), indexing="ij"
    )
    p = torch.stack(grid, dim=-1).reshape(1, f * h * w, 3) * torch.tensor(
        SCALE, device=dev, dtype=torch.float32
    )
    p = p.expand(frame_rate.shape[0], -1, -1).clone()
    p[..., 0] = (p[..., 0] + 1 - SCALE[0]).clamp(min=0) / frame_rate[:, None]
    return p


def rope_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """[B, S, 3] positions -> [B, S, dim/2, 2, 2] rotations over the whole width (the leading dim mod 6
    dimensions unrotated), for engine.denoise.common.rope."""
    n = dim // 6
    # in float32, as the original computes them: its angles reach ~1.6e4 radians, where float64 would give
    # other rotations (by up to ~1e-3 rad) than those the model was trained with
    freqs = THETA ** torch.linspace(0.0, 1.0, n, dtype=torch.float32, device=pos.device) * (math.pi / 2)
    frac = pos.float() / torch.tensor(MAX_POS, dtype=torch.float32, device=pos.device)
    ang = (freqs[None, None, :, None] * (frac[:, :, None, :] * 2 - 1)).flatten(2)  # [B, S, 3n], axes inner
    pad = (dim % 6) // 2
    if pad:
        ang = torch.cat([torch.zeros(*ang.shape[:2], pad, dtype=ang.dtype, device=ang.device), ang], dim=-1)
    cos, sin = torch.cos(ang), torch.sin(ang)
    return torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*ang.shape, 2, 2)


# -- binding the file's ops -----------------------------------------------------------------------------


def bind_ltxv(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, LTXVideo]:
    """(naming, the forward) of an LTX-Video transformer in the release's or diffusers' naming; `mods`: the
    component's modules by path (the plain holders of the scale-shift tables)."""
    diffusers = "proj_in" in mods
    if diffusers:
        from ..lora.family_names import LTX, to_original

        rename = to_original(mods, LTX)
        ops = ops.renamed({rename.get(p, p).replace(".norm_q", ".q_norm").replace(".norm_k", ".k_norm"): m
                           for p, m in mods.items()})  # fmt: skip
    dim = wshape(ops["patchify_proj"])[0]
    if dim % HEADS or dim % 2:
        raise UnsupportedModel(
            f"{ops.what}: width {dim} is not {HEADS} heads wide — not an LTX-Video transformer"
        )

    def table(path: str, rows: int):
        m = mods.get(path)
        if m is None or getattr(m, "scale_shift_table", None) is None:
            raise UnsupportedModel(
                f"{ops.what}: no {path or 'root'} scale_shift_table — not an LTX-Video transformer"
            )
        if held_shape(m, "scale_shift_table") != (rows, dim):
            raise UnsupportedModel(
                f"{ops.what}: {path or 'the root'}'s scale_shift_table is not [{rows}, {dim}]"
            )
        ops.take(m)
        return m

    def attn(p: str) -> Attn:
        return Attn(*(ops[f"{p}.{n}"] for n in ("to_q", "to_k", "to_v", "to_out.0", "q_norm", "k_norm")))

    blocks = [Block(table(f"transformer_blocks.{i}", 6), attn(f"transformer_blocks.{i}.attn1"),
                    attn(f"transformer_blocks.{i}.attn2"),
                    (ops[f"transformer_blocks.{i}.ff.net.0.proj"], ops[f"transformer_blocks.{i}.ff.net.2"]))
              for i in ops.children("transformer_blocks")]  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no transformer blocks — not an LTX-Video transformer")
    te = "adaln_single.emb.timestep_embedder"
    model = LTXVideo(
        architecture, ops["patchify_proj"], (ops[f"{te}.linear_1"], ops[f"{te}.linear_2"]), ops["adaln_single.linear"],
        (ops["caption_projection.linear_1"], ops["caption_projection.linear_2"]), blocks, table("", 2),
        ops["proj_out"], dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
