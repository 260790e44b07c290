"""Qwen-Image 2.1's transformer (one stream of text, condition images and the target, with block-causal attention),
run on the component's own castable ops, in the file's own naming: diffusers' (`img_mlp.gate_layer` / `proj`) or
ComfyUI's (the same names under `model.diffusion_model.`, with the SwiGLU's gate and up rows fused into
`img_mlp.gate_up`, gate first).

Architecture facts, from diffusers' `QwenImage21Transformer2DModel` (`transformer_qwenimage21.py`), its pipeline
(`pipeline_qwenimage21.py`) and `convert_qwen_image21_transformer_checkpoint_to_diffusers` (written from that
description, nothing copied):

* x [B, 64, h, w] latents of its 16× VAE, unpatched: one token per latent pixel in raster order → `img_in` (no bias);
  the output is `proj_out` of the target's tokens, back to [B, 64, h, w]. h and w are even (its pipeline makes them
  2·⌊H/32⌋).
* context [B, T, 4096] Qwen3-VL states of the prompt → `txt_in`: RMSNorm with its weight stored around 0 (scale
  1 + w, float32, eps 1e-6), `in_layer`, tanh-GELU, `out_layer`.
* One sequence: the context's positions in order, each position the VL encoder reserved for an image (`img_mask`)
  standing for 4 latent tokens, which the condition images' tokens fill in order (raster order, image after image);
  then the target's h·w tokens. The context's states at those reserved positions are not used.
* t in 0–1: the 256-wide sinusoidal embedding (cosines first) of 1000·t → `time_text_embed.timestep_embedder`
  (Linear, SiLU, Linear) = temb; `causal_condition` (the release's config): the text and condition-image tokens
  are modulated by the embedding of t = 0, the target's by t's. One `modulation.1`(SiLU(temb)) → (scale₁, gate₁,
  scale₂, gate₂) shared by every block (the blocks hold none).
* Block: x += tanh(gate₁) · attn(LN(x)·(1 + scale₁)); x += tanh(gate₂) · `out`(SiLU(`gate_layer`(y)) · `proj`(y)),
  y = LN(x)·(1 + scale₂); LN without affine, eps 1e-6; 128-wide heads, per-head RMSNorm of q and k (`norm_q`,
  `norm_k`, eps 1e-6), no biases anywhere; in float16 the residual is clipped to ±65504 after each block.
* Attention is block-causal: a query sees key j when j ≤ its own position, or when both are tokens of the same image
  (each condition image and the target is bidirectional inside itself); text is strictly causal; a prompt's padding
  (`context_mask`) is never a key.
* Rotary embedding on interleaved pairs, 3 axes of (16, 56, 56) dims, theta 10000: text tokens advance one position
  on all three axes; an image block sits at the frame position the text before it reached, its rows and columns
  centred on 0 (row r of H at r − (H − H//2)), and moves the position on by max(H, W).
* Out: scale = `norm_out.linear`(SiLU(temb)) (no shift); `proj_out`(LN(x)·(1 + scale)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import ops as castable
from ..errors import FormatError, UnsupportedModel
from .common import (
    Ops,
    held,
    layer_norm,
    merge_heads,
    rms_norm_with,
    rope,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import rope_table

HEAD_DIM = 128
AXES = (16, 56, 56)
THETA = 10000.0
EPS = 1e-6
TIME_FACTOR = 1000.0
SLOT = 4  # latent tokens one VL image slot stands for (a 2×2 group)
TOKENS = 256  # random inputs: the prompt's Qwen3-VL states
OPTIONAL = ("context_mask", "img_mask", "ref_latents")


@dataclass
class Block:
    q: object
    k: object
    v: object
    norm_q: object
    norm_k: object
    o: object
    mlp: tuple  # (gate_layer, proj) or (gate_up,)
    out: object

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.norm_q, self.norm_k, self.o, *self.mlp, self.out]


@dataclass
class Layout:
    """Where everything sits in the one sequence: `text` / `image` the positions of the context's text tokens and of
    the image tokens (condition images', then the target's), `ids` [L, 3] rotary positions, `segments` the
    (start, end, is_text) runs before the target (each condition image its own), `prefix` the target's start."""

    length: int
    text: torch.Tensor
    image: torch.Tensor
    ids: torch.Tensor
    segments: list
    prefix: int


