"""Ideogram 4's flow-matching transformer forward pass (Ideogram, 2026), run on the component's own castable ops. Its
release (ideogram-ai/ideogram-v4's `transformer/` and `unconditional_transformer/`, one layout) holds diffusers' own
module names (`Ideogram4Transformer2DModel`; no single-file converter), bare or under a prefix detection strips.

Architecture facts, from diffusers' `transformer_ideogram4.py` and `pipelines/ideogram4` (read for the facts, written
from that description, nothing copied):

* One packed sequence per item: the prompt's tokens (indicator 3), then the image's (indicator 2; 2×2 patches of the
  32-channel latent, 128 wide, one per 16 pixels), left-padded (indicator 0). Image rows: `input_proj` of the latent
  row; text rows: `llm_cond_proj`(RMS(features; `llm_cond_norm`, eps 1e-6)) of the 13 Qwen3-VL layers' states
  concatenated (53248 wide); every row adds `embed_image_indicator`'s row 1 (image) or 0 (the rest): a 2-entry table
  held as a 2-D weight.
* Time t in 0–1 (1 clean): the sinusoid of 1e4·t (sines first, frequencies 1e4^(−i/(half − 1))) → `t_embedding`
  (mlp_in, SiLU, mlp_out) → `adaln_proj` → SiLU = a, one per item (or per row when t is).
* Block (`layers.N`): (scale, gate, scale', gate') = `adaln_modulation`(a), gates through tanh; x += gate ·
  RMS₂(attn(RMS₁(x)·(1 + scale))) with `attention_norm1/2`, then x += gate' · RMS₄(MLP(RMS₃(x)·(1 + scale'))) with
  `ffn_norm1/2` (eps 1e-5). Attention: bias-free `attention.to_q/k/v`, per-head RMS norms (`norm_q`, `norm_k`, eps
  1e-5), multi-axis RoPE, bias-free `to_out.0`; rows attend only to rows of their segment (`segment_ids`). MLP: SwiGLU
  `feed_forward.w2`(SiLU(`w1`(x)) · `w3`(x)).
* RoPE (theta 5e6, heads of 256, sections (24, 20, 20) — diffusers' default config): frequencies theta^(−2i/256); the
  angle of frequency i is the row's t position but h's for i ≡ 1 (mod 3) and w's for i ≡ 2 (mod 3) below 60; the list
  repeated twice and applied to the head's halves (x·cos + [−x2, x1]·sin). Text rows sit at (i, i, i), image rows at
  65536 + (0, row, column).
* Out (every row; the image rows' are the velocity): `final_layer.linear`(LN(x; eps 1e-6, affine-free) ·
  (1 + `final_layer.adaln_modulation`(SiLU(a)))).

Inputs (diffusers' Ideogram4Transformer2DModel.forward, its packed layout): `hidden_states` [B, L, 128] (zeros on the
text rows), `timestep` [B] or [B, L] in 0–1 (1 − the scheduler's sigma), `encoder_hidden_states` [B, L, 53248] (zeros
on the image rows), `position_ids` [B, L, 3], `segment_ids` [B, L] and `indicator` [B, L]; the output is [B, L, 128].
A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, merge_heads, rms_norm_with, split_heads, wshape

THETA = 5_000_000.0
SECTIONS = (24, 20, 20)  # frequencies of the t, h, w axes (h's and w's interleaved into t's)
IMAGE_OFFSET = 65536  # image positions start here, apart from any text position
TEXT, IMAGE = 3, 2  # the indicator's roles
TOKENS = 256  # a random step's prompt tokens
EPS = 1e-5


@dataclass
class Layer:
    """One block: its modulation, the sandwich norms, the attention and the SwiGLU MLP, in call order."""

    mod: object
    norm1: object
    q: object
    k: object
    v: object
    q_norm: object
    k_norm: object
    o: object
    norm2: object
    ffn_norm1: object
    w1: object
    w3: object
    w2: object
    ffn_norm2: object

    def ops(self) -> list:
        return [self.mod, self.norm1, self.q, self.k, self.v, self.q_norm, self.k_norm, self.o, self.norm2,
                self.ffn_norm1, self.w1, self.w3, self.w2, self.ffn_norm2]  # fmt: skip


@dataclass
class Ideogram4:
    """A bound Ideogram 4 transformer: call it with diffusers' forward's packed inputs (module docstring)."""

    architecture: str
    input_proj: object
    llm_norm: object
    llm_proj: object
    t_mlp: tuple[object, object]
    adaln_proj: object
    indicator_table: object
    layers: list[Layer]
    final_mod: object
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "ideogram4"
    step_inputs = (
        "hidden_states",
        "timestep",
        "encoder_hidden_states",
        "position_ids",
        "segment_ids",
        "indicator",
    )
    step_optional = ()

    @property
    def in_channels(self) -> int:
        return wshape(self.input_proj)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.llm_proj)[1]

    def __call__(self, hidden_states, timestep, encoder_hidden_states, position_ids, segment_ids, indicator):
        dt = self.dtype
        ind = indicator.round().to(hidden_states.device)
        image, text = (ind == IMAGE), (ind == TEXT)
        x = self.input_proj(hidden_states.to(dt)) * image[..., None].to(dt)
        # the text rows alone through the norm and projection (diffusers zeroes the others' after it)
        feats = rms_norm_with(self.llm_norm, encoder_hidden_states.to(x.device)[text].to(dt), 1e-6)
        x = x.index_put((text,), self.llm_proj(feats).to(x.dtype), accumulate=True)
        table, _ = self.indicator_table.cast_params(x)
        x = x + F.embedding(image.long(), table.to(x.dtype))
        a = F.silu(self.adaln_proj(self._time(timestep.to(x.device))))  # [B, 1 or L, adaln]
        cos, sin = _rope(position_ids.to(x.device), x.dtype)
        seg = segment_ids.to(x.device)
        mask = (seg[:, :, None] == seg[:, None, :])[:, None]
        for layer in self.layers:
            x = self._layer(layer, x, a, cos, sin, mask)
        scale = 1 + self.final_mod(F.silu(a))
        return self.final_linear(F.layer_norm(x, (x.shape[-1],), eps=1e-6) * scale)

    def _time(self, t: torch.Tensor) -> torch.Tensor:
        """t_embedding's MLP of the sinusoid of 1e4·t (sines first), [B, 1, D] (or [B, L, D] for a per-row t)."""
        dim = wshape(self.t_mlp[0])[1]
        half = dim // 2
        freqs = torch.exp(
            torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(1e4) / (half - 1))
        )
        args = (1e4 * t.float())[..., None] * freqs
        emb = torch.cat([args.sin(), args.cos()], dim=-1)
        emb = self.t_mlp[1](F.silu(self.t_mlp[0](emb.to(self.dtype))))
        return emb[:, None] if t.dim() == 1 else emb

    def _layer(self, layer: Layer, x, a, cos, sin, mask):
        scale_a, gate_a, scale_m, gate_m = layer.mod(a).chunk(4, dim=-1)
        n = rms_norm_with(layer.norm1, x, EPS) * (1 + scale_a)
        q, k, v = (split_heads(p(n), self.heads) for p in (layer.q, layer.k, layer.v))
        q, k = rms_norm_with(layer.q_norm, q, EPS), rms_norm_with(layer.k_norm, k, EPS)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        o = layer.o(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
        x = x + torch.tanh(gate_a) * rms_norm_with(layer.norm2, o, EPS)
        n = rms_norm_with(layer.ffn_norm1, x, EPS) * (1 + scale_m)
        f = layer.w2(F.silu(layer.w1(n)) * layer.w3(n))
        return x + torch.tanh(gate_m) * rms_norm_with(layer.ffn_norm2, f, EPS)

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """The pipeline's conditional pass at width × height pixels (2×2 patches of the 8× latent: one row per 16
        pixels) with TOKENS prompt tokens and no padding, t in 0–1."""
        from .random_inputs import _latent

        gh, gw = _latent(width, height, 16)
        n = gh * gw
        rows, cols = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        text_pos = torch.arange(TOKENS, dtype=torch.float32)[:, None].expand(-1, 3)
        img_pos = (
            torch.stack([torch.zeros(n), rows.flatten().float(), cols.flatten().float()], dim=1)
            + IMAGE_OFFSET
        )
        return {
            "hidden_states": torch.cat([torch.zeros(batch, TOKENS, self.in_channels),
                                        torch.randn(batch, n, self.in_channels, generator=g)], dim=1),
            "timestep": torch.rand(batch, generator=g),
            "encoder_hidden_states": torch.cat([torch.randn(batch, TOKENS, self.context_dim, generator=g),
                                                torch.zeros(batch, n, self.context_dim)], dim=1),
            "position_ids": torch.cat([text_pos, img_pos])[None].expand(batch, -1, -1).clone(),
            "segment_ids": torch.ones(batch, TOKENS + n),
            "indicator": torch.cat([torch.full((batch, TOKENS), float(TEXT)), torch.full((batch, n), float(IMAGE))], 1),
        }  # fmt: skip

    def step_units(self, inputs: dict) -> int:
        """Rows of the packed sequence, the batch's (what its activations grow with; engine.stepping)."""
        x = inputs["hidden_states"]
        return x.shape[0] * x.shape[1]

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis): every one spans the packed sequence's L rows."""
        x = got.get("hidden_states")
        rows = x.shape[1] if x is not None and x.dim() == 3 else None
        t = got.get("timestep")
        return {"hidden_states": (None, rows, self.in_channels), "encoder_hidden_states": (None, rows, self.context_dim),
                "timestep": (None, rows) if t is not None and t.dim() == 2 else (None,),
                "position_ids": (None, rows, 3), "segment_ids": (None, rows), "indicator": (None, rows)}  # fmt: skip

    def check_extra(self, got: dict, source: str) -> None:
        """The roles and segments are whole numbers, and some row is the image's."""
        for n in ("indicator", "segment_ids"):
            if (got[n] != got[n].round()).any():
                raise FormatError(f"{source}: input {n} holds values that are not whole numbers")
        if not (got["indicator"] == IMAGE).any():
            raise FormatError(
                f"{source}: input indicator marks no image row ({IMAGE}); the output would hold none"
            )

    def op_order(self) -> list:
        order = [
            self.input_proj,
            self.llm_norm,
            self.llm_proj,
            self.indicator_table,
            *self.t_mlp,
            self.adaln_proj,
        ]
        for layer in self.layers:
            order += layer.ops()
        return [*order, self.final_mod, self.final_linear]


