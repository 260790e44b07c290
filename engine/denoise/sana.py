"""Sana's transformer (NVlabs' Sana 600M / 1600M and Sana 1.5 4.8B), run on the component's own castable ops, in the
file's own naming: the release's (`x_embedder`, `t_block`, `blocks.N.attn.qkv`, `cross_attn.kv_linear`,
`mlp.inverted_conv`) or diffusers' (`patch_embed`, `time_embed`, `transformer_blocks.N.attn1.to_q`, `ff.conv_inverted`,
renamed onto them).

Architecture facts, from NVlabs/Sana `diffusion/model/nets/sana_multi_scale.py`, diffusers' `SanaTransformer2DModel` /
`SanaLinearAttnProcessor2_0` and its single-file converter `convert_sana_transformer_to_diffusers` (written from that
description, nothing copied):

* x [B, 32, H, W] (DC-AE latents, a 32nd of the pixels) → `x_embedder.proj` (1×1 patches) → tokens in (row, column)
  order; no position embedding (the converter drops the release's `pos_embed`, as it does the null caption
  `y_embedder.y_embedding`: neither reaches the forward).
* t in 0–1000: e = `t_embedder.mlp`(emb₂₅₆(t)) (Linear, SiLU, Linear); six modulations = `t_block.1`(SiLU(e)).
  SANA-Sprint adds its guidance the same way: e += `cfg_embedder.mlp`(emb₂₅₆(guidance)) (diffusers'
  SanaCombinedTimestepGuidanceEmbeddings; its pipeline passes the guidance scale × 0.1 and t = sin s / (sin s +
  cos s) in 0–1, TrigFlow's time).
* context [B, T, 2304] (Gemma 2 2B states) → `y_embedder.y_proj` (fc1, tanh-GELU, fc2) → RMSNorm `attention_y_norm`
  (weight, eps 1e-5).
* Block: (shift, scale, gate, shift₂, scale₂, gate₂) = its `scale_shift_table` + the modulations; x += gate ·
  linear_attn(LN(x)·(1 + scale) + shift); x += cross_attn(x, context) (the prompt's tokens; q_linear, the fused
  kv_linear, proj); x += gate₂ · Mix-FFN(LN(x)·(1 + scale₂) + shift₂) on the token grid: 1×1 conv to 2·2.5·D, SiLU,
  3×3 depthwise conv, halves a · SiLU(b), 1×1 conv back (no bias). LN affine-free, eps 1e-6.
* Linear attention: 32-wide heads, q and k through ReLU; per head out = (V·Kᵀ)·Q / (1ᵀKᵀQ + 1e-15), in float32
  (the fused qkv has no bias). Cross-attention heads: 16 of 72 at width 1152, 20 of 112 at 2240 (the released
  configs' split). Sana 1.5: q and k RMS-normalised over the whole width (`q_norm`, `k_norm`) in both attentions.
* Final: (shift, scale) = `final_layer.scale_shift_table` + e; `final_layer.linear`(LN(x)·(1 + scale) + shift).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import (
    Ops,
    held,
    held_shape,
    layer_norm,
    merge_heads,
    mlp2,
    rms_norm_with,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import Proj

HEAD = 32  # the self-attention's head width in every Sana config
CROSS_HEADS = {1152: 16, 2240: 20}  # width -> cross-attention heads (600M: 16 x 72; 1600M and 4.8B: 20 x 112)
CAPTION_EPS = 1e-5
QK_EPS = 1e-5


@dataclass
class Attn:
    qkv: Proj  # q, k, v (the self-attention's fused qkv; the cross-attention's q_linear and fused kv_linear)
    o: object
    q_norm: object | None
    k_norm: object | None

    def ops(self) -> list:
        return [*self.qkv.ops(), *(n for n in (self.q_norm, self.k_norm) if n is not None), self.o]


@dataclass
class Block:
    table: object  # the plain holder of the block's scale_shift_table [6, D]
    attn: Attn
    cross: Attn
    ffn: tuple[object, object, object]  # inverted, depth, point convolutions


@dataclass
class Sana:
    """A bound Sana transformer: call it with x, timesteps, context [, context_mask]."""

    architecture: str
    embed: object
    t_embedder: tuple[object, object]
    t_block: object
    caption: tuple[object, object]
    caption_norm: object
    blocks: list[Block]
    final_table: object
    final_linear: object
    cross_heads: int
    dtype: torch.dtype = torch.float32
    guidance: tuple[object, object] | None = None  # SANA-Sprint's cfg_embedder (Linear, SiLU, Linear)
    family = "sana"

    @property
    def in_channels(self) -> int:
        return wshape(self.embed)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.caption[0])[1]

    def __call__(self, x, timesteps, context, context_mask=None, guidance=None) -> torch.Tensor:
        dt = self.dtype
        b, _, h, w = x.shape
        tokens = self.embed(x.to(dt)).flatten(2).transpose(1, 2)  # [B, H·W, D]
        e = mlp2(self.t_embedder, timestep_embedding(timesteps.float(), 256).to(dt))
        if self.guidance is not None:
            e = e + mlp2(self.guidance, timestep_embedding(guidance.float(), 256).to(dt))
        mods = self.t_block(F.silu(e)).reshape(b, 6, -1)
        ctx = self.caption[1](F.gelu(self.caption[0](context.to(dt)), approximate="tanh"))
        ctx = rms_norm_with(self.caption_norm, ctx, CAPTION_EPS)
        keys = None
        if context_mask is not None and not bool(context_mask.all()):
            keys = context_mask.bool()[:, None, None, :]
        for blk in self.blocks:
            table = held(blk.table, "scale_shift_table", tokens.device).to(tokens.device, dt)
            shift, scale, gate, shift2, scale2, gate2 = (table[None] + mods).chunk(6, dim=1)
            tokens = tokens + gate * self._linear_attn(blk.attn, layer_norm(tokens) * (1 + scale) + shift)
            tokens = tokens + self._cross(blk.cross, tokens, ctx, keys)
            y = (layer_norm(tokens) * (1 + scale2) + shift2).unflatten(1, (h, w)).permute(0, 3, 1, 2)
            tokens = tokens + gate2 * _mix_ffn(blk.ffn, y).flatten(2).transpose(1, 2)
        table = held(self.final_table, "scale_shift_table", tokens.device).to(tokens.device, dt)
        shift, scale = (table[None] + e[:, None]).chunk(2, dim=1)
        out = self.final_linear(layer_norm(tokens) * (1 + scale) + shift)
        return out.transpose(1, 2).reshape(b, -1, h, w)

    @staticmethod
    def _qk(a: Attn, x, src):
        if src is None:
            q, k, v = a.qkv(x)
        elif len(a.qkv.parts) == 2:  # q_linear, and the fused kv_linear
            q, (k, v) = a.qkv.parts[0](x), a.qkv.parts[1](src).chunk(2, dim=-1)
        else:
            q, k, v = a.qkv.parts[0](x), a.qkv.parts[1](src), a.qkv.parts[2](src)
        if a.q_norm is not None:
            q, k = rms_norm_with(a.q_norm, q, QK_EPS), rms_norm_with(a.k_norm, k, QK_EPS)
        return q, k, v

    def _linear_attn(self, a: Attn, x):
        q, k, v = self._qk(a, x, None)
        heads = q.shape[-1] // HEAD
        q, k, v = (
            F.relu(t) if i < 2 else t for i, t in enumerate(split_heads(p, heads).float() for p in (q, k, v))
        )
        kv = torch.einsum(
            "bhnd,bhne->bhde", k, torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        )  # [B, H, d, d+1]
        out = torch.einsum("bhnd,bhde->bhne", q, kv)
        out = out[..., :-1] / (out[..., -1:] + 1e-15)
        return a.o(merge_heads(out).to(x.dtype))

    def _cross(self, a: Attn, x, ctx, keys):
        q, k, v = self._qk(a, x, ctx)
        q, k, v = (split_heads(t, self.cross_heads) for t in (q, k, v))
        return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=keys)))

    def op_order(self) -> list:
        order = [
            self.embed,
            *self.t_embedder,
            *(self.guidance or ()),
            self.t_block,
            *self.caption,
            self.caption_norm,
        ]
        for blk in self.blocks:
            order += [*blk.attn.ops(), *blk.cross.ops(), *blk.ffn]
        return [*order, self.final_linear]


def _mix_ffn(ffn, y):
    inverted, depth, point = ffn
    a, g = depth(F.silu(inverted(y))).chunk(2, dim=1)
    return point(a * F.silu(g))


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's (the inverse of diffusers' convert_sana_transformer_to_diffusers; diffusers' split
# q / k / v and k / v are row blocks of the release's fused qkv and kv_linear, bound as such)
_TOP = (("patch_embed.proj", "x_embedder.proj"), ("time_embed.emb.timestep_embedder.linear_1", "t_embedder.mlp.0"),
        ("time_embed.emb.timestep_embedder.linear_2", "t_embedder.mlp.2"), ("time_embed.linear", "t_block.1"),
        ("time_embed.timestep_embedder.linear_1", "t_embedder.mlp.0"), ("time_embed.timestep_embedder.linear_2", "t_embedder.mlp.2"),
        ("time_embed.guidance_embedder.linear_1", "cfg_embedder.mlp.0"), ("time_embed.guidance_embedder.linear_2", "cfg_embedder.mlp.2"),
        ("caption_projection.linear_1", "y_embedder.y_proj.fc1"), ("caption_projection.linear_2", "y_embedder.y_proj.fc2"),
        ("caption_norm", "attention_y_norm"), ("proj_out", "final_layer.linear"))  # fmt: skip
_BLOCK = (("attn1.to_q", "attn.to_q"), ("attn1.to_k", "attn.to_k"), ("attn1.to_v", "attn.to_v"),
          ("attn2.to_k", "cross_attn.to_k"), ("attn2.to_v", "cross_attn.to_v"), ("attn1.to_out.0", "attn.proj"), ("attn1.norm_q", "attn.q_norm"), ("attn1.norm_k", "attn.k_norm"),
          ("attn2.to_q", "cross_attn.q_linear"), ("attn2.to_out.0", "cross_attn.proj"),
          ("attn2.norm_q", "cross_attn.q_norm"), ("attn2.norm_k", "cross_attn.k_norm"),
          ("ff.conv_inverted", "mlp.inverted_conv.conv"), ("ff.conv_depth", "mlp.depth_conv.conv"),
          ("ff.conv_point", "mlp.point_conv.conv"))  # fmt: skip
# buffers the release keeps that no forward reads (the converter drops them)
_UNREAD = ("pos_embed", "y_embedder")


def release_path(p: str, top, block) -> str:
    """A diffusers path in the release's names (Sana's and PixArt's: `top` whole paths, `block` paths below
    `transformer_blocks.N`, which become `blocks.N`)."""
    for a, b in top:
        if p == a:
            return b
    if p.startswith("transformer_blocks."):
        _, n, *rest = p.split(".", 2)
        return f"blocks.{n}" + ("." + dict(block).get(rest[0], rest[0]) if rest else "")
    return p


def release_ops(
    ops: Ops, mods: dict, top, block, unread, marks=("patch_embed.proj", "pos_embed.proj")
) -> tuple[bool, Ops, dict, object]:
    """(whether the file is diffusers-named — it holds a module of `marks` —, its ops and modules by the
    release's paths, the patch embedding): a diffusers file renamed, the buffers no forward reads (`unread`)
    taken, the embedding's stride set from its kernel (the file holds the kernel; the stride is the
    architecture's)."""
    diffusers = any(m in mods for m in marks)
    if diffusers:
        mods = {release_path(p, top, block): m for p, m in mods.items()}
        ops = ops.renamed(mods)
    for p, m in mods.items():
        if p in unread or (p == "" and {*m._parameters, *m._buffers} <= set(unread)):
            ops.take(m)
    embed = ops["x_embedder.proj"]
    embed.stride = tuple(wshape(embed)[2:])
    return diffusers, ops, mods, embed


def bind_table(ops: Ops, mods: dict, path: str, rows: int, dim: int, family: str):
    """The plain holder of `path`'s scale_shift_table [rows, dim], taken; UnsupportedModel without one."""
    m = mods.get(path)
    if (
        m is None
        or getattr(m, "scale_shift_table", None) is None
        or held_shape(m, "scale_shift_table") != (rows, dim)
    ):
        raise UnsupportedModel(
            f"{ops.what}: no {path or 'root'} scale_shift_table [{rows}, {dim}] — not {family}'s"
        )
    ops.take(m)
    return m


def bind_attn(ops: Ops, p: str, cross: bool, dim: int) -> Attn:
    """A self- (`attn`: fused qkv, or diffusers' q / k / v) or cross-attention (`cross_attn`: q_linear and
    the fused kv_linear, or diffusers' k / v) at `p`, with its QK norms where the file has them."""
    if cross and f"{p}.kv_linear" in ops:
        qkv = Proj(None, parts=(ops[f"{p}.q_linear"], ops[f"{p}.kv_linear"]))
    elif cross:  # diffusers' split k / v
        qkv = Proj(None, parts=(ops[f"{p}.q_linear"], ops[f"{p}.to_k"], ops[f"{p}.to_v"]))
    elif f"{p}.qkv" in ops:
        qkv = Proj(ops[f"{p}.qkv"], (dim, dim, dim))
    else:  # diffusers' split q / k / v
        qkv = Proj(None, parts=tuple(ops[f"{p}.to_{n}"] for n in "qkv"))
    return Attn(qkv, ops[f"{p}.proj"], ops.get(f"{p}.q_norm"), ops.get(f"{p}.k_norm"))


def bind_sana(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Sana]:
    """(naming, the forward) of a Sana transformer in the release's or diffusers' naming."""
    diffusers, ops, mods, embed = release_ops(ops, mods, _TOP, _BLOCK, _UNREAD)
    dim = wshape(embed)[0]
    if dim % HEAD or dim not in CROSS_HEADS:
        raise UnsupportedModel(
            f"{ops.what}: width {dim}: no released Sana has it (600M: 1152, 1600M and 4.8B: 2240), so its "
            "cross-attention heads are unknown"
        )

    def table(path: str, rows: int):
        return bind_table(ops, mods, path, rows, dim, "Sana")

    def attn(p: str, cross: bool) -> Attn:
        return bind_attn(ops, p, cross, dim)

    blocks = []
    for i in ops.children("blocks"):
        p = f"blocks.{i}"
        blocks.append(Block(table(p, 6), attn(f"{p}.attn", False), attn(f"{p}.cross_attn", True),
                            tuple(ops[f"{p}.mlp.{n}_conv.conv"] for n in ("inverted", "depth", "point"))))  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a Sana transformer")
    for blk in blocks:
        blk.ffn[1].padding = (1, 1)  # the depthwise 3x3 keeps the grid
        blk.ffn[1].groups = wshape(blk.ffn[1])[0]
    final = "final_layer" if "final_layer" in mods else ""
    model = Sana(
        architecture, embed, (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]), ops["t_block.1"],
        (ops["y_embedder.y_proj.fc1"], ops["y_embedder.y_proj.fc2"]), ops["attention_y_norm"], blocks,
        table(final, 2), ops["final_layer.linear"], CROSS_HEADS[dim], dtype,
        (ops["cfg_embedder.mlp.0"], ops["cfg_embedder.mlp.2"]) if "cfg_embedder.mlp.0" in ops else None,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
