"""Krea 2's transformer (a single-stream flow-matching DiT over tapped Qwen3-VL text layers), run on the component's
own castable ops, in the file's own naming: the release's (`first`, `blocks.N.attn.wq`, `mod.lin`, `txtfusion`) or
diffusers' (`img_in`, `transformer_blocks.N.attn.to_q`, `scale_shift_table`, `text_fusion`, renamed onto them).

Architecture facts, from diffusers' `Krea2Transformer2DModel`, its pipeline and its single-file converter
`convert_krea2_transformer_checkpoint_to_diffusers` (written from that description, nothing copied):

* x [B, 16, h, w] latents in 2×2 patches flattened (c, row, column) → `first` (width 6144); out: `last.linear` back
  to the patches.
* t in 0–1: the 256-wide sinusoidal embedding (cosines first) of 1000·t → `tmlp` (Linear, tanh-GELU, Linear) = e;
  `tproj.1`(tanh-GELU(e)) = six modulations shared by every block.
* Text: context [B, T, L, 2560], L (12) tapped layers of Qwen3-VL per token → `txtfusion`: 2 blocks attending across
  the L layers of each token, `projector` (Linear L → 1) collapsing them, 2 blocks across the tokens (the prompt's
  only); then `txtmlp` (RMSNorm, Linear, tanh-GELU, Linear) to the width.
* One sequence [text, image]; RoPE on interleaved pairs over (t, h, w) axes of widths (32, 48, 48), theta 1000: text
  tokens at the origin, image tokens at (0, row, column).
* Block: (scale, shift, gate, scale₂, shift₂, gate₂) = the six modulations + its `mod.lin` table; x += gate ·
  attn((1 + scale)·RMS(x) + shift); x += gate₂ · SwiGLU((1 + scale₂)·RMS(x) + shift₂). Attention: 128-wide heads,
  grouped K/V (48 query heads on 12), per-head RMS q/k norms, RoPE, the output gated by sigmoid(`gate`(x)) before
  `wo`; every Linear of the blocks bias-free. The text-fusion blocks are the same without modulation or RoPE.
* Every RMSNorm stores its scale around 0 (the weight is 1 + scale), computed in float32, eps 1e-5.
* Final: (scale, shift) = e + `last.modulation.lin` [2, D]; `last.linear`((1 + scale)·RMS(x) + shift).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops as castable
from ..errors import UnsupportedModel
from .common import Ops, held, merge_heads, rope, split_heads, timestep_embedding, wshape
from .flux import rope_table

AXES = (32, 48, 48)
THETA = 1000.0
EPS = 1e-5
TIME_FACTOR = 1000.0


@dataclass
class Attn:
    q: object
    k: object
    v: object
    gate: object
    o: object
    q_norm: object
    k_norm: object

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.gate, self.q_norm, self.k_norm, self.o]


@dataclass
class Block:
    table: object | None  # the plain holder of the block's six modulation rows (none in the text fusion)
    norm1: object
    norm2: object
    attn: Attn
    ff: tuple[object, object, object]  # gate, up, down

    def ops(self) -> list:
        return [self.norm1, *self.attn.ops(), self.norm2, *self.ff]


@dataclass
class Krea2:
    """A bound Krea 2 transformer: call it with x, timesteps, context [, context_mask]."""

    architecture: str
    img_in: object
    time_mlp: tuple[object, object]
    time_proj: object
    layerwise: list[Block]
    projector: object
    refiners: list[Block]
    txt_norm: object
    txt_mlp: tuple[object, object]
    blocks: list[Block]
    final_table: object
    final_norm: object
    final_linear: object
    dtype: torch.dtype = torch.float32
    family = "krea2"

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1] // 4

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_mlp[0])[1]

    @property
    def text_layers(self) -> int:
        return wshape(self.projector)[1]

    def __call__(self, x, timesteps, context, context_mask=None) -> torch.Tensor:
        dt = self.dtype
        b, c, h, w = x.shape
        img = self.img_in(
            x.to(dt).reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, 4 * c)
        )
        emb = timestep_embedding(TIME_FACTOR * timesteps.float(), wshape(self.time_mlp[0])[1]).to(dt)
        e = self.time_mlp[1](F.gelu(self.time_mlp[0](emb), approximate="tanh"))[:, None]  # [B, 1, D]
        mods = self.time_proj(F.gelu(e, approximate="tanh")).unflatten(-1, (6, -1))  # [B, 1, 6, D]
        mask = None if context_mask is None or bool(context_mask.all()) else context_mask.bool()
        txt = self._text(context.to(dt), mask)
        n_txt = txt.shape[1]
        seq = torch.cat([txt, img], dim=1)
        del txt, img
        ids = torch.zeros(n_txt + (h // 2) * (w // 2), 3, device=x.device)
        ids[n_txt:, 1] = torch.arange(h // 2, device=x.device).repeat_interleave(w // 2).float()
        ids[n_txt:, 2] = torch.arange(w // 2, device=x.device).repeat(h // 2).float()
        pe = rope_table(ids[None], AXES, THETA)
        keys = None
        if mask is not None:
            keys = torch.cat([mask, mask.new_ones(b, seq.shape[1] - n_txt)], dim=1)[:, None, None, :]
        for blk in self.blocks:
            table = held(blk.table, _table_attr(blk.table), seq.device).to(seq.device, dt).reshape(6, -1)
            scale, shift, gate, scale2, shift2, gate2 = (mods + table).unbind(-2)
            seq = seq + gate * self._attn(blk.attn, (1 + scale) * _norm(blk.norm1, seq) + shift, pe, keys)
            seq = seq + gate2 * _swiglu(blk.ff, (1 + scale2) * _norm(blk.norm2, seq) + shift2)
        img = seq[:, n_txt:]
        table = (
            held(self.final_table, _table_attr(self.final_table), img.device)
            .to(img.device, dt)
            .reshape(2, -1)
        )
        scale, shift = (e + table).chunk(2, dim=1)
        out = self.final_linear((1 + scale) * _norm(self.final_norm, img) + shift)
        return out.reshape(b, h // 2, w // 2, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, h, w)

    def _text(self, context, mask):
        b, t, layers, d = context.shape
        y = context.reshape(b * t, layers, d)
        for blk in self.layerwise:
            y = _plain_block(self, blk, y, None)
        y = self.projector(y.reshape(b, t, layers, d).transpose(2, 3)).squeeze(-1)
        keys = None if mask is None else mask[:, None, None, :]
        for blk in self.refiners:
            y = _plain_block(self, blk, y, keys)
        y = _norm(self.txt_norm, y)
        return self.txt_mlp[1](F.gelu(self.txt_mlp[0](y), approximate="tanh"))

    @staticmethod
    def _attn(a: Attn, x, pe, keys):
        head = wshape(a.q_norm)[0]
        q, k, v, gate = a.q(x), a.k(x), a.v(x), a.gate(x)
        q, k, v = (split_heads(p, p.shape[-1] // head) for p in (q, k, v))
        q, k = _norm(a.q_norm, q), _norm(a.k_norm, k)
        if pe is not None:
            q, k = rope(q, pe), rope(k, pe)
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        o = merge_heads(F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v, attn_mask=keys))
        return a.o(o * torch.sigmoid(gate))

    def op_order(self) -> list:
        order = [self.img_in, *self.time_mlp, self.time_proj]
        for blk in self.layerwise:
            order += blk.ops()
        order.append(self.projector)
        for blk in self.refiners:
            order += blk.ops()
        order += [n for n in (self.txt_norm,) if _is_op(n)] + list(self.txt_mlp)
        for blk in self.blocks:
            order += blk.ops()
        return [*order, *(n for n in (self.final_norm,) if _is_op(n)), self.final_linear]


def _plain_block(model: Krea2, blk: Block, y, keys):
    y = y + model._attn(blk.attn, _norm(blk.norm1, y), None, keys)
    return y + _swiglu(blk.ff, _norm(blk.norm2, y))


def _swiglu(ff, x):
    gate, up, down = ff
    return down(F.silu(gate(x)) * up(x))


def _is_op(m) -> bool:
    return isinstance(m, castable.Castable)


def _table_attr(m) -> str:
    return "lin" if getattr(m, "lin", None) is not None else "scale_shift_table"


def _norm(m, x: torch.Tensor) -> torch.Tensor:
    """Krea 2's RMSNorm: weight 1 + its stored scale, in float32 (eps 1e-5). `m` an op (cast, patched and streamed
    as its own forward would), or a plain holder of `scale` (the release's `txtmlp.0`, which no name marks a norm)."""
    if _is_op(m):
        w = m.cast_params(x)[0]
    else:
        w = held(m, "scale" if getattr(m, "scale", None) is not None else "weight", x.device).to(x.device)
    return F.rms_norm(x.float(), (x.shape[-1],), w.float() + 1.0, EPS).to(x.dtype)


# -- binding the file's ops -----------------------------------------------------------------------------

_BLOCK_HOLDER = re.compile(r"transformer_blocks\.\d+")


def bind_krea2(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Krea2]:
    """(naming, the forward) of a Krea 2 transformer in the release's or diffusers' naming; `mods`: the component's
    modules by path (the plain holders of the modulation tables and, in the release, of `txtmlp.0`'s scale)."""
    diffusers = "img_in" in mods
    if diffusers:  # renamed through the LoRA table (engine.lora.family_names.KREA2), one to one
        from ..lora.family_names import KREA2, to_original

        rename = to_original(mods, KREA2)
        # the modulation tables are parameters of the blocks themselves in diffusers' tree
        rename |= {p: "blocks" + p[len("transformer_blocks") :] for p in mods if _BLOCK_HOLDER.fullmatch(p)}
        mods = {rename.get(p, p): m for p, m in mods.items()}
        ops = ops.renamed(mods)

    def plain(path: str, holder: str | None = None):
        m = mods.get(path) if holder is None else mods.get(holder)
        if m is None:
            raise UnsupportedModel(f"{ops.what}: no {path} — not a Krea 2 transformer Loadout can run")
        ops.take(m)
        return m

    def table(block: str):
        """The block's modulation rows: the release's `mod.lin`, diffusers' own `scale_shift_table`."""
        return plain(f"{block}.mod") if f"{block}.mod" in mods else plain(block)

    def attn(p: str) -> Attn:
        names = ("wq", "wk", "wv", "gate", "wo", "qknorm.qnorm", "qknorm.knorm")
        return Attn(*(ops[f"{p}.{n}"] for n in names))

    def block(p: str, modulated: bool) -> Block:
        return Block(table(p) if modulated else None, ops[f"{p}.prenorm"], ops[f"{p}.postnorm"], attn(f"{p}.attn"),
                     tuple(ops[f"{p}.mlp.{n}"] for n in ("gate", "up", "down")))  # fmt: skip

    f = "txtfusion"
    blocks = [block(f"blocks.{i}", True) for i in ops.children("blocks")]
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a Krea 2 transformer")
    head = wshape(blocks[0].attn.q_norm)[0]
    if head != sum(AXES):
        raise UnsupportedModel(f"{ops.what}: {head}-wide heads: Krea 2's are {sum(AXES)} (RoPE axes {AXES})")
    txt_norm = ops.get("txtmlp.0") or plain("txtmlp.0")
    final_table = plain("last.modulation") if "last.modulation" in mods else plain("final_layer")
    model = Krea2(
        architecture, ops["first"], (ops["tmlp.0"], ops["tmlp.2"]), ops["tproj.1"],
        [block(f"{f}.layerwise_blocks.{i}", False) for i in ops.children(f"{f}.layerwise_blocks")],
        ops[f"{f}.projector"], [block(f"{f}.refiner_blocks.{i}", False) for i in ops.children(f"{f}.refiner_blocks")],
        txt_norm, (ops["txtmlp.1"], ops["txtmlp.3"]), blocks, final_table, ops["last.norm"], ops["last.linear"], dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