def layout(slots: list[bool], grids: list[tuple[int, int]], target: tuple[int, int]) -> Layout:
    """The sequence of a context whose positions `slots` marks as image slots, condition images of `grids` (h', w')
    filling them in order, and the target's (h, w) grid after them."""
    joint = [p for s in slots for p in ([True] * SLOT if s else [False])] + [True] * (target[0] * target[1])
    n = len(joint)
    frame, rows, cols, segments = [0] * n, [0] * n, [0] * n, []
    cursor = pos = 0
    for i, (gh, gw) in enumerate([*grids, target]):
        try:
            start = joint.index(True, cursor)
        except ValueError:
            raise FormatError("img_mask reserves fewer image slots than the condition images fill") from None
        if start > cursor:
            segments.append((cursor, start, True))
        for j in range(cursor, start):
            frame[j] = rows[j] = cols[j] = pos + j - cursor
        pos += start - cursor
        end = start + gh * gw
        if i < len(grids):
            segments.append((start, end, False))
        for j in range(start, end):
            r, c = divmod(j - start, gw)
            frame[j], rows[j], cols[j] = pos, r - (gh - gh // 2), c - (gw - gw // 2)
        pos += max(gh, gw)
        cursor = end
    if cursor != n or not all(joint[n - target[0] * target[1] :]):
        raise FormatError("img_mask reserves more image slots than the condition images fill")
    mask = torch.tensor(joint)
    ids = torch.tensor([frame, rows, cols], dtype=torch.float32).T
    text, image = (~mask).nonzero()[:, 0], mask.nonzero()[:, 0]
    return Layout(n, text, image, ids, segments, n - target[0] * target[1])


def block_causal(q, k, v, segments: list, prefix: int, keys) -> torch.Tensor:
    """Block-causal attention over [B, H, L, d], exactly, in one SDPA call per segment before the target and one for
    the target: a segment's queries against the keys up to its end (a text segment with a causal triangle over its
    own keys), the target's against every key. Chosen over one call with a boolean [L, L] mask: at 2048² (16 384
    target tokens) that mask is 270 MB a head-broadcast and rules out the flash kernel for the pass that holds nearly
    all of the work, which here runs unmasked (masked only by a padded prompt's keys, `keys` [B, 1, 1, L])."""
    outs = []
    for start, end, is_text in segments:
        mask = None
        if is_text:  # query start + i sees keys 0 … start + i
            mask = torch.ones(end - start, end, dtype=torch.bool, device=q.device).tril(start)
        if keys is not None:
            mask = keys[..., :end] if mask is None else mask & keys[..., :end]
        outs.append(
            F.scaled_dot_product_attention(q[:, :, start:end], k[:, :, :end], v[:, :, :end], attn_mask=mask)
        )
    outs.append(F.scaled_dot_product_attention(q[:, :, prefix:], k, v, attn_mask=keys))
    return torch.cat(outs, dim=2) if len(outs) > 1 else outs[0]


@dataclass
class QwenImage21:
    """A bound Qwen-Image 2.1 transformer: call it with x [B, 64, h, w], timesteps [B] (0–1), context [B, T, 4096]
    and optionally context_mask [B, T], img_mask [B, T], ref_latents [B, (N,) 64, h', w']."""

    architecture: str
    img_in: object
    txt_norm: object
    txt_in: tuple[object, object]
    time: tuple[object, object]
    modulation: object
    blocks: list[Block]
    norm_out: object
    proj_out: object
    dtype: torch.dtype = torch.float32
    family = "qwen_image21"

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_in[0])[1]

    def __call__(
        self, x, timesteps, context, context_mask=None, img_mask=None, ref_latents=None
    ) -> torch.Tensor:
        dt, dev = self.dtype, x.device
        b, c, h, w = x.shape
        refs = _refs(ref_latents)
        slots = [False] * context.shape[1] if img_mask is None else img_mask[0].bool().tolist()
        lay = layout(slots, [tuple(r.shape[-2:]) for r in refs], (h, w))
        tokens = [r.to(dt).flatten(2).transpose(1, 2) for r in refs] + [x.to(dt).flatten(2).transpose(1, 2)]
        img = self.img_in(torch.cat(tokens, 1) if len(tokens) > 1 else tokens[0])
        keep = ~torch.tensor(slots, device=dev)
        txt = self.txt_in[1](
            F.gelu(self.txt_in[0](self._txt_norm(context[:, keep].to(dt))), approximate="tanh")
        )
        seq = img.new_empty(b, lay.length, img.shape[-1])
        seq[:, lay.text.to(dev)] = txt.to(seq.dtype)
        seq[:, lay.image.to(dev)] = img
        del txt, img
        t = TIME_FACTOR * torch.cat(
            [timesteps.float(), timesteps.new_zeros(1).float()]
        )  # t's rows, then t = 0's
        temb = self.time[1](F.silu(self.time[0](timestep_embedding(t, 256).to(dt))))  # [B + 1, D]
        scale1, gate1, scale2, gate2 = self.modulation(F.silu(temb)).chunk(4, dim=-1)
        gate1, gate2 = gate1.tanh(), gate2.tanh()
        pe = rope_table(lay.ids.to(dev)[None], AXES, THETA)
        keys = None
        if context_mask is not None and not bool(context_mask.bool().all()):
            valid = torch.ones(b, lay.length, dtype=torch.bool, device=dev)
            valid[:, lay.text.to(dev)] = context_mask[:, keep].bool()
            keys = valid[:, None, None, :]
        p = lay.prefix
        for blk in self.blocks:
            a = self._attn(blk, _mod(layer_norm(seq), scale1, p), pe, lay, keys)
            seq = seq + _mod(a, gate1, p, gate=True)
            y = _mod(layer_norm(seq), scale2, p)
            seq = seq + _mod(blk.out(_swiglu(blk.mlp, y)), gate2, p, gate=True)
            if seq.dtype == torch.float16:
                seq = seq.clip(-65504, 65504)
        scale = self.norm_out(F.silu(temb))[:b, None]
        out = self.proj_out(layer_norm(seq[:, p:]) * (1 + scale))
        return out.transpose(1, 2).reshape(b, -1, h, w)

    def _txt_norm(self, x):
        """The text projection's RMSNorm: weight 1 + its stored value, in float32 (eps 1e-6)."""
        m = self.txt_norm
        w = (
            m.cast_params(x)[0]
            if isinstance(m, castable.Castable)
            else held(m, "weight", x.device).to(x.device)
        )
        return F.rms_norm(x.float(), (x.shape[-1],), w.float() + 1.0, EPS).to(x.dtype)

    @staticmethod
    def _attn(blk: Block, x, pe, lay: Layout, keys):
        heads = x.shape[-1] // HEAD_DIM
        q, k, v = (split_heads(p(x), heads) for p in (blk.q, blk.k, blk.v))
        q = rope(rms_norm_with(blk.norm_q, q, EPS).to(v.dtype), pe)
        k = rope(rms_norm_with(blk.norm_k, k, EPS).to(v.dtype), pe)
        return blk.o(merge_heads(block_causal(q, k, v, lay.segments, lay.prefix, keys)))

    def op_order(self) -> list:
        order = [self.img_in, self.txt_norm, *self.txt_in, *self.time, self.modulation]
        for blk in self.blocks:
            order += blk.ops()
        return [*order, self.norm_out, self.proj_out]

    # -- its inputs (engine.denoise.inputs' hooks) ---------------------------------------------------------------

    def shapes_extra(self, got: dict) -> dict:
        t = got["context"].shape[1] if got["context"].dim() == 3 else None
        out = {n: (None, t) for n in ("context_mask", "img_mask") if n in got}
        if "ref_latents" in got:
            many = got["ref_latents"].dim() == 5
            out["ref_latents"] = (None, *((None,) if many else ()), self.in_channels, None, None)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        for n in ("x", "ref_latents"):
            if n in got and any(s % 2 for s in got[n].shape[-2:]):
                raise FormatError(
                    f"{source}: input {n} has shape {list(got[n].shape)}: its height and width must be even "
                    "(each of the VL encoder's image slots stands for 2×2 latent tokens)"
                )
        mask = got.get("img_mask")
        if mask is not None and (not ((mask == 0) | (mask == 1)).all() or not (mask == mask[:1]).all()):
            raise FormatError(
                f"{source}: input img_mask must hold 0 and 1, the same in every item (one layout per batch)"
            )
        slots = 0 if mask is None else int(mask[0].sum())
        refs = _refs(got.get("ref_latents"))
        need = sum(r.shape[-2] * r.shape[-1] // SLOT for r in refs)
        if slots != need:
            raise FormatError(
                f"{source}: img_mask marks {slots} image slots; the condition images (ref_latents) fill {need} "
                f"(one slot per 2×2 latent tokens)"
            )

    def random_inputs(self, h: int, w: int, batch: int, g: torch.Generator) -> dict:
        return {
            "x": torch.randn(batch, self.in_channels, h, w, generator=g),
            "timesteps": torch.rand(batch, generator=g),
            "context": torch.randn(batch, TOKENS, self.context_dim, generator=g),
        }


def _refs(ref_latents) -> list:
    """The condition images' latents, one [B, C, h', w'] each, from [B, C, h', w'] or [B, N, C, h', w']."""
    if ref_latents is None:
        return []
    return list(ref_latents.unbind(1)) if ref_latents.dim() == 5 else [ref_latents]


def _mod(x, rows, p: int, gate: bool = False):
    """x·(1 + rows) (or x·rows for a gate), the tokens before `p` (text, condition images) by the last row (t = 0's),
    the target's by each item's own."""
    f = (lambda r: r) if gate else (lambda r: 1 + r)
    if p == 0:
        return x * f(rows[:-1, None])
    return torch.cat([x[:, :p] * f(rows[-1]), x[:, p:] * f(rows[:-1, None])], dim=1)


def _swiglu(mlp: tuple, y):
    if len(mlp) == 1:  # ComfyUI's fused gate_up: gate rows first
        gate, up = mlp[0](y).chunk(2, dim=-1)
    else:
        gate, up = mlp[0](y), mlp[1](y)
    return F.silu(gate) * up


def bind_qwen_image21(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, QwenImage21]:
    """(naming, the forward) of a Qwen-Image 2.1 transformer in diffusers' or ComfyUI's naming."""
    comfy = any(p.endswith("img_mlp.gate_up") for p in mods)
    blocks = []
    for i in ops.children("transformer_blocks"):
        p, a = f"transformer_blocks.{i}", f"transformer_blocks.{i}.attn"
        mlp = (
            (ops[f"{p}.img_mlp.gate_up"],)
            if comfy
            else (ops[f"{p}.img_mlp.gate_layer"], ops[f"{p}.img_mlp.proj"])
        )
        blocks.append(Block(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"], ops[f"{a}.norm_q"],
                            ops[f"{a}.norm_k"], ops[f"{a}.to_out.0"], mlp, ops[f"{p}.img_mlp.out"]))  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no transformer_blocks — not a Qwen-Image 2.1 transformer")
    hidden = wshape(ops["img_in"])[0]
    if hidden % HEAD_DIM or wshape(blocks[0].norm_q)[0] != HEAD_DIM:
        raise UnsupportedModel(f"{ops.what}: width {hidden}: Qwen-Image 2.1's heads are {HEAD_DIM} wide")
    txt_norm = ops.get("txt_in.text_norm")
    if txt_norm is None:
        raise UnsupportedModel(f"{ops.what}: no module 'txt_in.text_norm' — not a layout Loadout can run")
    te = "time_text_embed.timestep_embedder"
    model = QwenImage21(
        architecture, ops["img_in"], txt_norm, (ops["txt_in.in_layer"], ops["txt_in.out_layer"]),
        (ops[f"{te}.linear_1"], ops[f"{te}.linear_2"]), ops["modulation.1"], blocks, ops["norm_out.linear"],
        ops["proj_out"], dtype,
    )  # fmt: skip
    return ("comfyui" if comfy else "diffusers"), model
