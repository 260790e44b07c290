"""LongCat-Image's (Meituan, 2025) and Ovis-Image's (AIDC, 2025) transformer forward passes, run on the component's own
castable ops. One module serves both: each is FLUX.1's double- and single-stream blocks in diffusers' naming
(engine.denoise.flux: `flux_like_blocks` binds them, `Flux` runs them) without FLUX.1's pooled text vector, and they
differ from each other in three small points. Their releases hold diffusers' own module names (no single-file
converter exists), bare or under the prefix detection accepts.

Architecture facts, from diffusers' `transformer_longcat_image.py`, `transformer_ovis_image.py` and the pipelines
`pipelines/longcat_image`, `pipelines/ovis_image` (read for the facts, written from that description, nothing copied):

* Both: `x_embedder`, a Linear over the packed latent (FLUX.1's 16-channel VAE latent in 2×2 patches: 64 values a
  token); c = the time embedder (linear_1, SiLU, linear_2) of the 256-wide sinusoidal embedding (cosines first) of
  1000·t, with no pooled vector and no guidance embedder (LongCat's pipeline passes a `guidance` its model ignores);
  FLUX.1's blocks, heads of 128 (the QK norms' scale holds it), RoPE on axes (16, 56, 56), theta 10000, over the ids
  of [text; image]; out: `norm_out.linear` (scale, shift), then `proj_out`, still packed [B, L, 64].
* LongCat-Image (meituan-longcat/LongCat-Image; LongCat-Image-Edit's pipeline runs the same class): the time
  embedder under `time_embed.timestep_embedder`; `context_embedder` reads Qwen2.5-VL 7B's last hidden states (3584
  wide, the prompt padded to 512 tokens); its MLPs are FLUX.1's (tanh-GELU).
* Ovis-Image (AIDC-AI/Ovis-Image-7B): the time embedder at the top (`timestep_embedder`); the text states RMS-normed
  (`context_embedder_norm`, eps 1e-6) before `context_embedder` (Ovis 2.5's 2048-wide states, 256 tokens); SwiGLU
  MLPs: `ff.net.0.proj` (and a single block's `proj_mlp`) give [a, g], 2 × 4·hidden wide, and the MLP reads a·SiLU(g)
  (the gate second; FLUX.2's is first).
* Positions (the pipelines' ids): LongCat: text token i at (0, i, i), image token at (1, T + row, T + column) with T
  the prompt's 512 tokens; LongCat-Image-Edit appends the reference image's tokens to the image's, at
  (2, T + row, T + column), and keeps the first L outputs. Ovis: text token i at (0, i, i), image token at
  (0, row, column).

Inputs (diffusers' forward's names): `hidden_states` [B, L, 64] (the packed latent's tokens; an edit's reference
tokens after them), `encoder_hidden_states` [B, T, D] (the text encoder's states), `timestep` [B] in 0–1 (the
pipelines pass the scheduler's t / 1000), `img_ids` [L, 3] and `txt_ids` [T, 3] (one for the whole batch, as diffusers
takes them). Output [B, L, 64]. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .common import Ops, layer_norm, mlp2, rms_norm_with, split_heads, timestep_embedding
from .flux import TIME_FACTOR, Flux, Single, Stream, _attention, flux_like_blocks, rope_table

EPS = 1e-6  # Ovis' context_embedder_norm
# a random step's prompt tokens (the pipelines' padded lengths: LongCat's tokenizer_max_length, Ovis'
# max_sequence_length)
TOKENS = {"longcat_image": 512, "ovis_image": 256}


@dataclass
class LongCatImage(Flux):
    """A bound LongCat-Image transformer: call it with hidden_states [B, L, 64], encoder_hidden_states [B, T, D],
    timestep [B] (0–1), img_ids [L, 3], txt_ids [T, 3]."""

    text_norm: object | None = None  # Ovis' context_embedder_norm
    family = "longcat_image"
    step_inputs = (
        "hidden_states",
        "encoder_hidden_states",
        "timestep",
        "img_ids",
        "txt_ids",
    )  # diffusers' names
    step_optional = ()
    unbatched = ("img_ids", "txt_ids")  # one for the whole batch, as diffusers' forward takes them

    @property
    def vec_dim(self) -> int:
        return 0

    def __call__(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids) -> torch.Tensor:
        dt = self.dtype
        img = self.img_in(hidden_states.to(dt))
        vec = mlp2(self.time_in, timestep_embedding(TIME_FACTOR * timestep.float(), 256).to(dt))
        txt = encoder_hidden_states.to(dt)
        if self.text_norm is not None:
            txt = rms_norm_with(self.text_norm, txt, EPS)
        pe = rope_table(torch.cat([txt_ids, img_ids], dim=0)[None].to(img.device))
        streams = [img, self.txt_in(txt)]
        del img, txt  # engine.denoise.flux.Flux._blocks holds the only references
        return self._blocks(streams, F.silu(vec), pe)

    def positions(self, tokens: int, hp: int, wp: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(txt_ids [T, 3], img_ids [hp·wp, 3]) as the text-to-image pipeline makes them."""
        i = torch.arange(tokens, dtype=torch.float32)
        txt = torch.stack([torch.zeros(tokens), i, i], dim=-1)
        rows, cols = torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing="ij")
        img = torch.stack([torch.ones(hp, wp), rows + tokens, cols + tokens], dim=-1).reshape(-1, 3)
        return txt, img.float()

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """A text-to-image step at width × height pixels (one token per 16 × 16), the pipeline's padded prompt length,
        t in 0–1."""
        from .random_inputs import _latent

        hp, wp = _latent(width, height, 16)
        tokens = TOKENS[self.family]
        txt_ids, img_ids = self.positions(tokens, hp, wp)
        return {
            "hidden_states": torch.randn(batch, hp * wp, self.in_channels, generator=g),
            "encoder_hidden_states": torch.randn(batch, tokens, self.context_dim, generator=g),
            "timestep": torch.rand(batch, generator=g),
            "img_ids": img_ids,
            "txt_ids": txt_ids,
        }

    def step_units(self, inputs: dict) -> int:
        """Image tokens, the batch's (what its activations grow with; engine.stepping)."""
        x = inputs["hidden_states"]
        return x.shape[0] * x.shape[1]

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis); the ids as long as their tokens."""
        tokens, text = got["hidden_states"], got["encoder_hidden_states"]
        return {"hidden_states": (None, None, self.in_channels), "encoder_hidden_states": (None, None, self.context_dim),
                "timestep": (None,), "img_ids": (tokens.shape[1] if tokens.dim() == 3 else None, 3),
                "txt_ids": (text.shape[1] if text.dim() == 3 else None, 3)}  # fmt: skip

    def op_order(self) -> list:
        order = [
            self.img_in,
            *self.time_in,
            *([self.text_norm] if self.text_norm is not None else []),
            self.txt_in,
        ]
        for d in self.doubles:
            order += d.ops()
        for s in self.singles:
            order += s.ops()
        return [*order, self.final_mod, self.final_linear]


def _swiglu(h: torch.Tensor) -> torch.Tensor:
    """diffusers' SwiGLU: [a, g] → a·SiLU(g)."""
    a, gate = h.chunk(2, dim=-1)
    return a * F.silu(gate)


