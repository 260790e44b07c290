"""The MMDiT forward pass of Stable Diffusion 3 / 3.5 (Medium, Large; MMDiT-X for 3.5 Medium), run on the
component's own castable ops, in the file's own naming: Stability's (`joint_blocks`, fused `qkv`) or
diffusers' (`transformer_blocks`, separate q / k / v, which are the row blocks of the fused one).

Architecture facts, from Stability-AI/sd3.5 `mmditx.py` and diffusers' `SD3Transformer2DModel` with
`convert_sd3_transformer_checkpoint_to_diffusers` (written from that description, nothing copied):

* x [B, 16, H, W] → `x_embedder.proj`, a Conv2d with kernel = stride = patch (2) → tokens, plus the
  learned `pos_embed` [1, M², D] cropped to the centre: rows from (M − h) // 2, columns from (M − w) // 2.
* c = t_embedder(emb(t)) + y_embedder(y): each Linear, SiLU, Linear; emb the 256-wide sinusoidal
  embedding (cosines first) of t in 0–1000; y [B, 2048] the pooled CLIP-L + CLIP-G vector.
* context [B, L, 4096] → `context_embedder`. Heads of 64 (D / 64 of them).
* joint block, per stream: adaLN_modulation.1(SiLU(c)) → (shift, scale, gate, shift₂, scale₂, gate₂);
  LayerNorm without affine (eps 1e-6), x·(1 + scale) + shift, qkv, optional per-head RMSNorm of q and k
  (`ln_q`, `ln_k`: SD3.5, eps 1e-6), one attention over [context, x], then x += gate·proj(attn) and
  x += gate₂·fc2(GELU_tanh(fc1(LN(x)·(1 + scale₂) + shift₂))). The last block's context stream is
  "pre-only": a (shift, scale) modulation, q/k/v, nothing after the attention.
* MMDiT-X (SD3.5 Medium's first blocks): the image modulation has 9 parts, the last three (shift₃,
  scale₃, gate₃) for `attn2`, a self-attention of the image tokens on LN(x)·(1 + scale₃) + shift₃ (the
  same normalised x), added after the joint attention's output: x += gate₃·attn2.proj(…).
* final layer: (shift, scale) = adaLN_modulation.1(SiLU(c)); linear(LN(x)·(1 + scale) + shift); then the
  patches back into [B, C, H, W] (h, w, p, q, c → c, h·p, w·q). diffusers stores the final layer's and the
  pre-only context modulation's two halves the other way round (scale, shift).
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
    layer_norm,
    merge_heads,
    mlp2,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import Proj

HEAD_DIM = 64


@dataclass
class Attn:
    qkv: Proj
    ln_q: object | None
    ln_k: object | None
    proj: object | None  # None: the pre-only context stream

    def ops_before(self) -> list:
        return [*self.qkv.ops(), *(n for n in (self.ln_q, self.ln_k) if n is not None)]


@dataclass
class Stream:
    mod: object
    attn: Attn
    fc1: object | None
    fc2: object | None
    attn2: Attn | None = None  # MMDiT-X's extra self-attention (image stream)
    swapped: bool = False  # a pre-only modulation stored (scale, shift): diffusers

    @property
    def pre_only(self) -> bool:
        return self.attn.proj is None


@dataclass
class Joint:
    x: Stream
    ctx: Stream

    def ops(self) -> list:
        x, c = self.x, self.ctx
        order = [x.mod, c.mod, *x.attn.ops_before(), *c.attn.ops_before()]
        if x.attn2 is not None:
            order += x.attn2.ops_before()
        order += [x.attn.proj]
        if x.attn2 is not None:
            order += [x.attn2.proj]
        order += [x.fc1, x.fc2]
        if not c.pre_only:
            order += [c.attn.proj, c.fc1, c.fc2]
        return order


@dataclass
class MMDiT:
    """A bound SD3 / SD3.5 transformer: call it with the original forward's x, t, y, context."""

    architecture: str
    x_embedder: object
    pos_module: object  # the plain module holding `pos_embed` [1, M², D] (read when called: its tier moves)
    t_embedder: tuple[object, object]
    y_embedder: tuple[object, object]
    context_embedder: object
    blocks: list[Joint]
    final_mod: object
    final_swapped: bool
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "mmdit"

    @property
    def patch(self) -> int:
        return wshape(self.x_embedder)[2]

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1]

    @property
    def out_channels(self) -> int:
        return wshape(self.final_linear)[0] // self.patch**2

    @property
    def context_dim(self) -> int:
        return wshape(self.context_embedder)[1]

    @property
    def pooled_dim(self) -> int:
        return wshape(self.y_embedder[0])[1]

    @property
    def max_grid(self) -> int:
        # [1, M², D]; [M², D] in a GGUF whose writer dropped the leading 1 (ggml's n_dims)
        return math.isqrt(held_shape(self.pos_module, "pos_embed")[-2])

    def _pos(self, h: int, w: int, device) -> torch.Tensor:
        m = self.max_grid
        check_grid(h, w, m)
        top, left = (m - h) // 2, (m - w) // 2
        pe = held(self.pos_module, "pos_embed", device).reshape(1, m, m, -1)[
            :, top : top + h, left : left + w
        ]
        return pe.reshape(1, h * w, -1).to(device=device, dtype=self.dtype)

    def __call__(self, x, t, y, context) -> torch.Tensor:
        dt = self.dtype
        b, _, height, width = x.shape
        p = self.patch
        h = self.x_embedder(x.to(dt))
        gh, gw = h.shape[-2:]
        h = h.flatten(2).transpose(1, 2) + self._pos(gh, gw, h.device)
        c = mlp2(self.t_embedder, timestep_embedding(t.float(), 256).to(dt)) + mlp2(self.y_embedder, y.to(dt))
        cs = F.silu(c)
        ctx = self.context_embedder(context.to(dt))
        for blk in self.blocks:
            h, ctx = self._joint(blk, h, ctx, cs)
        shift, scale = self.final_mod(cs)[:, None].chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        out = self.final_linear((1 + scale) * layer_norm(h) + shift)
        co = out.shape[-1] // (p * p)
        out = out.reshape(b, gh, gw, p, p, co).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(b, co, gh * p, gw * p)

    def _qkv(self, a: Attn, x):
        q, k, v = a.qkv(x)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        if a.ln_q is not None:
            q, k = a.ln_q(q).to(v.dtype), a.ln_k(k).to(v.dtype)
        return q, k, v

    def _joint(self, blk: Joint, x, ctx, cs):
        xs, cst = blk.x, blk.ctx
        xm = xs.mod(cs)[:, None].chunk(9 if xs.attn2 is not None else 6, dim=-1)
        cm = cst.mod(cs)[:, None].chunk(2 if cst.pre_only else 6, dim=-1)
        c_shift, c_scale = (cm[1], cm[0]) if cst.swapped else (cm[0], cm[1])
        nx = layer_norm(x)
        xq, xk, xv = self._qkv(xs.attn, (1 + xm[1]) * nx + xm[0])
        cq, ck, cv = self._qkv(cst.attn, (1 + c_scale) * layer_norm(ctx) + c_shift)
        if xs.attn2 is not None:
            q2, k2, v2 = self._qkv(xs.attn2, (1 + xm[7]) * nx + xm[6])
        del nx
        n = ctx.shape[1]
        attn = merge_heads(F.scaled_dot_product_attention(torch.cat([cq, xq], 2), torch.cat([ck, xk], 2),
                                                     torch.cat([cv, xv], 2)))  # fmt: skip
        x = x + xm[2] * xs.attn.proj(attn[:, n:])
        if xs.attn2 is not None:
            x = x + xm[8] * xs.attn2.proj(merge_heads(F.scaled_dot_product_attention(q2, k2, v2)))
        x = x + xm[5] * xs.fc2(F.gelu(xs.fc1((1 + xm[4]) * layer_norm(x) + xm[3]), approximate="tanh"))
        if cst.pre_only:
            return x, ctx
        ctx = ctx + cm[2] * cst.attn.proj(attn[:, :n])
        ctx = ctx + cm[5] * cst.fc2(
            F.gelu(cst.fc1((1 + cm[4]) * layer_norm(ctx) + cm[3]), approximate="tanh")
        )
        return x, ctx

    def op_order(self) -> list:
        order = [self.x_embedder, *self.t_embedder, *self.y_embedder, self.context_embedder]
        for blk in self.blocks:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


