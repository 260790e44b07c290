"""Hunyuan-DiT (Tencent's bilingual 1.5B DiT-g/2: v1.0, v1.1, v1.2 and the distilled releases), run on the
component's own castable ops, in the file's own naming: the release's (`x_embedder.proj`, `t_embedder.mlp`, `mlp_t5`,
`pooler`, `extra_embedder`, `style_embedder`, `blocks.N.attn1.Wqkv`, `attn2.kv_proj`, `default_modulation.1`,
`final_layer`) or diffusers' (`pos_embed.proj`, `time_extra_emb.*`, `text_embedder`, `blocks.N.attn1.to_q`,
`norm1.linear`, `norm_out`, `proj_out`, renamed onto them).

Architecture facts, from Tencent/HunyuanDiT `hydit/modules/models.py` (HunYuanDiT, HunYuanDiTBlock, FinalLayer),
`attn_layers.py`, `embedders.py`, `poolers.py`, `posemb_layers.py` and `inference.py` (calc_rope, the style and size
arguments), diffusers' `HunyuanDiT2DModel` and its `scripts/convert_hunyuandit_to_diffusers.py` (the key mapping);
read for the facts, nothing copied:

* x [B, 4, h, w] (SD's VAE latents) → `x_embedder.proj` (2×2 patches) → tokens in (row, column) order; no position
  table: 2-D RoPE in every attention (below).
* Text: CLIP (Chinese BERT-large, 1024 wide, 77 tokens) `encoder_hidden_states` and mT5-XL (2048 wide, 256 tokens)
  `encoder_hidden_states_t5` → `mlp_t5` (Linear to 4·2048, SiLU in float32, Linear to 1024); the two concatenated
  (CLIP first), and every masked token (`text_embedding_mask`, `text_embedding_mask_t5`) replaced by its row of the
  learned `text_embedding_padding` [77 + 256, 1024]. Cross-attention takes no mask: the padding rows are its keys.
* c = `t_embedder.mlp`(emb₂₅₆(t)) + `extra_embedder`([pooled, meta, style]) (Linear to 4·D, SiLU, Linear), where
  pooled = `pooler`(T5 states) (CLIP's AttentionPool: the tokens' mean prepended, + `positional_embedding` [257,
  2048], one query over all 257 in 8 heads of q/k/v_proj, `c_proj` to 1024; no mask), and for v1.0 / v1.1 only (their
  `style_embedder`: v1.2 dropped both, diffusers' use_style_cond_and_image_meta_size) meta = emb₂₅₆ of each of the
  six `image_meta_size` numbers (the release's inference: source width and height 1024, 1024, then the target's
  pixel width, height and crop 0, 0) and style = `style_embedder` row `style` (always 0).
* Block N (40 at 1408 wide, 16 heads of 88): for N > depth // 2 first x = `skip_linear`(`skip_norm`([x, skip]))
  with skip the output of block depth − 1 − N (blocks 0 … depth // 2 − 2 pushed, popped in reverse: 39 takes 0's,
  21 takes 18's; the middle block has none); x += attn1(`norm1`(x) + `default_modulation.1`(SiLU(c))); x += attn2(`norm3`(x),
  text); x += `mlp`(`norm2`(x)) (fc1, tanh-GELU, fc2). The norms LayerNorms with affine, eps 1e-6, in float32
  (diffusers swaps the names norm2 and norm3). Attentions with biases: q and k LayerNorm'd per head (`q_norm`,
  `k_norm`, affine, eps 1e-6), then RoPE on q and k (cross-attention: on q only); SDPA at d^-1/2.
* RoPE: interleaved pairs (x₂ᵢ, x₂ᵢ₊₁) rotated; a head's first half by the token's column position, its second
  half by its row position, each at frequencies 10000^(-2i / (d/2)). Positions as the release's calc_rope: the
  h × w grid fitted inside the 32 × 32 base grid (512 px) keeping its aspect (the long side 32, centred),
  start + i · span / n (numpy's endpoint-free linspace). (diffusers' get_2d_rotary_pos_embed spaces them as
  linspace(start, stop · (n − 1) / n), which agrees only where the crop starts at 0: square grids.)
* Final: (shift, scale) = `final_layer.adaLN_modulation.1`(SiLU(c)) (diffusers' `norm_out.linear` holds its halves
  the other way round: scale, shift); `final_layer.linear`(LN(x)·(1 + scale) + shift) (LN affine-free, eps 1e-6)
  → 2×2 patches of 8 channels (v and the learned variance), features (row offset, column offset, channel).
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
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import Proj

PATCH = 2
BASE_GRID = 32  # the release's base size: 512 px // 8 // patch 2
POOL_HEADS = 8
EPS = 1e-6
SOURCE_SIZE = 1024.0  # the release's default source size condition (--size-cond 1024 1024)


@dataclass
class Attn:
    qkv: Proj  # self: Wqkv (or to_q / to_k / to_v); cross: q_proj and kv_proj (or to_q, to_k, to_v)
    q_norm: object
    k_norm: object
    o: object

    def ops(self) -> list:
        return [*self.qkv.ops(), self.q_norm, self.k_norm, self.o]


@dataclass
class Block:
    skip: tuple[object, object] | None  # skip_norm, skip_linear (the second half's blocks)
    norm1: object
    modulation: object
    attn1: Attn
    norm3: object  # the cross-attention's (diffusers: norm2)
    attn2: Attn
    norm2: object  # the MLP's (diffusers: norm3)
    mlp: tuple[object, object]

    def ops(self) -> list:
        return [*(self.skip or ()), self.modulation, self.norm1, *self.attn1.ops(), self.norm3, *self.attn2.ops(),
                self.norm2, *self.mlp]  # fmt: skip


@dataclass
class HunyuanDiT:
    """A bound Hunyuan-DiT: call it with x, t, encoder_hidden_states, encoder_hidden_states_t5 [, the masks]
    (and v1.0 / v1.1's image_meta_size, style)."""

    architecture: str
    embed: object
    t_embedder: tuple[object, object]
    mlp_t5: tuple[object, object]
    padding: object  # the plain holder of text_embedding_padding
    pooler: object  # the plain holder of the pooler's positional_embedding
    pool: tuple[object, object, object, object]  # q, k, v, c projections
    style: object | None  # style_embedder (v1.0 / v1.1)
    extra: tuple[object, object]
    blocks: list[Block]
    final_mod: object
    final_linear: object
    heads: int
    scale_first: bool  # diffusers' norm_out.linear: (scale, shift)
    dtype: torch.dtype = torch.float32
    family = "hunyuan_dit"

    @property
    def in_channels(self) -> int:
        return wshape(self.embed)[1]

    @property
    def t5_tokens(self) -> int:
        return held_shape(self.pooler, "positional_embedding")[0] - 1

    @property
    def clip_tokens(self) -> int:
        return held_shape(self.padding, "text_embedding_padding")[0] - self.t5_tokens

    @property
    def clip_dim(self) -> int:
        return held_shape(self.padding, "text_embedding_padding")[1]

    @property
    def t5_dim(self) -> int:
        return wshape(self.mlp_t5[0])[1]

    def __call__(self, x, t, encoder_hidden_states, encoder_hidden_states_t5, text_embedding_mask=None,
                 text_embedding_mask_t5=None, image_meta_size=None, style=None) -> torch.Tensor:  # fmt: skip
        dt, b = self.dtype, x.shape[0]
        h, w = x.shape[-2] // PATCH, x.shape[-1] // PATCH
        t5 = encoder_hidden_states_t5.to(dt)
        text = torch.cat([encoder_hidden_states.to(dt), self.mlp_t5[1](_silu(self.mlp_t5[0](t5)))], 1)
        masks = [
            torch.ones(b, n.shape[1], dtype=torch.bool, device=x.device) if m is None else m.bool()
            for m, n in ((text_embedding_mask, encoder_hidden_states), (text_embedding_mask_t5, t5))
        ]
        pad = held(self.padding, "text_embedding_padding", x.device).to(x.device, dt)
        text = torch.where(torch.cat(masks, 1)[..., None], text, pad)
        c = mlp2(self.t_embedder, timestep_embedding(t.float(), 256).to(dt))
        tokens = self.embed(x.to(dt)).flatten(2).transpose(1, 2)  # [B, h·w, D]
        extra = [self._pool(t5)]
        if self.style is not None:
            meta = image_meta_size
            if meta is None:  # the release's inference: source 1024 x 1024, target width and height, no crop
                px = [SOURCE_SIZE, SOURCE_SIZE, 8.0 * x.shape[-1], 8.0 * x.shape[-2], 0.0, 0.0]
                meta = torch.tensor([px], device=x.device).expand(b, 6)
            extra.append(timestep_embedding(meta.reshape(-1).float(), 256).to(dt).reshape(b, -1))
            ids = torch.zeros(b, dtype=torch.long, device=x.device) if style is None else style.long()
            weight, _ = self.style.cast_params(tokens)
            extra.append(F.embedding(ids, weight).to(dt))
        c = c + mlp2(self.extra, torch.cat(extra, 1))
        rope = rope_2d(tokens.shape[-1] // self.heads, h, w)
        rope = tuple(r.to(x.device) for r in rope)
        skips, half = [], len(self.blocks) // 2
        for i, blk in enumerate(self.blocks):
            if blk.skip is not None:
                tokens = blk.skip[1](_ln(blk.skip[0], torch.cat([tokens, skips.pop()], -1)))
            shift = blk.modulation(_silu(c))[:, None]
            tokens = tokens + self._attend(blk.attn1, _ln(blk.norm1, tokens) + shift, None, rope)
            tokens = tokens + self._attend(blk.attn2, _ln(blk.norm3, tokens), text, rope)
            tokens = tokens + blk.mlp[1](F.gelu(blk.mlp[0](_ln(blk.norm2, tokens)), approximate="tanh"))
            if i < half - 1:
                skips.append(tokens)
        shift, scale = self.final_mod(_silu(c))[:, None].chunk(2, dim=-1)
        if self.scale_first:
            shift, scale = scale, shift
        out = self.final_linear(layer_norm(tokens) * (1 + scale) + shift)
        out = out.reshape(b, h, w, PATCH, PATCH, -1).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(b, -1, h * PATCH, w * PATCH)

    def _pool(self, t5: torch.Tensor) -> torch.Tensor:
        """The pooler: the tokens' mean as the one query over [mean, tokens] + positions, 8 heads."""
        q_proj, k_proj, v_proj, c_proj = self.pool
        pos = held(self.pooler, "positional_embedding", t5.device).to(t5.device, t5.dtype)
        seq = torch.cat([t5.mean(1, keepdim=True), t5], 1) + pos[None]
        q, k, v = (
            split_heads(p(s), POOL_HEADS) for p, s in ((q_proj, seq[:, :1]), (k_proj, seq), (v_proj, seq))
        )
        return c_proj(merge_heads(F.scaled_dot_product_attention(q, k, v)))[:, 0]

    def _attend(self, a: Attn, x, src, rope):
        if src is None:
            q, k, v = a.qkv(x)
        elif len(a.qkv.parts) == 2:  # q_proj and the fused kv_proj
            q, (k, v) = a.qkv.parts[0](x), a.qkv.parts[1](src).chunk(2, dim=-1)
        else:
            q, k, v = a.qkv.parts[0](x), a.qkv.parts[1](src), a.qkv.parts[2](src)
        q, k, v = (split_heads(p, self.heads) for p in (q, k, v))
        q, k = _ln(a.q_norm, q), _ln(a.k_norm, k)
        q = apply_rope(q, rope)
        if src is None:
            k = apply_rope(k, rope)
        return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v)))

    def op_order(self) -> list:
        order = [
            *self.mlp_t5,
            *self.t_embedder,
            self.embed,
            *self.pool,
            *([self.style] if self.style else []),
        ]
        order += self.extra
        for blk in self.blocks:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def _silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x.float()).to(x.dtype)  # the release's FP32_SiLU


