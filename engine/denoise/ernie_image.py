"""ERNIE-Image's transformer forward pass (Baidu, 2026), run on the component's own castable ops. The release's single
files hold diffusers' own module names (`ErnieImageTransformer2DModel`; its single-file converter only strips
`model.diffusion_model.`), so one binder reads both.

Architecture facts, from diffusers' `transformer_ernie_image.py` and `pipelines/ernie_image` (read for the facts,
written from that description, nothing copied):

* Image tokens: `x_embedder.proj`, a patch convolution (1×1 in the release) over the 128-channel latent (FLUX.2's
  32-channel VAE latent packed 2×2 by the pipeline). Text tokens: `text_proj` (bias-free; absent when the text
  features are as wide as the model) of the text encoder's second-to-last hidden states, 2560 wide. One sequence:
  [image, text]; padded text tokens (past each prompt's `text_lens`) are masked out as keys.
* Time: the hidden-wide sinusoidal embedding of t (0–1000, the scheduler's timesteps) with sines first
  (`flip_sin_to_cos=False`) → `time_embedding` (linear_1, SiLU, linear_2) = c. One modulation shared by every block:
  `adaLN_modulation.1`(SiLU(c)) = (shift, scale, gate) for the attention and for the MLP.
* Block (`layers.N`): x += gate_msa · attn((1 + scale_msa)·RMS(x; `adaLN_sa_ln`) + shift_msa), then the same with
  `adaLN_mlp_ln` and the MLP; RMS norms eps 1e-6, the modulation worked in float32.
* Attention: bias-free q / k / v (`self_attention.to_q/k/v`), per-head RMS QK norms (`norm_q` / `norm_k`, eps 1e-6),
  RoPE, bias-free `to_out.0`. MLP: `linear_fc2`(`up_proj`(n) · GELU(`gate_proj`(n))), all bias-free.
* RoPE (theta 256, axes 32 / 48 / 48 = the 128-wide head): angles per axis as pos · theta^(-2i/d); the angle list is
  each angle twice in a row ([a0, a0, a1, a1, …]) applied to the head's halves (x·cos + [−x2, x1]·sin, Megatron's
  non-interleaved form). Positions: image token (text length, row, column), text token i (i, 0, 0).
* Out (image tokens only): (scale, shift) = `final_norm.linear`(c) — no SiLU —, (1 + scale)·LN(x) + shift (affine-free,
  eps 1e-6), `final_linear`, unpatched to [B, C, h, w].

Inputs (diffusers' ErnieImageTransformer2DModel.forward; the release's own forward is not published): `hidden_states`
[B, 128, h, w] (FLUX.2's 32-channel latent packed 2×2, a 16th of the pixels), `timestep` [B] in 0–1000 (the
scheduler's timesteps), `text_bth` [B, T, 2560] (the text encoder's second-to-last hidden states, zero-padded to the
longest prompt) and optionally `text_lens` [B] (each prompt's token count; default all T). A self-described family
(engine.denoise.SELF_DESCRIBED): `bind`, and the model's `step_*` say all of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, held, merge_heads, mlp2, rms_norm_with, split_heads, timestep_embedding, wshape

AXES = (32, 48, 48)
THETA = 256.0
TOKENS = 256  # a random step's prompt tokens
EPS = 1e-6


@dataclass
class Layer:
    """One shared-AdaLN block: its two RMS norms (plain holders of their scale: no name marks them norms), q / k / v
    with their norms, the output, the gated MLP."""

    sa_ln: object
    q: object
    k: object
    v: object
    q_norm: object
    k_norm: object
    o: object
    mlp_ln: object
    gate: object
    up: object
    down: object

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.q_norm, self.k_norm, self.o, self.gate, self.up, self.down]


@dataclass
class ErnieImage:
    """A bound ERNIE-Image transformer: call it with hidden_states [B, C, h, w], timestep [B] (0–1000), text_bth
    [B, T, D] [, text_lens [B]: each prompt's tokens, first; default all T]."""

    architecture: str
    x_embedder: object
    text_proj: object | None
    time_embedding: tuple[object, object]
    modulation: object
    layers: list[Layer]
    final_mod: object
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "ernie_image"
    step_inputs = ("hidden_states", "timestep", "text_bth")  # diffusers' forward's names
    step_optional = ("text_lens",)  # each prompt's tokens, [B]; default: every token

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1]

    @property
    def patch(self) -> int:
        return wshape(self.x_embedder)[2]

    @property
    def hidden(self) -> int:
        return wshape(self.x_embedder)[0]

    @property
    def context_dim(self) -> int:
        return wshape(self.text_proj)[1] if self.text_proj is not None else self.hidden

    def __call__(self, hidden_states, timestep, text_bth, text_lens=None) -> torch.Tensor:
        dt = self.dtype
        b, _, h, w = hidden_states.shape
        p = self.patch
        hp, wp = h // p, w // p
        img = self.x_embedder(hidden_states.to(dt)).flatten(2).transpose(1, 2)  # [B, hp·wp, D]
        txt = text_bth.to(dt)
        if self.text_proj is not None:
            txt = self.text_proj(txt)
        t_len = txt.shape[1]
        lens = torch.full((b,), t_len, device=txt.device) if text_lens is None else text_lens.round().long()
        temb = timestep_embedding(timestep.float(), self.hidden).to(txt.device)
        half = self.hidden // 2  # diffusers' Timesteps(flip_sin_to_cos=False): sines first
        c = mlp2(self.time_embedding, torch.cat([temb[:, half:], temb[:, :half]], dim=-1).to(dt))
        mods = [m[:, None].float() for m in self.modulation(F.silu(c)).chunk(6, dim=-1)]
        x = torch.cat([img, txt], dim=1)
        cos, sin = _rope(_positions(lens, hp, wp, t_len, x.device), x.dtype)
        mask = None
        if bool((lens < t_len).any()):  # padded prompts: their padding is no key
            valid = torch.arange(t_len, device=x.device)[None] < lens[:, None].to(x.device)
            mask = torch.cat([torch.ones(b, hp * wp, dtype=torch.bool, device=x.device), valid], dim=1)[
                :, None, None
            ]
        for layer in self.layers:
            x = self._layer(layer, x, mods, cos, sin, mask)
        scale, shift = self.final_mod(c).chunk(2, dim=-1)
        x = F.layer_norm(x, (x.shape[-1],), eps=EPS) * (1 + scale[:, None]) + shift[:, None]
        out = self.final_linear(x[:, : hp * wp])  # [B, hp·wp, p·p·C]
        c_out = out.shape[-1] // (p * p)
        return out.reshape(b, hp, wp, p, p, c_out).permute(0, 5, 1, 3, 2, 4).reshape(b, c_out, h, w)

    def _layer(self, layer: Layer, x, mods, cos, sin, mask):
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mods
        n = _modulate(_plain_rms(layer.sa_ln, x), scale_a, shift_a)
        x = x + (gate_a * self._attn(layer, n, cos, sin, mask).float()).to(x.dtype)
        n = _modulate(_plain_rms(layer.mlp_ln, x), scale_m, shift_m)
        return x + (gate_m * layer.down(F.gelu(layer.gate(n)) * layer.up(n)).float()).to(x.dtype)

    def _attn(self, layer: Layer, n, cos, sin, mask):
        q, k, v = (split_heads(p(n), self.heads) for p in (layer.q, layer.k, layer.v))
        q, k = rms_norm_with(layer.q_norm, q, EPS), rms_norm_with(layer.k_norm, k, EPS)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        return layer.o(
            merge_heads(F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask))
        )

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """A text-to-image step at width × height pixels (FLUX.2's latent packed 2×2: one patch per 16 pixels),
        TOKENS prompt tokens, t in 0–1000."""
        from .random_inputs import _latent

        h, w = (n * self.patch for n in _latent(width, height, 16))
        return {
            "hidden_states": torch.randn(batch, self.in_channels, h, w, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "text_bth": torch.randn(batch, TOKENS, self.context_dim, generator=g),
        }

    def step_units(self, inputs: dict) -> int:
        """Image tokens, the batch's (what its activations grow with; engine.stepping)."""
        b, _, h, w = inputs["hidden_states"].shape
        return b * (h // self.patch) * (w // self.patch)

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        out = {"hidden_states": (None, self.in_channels, None, None), "timestep": (None,),
               "text_bth": (None, None, self.context_dim)}  # fmt: skip
        if "text_lens" in got:
            out["text_lens"] = (None,)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """Each prompt's token count is a whole number within the text it is given, and the latent whole patches."""
        h, w = got["hidden_states"].shape[-2:]
        if h % self.patch or w % self.patch:
            raise FormatError(
                f"{source}: input hidden_states is {h}×{w}; the model reads {self.patch}×{self.patch} patches"
            )
        lens = got.get("text_lens")
        if (
            lens is not None
            and ((lens != lens.round()) | (lens < 0) | (lens > got["text_bth"].shape[1])).any()
        ):
            raise FormatError(
                f"{source}: input text_lens holds {lens.tolist()}: each prompt's token count in text_bth "
                f"(whole numbers, 0 to {got['text_bth'].shape[1]})"
            )

    def op_order(self) -> list:
        order = [self.x_embedder, *([self.text_proj] if self.text_proj is not None else []), *self.time_embedding,
                 self.modulation]  # fmt: skip
        for layer in self.layers:
            order += layer.ops()
        return [*order, self.final_mod, self.final_linear]


def _plain_rms(holder, x: torch.Tensor) -> torch.Tensor:
    """RMS norm with the scale a plain holder keeps (dequantized where a GGUF holds it as blocks)."""
    w = held(holder, "weight", x.device).to(x.device, x.dtype)
    return F.rms_norm(x, (x.shape[-1],), w, EPS)


def _modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """(1 + scale)·x + shift in float32, cast back (as the release computes it)."""
    return (x.float() * (1 + scale) + shift).to(x.dtype)


def _positions(lens: torch.Tensor, hp: int, wp: int, t_len: int, device) -> torch.Tensor:
    """[B, hp·wp + T, 3]: an image token at (its prompt's length, row, column), text token i at (i, 0, 0)."""
    b = lens.shape[0]
    rows, cols = torch.meshgrid(
        torch.arange(hp, device=device), torch.arange(wp, device=device), indexing="ij"
    )
    grid = torch.stack([rows, cols], dim=-1).reshape(1, -1, 2).float().expand(b, -1, -1)
    img = torch.cat([lens.float().to(device).view(b, 1, 1).expand(-1, hp * wp, 1), grid], dim=-1)
    txt = torch.zeros(b, t_len, 3, device=device)
    txt[..., 0] = torch.arange(t_len, device=device)
    return torch.cat([img, txt], dim=1)


def _rope(pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, 1, S, 128] of the angles [a0, a0, a1, a1, …] over the three axes, worked in float32."""
    angles = []
    for i, d in enumerate(AXES):
        omega = THETA ** (-torch.arange(0, d, 2, dtype=torch.float32, device=pos.device) / d)
        angles.append(pos[..., i, None].float() * omega)
    a = torch.cat(angles, dim=-1).repeat_interleave(2, dim=-1)[:, None]
    return a.cos().to(dtype), a.sin().to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


# -- binding the file's ops -----------------------------------------------------------------------------

_LAYER = ("adaLN_sa_ln", "self_attention.to_q", "self_attention.to_k", "self_attention.to_v", "self_attention.norm_q",
          "self_attention.norm_k", "self_attention.to_out.0", "adaLN_mlp_ln", "mlp.gate_proj", "mlp.up_proj",
          "mlp.linear_fc2")  # fmt: skip
_PLAIN = (
    "adaLN_sa_ln",
    "adaLN_mlp_ln",
)  # the blocks' RMS norms, which the module tree cannot tell from their names


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, ErnieImage]:
    """The forward of an ERNIE-Image transformer (the release's and diffusers' names are one)."""

    def part(path: str):
        if path.rsplit(".", 1)[-1] not in _PLAIN:
            return ops[path]
        m = mods.get(path)
        if m is None or getattr(m, "weight", None) is None:
            raise UnsupportedModel(
                f"{ops.what}: no norm scale {path + '.weight'!r} — not a layout Loadout can run"
            )
        ops.take(m)
        return m

    layers = [Layer(*(part(f"layers.{i}.{n}") for n in _LAYER)) for i in ops.children("layers")]
    if not layers:
        raise UnsupportedModel(f"{ops.what}: no ERNIE-Image layers")
    hidden = wshape(ops["x_embedder.proj"])[0]
    head = wshape(layers[0].k_norm)[0]
    if head != sum(AXES) or hidden % head:
        raise UnsupportedModel(
            f"{ops.what}: head width {head} with hidden size {hidden} — ERNIE-Image's heads are {sum(AXES)} wide "
            f"(RoPE axes {AXES})"
        )
    return "release", ErnieImage(
        architecture, ops["x_embedder.proj"], ops.get("text_proj"),
        (ops["time_embedding.linear_1"], ops["time_embedding.linear_2"]), ops["adaLN_modulation.1"], layers,
        ops["final_norm.linear"], ops["final_linear"], hidden // head, dtype,
    )  # fmt: skip