# -- binding the file's ops -----------------------------------------------------------------------------


def _common(ops: Ops, embed: str) -> tuple[object, int]:
    pe = ops[embed]
    k = wshape(pe)[2:]
    if len(k) != 2 or k[0] != k[1]:
        raise UnsupportedModel(f"{ops.what}: a patch embedding of {k}, not a square MMDiT patch")
    pe.stride = pe.kernel_size  # the file holds the kernel; the stride is the architecture's
    hidden = wshape(pe)[0]
    if hidden % HEAD_DIM:
        raise UnsupportedModel(
            f"{ops.what}: width {hidden} is not a multiple of MMDiT's {HEAD_DIM}-wide heads"
        )
    return pe, hidden // HEAD_DIM


def _pos_embed(module, what: str):
    if module is None or getattr(module, "pos_embed", None) is None:
        raise UnsupportedModel(f"{what}: no pos_embed — not an SD3 layout Loadout can run")
    return module


def bind_native(ops: Ops, architecture: str, dtype: torch.dtype, root) -> MMDiT:
    """Stability's naming; `root`: the component's module holding the top-level `pos_embed`."""
    pe, heads = _common(ops, "x_embedder.proj")
    hidden = heads * HEAD_DIM

    def attn(p: str, proj: bool) -> Attn:
        return Attn(Proj(ops[f"{p}.qkv"], (hidden,) * 3), ops.get(f"{p}.ln_q"), ops.get(f"{p}.ln_k"),
                    ops[f"{p}.proj"] if proj else None)  # fmt: skip

    blocks = []
    for i in ops.children("joint_blocks"):
        xb, cb = f"joint_blocks.{i}.x_block", f"joint_blocks.{i}.context_block"
        pre_only = f"{cb}.attn.proj" not in ops
        x = Stream(ops[f"{xb}.adaLN_modulation.1"], attn(f"{xb}.attn", True), ops[f"{xb}.mlp.fc1"],
                   ops[f"{xb}.mlp.fc2"], attn(f"{xb}.attn2", True) if f"{xb}.attn2.qkv" in ops else None)  # fmt: skip
        c = Stream(ops[f"{cb}.adaLN_modulation.1"], attn(f"{cb}.attn", not pre_only),
                   None if pre_only else ops[f"{cb}.mlp.fc1"], None if pre_only else ops[f"{cb}.mlp.fc2"])  # fmt: skip
        blocks.append(Joint(x, c))
    return MMDiT(
        architecture, pe, _pos_embed(root, ops.what), (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]),
        (ops["y_embedder.mlp.0"], ops["y_embedder.mlp.2"]), ops["context_embedder"], blocks,
        ops["final_layer.adaLN_modulation.1"], False, ops["final_layer.linear"], heads, dtype,
    )  # fmt: skip