def _ln(op, x: torch.Tensor) -> torch.Tensor:
    """LayerNorm with `op`'s weight and bias (cast, patched and streamed as its own forward would), in float32 as
    the release's FP32_Layernorm, at eps 1e-6."""
    w, b = op.cast_params(x)
    out = F.layer_norm(x.float(), (x.shape[-1],), w.float(), None if b is None else b.float(), EPS)
    return out.to(x.dtype)


def apply_rope(x: torch.Tensor, rope) -> torch.Tensor:
    """x [B, H, L, d] with its interleaved pairs rotated by `rope` (cos, sin [L, d]), in float32."""
    cos, sin = rope
    xf = x.float()
    pairs = xf.reshape(*x.shape[:-1], -1, 2)
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2)
    return (xf * cos + rotated * sin).to(x.dtype)


def grid_positions(n: int, other: int, long_side: bool) -> torch.Tensor:
    """The release's positions along one axis of an n-long side of an n × other grid fitted into the base grid."""
    span = BASE_GRID if long_side else int(round(BASE_GRID / other * n))
    start = int(round((BASE_GRID - span) / 2.0))
    return (start + torch.arange(n, dtype=torch.float64) * (span / n)).float()


def rope_2d(head_dim: int, h: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [h·w, head_dim] of an h × w token grid (see the module's text): a head's first half from the
    column, the second from the row."""
    rows = grid_positions(h, w, h > w)
    cols = grid_positions(w, h, h <= w)
    r, c = torch.meshgrid(rows, cols, indexing="ij")
    quarter = head_dim // 2
    freqs = 1.0 / 10000 ** (torch.arange(0, quarter, 2)[: quarter // 2].float() / quarter)

    def one(pos: torch.Tensor):
        angles = torch.outer(pos.reshape(-1), freqs)
        return angles.cos().repeat_interleave(2, 1), angles.sin().repeat_interleave(2, 1)

    (cc, cs), (rc, rs) = one(c), one(r)
    return torch.cat([cc, rc], 1), torch.cat([cs, rs], 1)


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's: the one rename table LoRAs use too (engine.lora.family_names.HUNYUAN_DIT; diffusers'
# split q / k / v and k / v stay, bound as row blocks of the release's fused Wqkv and kv_proj), and what only the
# binder renames: the final adaLN (its halves swapped, read in diffusers' order), the pooler's module (a holder of
# its positional embedding) and the two norms whose names diffusers swaps (a LoRA's prefix decides those).
_OWN = {"norm_out.linear": "final_layer.adaLN_modulation.1", "time_extra_emb.pooler": "pooler"}
_NORMS = {"norm2": "norm3", "norm3": "norm2"}


def release_paths(mods) -> dict:
    """diffusers path -> the release's, for every path of `mods` the two names differ in."""
    from ..lora.family_names import HUNYUAN_DIT, to_original

    out = to_original(mods, HUNYUAN_DIT) | {p: r for p, r in _OWN.items() if p in mods}
    for p in mods:
        head, _, last = p.rpartition(".")
        if head.startswith("blocks.") and head.count(".") == 1 and last in _NORMS:
            out[p] = f"{head}.{_NORMS[last]}"
    return out


def _attn(ops: Ops, p: str, cross: bool, dim: int) -> Attn:
    if cross and f"{p}.kv_proj" in ops:
        qkv = Proj(None, parts=(ops[f"{p}.q_proj"], ops[f"{p}.kv_proj"]))
    elif cross:  # diffusers' split k / v
        qkv = Proj(None, parts=(ops[f"{p}.q_proj"], ops[f"{p}.to_k"], ops[f"{p}.to_v"]))
    elif f"{p}.Wqkv" in ops:
        qkv = Proj(ops[f"{p}.Wqkv"], (dim, dim, dim))
    else:  # diffusers' split q / k / v
        qkv = Proj(None, parts=tuple(ops[f"{p}.to_{n}"] for n in "qkv"))
    return Attn(qkv, ops[f"{p}.q_norm"], ops[f"{p}.k_norm"], ops[f"{p}.out_proj"])


def _holder(ops: Ops, mods: dict, path: str, attr: str):
    m = mods.get(path)
    if m is None or getattr(m, attr, None) is None:
        raise UnsupportedModel(
            f"{ops.what}: no {path + '.' if path else ''}{attr} — not a Hunyuan-DiT transformer"
        )
    ops.take(m)
    return m


def bind_hunyuan_dit(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, HunyuanDiT]:
    """(naming, the forward) of a Hunyuan-DiT transformer in the release's or diffusers' naming."""
    diffusers = "pos_embed.proj" in mods
    if diffusers:
        rename = release_paths(mods)
        mods = {rename.get(p, p): m for p, m in mods.items()}
        ops = ops.renamed(mods)
    embed = ops["x_embedder.proj"]
    embed.stride = tuple(wshape(embed)[2:])
    dim = wshape(embed)[0]
    if tuple(wshape(embed)[2:]) != (PATCH, PATCH):
        raise UnsupportedModel(f"{ops.what}: patch {wshape(embed)[2:]}: not Hunyuan-DiT's 2×2")
    blocks = []
    for i in ops.children("blocks"):
        p = f"blocks.{i}"
        skip = (ops[f"{p}.skip_norm"], ops[f"{p}.skip_linear"]) if f"{p}.skip_linear" in ops else None
        blocks.append(Block(skip, ops[f"{p}.norm1"], ops[f"{p}.default_modulation.1"], _attn(ops, f"{p}.attn1", False, dim),
                            ops[f"{p}.norm3"], _attn(ops, f"{p}.attn2", True, dim), ops[f"{p}.norm2"],
                            (ops[f"{p}.mlp.fc1"], ops[f"{p}.mlp.fc2"])))  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a Hunyuan-DiT transformer")
    half = len(blocks) // 2
    if [b.skip is not None for b in blocks] != [i > half for i in range(len(blocks))]:
        raise UnsupportedModel(
            f"{ops.what}: long skips on blocks other than {half + 1}–{len(blocks) - 1} of {len(blocks)}: "
            "not Hunyuan-DiT's layout"
        )
    head = wshape(blocks[0].attn1.q_norm)[0]
    if dim % head:
        raise UnsupportedModel(f"{ops.what}: width {dim} in heads of {head}")
    pool = tuple(ops[f"pooler.{n}_proj"] for n in "qkvc")
    model = HunyuanDiT(
        architecture, embed, (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]), (ops["mlp_t5.0"], ops["mlp_t5.2"]),
        _holder(ops, mods, "", "text_embedding_padding"), _holder(ops, mods, "pooler", "positional_embedding"), pool,
        ops.get("style_embedder"), (ops["extra_embedder.0"], ops["extra_embedder.2"]), blocks,
        ops["final_layer.adaLN_modulation.1"], ops["final_layer.linear"], dim // head, diffusers, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