def _rope(pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, 1, L, head] of the interleaved multi-axis angles, worked in float32, cast to dtype."""
    head = 2 * _FREQS
    # 1 / theta^(2i/head), rounded as diffusers computes it: image positions near 65536 magnify any difference
    omega = 1.0 / THETA ** (torch.arange(0, head, 2, dtype=torch.float32, device=pos.device) / head)
    per_axis = pos.float()[..., None] * omega  # [B, L, 3, head/2]
    axis = torch.zeros(_FREQS, dtype=torch.long, device=pos.device)
    for i, offset in ((1, 1), (2, 2)):
        axis[offset : 3 * SECTIONS[i] : 3] = i
    a = per_axis.gather(2, axis.view(1, 1, 1, -1).expand(*pos.shape[:2], 1, -1)).squeeze(2)
    a = torch.cat([a, a], dim=-1)[:, None]
    return a.cos().to(dtype), a.sin().to(dtype)


_FREQS = 128  # half of diffusers' default head (256), the width the sections are laid out over


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# -- binding the file's ops -----------------------------------------------------------------------------

_LAYER = ("adaln_modulation", "attention_norm1", "attention.to_q", "attention.to_k", "attention.to_v",
          "attention.norm_q", "attention.norm_k", "attention.to_out.0", "attention_norm2", "ffn_norm1",
          "feed_forward.w1", "feed_forward.w3", "feed_forward.w2", "ffn_norm2")  # fmt: skip


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Ideogram4]:
    """The forward of an Ideogram 4 transformer in diffusers' names (the release's)."""
    layers = [Layer(*(ops[f"layers.{i}.{n}"] for n in _LAYER)) for i in ops.children("layers")]
    if not layers:
        raise UnsupportedModel(f"{ops.what}: no Ideogram 4 layers")
    hidden = wshape(ops["input_proj"])[0]
    head = wshape(layers[0].q_norm)[0]
    if head != 2 * _FREQS or hidden % head:
        raise UnsupportedModel(
            f"{ops.what}: head width {head} with hidden size {hidden} — Ideogram 4's heads are {2 * _FREQS} wide "
            f"(its RoPE sections {SECTIONS} are laid out over them)"
        )
    table = ops["embed_image_indicator"]
    if wshape(table) != (2, hidden):
        raise UnsupportedModel(
            f"{ops.what}: embed_image_indicator is {list(wshape(table))}, not [2, {hidden}]"
        )
    return "diffusers", Ideogram4(
        architecture, ops["input_proj"], ops["llm_cond_norm"], ops["llm_cond_proj"],
        (ops["t_embedding.mlp_in"], ops["t_embedding.mlp_out"]), ops["adaln_proj"], table, layers,
        ops["final_layer.adaln_modulation"], ops["final_layer.linear"], hidden // head, dtype,
    )  # fmt: skip
