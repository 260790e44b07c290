"""Bria 3.2's and Bria FIBO's transformer forward passes (Bria AI), run on the component's own castable ops. Their
releases hold diffusers' own module names (`BriaTransformer2DModel`, `BriaFiboTransformer2DModel`; diffusers has no
single-file converter for them), and their blocks are FLUX.1's in diffusers' naming, so the blocks are
engine.denoise.flux's (`flux_like_blocks`, `Flux._double` / `_single`).

Architecture facts, from diffusers' `transformer_bria.py`, `transformer_bria_fibo.py`, `pipelines/bria` and
`pipelines/bria_fibo` (read for the facts, written from that description, nothing copied):

* What differs from FLUX.1 (diffusers' naming): no pooled text vector and no guidance embedding — the conditioning
  vector is `time_embed.timestep_embedder` (linear_1, SiLU, linear_2) of the 256-wide sinusoidal embedding of t
  itself (cosines first, max period `time_theta` = 10000), t being the scheduler's timestep in 0–1000 (FLUX.1
  embeds 1000·t of a 0–1 t). Image tokens `x_embedder`, text `context_embedder`, RoPE over (16, 56, 56) with theta
  10000 on 128-wide heads, `norm_out` (scale, shift) and `proj_out` as FLUX.1's diffusers layout.
* Bria 3.2: T5-XXL's 4096-wide states, zero-padded to 128 tokens and all attended (no mask); 64 input channels (a
  16-channel 8× latent packed 2×2).
* FIBO: `text_encoder_dim`-wide states of every layer of its text encoder (SmolLM3, 2048 wide) come in beside the
  prompt embedding (its last two layers concatenated, 4096 wide). Before each block — doubles then singles, block
  i in that order — the text stream keeps its first hidden/2 channels and takes `caption_projection.i.linear`
  (bias-free) of layer i's states as its second half; in a single block that is the text part of the joint
  sequence. Padded prompt tokens are masked out as keys (the pipeline's mask over [text, image], image all kept),
  in every block. 48 input channels: Wan 2.2's VAE latent, one token per 16 pixels, unpacked.

Inputs (diffusers' forward's names; FLUX-style packed tokens, ids with a batch axis): `hidden_states` [B, L, C] (the
latent's tokens, row-major), `encoder_hidden_states` [B, T, 4096], `timestep` [B] in 0–1000, `img_ids` [B, L, 3]
(0, row, column) and `txt_ids` [B, T, 3] (zeros in both pipelines); FIBO also `text_encoder_layers` [B, N, T, D]
(one text-encoder layer's states per block, N = doubles + singles: the pipeline's list stacked on axis 1, after it
drops the first layers or repeats the last to make N) and optionally `attention_mask` [B, T] (1 for a prompt
token, 0 for padding; default all 1). A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, layer_norm, mlp2, timestep_embedding, wshape
from .flux import Flux, flux_like_blocks, rope_table

TIME_THETA = 10000.0  # the configs' time_theta (diffusers' default)
TOKENS = {
    "bria": 128,
    "bria_fibo": 512,
}  # a random step's prompt tokens: Bria 3.2's max_sequence_length; a FIBO
# JSON prompt's few hundred


@dataclass
class Bria(Flux):
    """A bound Bria 3.2 transformer: call it with hidden_states [B, L, C], encoder_hidden_states [B, T, D],
    timestep [B] (0–1000), img_ids [B, L, 3], txt_ids [B, T, 3]."""

    family = "bria"
    step_inputs = ("hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids")
    step_optional = ()

    @property
    def vec_dim(self) -> int:
        return 0  # no pooled text vector

    def __call__(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids) -> torch.Tensor:
        return self._run(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids)

    def _run(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, layers=None, mask=None):
        dt = self.dtype
        img = self.img_in(hidden_states.to(dt))
        vec = mlp2(self.time_in, timestep_embedding(timestep.float(), 256, TIME_THETA).to(dt))
        txt = self.txt_in(encoder_hidden_states.to(dt))
        pe = rope_table(torch.cat([txt_ids, img_ids], dim=1))
        vs = F.silu(vec)
        for i, blk in enumerate(self.doubles):
            img, txt = self._double(blk, img, self._caption(i, txt, layers), vs, pe, mask)
        n_txt = txt.shape[1]
        x = torch.cat([txt, img], dim=1)
        del img, txt
        for j, blk in enumerate(self.singles):
            if layers is not None:
                x = torch.cat(
                    [self._caption(len(self.doubles) + j, x[:, :n_txt], layers), x[:, n_txt:]], dim=1
                )
            x = self._single(blk, x, vs, pe, mask)
        scale, shift = self.final_mod(vs).chunk(2, dim=-1)  # diffusers' norm_out: (scale, shift)
        return self.final_linear((1 + scale[:, None]) * layer_norm(x[:, n_txt:]) + shift[:, None])

    def _caption(self, i: int, txt, layers):
        return txt

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """A text-to-image step at width × height pixels (one token per 16 pixels), t in 0–1000."""
        from .random_inputs import _latent

        h, w = _latent(width, height, 16)
        tokens = TOKENS[self.family]
        ids = torch.zeros(h, w, 3)
        ids[..., 1] = torch.arange(h)[:, None]
        ids[..., 2] = torch.arange(w)[None, :]
        return {
            "hidden_states": torch.randn(batch, h * w, self.in_channels, generator=g),
            "encoder_hidden_states": torch.randn(batch, tokens, self.context_dim, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "img_ids": ids.reshape(1, h * w, 3).repeat(batch, 1, 1),
            "txt_ids": torch.zeros(batch, tokens, 3),
        }

    def step_units(self, inputs: dict) -> int:
        """Image tokens, the batch's (what its activations grow with; engine.stepping)."""
        x = inputs["hidden_states"]
        return x.shape[0] * x.shape[1]

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis); the ids as long as the tokens they place."""
        n_img, n_txt = got["hidden_states"].shape[1], got["encoder_hidden_states"].shape[1]
        return {"hidden_states": (None, None, self.in_channels), "encoder_hidden_states": (None, None, self.context_dim),
                "timestep": (None,), "img_ids": (None, n_img, 3), "txt_ids": (None, n_txt, 3)}  # fmt: skip


@dataclass
class BriaFibo(Bria):
    """A bound Bria FIBO transformer: Bria 3.2's inputs and text_encoder_layers [B, N, T, D] [, attention_mask
    [B, T]]."""

    captions: list = field(default_factory=list)
    family = "bria_fibo"
    step_inputs = (*Bria.step_inputs, "text_encoder_layers")
    step_optional = ("attention_mask",)

    @property
    def text_dim(self) -> int:
        return wshape(self.captions[0])[1]

    def __call__(self, hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, text_encoder_layers,
                 attention_mask=None) -> torch.Tensor:  # fmt: skip
        mask = None
        if attention_mask is not None and not bool((attention_mask > 0.5).all()):
            b, n_img = hidden_states.shape[:2]
            keep = torch.ones(b, n_img, dtype=torch.bool, device=attention_mask.device)
            mask = torch.cat([attention_mask > 0.5, keep], dim=1)[:, None, None].to(hidden_states.device)
        return self._run(
            hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, text_encoder_layers, mask
        )

    def _caption(self, i: int, txt, layers):
        half = self.captions[i](layers[:, i].to(self.dtype))
        return torch.cat([txt[..., : txt.shape[-1] - half.shape[-1]], half], dim=-1)

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        out = super().step_random(width, height, batch, g)
        n, tokens = len(self.captions), out["txt_ids"].shape[1]
        return {**out, "text_encoder_layers": torch.randn(batch, n, tokens, self.text_dim, generator=g)}

    def step_shapes(self, got: dict) -> dict:
        out = super().step_shapes(got)
        n_txt = got["encoder_hidden_states"].shape[1]
        out["text_encoder_layers"] = (None, len(self.captions), n_txt, self.text_dim)
        if "attention_mask" in got:
            out["attention_mask"] = (None, n_txt)
        return out

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, self.txt_in]
        for cap, blk in zip(self.captions, [*self.doubles, *self.singles], strict=True):
            order += [cap, *blk.ops()]
        return [*order, self.final_mod, self.final_linear]


# -- binding the file's ops -----------------------------------------------------------------------------


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Bria]:
    """The forward of a Bria 3.2 or FIBO transformer (the release's and diffusers' names are one)."""
    name = "Bria FIBO" if architecture == "bria_fibo" else "Bria 3.2"
    if "x_embedder" not in ops or "time_embed.timestep_embedder.linear_1" not in ops:
        raise UnsupportedModel(
            f"{ops.what}: no x_embedder / time_embed.timestep_embedder — not a {name} layout"
        )
    if ops.has_prefix("guidance_embed"):
        raise UnsupportedModel(
            f"{ops.what}: a guidance embedding (guidance_embed), which no {name} release has — a guidance-distilled "
            "variant Loadout does not run"
        )
    doubles, singles, heads = flux_like_blocks(ops, name)
    te = "time_embed.timestep_embedder"
    common = (architecture, ops["x_embedder"], ops["context_embedder"], (ops[f"{te}.linear_1"], ops[f"{te}.linear_2"]),
              None, (), doubles, singles, ops["norm_out.linear"], True, ops["proj_out"], heads, dtype)  # fmt: skip
    if architecture != "bria_fibo":
        return "diffusers", Bria(*common)
    n = len(doubles) + len(singles)
    found = ops.children("caption_projection")
    if found != list(range(n)):
        raise UnsupportedModel(
            f"{ops.what}: caption projections {found} for {n} blocks — Bria FIBO has one per block "
            "(caption_projection.0 … N-1)"
        )
    captions = [ops[f"caption_projection.{i}.linear"] for i in range(n)]
    if wshape(captions[0])[0] * 2 != wshape(ops["x_embedder"])[0]:
        raise FormatError(
            f"{ops.what}: caption projections {wshape(captions[0])[0]} wide; FIBO's are hidden / 2"
        )
    return "diffusers", BriaFibo(*common, captions)
