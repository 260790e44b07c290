"""Bria FIBO 2's transformer (briaai/Fibo-2.0-dev, 2026), run on the component's own castable ops. The release holds
diffusers' module names (`BriaFibo2Transformer2DModel`), bare or under `model.diffusion_model.`.

Architecture facts, from diffusers' `transformer_bria_fibo2.py` and `pipelines/bria_fibo2` (read for the facts, written
from that description, nothing copied):

* Z-Image's single-stream block (engine.denoise.nextdit: per-head RMS q / k norms, RoPE on interleaved pairs, gated
  SwiGLU, sandwich RMSNorms, eps 1e-5, the modulation Linear of temb with no SiLU) with separate bias-free to_q / k / v.
  The blocks listed as injection blocks (the release: 6, 14, 22, 30, 38) also hold a cross-attention to one bundle of
  text features between the attention and the FFN: x += tanh(`cross_attn_gate`)·RMS(cross(RMS(x), text)), q / k
  RMS-normed, no RoPE, padded text tokens masked.
* Latents [B, 32, h, w] → 2×2 patches, features (channel, row offset, column offset) — channels first, unlike
  Z-Image — → `x_embedder`; the output unpacks the same way.
* Time: t in 0–1 (1 = noise) → the 256-wide sinusoidal embedding (cosines first) of 1000·t → `t_embedder.mlp.0/2`
  (1024 wide inside) = the noisy temb; the same of t = 0 is the clean temb that the gist and context tokens take.
* `noise_refiner`: 2 blocks over the image tokens (and any context image's, which take the clean temb).
* Text: `encoder_hidden_states` [B, 1 + injections, T, 7680]: bundle 0 feeds a Perceiver (`perceiver`): G learned
  queries (`latent_queries`, the first G of 512) through layers of cross-attention to the text, self-attention (no
  RoPE) and an FFN, each pre-RMS-normed and residual without gates, then `norm_out`. G grows with the prompt's length
  n: 256 + (512 − 256)·clamp((n − 256) / (2048 − 256)), rounded up to a multiple of 64. Bundle k feeds the k-th
  injection block.
* One stream: [gist, image, context]; positions (frame, row, column) on axes (32, 48, 48), theta 256: gist token i at
  (1 + i, 0, 0), the image at frame 513 (the queries' count + 1), context image k at frame 514 + k. A batch whose
  prompts give different G pads the gist to the largest, masked, and puts it last ([image, context, gist]).
* Out: (1 + `final_layer.adaLN_modulation.1`(SiLU(temb))) scales LayerNorm(x) (no affine, eps 1e-6), then
  `final_layer.linear`, on the image tokens.

Inputs (diffusers' forward's names): `hidden_states` [B, 32, h, w] (the latent, a 16th of the pixels; h, w even),
`timestep` [B] in 0–1, `encoder_hidden_states` [B, 1 + injections, T, 7680], optionally `encoder_attention_mask`
[B, T] (1 at each prompt's tokens, 0 at its padding) and `context_latents` [B, 32, h', w'] (one image to edit;
diffusers takes a list, and a step file holds one). A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import (
    Ops,
    held,
    held_shape,
    layer_norm,
    merge_heads,
    mlp2,
    rms_norm_with,
    timestep_embedding,
    wshape,
)
from .flux import Proj, rope_table
from .nextdit import NORM_EPS, Block, attention_half, ffn_half, modulation

AXES = (32, 48, 48)
THETA = 256.0
T_SCALE = 1000.0
PATCH = 2
GIST_MIN, GIST_STEP, TEXT_MIN, TEXT_MAX = 256, 64, 256, 2048  # the release's config (no weight says them)
TOKENS = 512  # a random step's prompt tokens


@dataclass
class Cross:
    """An injection block's (or a Perceiver layer's) cross-attention: q of the stream, k / v of the text."""

    norm_in: (
        object  # the pre-norm of the stream (a Perceiver layer's `self_attn_norm` for its self-attention)
    )
    q: object
    k: object
    v: object
    norm_q: object
    norm_k: object
    out: object

    def ops(self) -> list:
        return [self.norm_in, self.q, self.k, self.v, self.norm_q, self.norm_k, self.out]

    def __call__(self, x, text, keys):
        """The attention of RMS(x) to `text` (to itself where None); q / k RMS-normed per head, no RoPE."""
        hd = wshape(self.norm_q)[0]
        n = rms_norm_with(self.norm_in, x, NORM_EPS)
        q = self.q(n).unflatten(-1, (-1, hd)).transpose(1, 2)
        text = n if text is None else text
        k, v = (p(text).unflatten(-1, (-1, hd)).transpose(1, 2) for p in (self.k, self.v))
        q, k = rms_norm_with(self.norm_q, q, NORM_EPS), rms_norm_with(self.norm_k, k, NORM_EPS)
        o = F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v, attn_mask=keys)
        return self.out(merge_heads(o))


@dataclass
class Layer:
    block: Block
    cross: Cross | None = None
    gate_holder: object | None = None  # the block module holding `cross_attn_gate`
    cross_norm2: object | None = None

    def ops(self) -> list:
        b = self.block
        first = [b.mod, b.norm1, *b.qkv.ops(), b.norm_q, b.norm_k, b.out, b.norm2]
        extra = [*self.cross.ops(), self.cross_norm2] if self.cross is not None else []
        return [*first, *extra, b.ffn_norm1, b.w1, b.w3, b.w2, b.ffn_norm2]


@dataclass
class Perceiver:
    holder: object  # `perceiver`, holding latent_queries
    layers: list[
        tuple[Cross, Cross, object, tuple]
    ]  # cross-attention, self-attention, ffn_norm, (w1, w3, w2)
    norm_out: object

    def ops(self) -> list:
        order = []
        for cross, self_attn, fn, ffn in self.layers:
            order += [*cross.ops(), *self_attn.ops(), fn, *ffn]
        return [*order, self.norm_out]

    def __call__(self, text, count: int, text_keys, gist_keys, dtype):
        queries = held(self.holder, "latent_queries", text.device).to(text.device, dtype)
        x = queries[:count][None].expand(text.shape[0], -1, -1)
        for cross, self_attn, fn, (w1, w3, w2) in self.layers:
            x = x + cross(x, text, text_keys)
            x = x + self_attn(x, None, gist_keys)
            f = rms_norm_with(fn, x, NORM_EPS)
            x = x + w2(F.silu(w1(f)) * w3(f))
        return rms_norm_with(self.norm_out, x, NORM_EPS)


def gist_count(n: int, most: int) -> int:
    """The gist tokens a prompt of n tokens gets: from GIST_MIN at TEXT_MIN tokens up to `most` at TEXT_MAX, linearly,
    rounded up to a multiple of GIST_STEP."""
    least = min(GIST_MIN, most)
    share = min(1.0, max(0.0, (n - TEXT_MIN) / (TEXT_MAX - TEXT_MIN)))
    steps = math.ceil((least + share * (most - least)) / GIST_STEP) * GIST_STEP
    return max(least, min(most, steps))


def _grid(frame: int, h: int, w: int) -> torch.Tensor:
    ids = torch.zeros(h, w, 3)
    ids[..., 0] = frame
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(-1, 3)


def _patches(x: torch.Tensor) -> torch.Tensor:
    b, c, h, w = x.shape
    x = x.reshape(b, c, h // PATCH, PATCH, w // PATCH, PATCH).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // PATCH) * (w // PATCH), -1)


@dataclass
class BriaFibo2:
    """A bound Bria FIBO 2 transformer: call it with hidden_states [B, 32, h, w], timestep [B] (0–1),
    encoder_hidden_states [B, 1 + injections, T, D] [, encoder_attention_mask [B, T], context_latents [B, 32, h', w']]."""

    architecture: str
    x_embedder: object
    time: tuple[object, object]
    noise_refiner: list[Layer]
    perceiver: Perceiver
    layers: list[Layer]
    final_mod: object
    final_linear: object
    dtype: torch.dtype = torch.float32
    family = "bria_fibo2"
    step_inputs = ("hidden_states", "timestep", "encoder_hidden_states")
    step_optional = ("encoder_attention_mask", "context_latents")

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1] // (PATCH * PATCH)

    @property
    def context_dim(self) -> int:
        return wshape(self.perceiver.layers[0][0].k)[1]

    @property
    def bundles(self) -> int:
        return 1 + sum(layer.cross is not None for layer in self.layers)

    @property
    def most_gist(self) -> int:
        return held_shape(self.perceiver.holder, "latent_queries")[0]

    def __call__(self, hidden_states, timestep, encoder_hidden_states, encoder_attention_mask=None,
                 context_latents=None) -> torch.Tensor:  # fmt: skip
        dt, dev = self.dtype, hidden_states.device
        b, c, height, width = hidden_states.shape
        h, w = height // PATCH, width // PATCH
        n = h * w
        t = timestep.float().to(dev)
        emb = timestep_embedding(torch.cat([T_SCALE * t, torch.zeros_like(t)]), 256).to(dt)
        temb = mlp2(self.time, emb)  # the B noisy rows, then the B clean ones
        frame = self.most_gist + 1
        tokens, ids = [_patches(hidden_states.to(dt))], [_grid(frame, h, w)]
        if context_latents is not None:
            tokens.append(_patches(context_latents.to(dt)))
            ids.append(_grid(frame + 1, context_latents.shape[2] // PATCH, context_latents.shape[3] // PATCH))
        x = self.x_embedder(torch.cat(tokens, 1))
        pe_img = rope_table(torch.cat(ids)[None].to(dev), AXES, THETA)
        runs = [(0, n, True), (n, x.shape[1], False)] if context_latents is not None else None
        for layer in self.noise_refiner:
            x = self._layer(layer, x, pe_img, temb if runs else temb[:b], None, runs, None, None)

        text = encoder_hidden_states.to(dt)
        t_len = text.shape[2]
        lens = (
            [t_len] * b if encoder_attention_mask is None else [int(m) for m in encoder_attention_mask.sum(1)]
        )
        counts = [gist_count(m, self.most_gist) for m in lens]
        g = max(counts)
        text_keys = (
            None if encoder_attention_mask is None else encoder_attention_mask.bool().to(dev)[:, None, None]
        )
        gist_keep = torch.arange(g)[None] < torch.tensor(counts)[:, None]
        padded = min(counts) < g
        gist = self.perceiver(
            text[:, 0], g, text_keys, gist_keep.to(dev)[:, None, None] if padded else None, dt
        )
        gist_ids = torch.zeros(1, g, 3)
        gist_ids[..., 0] = 1 + torch.arange(g)  # gist token i at (1 + i, 0, 0)
        pe_gist = rope_table(gist_ids.to(dev), AXES, THETA)
        s = x.shape[1]
        if not padded:
            seq, pe, keys, first = torch.cat([gist, x], 1), torch.cat([pe_gist, pe_img], 2), None, g
        else:
            seq, pe, first = torch.cat([x, gist], 1), torch.cat([pe_img, pe_gist], 2), 0
            keys = torch.cat([torch.ones(b, s, dtype=torch.bool), gist_keep], 1).to(dev)[:, None, None]
        total = seq.shape[1]
        runs = [(a, e, noisy) for a, e, noisy in ((0, first, False), (first, first + n, True), (first + n, total, False))
                if e > a]  # fmt: skip
        bundle = 0
        for layer in self.layers:
            txt = None
            if layer.cross is not None:
                bundle += 1
                txt = text[:, bundle]
            seq = self._layer(layer, seq, pe, temb, keys, runs, txt, text_keys)
        scale = 1 + self.final_mod(F.silu(temb[:b]))[:, None]
        out = self.final_linear(layer_norm(seq[:, first : first + n]) * scale)
        return out.reshape(b, h, w, -1, PATCH, PATCH).permute(0, 3, 1, 4, 2, 5).reshape(b, -1, height, width)

    def _layer(self, layer: Layer, x, pe, tmod, keys, runs, text, text_keys):
        apply = modulation(layer.block, tmod, runs)
        x = attention_half(layer.block, x, pe, apply, keys)
        if layer.cross is not None:
            gate = held(layer.gate_holder, "cross_attn_gate", x.device).to(x.device, x.dtype).tanh()
            x = x + gate * rms_norm_with(layer.cross_norm2, layer.cross(x, text, text_keys), NORM_EPS)
        return ffn_half(layer.block, x, apply)

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """A text-to-image step at width × height pixels (the latent a 16th a side), TOKENS prompt tokens."""
        from .random_inputs import _latent

        h, w = (2 * n for n in _latent(width, height, 16))
        return {
            "hidden_states": torch.randn(batch, self.in_channels, h, w, generator=g),
            "timestep": torch.rand(batch, generator=g),
            "encoder_hidden_states": torch.randn(batch, self.bundles, TOKENS, self.context_dim, generator=g),
        }

    def step_units(self, inputs: dict) -> int:
        """The stream's tokens, the batch's (image, context and the most gist tokens)."""
        b, _, h, w = inputs["hidden_states"].shape
        ctx = inputs.get("context_latents")
        extra = 0 if ctx is None else ctx.shape[2] * ctx.shape[3] // (PATCH * PATCH)
        return b * (h * w // (PATCH * PATCH) + extra + self.most_gist)

    def step_shapes(self, got: dict) -> dict:
        b = got["hidden_states"].shape[0] if "hidden_states" in got else None
        out = {"hidden_states": (None, self.in_channels, None, None), "timestep": (b,),
               "encoder_hidden_states": (b, self.bundles, None, self.context_dim)}  # fmt: skip
        if "encoder_attention_mask" in got:
            t_len = got["encoder_hidden_states"].shape[2] if "encoder_hidden_states" in got else None
            out["encoder_attention_mask"] = (b, t_len)
        if "context_latents" in got:
            out["context_latents"] = (b, self.in_channels, None, None)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """Latents of whole patches; a mask of 0s and 1s (its sums are the prompts' lengths, which set the gist)."""
        for name in ("hidden_states", "context_latents"):
            if name in got and any(s % PATCH for s in got[name].shape[-2:]):
                raise FormatError(
                    f"{source}: input {name} is {tuple(got[name].shape[-2:])}: the model reads 2×2 patches"
                )
        m = got.get("encoder_attention_mask")
        if m is not None and not bool(((m == 0) | (m == 1)).all()):
            raise FormatError(
                f"{source}: input encoder_attention_mask must hold 1 at each prompt's tokens and 0 elsewhere"
            )

    def op_order(self) -> list:
        order = [*self.time, self.x_embedder]
        for layer in self.noise_refiner:
            order += layer.ops()
        order += self.perceiver.ops()
        for layer in self.layers:
            order += layer.ops()
        return [*order, self.final_mod, self.final_linear]


def _cross(ops: Ops, p: str, norm: str) -> Cross:
    a = f"{p}.cross_attention"
    return Cross(ops[f"{p}.{norm}"], ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"], ops[f"{a}.norm_q"],
                 ops[f"{a}.norm_k"], ops[f"{a}.to_out.0"])  # fmt: skip


def _block(ops: Ops, p: str) -> Block:
    a = f"{p}.attention"
    return Block(ops[f"{p}.adaLN_modulation.0"], ops[f"{p}.attention_norm1"],
                 Proj(None, parts=tuple(ops[f"{a}.to_{n}"] for n in "qkv")), ops[f"{a}.norm_q"], ops[f"{a}.norm_k"],
                 ops[f"{a}.to_out.0"], ops[f"{p}.attention_norm2"], ops[f"{p}.ffn_norm1"], ops[f"{p}.feed_forward.w1"],
                 ops[f"{p}.feed_forward.w3"], ops[f"{p}.feed_forward.w2"], ops[f"{p}.ffn_norm2"])  # fmt: skip


def _layer(ops: Ops, mods: dict, p: str) -> Layer:
    if f"{p}.cross_attention.to_q" not in ops:
        return Layer(_block(ops, p))
    holder = mods.get(p)
    if holder is None or getattr(holder, "cross_attn_gate", None) is None:
        raise UnsupportedModel(
            f"{ops.what}: {p} has a cross-attention but no cross_attn_gate — not Bria FIBO 2"
        )
    ops.take(holder)
    return Layer(_block(ops, p), _cross(ops, p, "cross_attn_norm1"), holder, ops[f"{p}.cross_attn_norm2"])


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, BriaFibo2]:
    """The forward of a Bria FIBO 2 transformer (the release's names are diffusers')."""
    holder = mods.get("perceiver")
    if holder is None or getattr(holder, "latent_queries", None) is None:
        raise UnsupportedModel(f"{ops.what}: no perceiver.latent_queries — not a Bria FIBO 2 transformer")
    ops.take(holder)
    p_layers = []
    for i in ops.children("perceiver.layers"):
        p = f"perceiver.layers.{i}"
        s = f"{p}.self_attention"
        self_attn = Cross(ops[f"{p}.self_attn_norm"], ops[f"{s}.to_q"], ops[f"{s}.to_k"], ops[f"{s}.to_v"], ops[f"{s}.norm_q"],
                          ops[f"{s}.norm_k"], ops[f"{s}.to_out.0"])  # fmt: skip
        ffn = tuple(ops[f"{p}.ffn.{n}"] for n in ("w1", "w3", "w2"))
        p_layers.append((_cross(ops, p, "cross_attn_norm"), self_attn, ops[f"{p}.ffn_norm"], ffn))
    layers = [_layer(ops, mods, f"layers.{i}") for i in ops.children("layers")]
    if not layers or not p_layers:
        raise UnsupportedModel(
            f"{ops.what}: no layers or no perceiver layers — not a Bria FIBO 2 transformer"
        )
    dim, hd = wshape(ops["x_embedder"])[0], wshape(layers[0].block.norm_q)[0]
    if hd != sum(AXES) or dim % hd:
        raise UnsupportedModel(
            f"{ops.what}: heads {hd} wide in a width of {dim}: Bria FIBO 2's rotary axes {AXES} need {sum(AXES)}"
        )
    return "diffusers", BriaFibo2(
        architecture, ops["x_embedder"], (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]),
        [_layer(ops, mods, f"noise_refiner.{i}") for i in ops.children("noise_refiner")],
        Perceiver(holder, p_layers, ops["perceiver.norm_out"]), layers, ops["final_layer.adaLN_modulation.1"],
        ops["final_layer.linear"], dtype,
    )  # fmt: skip