@dataclass
class OvisImage(LongCatImage):
    """A bound Ovis-Image transformer: LongCat-Image's inputs; its text RMS-normed, its MLPs SwiGLU."""

    family = "ovis_image"

    def positions(self, tokens: int, hp: int, wp: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.arange(tokens, dtype=torch.float32)
        rows, cols = torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing="ij")
        img = torch.stack([torch.zeros(hp, wp), rows, cols], dim=-1).reshape(-1, 3)
        return torch.stack([torch.zeros(tokens), i, i], dim=-1), img.float()

    @staticmethod
    def _after(s: Stream, x, attn, m):
        x = x + m[2] * s.proj(attn)
        return x + m[5] * s.mlp_out(_swiglu(s.mlp_in((1 + m[4]) * layer_norm(x) + m[3])))

    def _single_with(self, blk: Single, x, shift, scale, gate, pe, mask=None):
        q, k, v, mlp = blk.linear1((1 + scale) * layer_norm(x) + shift)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        q, k = blk.q_norm(q).to(v.dtype), blk.k_norm(k).to(v.dtype)
        return x + gate * blk.linear2(torch.cat([_attention(q, k, v, pe, mask), _swiglu(mlp)], dim=2))


# -- binding the file's ops -----------------------------------------------------------------------------


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, LongCatImage]:
    """The forward of a LongCat-Image or Ovis-Image transformer (diffusers' names: the releases' own)."""
    ovis = architecture == "ovis_image"
    doubles, singles, heads = flux_like_blocks(ops, architecture)
    time = "timestep_embedder" if ovis else "time_embed.timestep_embedder"
    cls = OvisImage if ovis else LongCatImage
    return "diffusers", cls(
        architecture, ops["x_embedder"], ops["context_embedder"], (ops[f"{time}.linear_1"], ops[f"{time}.linear_2"]),
        None, (), doubles, singles, ops["norm_out.linear"], True, ops["proj_out"], heads, dtype,
        ops["context_embedder_norm"] if ovis else None,
    )  # fmt: skip
