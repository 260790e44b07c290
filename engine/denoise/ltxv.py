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
        mods, e = adaln_single(self.t_embedder, self.adaln, TIME_SCALE * timestep.float(), b, dt)
        mods = mods.reshape(*mods.shape[:2], 6, -1)  # one per batch item [B, 1, …] or per token [B, S, …]
        ctx = gelu_mlp(self.caption, context.to(dt))
        keys = key_mask(attention_mask)
        rate = frame_rate.float() if frame_rate is not None else torch.full((b,), FRAME_RATE, device=x.device)
        pe = rope_table(positions(f, h, w, rate), tokens.shape[-1])
        for blk in self.blocks:
            tokens = self._block(blk, tokens, ctx, mods, pe, keys)
        out = modulated_out(self.table, "scale_shift_table", e, tokens, self.proj_out)
        return out.transpose(1, 2).reshape(b, -1, f, h, w)

    def _block(self, blk: Block, x, ctx, mods, pe, keys):
        shift, scale, gate, shift2, scale2, gate2 = modulation(blk.table, "scale_shift_table", mods)
        x = x + gate * attend(blk.attn1, rms(x) * (1 + scale) + shift, None, HEADS, QK_EPS, rope, pe)
        x = x + attend(blk.attn2, x, ctx, HEADS, QK_EPS, keys=keys)
        return x + gate2 * gelu_mlp(blk.ff, rms(x) * (1 + scale2) + shift2)

    def op_order(self) -> list:
        order = [self.proj_in, *self.t_embedder, self.adaln, *self.caption]
        for blk in self.blocks:
            order += [*blk.attn1.ops(), *blk.attn2.ops(), *blk.ff]
        return [*order, self.proj_out]


# -- the pieces LTX-2 (engine.denoise.ltx2) builds on ----------------------------------------------------


def mlp_silu(pair, x: torch.Tensor) -> torch.Tensor:
    return pair[1](F.silu(pair[0](x)))


def gelu_mlp(pair, x: torch.Tensor) -> torch.Tensor:
    """Linear, tanh-GELU, Linear: the caption projection and the feed-forwards."""
    return pair[1](F.gelu(pair[0](x), approximate="tanh"))


def rms(x: torch.Tensor) -> torch.Tensor:
    """Affine-free RMSNorm over the last axis, computed in float32 (eps 1e-6)."""
    return F.rms_norm(x.float(), (x.shape[-1],), eps=RMS_EPS).to(x.dtype)


