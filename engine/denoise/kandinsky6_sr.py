"""Kandinsky 6's video super-resolution transformer forward pass (kandinskylab, 2026), run on the component's own
castable ops, in diffusers' names (`Kandinsky6SRTransformer3DModel`, the names its files ship).

Architecture facts, from diffusers' `transformer_kandinsky6_sr.py` and `pipelines/kandinsky6/pipeline_kandinsky6_sr.py`
(read for the facts, written from that description, nothing copied): Kandinsky 5's visual blocks (engine.denoise.
kandinsky5) without text — no text blocks, no cross-attention, a 6-fold `visual_modulation` (shift, scale, gate ×
self-attention, MLP), the MLP diffusers' `FeedForward` (`feed_forward.net.0.proj` / `net.2`, GELU, bias-free).

* Input: the channels-last latent tile [B, T, H, W, 2·C + 1] (C = 64, the K-VAE's): the noisy latent, the anchor (the
  low-resolution video's latent) and the anchor mask; (1, 1, 1) patches → `visual_embeddings.in_layer`.
* c = `time_embeddings.timestep_embedder` (linear_1, SiLU, linear_2) of the sinusoidal t (cosines first,
  10000^(-i/half), model-wide) + `pooled_bias` (the release's empty caption's pooled-text projection, folded in).
* 3-D RoPE over axes (head/4, 3·head/8, 3·head/8) of (frame, row, column), angles divided by the config's scale_factor
  (1, 2, 2), applied in float32 without Kandinsky 5's bfloat16 rounding.
* Attention: NABLA, always (the released config's threshold 0.8, sliding-tile window 11 × 7 × 7 blocks). The tokens
  are ordered frame by frame in 8 × 8 tiles of the grid (the grid's sides must be multiples of 8); each 64-token tile
  is a block. Per item and head, the blocks' mean q and k give a block-level softmax; each query block keeps the key
  blocks that make up the top `threshold` of its mass (the smallest probabilities dropped while their sum stays
  within 1 − threshold) and every block within the window (±5 frames, ±3 tiles); it attends to those blocks' tokens
  in full. Here that is scaled-dot-product attention with the block mask spread to tokens, a band of query blocks at
  a time, the band's scores bounded (BAND_ELEMS; diffusers runs flex attention).
* Out: Kandinsky 5's head (`out_layer`): [B, T, H, W, out] (out = C for a velocity checkpoint, n·C for the
  piflow-distilled ones, whose scheduler reads the n-way mixture).

Inputs (diffusers' forward's names): `hidden_states` [B, T, H, W, 129] and `timestep` [B] (0–1000). Output `out`
[B, T, H, W, out]. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, Taken, held, merge_heads, mlp2, rope, split_heads, timestep_embedding, wshape
from .kandinsky5 import AXES, Attention, qk_norm
from .kandinsky6 import SCALE, gated, modulate, modulations, rope_video

TILE = 8  # NABLA's tiles of the token grid: 8 × 8 tokens a block
THRESHOLD = 0.8  # the released config's nabla_threshold
WINDOW = (11, 7, 7)  # the released config's nabla_window (frames, tile rows, tile columns)
BAND_ELEMS = 1 << 26  # scores (and mask entries) one band of query blocks may span, all items and heads
_ATTN = ("to_query", "to_key", "to_value", "query_norm", "key_norm", "out_layer")


@dataclass
class Block:
    modulation: object
    attn: Attention
    ff_in: object
    ff_out: object

    def ops(self) -> list:
        return [self.modulation, *self.attn.ops(), self.ff_in, self.ff_out]


@dataclass
class Kandinsky6SR:
    """A bound Kandinsky 6 SR transformer: call it with hidden_states [B, T, H, W, 2·C + 1] and timestep [B]."""

    architecture: str
    visual_in: object
    time: tuple[object, object]
    bias: object  # the root holder of `pooled_bias`
    blocks: list[Block]
    out: tuple[object, object]  # modulation, out_layer
    head: int
    dtype: torch.dtype = torch.float32
    family = "kandinsky6_sr"
    step_inputs = ("hidden_states", "timestep")
    step_optional = ()

    @property
    def hidden(self) -> int:
        return wshape(self.visual_in)[0]

    @property
    def in_channels(self) -> int:
        return wshape(self.visual_in)[1]

    @property
    def latent_channels(self) -> int:
        return (self.in_channels - 1) // 2

    def __call__(self, hidden_states, timestep) -> torch.Tensor:
        dt, dev = self.dtype, hidden_states.device
        b, t, h, w, _ = hidden_states.shape
        x = self.visual_in(hidden_states.to(dt))  # [B, T, H, W, D]
        temb = timestep_embedding(timestep.float().to(dev), wshape(self.time[0])[1])
        cemb = mlp2(self.time, temb.to(dt)) + held(self.bias, "pooled_bias", dev).to(dt)
        pe = rope_video(torch.arange(t), (h, w), AXES[self.head], torch.tensor([SCALE]), dev)
        pe = _tiled(
            pe.reshape(1, 1, t, h, w, *pe.shape[-3:]), 2
        )  # [1, 1, S, d/2, 2, 2] in NABLA's token order
        x = _tiled(x, 1)
        sta = _window_mask(t, h // TILE, w // TILE, dev)
        for blk in self.blocks:
            m = modulations(blk.modulation, cemb, 6)
            x = gated(x, m[2], self._attn(blk.attn, modulate(x, m[0], m[1]), pe, sta))
            x = gated(x, m[5], blk.ff_out(F.gelu(blk.ff_in(modulate(x, m[3], m[4])))))
        mod, lin = self.out
        shift, scale = mod(F.silu(cemb)).float().chunk(2, dim=-1)
        y = lin(modulate(x, shift[:, None], scale[:, None]))
        return _untiled(y, (t, h, w))

    def _attn(self, a: Attention, x, pe, sta):
        heads = self.hidden // self.head
        q, k, v = (split_heads(p(x), heads) for p in (a.q, a.k, a.v))
        q, k = rope(qk_norm(a.q_norm, q), pe), rope(qk_norm(a.k_norm, k), pe)
        keep = _nabla(q, k, sta)  # [B, heads, n, n] key blocks per query block
        blk = TILE * TILE
        out = torch.empty_like(q)
        band = max(1, BAND_ELEMS // (blk * q.shape[0] * q.shape[1] * q.shape[2]))
        for i in range(0, keep.shape[-2], band):
            rows = keep[:, :, i : i + band].repeat_interleave(blk, dim=-2).repeat_interleave(blk, dim=-1)
            qs = q[:, :, i * blk : (i + band) * blk]
            out[:, :, i * blk : i * blk + qs.shape[2]] = F.scaled_dot_product_attention(
                qs, k, v, attn_mask=rows
            )
        return a.o(merge_heads(out))

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """One latent frame of a width × height tile (the K-VAE's 16x latent, sides rounded up to NABLA's 8-token
        tiles), noise, a random anchor and an anchor mask of ones (the SR pipeline conditions every frame)."""
        h, w = (TILE * max(1, math.ceil(n / 16 / TILE)) for n in (height, width))
        c = self.latent_channels
        x = torch.cat(
            [torch.randn(batch, 1, h, w, 2 * c, generator=g), torch.ones(batch, 1, h, w, 1)], dim=-1
        )
        return {"hidden_states": x, "timestep": torch.rand(batch, generator=g) * 1000.0}

    def step_units(self, inputs: dict) -> int:
        """Tokens, the batch's (one per latent pixel and frame)."""
        b, t, h, w, _ = inputs["hidden_states"].shape
        return b * t * h * w

    def step_shapes(self, got: dict) -> dict:
        return {"hidden_states": (None, None, None, None, self.in_channels), "timestep": (None,)}

    def check_extra(self, got: dict, source: str) -> None:
        """NABLA's 8 × 8 token tiles."""
        h, w = got["hidden_states"].shape[2:4]
        if h % TILE or w % TILE:
            raise FormatError(
                f"{source}: input hidden_states is {h}×{w} latent pixels; Kandinsky 6 SR's attention reads the grid "
                f"in {TILE}×{TILE} tiles (a tile of {16 * TILE}-pixel multiples)"
            )

    def op_order(self) -> list:
        order = [self.visual_in, *self.time]
        for blk in self.blocks:
            order += blk.ops()
        return [*order, *self.out]