def bind_diffusers(ops: Ops, architecture: str, dtype: torch.dtype) -> MMDiT:
    """diffusers' SD3Transformer2DModel naming."""
    pe, heads = _common(ops, "pos_embed.proj")

    def attn(p: str, q: str, k: str, v: str, nq: str, nk: str, out: str | None) -> Attn:
        return Attn(Proj(None, parts=(ops[f"{p}.{q}"], ops[f"{p}.{k}"], ops[f"{p}.{v}"])), ops.get(f"{p}.{nq}"),
                    ops.get(f"{p}.{nk}"), ops[f"{p}.{out}"] if out else None)  # fmt: skip

    blocks = []
    for i in ops.children("transformer_blocks"):
        t = f"transformer_blocks.{i}"
        pre_only = f"{t}.attn.to_add_out" not in ops
        a2 = (
            attn(f"{t}.attn2", "to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0")
            if f"{t}.attn2.to_q" in ops
            else None
        )
        x = Stream(ops[f"{t}.norm1.linear"], attn(f"{t}.attn", "to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0"),
                   ops[f"{t}.ff.net.0.proj"], ops[f"{t}.ff.net.2"], a2)  # fmt: skip
        c = Stream(ops[f"{t}.norm1_context.linear"],
                   attn(f"{t}.attn", "add_q_proj", "add_k_proj", "add_v_proj", "norm_added_q", "norm_added_k",
                        None if pre_only else "to_add_out"),
                   None if pre_only else ops[f"{t}.ff_context.net.0.proj"],
                   None if pre_only else ops[f"{t}.ff_context.net.2"], swapped=pre_only)  # fmt: skip
        blocks.append(Joint(x, c))
    te = "time_text_embed"
    return MMDiT(
        architecture, pe, _pos_embed(ops.get("pos_embed"), ops.what),
        (ops[f"{te}.timestep_embedder.linear_1"], ops[f"{te}.timestep_embedder.linear_2"]),
        (ops[f"{te}.text_embedder.linear_1"], ops[f"{te}.text_embedder.linear_2"]), ops["context_embedder"],
        blocks, ops["norm_out.linear"], True, ops["proj_out"], heads, dtype,
    )  # fmt: skip
