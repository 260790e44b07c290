"""Kandinsky 5's transformer forward pass (ai-forever / kandinskylab, 2025-26: T2V / I2V Lite 2B, Pro 19B, Image Lite
6B T2I / I2I), run on the component's own castable ops. The release's files and diffusers' hold the same module names
(`Kandinsky5Transformer3DModel` keeps the original `DiffusionTransformer3D`'s), so one binder reads both.

Architecture facts, from diffusers' `transformer_kandinsky.py` and `pipelines/kandinsky5` (read for the facts, written
from that description, nothing copied), and the original configs (Kandinsky-5 `configs/*.yaml`):

* Visual tokens: the channels-last latent [B, T, H, W, C] cut into (1, 2, 2) patches, each patch's values in
  (t, h, w, channel) order → `visual_embeddings.in_layer`. C is 16 (HunyuanVideo's VAE for video, FLUX.1's for images)
  or, for a model with visual conditioning (`visual_cond`: the video models and I2I), 33: [noise 16 | condition 16 |
  mask 1]. Text tokens: `text_embeddings.in_layer` of Qwen2.5-VL's last hidden states (3584 wide), LayerNorm with
  affine (`.norm`, eps 1e-5).
* Time: the model-wide sinusoidal embedding of t (0–1000, the scheduler's timesteps; cosines first, freqs
  10000^(-i/half)) → `time_embeddings` (in_layer, SiLU, out_layer), plus `pooled_text_embeddings` (in_layer, LayerNorm
  with affine) of CLIP's pooled output (768): c.
* Text blocks (`text_transformer_blocks.N`, 2 or 4): `text_modulation.out_layer`(SiLU(c)) = (shift, scale, gate) ×
  (attention, MLP); x += gate·attn((1 + scale)·LN(x) + shift), then the MLP likewise; LN affine-free, eps 1e-5, the
  modulation and residual worked in float32. Text RoPE: 1-D over the whole head, position i for token i.
* Visual blocks (`visual_transformer_blocks.N`): `visual_modulation.out_layer`(SiLU(c)) = (shift, scale, gate) ×
  (self-attention, cross-attention, MLP); self-attention with 3-D RoPE, cross-attention to the text tokens (no RoPE,
  no mask: every text token is a key).
* Attention: q / k / v / `out_layer` with biases, per-head RMS `query_norm` / `key_norm` (weights, eps float32's
  machine epsilon: torch's RMSNorm default, computed in float32); RoPE on interleaved pairs, then q and k rounded to
  bfloat16 (the original `apply_rotary` and diffusers' both end in `.to(torch.bfloat16)`: the model is that rounding).
  MLP: `feed_forward.out_layer`(GELU(`in_layer`)), bias-free.
* 3-D RoPE: head split into axes (head/4, 3·head/8, 3·head/8) — (16, 24, 24) for Lite's 64-wide heads, (32, 48, 48)
  for Pro's and Image's 128; angles pos · 10000^(-2i/d) / scale_factor[axis], positions the latent frame, row and
  column of the patch grid (what every pipeline passes: aranges). 1-D text RoPE likewise over the whole head.
* Out: (shift, scale) = `out_layer.modulation.out_layer`(SiLU(c)), (1 + scale)·LN(x) + shift (affine-free, eps 1e-5,
  float32), `out_layer.out_layer`, each token's values in (channel, t, h, w) order → [B, T, H, W, 16].

Attention: dense, as diffusers' default config (`attention_type="regular"`) and the 5-second Lite and Image releases
run. Lite's 10-second files and the Pro configs of the original repository use NABLA (a block-sparse mask estimated from
pooled q·k, flex attention on CUDA), which the files do not record and this forward does not compute: on those it gives
the dense attention's output, which NABLA approximates.

Inputs (diffusers' Kandinsky5Transformer3DModel.forward's names): `hidden_states` [B, T, H, W, C] (channels last; T
latent frames, H × W the 8x latent), `encoder_hidden_states` [B, L, 3584], `timestep` [B] (0–1000),
`pooled_projections` [B, 768], and optionally `scale_factor` [B, 3] (RoPE's divisors per axis; default 1, 1, 1, as
diffusers' forward; the video pipelines pass (1, 2, 2) when both sides are 480–854 px, else (1, 3.16, 3.16)). The
positions (`visual_rope_pos`, `text_rope_pos`) are the aranges every pipeline passes. A self-described family
(engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, layer_norm_with, merge_heads, mlp2, split_heads, timestep_embedding, wshape

PATCH = (1, 2, 2)  # every release (configs' patch_size); the weights hold only its product
AXES = {
    64: (16, 24, 24),
    128: (32, 48, 48),
}  # head width -> RoPE axes (config_5s_sft.yaml, k5_pro_*.yaml, config_t2i)
THETA = 10000.0
LN_EPS = 1e-5  # torch's LayerNorm default, which the model's norms keep
QK_EPS = torch.finfo(torch.float32).eps  # torch's RMSNorm default (eps=None) on a float32 input
TOKENS = 256  # a random step's prompt tokens (the video pipelines' max_sequence_length)
IMAGE_WIDTH = (
    2560  # Image Lite's width (engine.detect.kandinsky.K5_SIZES): its pipelines pass scale_factor 1, 1, 1
)


@dataclass
class Attention:
    q: object
    k: object
    v: object
    q_norm: object
    k_norm: object
    o: object

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.q_norm, self.k_norm, self.o]


@dataclass
class Block:
    """A text block (`cross` None) or a visual block: its modulation, attentions and MLP."""

    modulation: object
    attn: Attention
    cross: Attention | None
    ff_in: object
    ff_out: object

    def ops(self) -> list:
        cross = self.cross.ops() if self.cross is not None else []
        return [self.modulation, *self.attn.ops(), *cross, self.ff_in, self.ff_out]


@dataclass
class Kandinsky5:
    """A bound Kandinsky 5 transformer: call it with hidden_states [B, T, H, W, C], encoder_hidden_states [B, L, D],
    timestep [B], pooled_projections [B, P] [, scale_factor [B, 3]]."""

    architecture: str
    visual_in: object
    text_in: tuple[object, object]  # in_layer, norm
    time: tuple[object, object]
    pooled_in: tuple[object, object]
    text_blocks: list[Block]
    visual_blocks: list[Block]
    out_mod: object
    out: object
    head: int
    dtype: torch.dtype = torch.float32
    family = "kandinsky5"
    step_inputs = ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")
    step_optional = ("scale_factor",)  # RoPE's divisors per axis, [B, 3]; default 1, 1, 1

    @property
    def hidden(self) -> int:
        return wshape(self.visual_in)[0]

    @property
    def in_channels(self) -> int:
        return wshape(self.visual_in)[1] // (PATCH[0] * PATCH[1] * PATCH[2])

    @property
    def out_channels(self) -> int:
        return wshape(self.out)[0] // (PATCH[0] * PATCH[1] * PATCH[2])

    @property
    def text_dim(self) -> int:
        return wshape(self.text_in[0])[1]

    @property
    def pooled_dim(self) -> int:
        return wshape(self.pooled_in[0])[1]

    @property
    def heads(self) -> int:
        return self.hidden // self.head

    @property
    def visual_cond(self) -> bool:
        """The latent carries a condition and its mask beside the noise (I2V, I2I, and the video T2V files)."""
        return self.in_channels == 2 * self.out_channels + 1

    def __call__(self, hidden_states, encoder_hidden_states, timestep, pooled_projections, scale_factor=None):
        dt = self.dtype
        b, t, h, w, c = hidden_states.shape
        pt, ph, pw = PATCH
        tp, hp, wp = t // pt, h // ph, w // pw
        x = hidden_states.to(dt).reshape(b, tp, pt, hp, ph, wp, pw, c).permute(0, 1, 3, 5, 2, 4, 6, 7)
        x = self.visual_in(x.reshape(b, tp * hp * wp, -1))  # [B, S, D], tokens in (t, h, w) order
        txt = layer_norm_with(self.text_in[1], self.text_in[0](encoder_hidden_states.to(dt)), LN_EPS)
        temb = timestep_embedding(timestep.float(), self.hidden).to(txt.device)
        pooled = layer_norm_with(self.pooled_in[1], self.pooled_in[0](pooled_projections.to(dt)), LN_EPS)
        cemb = mlp2(self.time, temb.to(dt)) + pooled
        scales = torch.ones(b, 3) if scale_factor is None else scale_factor.float().cpu()
        text_pe = _rope_1d(txt.shape[1], self.head, txt.device)[None, None]  # [1, 1, L, d/2, 2, 2]
        for block in self.text_blocks:
            txt = self._block(block, txt, cemb, text_pe, None)
        pe = _rope_3d((tp, hp, wp), AXES[self.head], scales, x.device)  # [B, 1, S, d/2, 2, 2]
        for block in self.visual_blocks:
            x = self._block(block, x, cemb, pe, txt)
        shift, scale = self.out_mod(F.silu(cemb)).float().chunk(2, dim=-1)
        x = (F.layer_norm(x.float(), (x.shape[-1],), eps=LN_EPS) * (1 + scale[:, None]) + shift[:, None]).to(
            dt
        )
        out = self.out(x).reshape(b, tp, hp, wp, -1, pt, ph, pw)  # each token's values: (channel, t, h, w)
        return out.permute(0, 1, 5, 2, 6, 3, 7, 4).reshape(b, tp * pt, hp * ph, wp * pw, -1)

    def _block(self, block: Block, x, cemb, pe, txt):
        """A text block (txt None: self-attention and MLP) or a visual block (self-, cross-attention, MLP)."""
        mods = block.modulation(F.silu(cemb)).float()[:, None].chunk(6 if txt is None else 9, dim=-1)
        if txt is None:
            mods = mods[:3], mods[3:]  # the text modulation: (shift, scale, gate) for attention, then the MLP
        else:
            mods = mods[:3], mods[3:6], mods[6:]
        x = _residual(x, mods[0], lambda n: self._attn(block.attn, n, n, pe))
        if txt is not None:
            x = _residual(x, mods[1], lambda n: self._attn(block.cross, n, txt, None))
        return _residual(x, mods[-1], lambda n: block.ff_out(F.gelu(block.ff_in(n))))

    def _attn(self, a: Attention, x, ctx, pe):
        q, k, v = (split_heads(p(s), self.heads) for p, s in ((a.q, x), (a.k, ctx), (a.v, ctx)))
        q, k = qk_norm(a.q_norm, q), qk_norm(a.k_norm, k)
        if pe is not None:  # the release rounds the rotated q and k to bfloat16 (see the module's docstring)
            q, k = _rotate(q, pe), _rotate(k, pe)
        return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v.to(q.dtype))))

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """One latent frame at width × height pixels (the 8x VAE latent: one token per 16 pixels), noise in the first
        16 channels and, for a conditioned model, the T2V pipeline's empty condition and mask (zeros); TOKENS prompt
        tokens; the pipelines' RoPE scale for that size (video: (1, 2, 2) at 480–854 px a side, else 3.16; images 1)."""
        from .random_inputs import _latent

        h, w = (n * 2 for n in _latent(width, height, 16))
        x = torch.zeros(batch, 1, h, w, self.in_channels)
        x[..., : self.out_channels] = torch.randn(batch, 1, h, w, self.out_channels, generator=g)
        sides = (480 <= width <= 854) and (480 <= height <= 854)
        s = 1.0 if self.hidden == IMAGE_WIDTH else (2.0 if sides else 3.16)
        return {
            "hidden_states": x,
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.text_dim, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "pooled_projections": torch.randn(batch, self.pooled_dim, generator=g),
            "scale_factor": torch.tensor([[1.0, s, s]]).expand(batch, 3).clone(),
        }

    def step_units(self, inputs: dict) -> int:
        """Visual tokens, the batch's (what its activations grow with; engine.stepping)."""
        b, t, h, w, _ = inputs["hidden_states"].shape
        return b * (t // PATCH[0]) * (h // PATCH[1]) * (w // PATCH[2])

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        out = {"hidden_states": (None, None, None, None, self.in_channels), "encoder_hidden_states": (None, None,
               self.text_dim), "timestep": (None,), "pooled_projections": (None, self.pooled_dim)}  # fmt: skip
        if "scale_factor" in got:
            out["scale_factor"] = (None, 3)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """The latent is whole patches; RoPE's divisors are positive."""
        t, h, w = got["hidden_states"].shape[1:4]
        if t % PATCH[0] or h % PATCH[1] or w % PATCH[2]:
            raise FormatError(
                f"{source}: input hidden_states is {t}×{h}×{w} (frames × height × width); the model reads "
                f"{'×'.join(map(str, PATCH))} patches"
            )
        s = got.get("scale_factor")
        if s is not None and bool((s <= 0).any()):
            raise FormatError(
                f"{source}: input scale_factor holds {s.tolist()}: RoPE's divisors must be positive"
            )

    def op_order(self) -> list:
        order = [self.visual_in, *self.text_in, *self.pooled_in, *self.time]
        for block in (*self.text_blocks, *self.visual_blocks):
            order += block.ops()
        return [*order, self.out_mod, self.out]


def _residual(x: torch.Tensor, mod, f) -> torch.Tensor:
    """x + gate·f((1 + scale)·LN(x) + shift): the norm, modulation and sum in float32, cast back to x's dtype."""
    shift, scale, gate = mod
    n = (F.layer_norm(x.float(), (x.shape[-1],), eps=LN_EPS) * (1 + scale) + shift).to(x.dtype)
    return (x.float() + gate * f(n).float()).to(x.dtype)


def qk_norm(op, x: torch.Tensor) -> torch.Tensor:
    """Per-head RMS norm with the op's weight, in float32 (as the release computes it), cast back."""
    w, _ = op.cast_params(x)
    return F.rms_norm(x.float(), (x.shape[-1],), w.float(), QK_EPS).to(x.dtype)


def _rotate(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """RoPE on interleaved pairs in float32 (`pe` [..., d/2, 2, 2]), rounded to bfloat16 as the release rounds it, then
    to x's dtype."""
    xf = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = pe[..., 0] * xf[..., 0] + pe[..., 1] * xf[..., 1]
    return out.reshape(x.shape).to(torch.bfloat16).to(x.dtype)


def rotations(angles: torch.Tensor) -> torch.Tensor:
    """[..., n] angles -> [..., n, 2, 2] rotations [[cos, -sin], [sin, cos]] (FLUX.1's layout, common.rope's)."""
    cos, sin = angles.cos(), angles.sin()
    return torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*angles.shape, 2, 2)


def rope_freqs(d: int) -> torch.Tensor:
    half = d // 2
    return torch.exp(-torch.log(torch.tensor(THETA)) * torch.arange(half, dtype=torch.float32) / half)


def _rope_1d(n: int, head: int, device) -> torch.Tensor:
    """[n, head/2, 2, 2]: token i's rotations over the whole head."""
    return rotations(torch.outer(torch.arange(n, dtype=torch.float32), rope_freqs(head))).to(device)


def _rope_3d(grid: tuple[int, int, int], axes: tuple[int, ...], scales: torch.Tensor, device) -> torch.Tensor:
    """[B, 1, t·h·w, head/2, 2, 2]: each patch's rotations, (frame, row, column) angles over the three axes, each
    axis' angles divided by the item's scale_factor for it."""
    b = scales.shape[0]
    parts = []
    for i, (n, d) in enumerate(zip(grid, axes, strict=True)):
        a = torch.outer(torch.arange(n, dtype=torch.float32), rope_freqs(d))[None] / scales[:, i, None, None]
        shape = [b, 1, 1, 1, d // 2]
        shape[1 + i] = n
        parts.append(a.reshape(shape).expand(b, *grid, d // 2))
    return rotations(torch.cat(parts, dim=-1).reshape(b, 1, -1, sum(axes) // 2)).to(device)


# -- binding the file's ops -----------------------------------------------------------------------------

_ATTN = ("to_query", "to_key", "to_value", "query_norm", "key_norm", "out_layer")


def check_patches(ops: Ops, family: str) -> None:
    """The patch embedding's inputs and the output layer's values are whole channels of the 1×2×2 patches (Kandinsky
    5's and 6's, as their files are named)."""
    patch = PATCH[0] * PATCH[1] * PATCH[2]
    ins, outs = wshape(ops["visual_embeddings.in_layer"])[1], wshape(ops["out_layer.out_layer"])[0]
    if ins % patch or outs % patch:
        raise UnsupportedModel(
            f"{ops.what}: patch embedding of {ins} and output of {outs} values — not a whole number of channels in "
            f"{family}'s {'×'.join(map(str, PATCH))} patches"
        )


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Kandinsky5]:
    """The forward of a Kandinsky 5 transformer (the release's and diffusers' names are one)."""

    def attn(path: str) -> Attention:
        return Attention(*(ops[f"{path}.{n}"] for n in _ATTN))

    def block(path: str, modulation: str, cross: bool) -> Block:
        return Block(
            ops[f"{path}.{modulation}.out_layer"], attn(f"{path}.self_attention"),
            attn(f"{path}.cross_attention") if cross else None, ops[f"{path}.feed_forward.in_layer"],
            ops[f"{path}.feed_forward.out_layer"],
        )  # fmt: skip

    text = [block(f"text_transformer_blocks.{i}", "text_modulation", False)
            for i in ops.children("text_transformer_blocks")]  # fmt: skip
    visual = [block(f"visual_transformer_blocks.{i}", "visual_modulation", True)
              for i in ops.children("visual_transformer_blocks")]  # fmt: skip
    if not visual:
        raise UnsupportedModel(f"{ops.what}: no Kandinsky 5 visual blocks")
    head = wshape(visual[0].attn.q_norm)[0]
    hidden = wshape(ops["visual_embeddings.in_layer"])[0]
    if head not in AXES or hidden % head:
        raise UnsupportedModel(
            f"{ops.what}: head width {head} with hidden size {hidden} — Kandinsky 5's heads are "
            f"{' or '.join(map(str, AXES))} wide (their RoPE axes {' / '.join(map(str, AXES.values()))})"
        )
    check_patches(ops, "Kandinsky 5")
    return "diffusers", Kandinsky5(
        architecture, ops["visual_embeddings.in_layer"], (ops["text_embeddings.in_layer"], ops["text_embeddings.norm"]),
        (ops["time_embeddings.in_layer"], ops["time_embeddings.out_layer"]),
        (ops["pooled_text_embeddings.in_layer"], ops["pooled_text_embeddings.norm"]), text, visual,
        ops["out_layer.modulation.out_layer"], ops["out_layer.out_layer"], head, dtype,
    )  # fmt: skip