def adaln_single(
    embedder: tuple, linear, t: torch.Tensor, b: int, dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """PixArt-α's adaLN-single on timesteps already scaled (× 1000), one per batch item [B] or per token [B, S]:
    e = embedder(its 256-wide sinusoidal embedding, cosines first) (Linear, SiLU, Linear); (linear(SiLU(e)) as
    [B, 1 or S, rows·D], e as [B, 1 or S, D])."""
    t = t.float().reshape(b, -1)
    e = mlp_silu(embedder, timestep_embedding(t.flatten(), 256).to(dtype))
    return linear(F.silu(e)).reshape(b, t.shape[1], -1), e.reshape(b, t.shape[1], -1)


def modulation(holder, attr: str, mods: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The rows of a block's scale-shift table `holder.attr` [rows, D] plus the modulations [B, 1 or S,
    rows·D] (or [B, 1 or S, rows, D]): one [B, 1 or S, D] tensor per row."""
    table = held(holder, attr, mods.device).to(mods.device, mods.dtype)
    return (table[None, None] + mods.reshape(*mods.shape[:2], *table.shape)).unbind(2)


def modulated_out(holder, attr: str, e: torch.Tensor, x: torch.Tensor, proj_out) -> torch.Tensor:
    """The output layer: (shift, scale) = `holder.attr` [2, D] + e; proj_out(LN(x)·(1 + scale) + shift), LN
    affine-free (eps 1e-6)."""
    table = held(holder, attr, x.device).to(x.device, x.dtype)
    shift, scale = (table[None, None] + e[:, :, None]).unbind(2)
    return proj_out(layer_norm(x) * (1 + scale) + shift)


def key_mask(mask) -> torch.Tensor | None:
    """A [B, T] mask of the text's tokens (1: attended) as SDPA's boolean key mask [B, 1, 1, T]; None when
    every token is attended."""
    if mask is None or bool(mask.all()):
        return None
    return mask.bool()[:, None, None, :]


def attend(a: Attn, x, ctx, heads: int, eps: float, rotate=None, pe=None, k_pe=None, keys=None):
    """LTX attention over x (to ctx; itself when None): q and k RMS-normalised over the whole width (their
    norms' weights, `eps`), then rotated by `rotate(t, pe)` (k by `k_pe` when given: LTX-2's cross-modal
    attentions place queries and keys on their own streams' times) in float32; `heads` heads; an optional
    boolean key mask; LTX-2.3's per-head gate 2·sigmoid(gate(x)) on the heads' outputs; the output projection."""
    src = x if ctx is None else ctx
    q, k = rms_norm_with(a.q_norm, a.q(x), eps), rms_norm_with(a.k_norm, a.k(src), eps)
    v = a.v(src)
    if pe is not None:
        q, k = rotate(q, pe).to(v.dtype), rotate(k, pe if k_pe is None else k_pe).to(v.dtype)
    q, k, v = (split_heads(t, heads) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)  # [B, heads, S, d]
    if a.gate is not None:
        o = o * (2 * torch.sigmoid(a.gate(x))).transpose(1, 2)[..., None].to(o.dtype)
    return a.o(merge_heads(o))


def positions(f: int, h: int, w: int, frame_rate: torch.Tensor, shift: int = 0) -> torch.Tensor:
    """[B, F·H·W, 3] pixel positions of the latent's tokens: (frame time, row, column) as the original pipeline
    gives them (the causal first frame: 8f + 1 − 8 clamped at 0, over the frame rate); `shift` 1: the ends of
    the tokens' spans, the next latent frame's, row's and column's positions (LTX-2 places a token at the middle
    of its span)."""
    dev = frame_rate.device
    grid = torch.meshgrid(
        *(torch.arange(n, device=dev, dtype=torch.float32) for n in (f, h, w)), indexing="ij"
    )
    p = (torch.stack(grid, dim=-1).reshape(1, f * h * w, 3) + shift) * torch.tensor(
        SCALE, device=dev, dtype=torch.float32
    )
    p = p.expand(frame_rate.shape[0], -1, -1).clone()
    p[..., 0] = (p[..., 0] + 1 - SCALE[0]).clamp(min=0) / frame_rate[:, None]
    return p


def rope_angles(frac: torch.Tensor, n: int, double: bool = False) -> torch.Tensor:
    """[B, S, axes] positions over their maxima -> [B, S, n·axes] angles f_j · (2p − 1), the axes inner per
    frequency: f_j = theta^(j / (n − 1)) · π/2, in float32 (LTX-Video's), or worked out in float64 and rounded
    to float32 (`double`: LTX-2's `frequencies_precision` float64); the angles themselves in float32."""
    if double:
        freqs = (
            THETA ** torch.linspace(0.0, 1.0, n, dtype=torch.float64, device=frac.device) * (math.pi / 2)
        ).float()
    else:
        # in float32, as the original computes them: its angles reach ~1.6e4 radians, where float64 would give
        # other rotations (by up to ~1e-3 rad) than those the model was trained with
        freqs = THETA ** torch.linspace(0.0, 1.0, n, dtype=torch.float32, device=frac.device) * (math.pi / 2)
    return (freqs[None, None, :, None] * (frac[:, :, None, :] * 2 - 1)).flatten(2)


def rope_table(pos: torch.Tensor, dim: int) -> torch.Tensor:
    """[B, S, 3] positions -> [B, S, dim/2, 2, 2] rotations over the whole width (the leading dim mod 6
    dimensions unrotated), for engine.denoise.common.rope."""
    frac = pos.float() / torch.tensor(MAX_POS, dtype=torch.float32, device=pos.device)
    ang = rope_angles(frac, dim // 6)  # [B, S, 3n], axes inner
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
        ops = ops.renamed(release_paths(mods))
    dim = wshape(ops["patchify_proj"])[0]
    if dim % HEADS or dim % 2:
        raise UnsupportedModel(
            f"{ops.what}: width {dim} is not {HEADS} heads wide — not an LTX-Video transformer"
        )

    def table(path: str, rows: int):
        return read_table(ops, mods, path, "scale_shift_table", (rows,), dim, "an LTX-Video transformer")

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


def release_paths(mods) -> dict:
    """A diffusers-named LTX-Video / LTX-2 transformer's module paths -> the release's (`proj_in` ->
    `patchify_proj`, `time_embed` -> `adaln_single`, … engine.lora.family_names.LTX; `norm_q` -> `q_norm`)."""
    from ..lora.family_names import LTX, to_original

    rename = to_original(mods, LTX)
    return {
        rename.get(p, p).replace(".norm_q", ".q_norm").replace(".norm_k", ".k_norm"): m
        for p, m in mods.items()
    }


def read_table(ops: Ops, mods: dict, path: str, attr: str, rows: tuple[int, ...], dim: int, what: str):
    """The plain module at `path` holding the table `attr` of one of `rows` rows of `dim`, taken as a layer the
    forward computes with; UnsupportedModel when it is missing or of another shape."""
    m = mods.get(path)
    where = f"{path}.{attr}" if path else attr
    if m is None or getattr(m, attr, None) is None:
        raise UnsupportedModel(f"{ops.what}: no {where} — not {what}")
    shape = held_shape(m, attr)
    if shape not in [(r, dim) for r in rows]:
        want = " or ".join(f"[{r}, {dim}]" for r in rows)
        raise UnsupportedModel(f"{ops.what}: {where} is {list(shape)}, not {want} — not {what}")
    ops.take(m)
    return m