def _tiled(x: torch.Tensor, dim: int) -> torch.Tensor:
    """[..., T, H, W, ...] (grid from axis `dim`) -> [..., T·H·W, ...] in NABLA's order: frame, tile row, tile column,
    then the tile's 8 × 8 tokens row by row."""
    t, h, w = x.shape[dim : dim + 3]
    x = x.reshape(*x.shape[:dim], t, h // TILE, TILE, w // TILE, TILE, *x.shape[dim + 3 :])
    order = list(range(x.ndim))
    order[dim + 2], order[dim + 3] = dim + 3, dim + 2  # (t, hb, wb, i, j)
    return x.permute(order).reshape(*x.shape[:dim], t * h * w, *x.shape[dim + 5 :])


def _untiled(y: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
    """[B, S, C] in NABLA's order -> [B, T, H, W, C]."""
    t, h, w = grid
    y = y.reshape(y.shape[0], t, h // TILE, w // TILE, TILE, TILE, y.shape[-1]).permute(0, 1, 2, 4, 3, 5, 6)
    return y.reshape(y.shape[0], t, h, w, y.shape[-1])


def _window_mask(t: int, hb: int, wb: int, device) -> torch.Tensor:
    """[n, n] blocks (frame, tile row, tile column order) within the sliding-tile window of each other."""
    axes = [torch.arange(n, device=device) for n in (t, hb, wb)]
    pos = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)
    reach = torch.tensor([d // 2 for d in WINDOW], device=device)
    return ((pos[:, None] - pos[None]).abs() <= reach).all(-1)


def _nabla(q: torch.Tensor, k: torch.Tensor, sta: torch.Tensor) -> torch.Tensor:
    """[B, heads, n, n]: the key blocks each query block attends to (see the module's docstring)."""
    b, h, s, d = q.shape
    n = s // (TILE * TILE)
    qa = q.reshape(b, h, n, TILE * TILE, d).mean(-2)
    ka = k.reshape(b, h, n, TILE * TILE, d).mean(-2)
    p = torch.softmax(qa @ ka.transpose(-2, -1) / math.sqrt(d), dim=-1)
    vals, order = p.sort(dim=-1)
    keep = torch.zeros_like(p, dtype=torch.bool).scatter_(-1, order, vals.cumsum(-1) >= 1 - THRESHOLD)
    return keep | sta


# -- binding the file's ops -----------------------------------------------------------------------------


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Kandinsky6SR]:
    """The forward of a Kandinsky 6 SR transformer (diffusers' names, bare or under a prefix)."""

    def block(p: str) -> Block:
        a = Attention(*(ops[f"{p}.self_attention.{n}"] for n in _ATTN))
        return Block(ops[f"{p}.visual_modulation.out_layer"], a, ops[f"{p}.feed_forward.net.0.proj"],
                     ops[f"{p}.feed_forward.net.2"])  # fmt: skip

    blocks = [block(f"visual_transformer_blocks.{i}") for i in ops.children("visual_transformer_blocks")]
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no Kandinsky 6 SR blocks")
    head, hidden = wshape(blocks[0].attn.q_norm)[0], wshape(ops["visual_embeddings.in_layer"])[0]
    if head not in AXES or hidden % head:
        raise UnsupportedModel(
            f"{ops.what}: head width {head} with hidden size {hidden} — Kandinsky 6 SR's heads are "
            f"{' or '.join(map(str, AXES))} wide (their RoPE axes {' / '.join(map(str, AXES.values()))})"
        )
    ins = wshape(ops["visual_embeddings.in_layer"])[1]
    if ins % 2 == 0:
        raise UnsupportedModel(
            f"{ops.what}: a patch embedding of {ins} channels — Kandinsky 6 SR reads the noise, the anchor and its "
            "mask (2 × C + 1), in 1 × 1 × 1 patches"
        )
    root = Taken(mods, ops).get("")
    if root is None or getattr(root, "pooled_bias", None) is None:
        raise UnsupportedModel(
            f"{ops.what}: no `pooled_bias` — not a Kandinsky 6 SR transformer Loadout knows"
        )
    return "diffusers", Kandinsky6SR(
        architecture, ops["visual_embeddings.in_layer"],
        (ops["time_embeddings.timestep_embedder.linear_1"], ops["time_embeddings.timestep_embedder.linear_2"]), root,
        blocks, (ops["out_layer.modulation.out_layer"], ops["out_layer.out_layer"]), head, dtype,
    )  # fmt: skip
