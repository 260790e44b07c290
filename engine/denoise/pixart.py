"""PixArt-α and PixArt-Σ (PixArt-alpha's XL/2 transformers: 256 to 2K), run on the component's own castable ops, in the
file's own naming: the release's (`x_embedder.proj`, `t_block`, `blocks.N.attn.qkv`, `cross_attn.kv_linear`,
`mlp.fc1`, `final_layer`) or diffusers' (`pos_embed.proj`, `adaln_single`, `transformer_blocks.N.attn1.to_q`,
`ff.net.0.proj`, `proj_out`, renamed onto them).

Architecture facts, from PixArt-alpha's `diffusion/model/nets/PixArt.py` / `PixArtMS.py` (as its papers and diffusers'
`PixArtTransformer2DModel`, `AdaLayerNormSingle` and `BasicTransformerBlock` describe them; nothing copied). Sana
(engine.denoise.sana) grew from this block, and shares its attention pieces here:

* x [B, 4, h, w] (SD's VAE latents) → `x_embedder.proj` (2×2 patches) → tokens in (row, column) order, plus a fixed
  2-D sin-cos table: a token at (r, c) of an h × w grid sits at (r, c) · 64 / (h, w) / 2 — the first half of its
  features from the column, the second from the row, each [sin | cos] of position / 10000^(2i / (D/2)). Every
  release's base size over its interpolation scale is 32 (512: 32 / 1, 1024: 64 / 2, 2K: 128 / 4; diffusers' Σ
  256 config 16 / 0.5), so the table depends on the grid alone.
* t in 0–1000: e = `t_embedder.mlp`(emb₂₅₆(t)) (Linear, SiLU, Linear); PixArt-α 1024 (its `csize_embedder` and
  `ar_embedder`) adds [size emb(h), size emb(w), ar emb(h / w)] (each the same MLP shape, D/3 wide) from the
  image's pixel height, width and aspect ratio; six modulations = `t_block.1`(SiLU(e)).
* y [B, T, 4096] (T5-XXL states: α 120 tokens, Σ 300) → `y_embedder.y_proj` (fc1, tanh-GELU, fc2); the release's
  null caption `y_embedding` is for training's dropout, never read.
* Block: (shift, scale, gate, shift₂, scale₂, gate₂) = its `scale_shift_table` + the modulations; x += gate ·
  attn(LN(x)·(1 + scale) + shift); x += cross_attn(x, y) (the prompt's tokens: `mask`); x += gate₂ ·
  mlp(LN(x)·(1 + scale₂) + shift₂), mlp = fc2(tanh-GELU(fc1)). Attention with biases, 72-wide heads (16 at 1152);
  LN affine-free, eps 1e-6.
* Final: (shift, scale) = `final_layer.scale_shift_table` + e; `final_layer.linear`(LN(x)·(1 + scale) + shift) → 2×2
  patches of 8 channels (ε and the learned variance), features (row offset, column offset, channel).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import (
    Ops,
    held,
    layer_norm,
    merge_heads,
    mlp2,
    split_heads,
    timestep_embedding,
    wshape,
)
from .sana import Attn, Sana, bind_attn, bind_table, release_ops

HEAD = 72  # PixArt XL/2's head width (1152 = 16 x 72): not in the weights
PATCH = 2
POS_SCALE = 32.0  # base size / interpolation scale, the same in every release (see the module's text)


@dataclass
class Block:
    table: object  # the plain holder of the block's scale_shift_table [6, D]
    attn: Attn
    cross: Attn
    mlp: tuple[object, object]


@dataclass
class PixArt:
    """A bound PixArt transformer: call it with x, timestep, y [, mask] (and α 1024's img_hw, aspect_ratio)."""

    architecture: str
    embed: object
    t_embedder: tuple[object, object]
    t_block: object
    caption: tuple[object, object]
    blocks: list[Block]
    final_table: object
    final_linear: object
    micro: tuple[tuple[object, object], tuple[object, object]] | None  # α 1024: size and aspect-ratio MLPs
    dtype: torch.dtype = torch.float32
    family = "pixart"

    @property
    def in_channels(self) -> int:
        return wshape(self.embed)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.caption[0])[1]

    def __call__(self, x, timestep, y, mask=None, img_hw=None, aspect_ratio=None) -> torch.Tensor:
        dt, b = self.dtype, x.shape[0]
        h, w = x.shape[-2] // PATCH, x.shape[-1] // PATCH
        tokens = self.embed(x.to(dt)).flatten(2).transpose(1, 2)  # [B, h·w, D]
        tokens = tokens + sincos_2d(tokens.shape[-1], h, w).to(tokens.device, dt)
        e = mlp2(self.t_embedder, timestep_embedding(timestep.float(), 256).to(dt))
        if self.micro is not None:
            hw = (
                img_hw
                if img_hw is not None
                else torch.tensor([[8.0 * x.shape[-2], 8.0 * x.shape[-1]]]).expand(b, 2)
            )
            ar = aspect_ratio if aspect_ratio is not None else hw[:, :1] / hw[:, 1:]
            size = mlp2(self.micro[0], timestep_embedding(hw.reshape(-1).float(), 256).to(dt)).reshape(b, -1)
            e = e + torch.cat(
                [size, mlp2(self.micro[1], timestep_embedding(ar.reshape(-1).float(), 256).to(dt))], 1
            )
        mods = self.t_block(F.silu(e)).reshape(b, 6, -1)
        ctx = self.caption[1](F.gelu(self.caption[0](y.to(dt)), approximate="tanh"))
        keys = None if mask is None or bool(mask.all()) else mask.bool()[:, None, None, :]
        heads = tokens.shape[-1] // HEAD
        for blk in self.blocks:
            table = held(blk.table, "scale_shift_table", tokens.device).to(tokens.device, dt)
            shift, scale, gate, shift2, scale2, gate2 = (table[None] + mods).chunk(6, dim=1)
            tokens = tokens + gate * _attend(
                blk.attn, layer_norm(tokens) * (1 + scale) + shift, None, heads, None
            )
            tokens = tokens + _attend(blk.cross, tokens, ctx, heads, keys)
            a = layer_norm(tokens) * (1 + scale2) + shift2
            tokens = tokens + gate2 * blk.mlp[1](F.gelu(blk.mlp[0](a), approximate="tanh"))
        table = held(self.final_table, "scale_shift_table", tokens.device).to(tokens.device, dt)
        shift, scale = (table[None] + e[:, None]).chunk(2, dim=1)
        out = self.final_linear(layer_norm(tokens) * (1 + scale) + shift)
        out = out.reshape(b, h, w, PATCH, PATCH, -1).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(b, -1, h * PATCH, w * PATCH)

    def op_order(self) -> list:
        order = [self.embed, *self.t_embedder, *(m for pair in self.micro or () for m in pair), self.t_block]
        order += self.caption
        for blk in self.blocks:
            order += [*blk.attn.ops(), *blk.cross.ops(), *blk.mlp]
        return [*order, self.final_linear]


