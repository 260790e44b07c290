"""AuraFlow's transformer (fal's AuraFlow v0.1–0.3, the base of Pony V7), run on the component's own
castable ops, in the file's own naming: the release's (`double_layers`, `single_layers`, ComfyUI's and the
GGUFs' files) or diffusers' (`joint_transformer_blocks`, `single_transformer_blocks`).

Architecture facts, from diffusers' `AuraFlowTransformer2DModel` and its single-file converter
`convert_auraflow_transformer_checkpoint_to_diffusers` (written from that description, nothing copied):

* x [B, 4, H, W] → 2×2 patches flattened channel first (c, row, column) → `init_x_linear` (diffusers
  `pos_embed.proj`), plus the learned `positional_encoding` [1, M², D] cropped to the centre of its M×M grid:
  rows from M // 2 − h // 2, columns from M // 2 − w // 2.
* t [B] in 0–1 (the pipeline's t / 1000): its 256-wide sinusoidal embedding (cosines first) of 1000·t →
  `t_embedder.mlp` (Linear, SiLU, Linear; diffusers `time_step_proj`) → c.
* context [B, T, 2048] (Pile-T5-XL states) → `cond_seq_linear` (no bias), after 8 learned `register_tokens`.
* Every Linear in the blocks is bias-free; every LayerNorm is affine-free, eps 1e-5, computed in float32;
  heads are 256 wide (the release: width 3072, 12 heads); q and k are LayerNormed per head.
* double block (`modX`, `modC`: Linear(SiLU(c)) → shift, scale, gate, shift₂, scale₂, gate₂ per stream): one
  attention over [context, x] of the modulated LN(x) and LN(context) (x's q/k/v/o `w2*`, context's `w1*`);
  then per stream, with r the block's input: r + gate₂·mlp(LN(r + gate·o(attn))·(1 + scale₂) + shift₂) —
  the attention reaches the output only through the second norm's input (the release's DiT block does
  so too). mlp: c_proj(SiLU(c_fc1(x)) · c_fc2(x)).
* single block (`modCX`, `w1*`, `mlp`): the same on [context, x] as one sequence.
* final: (shift, scale) = modF.1(SiLU(c)) (diffusers `norm_out.linear` holds them as scale, shift);
  final_linear(x·(1 + scale) + shift), no norm; then the patches back into [B, 4, H, W].
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import (
    Ops,
    check_grid,
    held,
    held_shape,
    merge_heads,
    mlp2,
    split_heads,
    timestep_embedding,
    wshape,
)

HEAD_DIM = 256
PATCH = 2
EPS = 1e-5  # torch's LayerNorm default, which every AuraFlow norm keeps


@dataclass
class Stream:
    """One stream of a block: its modulation, q, k, v and output projections, and its MLP."""

    mod: object
    q: object
    k: object
    v: object
    o: object
    mlp: tuple[object, object, object]  # c_fc1, c_fc2, c_proj

    def ops_before(self) -> list:
        return [self.q, self.k, self.v]

    def ops_after(self) -> list:
        return [self.o, *self.mlp]


@dataclass
class Block:
    x: Stream
    ctx: Stream | None  # None: a single block (one stream over [context, x])


@dataclass
class AuraFlow:
    """A bound AuraFlow transformer: call it with x, t, context."""

    architecture: str
    x_embedder: object
    t_embedder: tuple[object, object]
    context_embedder: object
    tables: tuple[object, str, object]  # (holder, attribute) of the positions, holder of register_tokens
    blocks: list[Block]
    final_mod: object
    final_swapped: bool
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "auraflow"

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1] // (PATCH * PATCH)

    @property
    def context_dim(self) -> int:
        return wshape(self.context_embedder)[1]

    @property
    def max_grid(self) -> int:
        holder, attr, _ = self.tables
        return math.isqrt(held_shape(holder, attr)[-2])  # [1, M², D], or [M², D] as ggml stores it

    def _pos(self, h: int, w: int, device) -> torch.Tensor:
        m, (holder, attr, _) = self.max_grid, self.tables
        check_grid(h, w, m)
        top, left = m // 2 - h // 2, m // 2 - w // 2
        pe = held(holder, attr, device).reshape(m, m, -1)[top : top + h, left : left + w]
        return pe.reshape(1, h * w, -1).to(device=device, dtype=self.dtype)

    def __call__(self, x, t, context) -> torch.Tensor:
        dt, (b, c, height, width) = self.dtype, x.shape
        gh, gw = height // PATCH, width // PATCH
        patches = x.to(dt).reshape(b, c, gh, PATCH, gw, PATCH).permute(0, 2, 4, 1, 3, 5)
        h = self.x_embedder(patches.reshape(b, gh * gw, c * PATCH * PATCH))
        h = h + self._pos(gh, gw, h.device)
        cs = F.silu(mlp2(self.t_embedder, timestep_embedding(t.float() * 1000, 256).to(dt)))
        ctx = self.context_embedder(context.to(dt))
        reg = held(self.tables[2], "register_tokens", ctx.device).to(ctx.device, dt)
        ctx = torch.cat([reg.reshape(1, -1, ctx.shape[-1]).expand(b, -1, -1), ctx], 1)
        n = ctx.shape[1]
        seq = None
        for blk in self.blocks:
            if blk.ctx is not None:
                h, ctx = self._double(blk, h, ctx, cs)
                continue
            if seq is None:
                seq = torch.cat([ctx, h], 1)
            seq = self._single(blk.x, seq, cs)
        if seq is not None:
            h = seq[:, n:]
        shift, scale = self.final_mod(cs)[:, None].chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        out = self.final_linear(h * (1 + scale) + shift)
        co = out.shape[-1] // (PATCH * PATCH)
        out = out.reshape(b, gh, gw, PATCH, PATCH, co).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(b, co, height, width)

    def _qkv(self, s: Stream, x):
        q, k, v = (split_heads(p(x), self.heads) for p in (s.q, s.k, s.v))
        return _ln(q), _ln(k), v

    def _double(self, blk: Block, x, ctx, cs):
        xm = blk.x.mod(cs)[:, None].chunk(6, dim=-1)
        cm = blk.ctx.mod(cs)[:, None].chunk(6, dim=-1)
        xq, xk, xv = self._qkv(blk.x, _ln(x) * (1 + xm[1]) + xm[0])
        cq, ck, cv = self._qkv(blk.ctx, _ln(ctx) * (1 + cm[1]) + cm[0])
        n = ctx.shape[1]
        a = merge_heads(F.scaled_dot_product_attention(torch.cat([cq, xq], 2), torch.cat([ck, xk], 2),
                                                       torch.cat([cv, xv], 2)))  # fmt: skip
        x = _after(blk.x, x, blk.x.o(a[:, n:]), xm)
        ctx = _after(blk.ctx, ctx, blk.ctx.o(a[:, :n]), cm)
        return x, ctx

    def _single(self, s: Stream, seq, cs):
        m = s.mod(cs)[:, None].chunk(6, dim=-1)
        q, k, v = self._qkv(s, _ln(seq) * (1 + m[1]) + m[0])
        return _after(s, seq, s.o(merge_heads(F.scaled_dot_product_attention(q, k, v))), m)

    def op_order(self) -> list:
        order = [self.x_embedder, *self.t_embedder, self.context_embedder]
        for blk in self.blocks:
            if blk.ctx is None:
                order += [blk.x.mod, *blk.x.ops_before(), *blk.x.ops_after()]
                continue
            x, c = blk.x, blk.ctx
            order += [x.mod, c.mod, *x.ops_before(), *c.ops_before(), x.o, *x.mlp, c.o, *c.mlp]
        return [*order, self.final_mod, self.final_linear]


def _ln(x: torch.Tensor) -> torch.Tensor:
    """Affine-free LayerNorm over the last axis, in float32 (AuraFlow's FP32 norms), back in x's dtype."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=EPS).to(x.dtype)


def _after(s: Stream, r, attn, m):
    """r + gate₂·mlp(LN(r + gate·attn)·(1 + scale₂) + shift₂): the block's output for a stream."""
    y = _ln(r + m[2] * attn) * (1 + m[4]) + m[3]
    del attn
    fc1, fc2, proj = s.mlp
    return r + m[5] * proj(F.silu(fc1(y)) * fc2(y))


# -- binding the file's ops -----------------------------------------------------------------------------

# stream -> (modulation, q, k, v, o, MLP) under a block, in the release's names (a diffusers-named file is
# renamed onto them: engine.lora.family_names.AURAFLOW)
_STREAMS = {
    "x": ("modX.1", "attn.w2q", "attn.w2k", "attn.w2v", "attn.w2o", "mlpX"),
    "ctx": ("modC.1", "attn.w1q", "attn.w1k", "attn.w1v", "attn.w1o", "mlpC"),
    "single": ("modCX.1", "attn.w1q", "attn.w1k", "attn.w1v", "attn.w1o", "mlp"),
}


def bind_auraflow(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, AuraFlow]:
    """(naming, the forward) of an AuraFlow transformer in the release's or diffusers' naming; `mods`: the
    component's modules by path (the plain holders of the position table and the register tokens)."""
    diffusers = "init_x_linear" not in mods
    root = mods.get("")
    pos_holder, pos_attr = (
        (mods.get("pos_embed"), "pos_embed") if diffusers else (root, "positional_encoding")
    )
    for holder, attr in ((pos_holder, pos_attr), (root, "register_tokens")):
        if holder is None or getattr(holder, attr, None) is None:
            raise UnsupportedModel(f"{ops.what}: no {attr} — not an AuraFlow transformer Loadout can run")
        ops.take(holder)
    if diffusers:
        from ..lora.family_names import AURAFLOW, to_original

        rename = to_original(mods, AURAFLOW)
        ops = ops.renamed(
            {rename[p]: m for p, m in mods.items() if p in rename} | {"modF.1": ops["norm_out.linear"]}
        )
    embed = ops["init_x_linear"]
    dim = wshape(embed)[0]
    if dim % HEAD_DIM or wshape(embed)[1] % (PATCH * PATCH):
        raise UnsupportedModel(
            f"{ops.what}: width {dim} in {HEAD_DIM}-wide heads over {PATCH}×{PATCH} patches: not AuraFlow's"
        )

    def stream(prefix: str, kind: str) -> Stream:
        mod, q, k, v, o, mlp = (f"{prefix}.{p}" for p in _STREAMS[kind])
        return Stream(ops[mod], ops[q], ops[k], ops[v], ops[o],
                      tuple(ops[f"{mlp}.{p}"] for p in ("c_fc1", "c_fc2", "c_proj")))  # fmt: skip

    blocks = [Block(stream(f"double_layers.{i}", "x"), stream(f"double_layers.{i}", "ctx"))
              for i in ops.children("double_layers")]  # fmt: skip
    blocks += [Block(stream(f"single_layers.{i}", "single"), None) for i in ops.children("single_layers")]
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no double or single layers — not an AuraFlow transformer")
    model = AuraFlow(
        architecture, embed, (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]), ops["cond_seq_linear"],
        (pos_holder, pos_attr, root), blocks, ops["modF.1"], diffusers, ops["final_linear"], dim // HEAD_DIM, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
