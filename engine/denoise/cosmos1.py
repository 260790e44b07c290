"""Cosmos 1.0's transformer (NVIDIA Cosmos-1.0-Diffusion 7B / 14B Text2World and Video2World, a.k.a.
Cosmos-Predict1): Cosmos Predict2's forward (engine.denoise.cosmos) plus learnable position embeddings, in the
file's own naming: NVIDIA's 1.0 release (`blocks.blockN.blocks.{0,1,2}.block…`, under `net.`), diffusers'
(`transformer_blocks.N.attn1`, `learnable_pos_embed`), or Predict2's MiniTrainDIT names with
`extra_pos_embedder` — each renamed onto Predict2's native paths. A self-described family
(engine.denoise.SELF_DESCRIBED).

Architecture facts, from diffusers' `CosmosTransformer3DModel` (`transformer_cosmos.py`, which runs both
generations), its `convert_cosmos_to_diffusers.py` (the Cosmos-1.0 configs and COSMOS_1_0 renames) and NVIDIA's cosmos1 code as
NeMo ships it (`cosmos1/models/diffusion/module/position_embedding.py`, the Cosmos-1.0 Text2World inference
configs: `extra_per_block_abs_pos_emb`, the RoPE extrapolation ratios, a [16, 16, 88, 160] latent); written from
that description, nothing copied:

* The block, time embedding, AdaLN-LoRA modulation, RoPE and final layer are Predict2's (engine.denoise.cosmos).
  NVIDIA's 1.0 names nest each block's three parts: `blocks.0` self-attention, `blocks.1` cross-attention,
  `blocks.2` the MLP (`block.layer1/2`), each with its `adaLN_modulation.1/2` pair; an attention's `to_q` is
  (Linear, per-head RMSNorm), `to_k` likewise, `to_v.0`, `to_out.0`; the time embedding's RMSNorm is
  `affline_norm`.
* Learnable position embeddings `pos_emb_t` [128, D], `pos_emb_h` [120, D], `pos_emb_w` [120, D] (max 128 latent
  frames, 240 × 240 latent px in 2×2 patches): e = t[f] + h[i] + w[j] per token, divided by its RMS (+ 1e-6),
  in float32, then cast to the compute dtype and added to the tokens at the start of EVERY block (diffusers
  adds `extra_pos_emb` in each block's forward; the original's `extra_per_block_abs_pos_emb`; the 14B config's
  `extra_*_extrapolation_ratio` is ignored by its table, which only crops).
* RoPE NTK scales (t, h, w): 7B (2, 1, 1), 14B (2, 2, 2) (the converter's 1.0 configs and NVIDIA's; not in the
  weights). Native size 1280 × 704 px, 121 frames (16 latent frames).
* x: 16 latent channels of Cosmos-Tokenize1-CV8x8x8 (8× spatial and temporal), Video2World a condition-mask
  channel, then the padding mask (zeros): 68 patch inputs for Text2World, 72 for Video2World.
* timesteps: EDM's c_noise = ln(σ) / 4 (diffusers' EDMEulerScheduler); the output is EDM's F, which the
  sampler preconditions (c_skip · x + c_out · F): none of eps, v or flow.
* Kept beside the layers and not computed: RoPE's `pos_embedder.seq` table and EDM's training-only `logvar`
  head (Fourier features and a Linear: the loss weighting's uncertainty).

Inputs (as Predict2's): `x` [B, 16, F, h, w], `timesteps` [B] or [B, F], `context` [B, T, 1024] (T5-XXL states),
Video2World optionally `condition_mask` [B, 1, F, h, w] and `fps` [B].
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields

import torch

from ..errors import UnsupportedModel
from .common import Ops, held
from .cosmos import LATENT, Cosmos, bind_cosmos

MAX_SIZE = (128, 120, 120)  # the position tables' rows: latent frames, and 2x2 patches of 240 latent px
ROPE_SCALE_14B = (2.0, 2.0, 2.0)
ROPE_SCALE = (2.0, 1.0, 1.0)  # 7B (and any other width)
TOKENS = 512  # the 1.0 pipelines' T5 length
EPS = 1e-6
SIGMA = (0.002, 80.0)  # EDM's noise range (random steps draw c_noise from it)


@dataclass
class Cosmos1(Cosmos):
    """A bound Cosmos 1.0 transformer: Predict2's forward with its learnable position embeddings."""

    pos: object = None  # the plain holder of pos_emb_t / _h / _w
    family = "cosmos_predict1"
    step_inputs = ("x", "timesteps", "context")

    @property
    def step_optional(self) -> tuple[str, ...]:
        return ("condition_mask", "fps") if self.video2world else ()

    def _extra_pos(self, f: int, h: int, w: int, device) -> torch.Tensor:
        t_, h_, w_ = (held(self.pos, f"pos_emb_{a}", device).to(device, torch.float32) for a in "thw")
        if f > t_.shape[0] or h > h_.shape[0] or w > w_.shape[0]:
            raise ValueError(
                f"a latent of {f} frames × {2 * h} × {2 * w}: Cosmos 1.0's position embeddings cover at most "
                f"{t_.shape[0]} frames × {2 * h_.shape[0]} × {2 * w_.shape[0]} latent px"
            )
        emb = (t_[:f, None, None] + h_[None, :h, None] + w_[None, None, :w]).reshape(1, f * h * w, -1)
        rms = torch.linalg.vector_norm(emb, dim=-1, keepdim=True) * math.sqrt(1 / emb.shape[-1]) + EPS
        return (emb / rms).to(self.dtype)

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """One latent frame of the 8× tokenizer at width × height, c_noise of a σ drawn log-uniform over EDM's
        range, TOKENS T5 states."""
        from .random_inputs import _latent

        h, w = _latent(width, height, 16)
        lo, hi = (math.log(s) for s in SIGMA)
        return {
            "x": torch.randn(batch, LATENT, 1, 2 * h, 2 * w, generator=g),
            "timesteps": (lo + (hi - lo) * torch.rand(batch, generator=g)) / 4,
            "context": torch.randn(batch, TOKENS, self.context_dim, generator=g),
        }

    def step_units(self, inputs: dict) -> int:
        """2×2 patches of every latent frame, the batch's."""
        b, _, f, h, w = inputs["x"].shape
        return b * f * (h // 2) * (w // 2)

    def step_shapes(self, got: dict) -> dict:
        from .input_shapes import _cosmos_shapes

        return _cosmos_shapes(self, got)


# NVIDIA's 1.0 names -> Predict2's (the inverse of diffusers' COSMOS_1_0 renames composed with its COSMOS_2_0 ones)
_PARTS = ("self_attn", "cross_attn", "mlp")
_ATTN = {"to_q.0": "q_proj", "to_q.1": "q_norm", "to_k.0": "k_proj", "to_k.1": "k_norm", "to_v.0": "v_proj",
         "to_out.0": "output_proj"}  # fmt: skip
_BLOCK = re.compile(r"blocks\.block(\d+)\.blocks\.([012])\.(block\.attn\.|block\.|adaLN_modulation\.)(.*)")
_STEM = {"affline_norm": "t_embedding_norm", "final_layer.adaLN_modulation.1": "final_layer.adaln_modulation.1",
         "final_layer.adaLN_modulation.2": "final_layer.adaln_modulation.2"}  # fmt: skip


def predict2_path(path: str) -> str:
    """A module path in NVIDIA's 1.0 naming as Predict2's MiniTrainDIT names it (others unchanged)."""
    m = _BLOCK.fullmatch(path)
    if m is None:
        return _STEM.get(path, path)
    n, part, kind, rest = int(m[1]), _PARTS[int(m[2])], m[3], m[4]
    if kind == "adaLN_modulation.":
        return f"blocks.{n}.adaln_modulation_{part}.{rest}"
    if kind == "block.attn.":
        return f"blocks.{n}.{part}.{_ATTN.get(rest, rest)}"
    return f"blocks.{n}.{part}.{rest}"  # the MLP's layer1 / layer2


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Cosmos1]:
    """(naming, the forward) of a Cosmos 1.0 transformer in NVIDIA's 1.0, diffusers' or Predict2's naming."""
    nvidia = any(p.startswith("blocks.block") for p in mods)
    if nvidia:
        mods = {predict2_path(p): m for p, m in mods.items()}
        ops = ops.renamed(mods)
    holder = mods.get("extra_pos_embedder") or mods.get("learnable_pos_embed")
    if holder is None or not all(hasattr(holder, f"pos_emb_{a}") for a in "thw"):
        raise UnsupportedModel(
            f"{ops.what}: no learnable position embeddings (`extra_pos_embedder.pos_emb_t/h/w`): not a whole Cosmos "
            "1.0 transformer (a shard of one? load the whole model; a Cosmos Predict2 file steps as cosmos_predict2)"
        )
    ops.take(holder)
    for p in ("logvar", "logvar.0", "logvar.1"):  # EDM's training-only uncertainty head
        if p in mods:
            ops.take(mods[p])
    naming, base = bind_cosmos(ops, mods, architecture, dtype)
    if base.adapter is not None:
        raise UnsupportedModel(f"{ops.what}: an LLM adapter beside Cosmos 1.0's blocks: no known release")
    model = Cosmos1(**{f.name: getattr(base, f.name) for f in fields(base)}, pos=holder)
    model.rope_scale = ROPE_SCALE_14B if base.heads * 128 == 5120 else ROPE_SCALE
    return ("nvidia" if nvidia else naming), model