def _attend(a: Attn, x, src, heads: int, keys):
    q, k, v = (split_heads(t, heads) for t in Sana._qk(a, x, src))
    return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=keys)))


def sincos_2d(dim: int, h: int, w: int) -> torch.Tensor:
    """[h·w, dim] PixArt's fixed position table for an h × w token grid (see the module's text), in float64 then
    float32 as the original's numpy table."""

    def one(pos: torch.Tensor) -> torch.Tensor:
        omega = 1.0 / 10000 ** (torch.arange(dim // 4, dtype=torch.float64) / (dim / 4.0))
        out = torch.outer(pos.reshape(-1).double(), omega)
        return torch.cat([out.sin(), out.cos()], 1)

    rows = torch.arange(h, dtype=torch.float32) / (h / (2 * POS_SCALE)) / 2
    cols = torch.arange(w, dtype=torch.float32) / (w / (2 * POS_SCALE)) / 2
    r, c = torch.meshgrid(rows, cols, indexing="ij")
    return torch.cat([one(c), one(r)], 1).float()


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's (the inverse of diffusers' convert_pixart_alpha / sigma_to_diffusers scripts;
# diffusers' split q / k / v and k / v are row blocks of the release's fused qkv and kv_linear, bound as such)
_TOP = (("pos_embed.proj", "x_embedder.proj"), ("adaln_single.emb.timestep_embedder.linear_1", "t_embedder.mlp.0"),
        ("adaln_single.emb.timestep_embedder.linear_2", "t_embedder.mlp.2"), ("adaln_single.linear", "t_block.1"),
        ("adaln_single.emb.resolution_embedder.linear_1", "csize_embedder.mlp.0"),
        ("adaln_single.emb.resolution_embedder.linear_2", "csize_embedder.mlp.2"),
        ("adaln_single.emb.aspect_ratio_embedder.linear_1", "ar_embedder.mlp.0"),
        ("adaln_single.emb.aspect_ratio_embedder.linear_2", "ar_embedder.mlp.2"),
        ("caption_projection.linear_1", "y_embedder.y_proj.fc1"), ("caption_projection.linear_2", "y_embedder.y_proj.fc2"),
        ("proj_out", "final_layer.linear"))  # fmt: skip
_BLOCK = (("attn1.to_q", "attn.to_q"), ("attn1.to_k", "attn.to_k"), ("attn1.to_v", "attn.to_v"),
          ("attn1.to_out.0", "attn.proj"), ("attn2.to_q", "cross_attn.q_linear"), ("attn2.to_k", "cross_attn.to_k"),
          ("attn2.to_v", "cross_attn.to_v"), ("attn2.to_out.0", "cross_attn.proj"), ("ff.net.0.proj", "mlp.fc1"),
          ("ff.net.2", "mlp.fc2"))  # fmt: skip
_UNREAD = ("pos_embed", "y_embedder", "y_embedding")  # the release's fixed table buffer and null caption


def bind_pixart(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, PixArt]:
    """(naming, the forward) of a PixArt-α / Σ transformer in the release's or diffusers' naming."""
    diffusers, ops, mods, embed = release_ops(ops, mods, _TOP, _BLOCK, _UNREAD)
    dim = wshape(embed)[0]
    if dim % HEAD or tuple(wshape(embed)[2:]) != (PATCH, PATCH):
        raise UnsupportedModel(
            f"{ops.what}: width {dim}, patch {wshape(embed)[2:]}: not PixArt's XL/2 (72-wide heads)"
        )

    def table(path: str, rows: int):
        return bind_table(ops, mods, path, rows, dim, "PixArt")

    def attn(p: str, cross: bool) -> Attn:
        return bind_attn(ops, p, cross, dim)

    blocks = [
        Block(table(f"blocks.{i}", 6), attn(f"blocks.{i}.attn", False), attn(f"blocks.{i}.cross_attn", True),
              (ops[f"blocks.{i}.mlp.fc1"], ops[f"blocks.{i}.mlp.fc2"]))
        for i in ops.children("blocks")
    ]  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a PixArt transformer")
    micro = None
    if "csize_embedder.mlp.0" in ops:  # PixArt-α 1024's size and aspect-ratio conditions
        micro = tuple((ops[f"{n}.mlp.0"], ops[f"{n}.mlp.2"]) for n in ("csize_embedder", "ar_embedder"))
        if wshape(micro[0][1])[0] * 3 != dim:
            raise UnsupportedModel(
                f"{ops.what}: size conditions {wshape(micro[0][1])[0]} wide in a width of {dim}"
            )
    model = PixArt(
        architecture, embed, (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]), ops["t_block.1"],
        (ops["y_embedder.y_proj.fc1"], ops["y_embedder.y_proj.fc2"]), blocks, table("final_layer" if "final_layer" in mods else "", 2),
        ops["final_layer.linear"], micro, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
