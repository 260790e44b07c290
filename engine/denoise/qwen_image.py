"""Qwen-Image's transformer forward pass, run on the component's own castable ops, in its one naming (it was
released in diffusers' naming, which ComfyUI's repackaged files keep).

Architecture facts, from diffusers' `QwenImageTransformer2DModel` (`transformer_qwenimage.py`) and the
Qwen-Image pipeline's latent packing (written from that description, nothing copied):

* x [B, 16, h, w] latents → 2×2 patches, channels first (c, p, q) → `img_in` [D, 64]; the output's
  `proj_out` rows are unpacked the same way.
* context [B, T, 3584] Qwen2.5-VL states → `txt_norm` (RMSNorm, eps 1e-6) → `txt_in`.
* temb = Linear, SiLU, Linear (`time_text_embed.timestep_embedder`) of the 256-wide sinusoidal
  embedding (cosines first) of 1000·t, t in 0–1.
* block, per stream (img, txt): `*_mod.1`(SiLU(temb)) → (shift, scale, gate, shift₂, scale₂, gate₂);
  LayerNorm without affine (eps 1e-6), x·(1 + scale) + shift; q, k, v (`to_q` … for the image,
  `add_q_proj` … for the text), per-head RMSNorm of q and k, rotary embedding; one attention over
  [txt, img]; x += gate·out (`to_out.0`, `to_add_out`); x += gate₂·MLP(LN(x)·(1 + scale₂) + shift₂) with
  a tanh-GELU MLP (`*_mlp.net.0.proj`, `*_mlp.net.2`). Heads of 128.
* rotary positions, 3 axes of (16, 56, 56) dims, theta 10000, on interleaved pairs (FLUX.1's rotation):
  the image token at patch row r, column c of an h × w grid sits at (0, r − (h − h//2), c − (w − w//2)),
  centred on the grid (`scale_rope`); text token i sits at s + i on all three axes, s = max(h//2, w//2).
* out: `norm_out.linear`(SiLU(temb)) → (scale, shift) (diffusers' order), proj_out(LN(x)·(1 + scale) + shift).
* Qwen-Image-Layered (diffusers' `use_layer3d_rope`, `use_additional_t_cond`; ComfyUI tells it by
  `time_text_embed.addition_t_embedding`): x [B, 16, F, h, w], the F = layers + 1 latents it decomposes an image
  into, each packed as above at frame f (0…F−1), and the input image's latents (`ref_latents`) at frame −1; the
  text starts past the largest half-grid and past F; the time embedding plus `addition_t_embedding` row 0 (its
  pipeline's `is_rgb`); the output is the F frames' tokens.
* Qwen-Image-Edit (2509, 2511: the same weights' layout) takes the reference image's latents too, packed
  the same way and appended to the image tokens as frame 1 of a video (positions (1, row, column), centred
  on its own grid; the text starts past the largest grid); the output is the first frame's tokens. Edit
  2511 (ComfyUI marks its files with a `__index_timestep_zero__` key; diffusers' `zero_cond_t`) modulates
  the reference tokens with the embedding of t = 0, everything else with t's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, layer_norm, rope, timestep_embedding, wshape
from .flux import Proj, rope_table

HEAD_DIM = 128
TIME_FACTOR = 1000.0


@dataclass
class Stream:
    mod: object
    qkv: Proj
    norm_q: object
    norm_k: object
    out: object
    mlp_in: object
    mlp_out: object


@dataclass
class Block:
    img: Stream
    txt: Stream

    def ops(self) -> list:
        i, t = self.img, self.txt
        return [i.mod, t.mod, *i.qkv.ops(), *t.qkv.ops(), i.norm_q, i.norm_k, t.norm_q, t.norm_k,
                i.out, t.out, i.mlp_in, i.mlp_out, t.mlp_in, t.mlp_out]  # fmt: skip


def positions(h: int, w: int, n_txt: int, *more: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """([h·w (+ the other frames' h·w), 3] image, [n_txt, 3] text) positions, float, as the rotary
    embedding takes them; `more`: the grids of further frames (an edit's reference images)."""
    frames = []
    for f, (fh, fw) in enumerate(((h, w), *more)):
        img = torch.zeros(fh, fw, 3)
        img[..., 0] = f
        img[..., 1] = (torch.arange(fh) - (fh - fh // 2))[:, None]
        img[..., 2] = (torch.arange(fw) - (fw - fw // 2))[None, :]
        frames.append(img.reshape(fh * fw, 3))
    start = max(max(fh // 2, fw // 2) for fh, fw in ((h, w), *more))
    txt = (start + torch.arange(n_txt, dtype=torch.float32))[:, None].expand(n_txt, 3)
    return torch.cat(frames), txt


def layered_positions(
    f: int, h: int, w: int, ref: tuple[int, int], n_txt: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-Image-Layered's ([F·h·w + h'·w', 3] image, [n_txt, 3] text) positions: frames 0…F−1, then the input
    image at frame −1, each grid centred; the text from max(its half-grids, F) on."""
    img, _ = positions(h, w, 0, *([(h, w)] * (f - 1)), ref)
    img[f * h * w :, 0] = -1
    start = max(max(h // 2, w // 2), max(ref[0] // 2, ref[1] // 2), f)
    txt = (start + torch.arange(n_txt, dtype=torch.float32))[:, None].expand(n_txt, 3)
    return img, txt


def _pack(x: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] latents → [B, h/2 · w/2, 4C] tokens, channels first in each 2×2 patch."""
    b, c, height, width = x.shape
    return x.reshape(b, c, height // 2, 2, width // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)


@dataclass
class QwenImage:
    """A bound Qwen-Image transformer: call it with x [B, 16, h, w], timesteps [B] (0–1) and context
    [B, T, 3584]."""

    architecture: str
    img_in: object
    txt_norm: object
    txt_in: object
    time: tuple[object, object]
    blocks: list[Block]
    norm_out: object
    proj_out: object
    heads: int
    dtype: torch.dtype = torch.float32
    zero_cond: bool = False  # Edit 2511: the reference tokens modulated by the embedding of t = 0
    addition_t: object = None  # Qwen-Image-Layered's `addition_t_embedding` [2, D]
    family = "qwen_image"

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1] // 4

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_in)[1]

    @property
    def layered(self) -> bool:
        return self.addition_t is not None

    def __call__(self, x, timesteps, context, ref_latents=None) -> torch.Tensor:
        if self.layered:
            return self._layered(x, timesteps, context, ref_latents)
        dt = self.dtype
        b, c, height, width = x.shape
        h, w = height // 2, width // 2
        tokens = [_pack(x.to(dt))]
        if ref_latents is not None:
            tokens.append(_pack(ref_latents.to(dt)))
        img = self.img_in(torch.cat(tokens, 1) if len(tokens) > 1 else tokens[0])
        t = TIME_FACTOR * timesteps.float()
        if self.zero_cond and ref_latents is not None:  # t's embedding, then 0's, in one pass
            t = torch.cat([t, torch.zeros_like(t)])
        temb = self.time[1](F.silu(self.time[0](timestep_embedding(t, 256).to(dt))))
        ts = F.silu(temb)  # [B or 2B, D]
        txt = self.txt_in(self.txt_norm(context.to(dt)).to(dt))
        more = [(r // 2, s // 2) for r, s in [ref_latents.shape[-2:]]] if ref_latents is not None else []
        ipos, tpos = positions(h, w, txt.shape[1], *more)
        pe = rope_table(torch.cat([tpos, ipos]).to(x.device)[None])
        split = h * w if len(ts) > b else None  # the first reference token, where its modulation starts
        for blk in self.blocks:
            img, txt = self._block(blk, img, txt, ts, pe, split)
        scale, shift = self.norm_out(ts[:b])[:, None].chunk(2, dim=-1)
        out = self.proj_out((1 + scale) * layer_norm(img[:, : h * w]) + shift)
        co = out.shape[-1] // 4
        return out.reshape(b, h, w, co, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, co, height, width)

    def _layered(self, x, timesteps, context, ref_latents):
        if x.dim() != 5 or ref_latents is None:
            raise ValueError(
                "Qwen-Image-Layered takes x [B, 16, layers + 1, h, w] and the input image's ref_latents"
            )
        dt = self.dtype
        b, c, f, height, width = x.shape
        h, w = height // 2, width // 2
        frames = [_pack(x[:, :, i].to(dt)) for i in range(f)]
        img = self.img_in(torch.cat([*frames, _pack(ref_latents.to(dt))], 1))
        e = timestep_embedding(TIME_FACTOR * timesteps.float(), 256).to(dt)
        temb = self.time[1](F.silu(self.time[0](e))) + self.addition_t.cast_params(e)[0][0]  # is_rgb = 0
        ts = F.silu(temb)
        txt = self.txt_in(self.txt_norm(context.to(dt)).to(dt))
        ipos, tpos = layered_positions(
            f, h, w, (ref_latents.shape[-2] // 2, ref_latents.shape[-1] // 2), txt.shape[1]
        )
        pe = rope_table(torch.cat([tpos, ipos]).to(x.device)[None])
        for blk in self.blocks:
            img, txt = self._block(blk, img, txt, ts, pe)
        scale, shift = self.norm_out(ts)[:, None].chunk(2, dim=-1)
        out = self.proj_out((1 + scale) * layer_norm(img[:, : f * h * w]) + shift)
        co = out.shape[-1] // 4
        out = out.reshape(b, f, h, w, co, 2, 2).permute(0, 4, 1, 2, 5, 3, 6)
        return out.reshape(b, co, f, height, width)

    def _block(self, blk: Block, img, txt, ts, pe, split=None):
        b = txt.shape[0]
        im = blk.img.mod(ts)[:, None].chunk(6, dim=-1)  # [B, 1, D] each; Edit 2511 with a reference: [2B, …]
        tm = blk.txt.mod(ts[:b])[:, None].chunk(6, dim=-1)
        iq, ik, iv = (
            t.unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2)
            for t in blk.img.qkv(_modulated(layer_norm(img), im[0], im[1], split))
        )
        tq, tk, tv = (
            t.unflatten(-1, (-1, HEAD_DIM)).transpose(1, 2)
            for t in blk.txt.qkv((1 + tm[1]) * layer_norm(txt) + tm[0])
        )
        iq, ik = blk.img.norm_q(iq).to(iv.dtype), blk.img.norm_k(ik).to(iv.dtype)
        tq, tk = blk.txt.norm_q(tq).to(tv.dtype), blk.txt.norm_k(tk).to(tv.dtype)
        q = rope(torch.cat([tq, iq], 2), pe)
        k = rope(torch.cat([tk, ik], 2), pe)
        o = F.scaled_dot_product_attention(q, k, torch.cat([tv, iv], 2))
        bsz, heads, n, d = o.shape
        o = o.transpose(1, 2).reshape(bsz, n, heads * d)
        nt = txt.shape[1]
        img = img + _gated(im[2], blk.img.out(o[:, nt:]), split)
        txt = txt + tm[2] * blk.txt.out(o[:, :nt])
        img = img + _gated(
            im[5],
            blk.img.mlp_out(
                F.gelu(blk.img.mlp_in(_modulated(layer_norm(img), im[3], im[4], split)), approximate="tanh")
            ),
            split,
        )
        txt = txt + tm[5] * blk.txt.mlp_out(
            F.gelu(blk.txt.mlp_in((1 + tm[4]) * layer_norm(txt) + tm[3]), approximate="tanh")
        )
        return img, txt

    def op_order(self) -> list:
        order = [
            self.img_in,
            *self.time,
            *([self.addition_t] if self.layered else []),
            self.txt_norm,
            self.txt_in,
        ]
        for blk in self.blocks:
            order += blk.ops()
        return [*order, self.norm_out, self.proj_out]


def _modulated(x, shift, scale, split):
    """x·(1 + scale) + shift; with `split` (Edit 2511 with a reference image) the image tokens before it take
    the first B rows of shift and scale (t's), the reference tokens after it the last B (t = 0's) — a
    [B, L, D] result as without, no per-token copies of the modulation."""
    if split is None:
        return (1 + scale) * x + shift
    b = x.shape[0]
    return torch.cat(
        [(1 + scale[:b]) * x[:, :split] + shift[:b], (1 + scale[b:]) * x[:, split:] + shift[b:]], 1
    )


def _gated(gate, y, split):
    """gate · y, the gate split as in `_modulated`."""
    if split is None:
        return gate * y
    b = y.shape[0]
    return torch.cat([gate[:b] * y[:, :split], gate[b:] * y[:, split:]], 1)


def bind_qwen_image(ops: Ops, architecture: str, dtype: torch.dtype) -> QwenImage:
    addition_t = ops.get("time_text_embed.addition_t_embedding")  # Qwen-Image-Layered
    root = ops.get("")
    zero_cond = hasattr(root or object(), "__index_timestep_zero__")  # ComfyUI's marker of Edit 2511
    hidden = wshape(ops["img_in"])[0]
    if hidden % HEAD_DIM:
        raise UnsupportedModel(
            f"{ops.what}: width {hidden} is not a multiple of Qwen-Image's {HEAD_DIM}-wide heads"
        )
    blocks = []
    for i in ops.children("transformer_blocks"):
        p, a = f"transformer_blocks.{i}", f"transformer_blocks.{i}.attn"
        img = Stream(ops[f"{p}.img_mod.1"], Proj(None, parts=(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"])),
                     ops[f"{a}.norm_q"], ops[f"{a}.norm_k"], ops[f"{a}.to_out.0"], ops[f"{p}.img_mlp.net.0.proj"],
                     ops[f"{p}.img_mlp.net.2"])  # fmt: skip
        txt = Stream(ops[f"{p}.txt_mod.1"],
                     Proj(None, parts=(ops[f"{a}.add_q_proj"], ops[f"{a}.add_k_proj"], ops[f"{a}.add_v_proj"])),
                     ops[f"{a}.norm_added_q"], ops[f"{a}.norm_added_k"], ops[f"{a}.to_add_out"],
                     ops[f"{p}.txt_mlp.net.0.proj"], ops[f"{p}.txt_mlp.net.2"])  # fmt: skip
        blocks.append(Block(img, txt))
    te = "time_text_embed.timestep_embedder"
    return QwenImage(
        architecture, ops["img_in"], ops["txt_norm"], ops["txt_in"], (ops[f"{te}.linear_1"], ops[f"{te}.linear_2"]),
        blocks, ops["norm_out.linear"], ops["proj_out"], hidden // HEAD_DIM, dtype, zero_cond, addition_t,
    )  # fmt: skip
