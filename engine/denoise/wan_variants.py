"""Wan 2.1 finetunes that change only how the time conditions the blocks, run on engine.denoise.wan's
forward: SkyReels-V2 and AnyFlow.

* SkyReels-V2 (SkyworkAI/SkyReels-V2 `skyreels_v2_infer/modules/transformer.py`; diffusers
  `transformer_skyreels_v2.py`, SkyReelsV2Transformer3DModel with `inject_sample_info`): Wan 2.1's
  network plus `fps_embedding`, an Embedding of two rows (0: 16 fps, 1: 24 fps: the pipelines map the clip's
  frame rate onto them), through `fps_projection` (Linear, SiLU, Linear to 6·dim; diffusers:
  `fps_projection.net.0.proj` / `net.2`), added to the six time modulations of every block (not the
  head's). Its diffusion-forcing models take one timestep per latent frame, t [B, F]: each frame's
  tokens are modulated by their own frame's time, the head too. The input `fps` [B] is that index, as
  the original forward names it. The original and diffusers repeat the fps term over frames with
  `repeat`, which pairs it with the right sample only at batch 1; here each sample gets its own.
  The DF models' asynchronous mode is a pipeline setting, not in the file: frames denoised in blocks of
  `causal_block_size` latent frames, each block's self-attention seeing its own and the earlier blocks'
  frames (diffusers' `_set_ar_attention`, `num_frame_per_block`; cross-attention unmasked). It comes as the
  optional input `causal_block_size` [B] (one whole number dividing the frames); absent or 1, every frame
  sees every other (the synchronous mode, the pipelines' default).
* AnyFlow (diffusers `transformer_anyflow.py`, AnyFlowTransformer3DModel; arXiv 2605.13724): Wan 2.1's
  network whose time embedding mixes a second embedder's (`condition_embedder.delta_embedder`, the flow
  map's target time r): e = (1 − g)·time_embedding(t) + g·delta_embedding(r), g = 0.25, both through the
  same 256-wide sinusoid; e feeds the blocks' modulations and the head. t and r are per latent frame
  ([B, F], or [B] for every frame). g and whether the delta is r or t − r are config, not in the file:
  the released distillations' (g 0.25, delta r) are taken. diffusers lays the latents out [B, F, C, H, W];
  here they stay Wan's [B, C, F, H, W]. AnyFlow-FAR (its compressed context frames through
  `far_patch_embedding` and a block-causal mask) is refused by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .wan import Wan, embed_time, per_frame

ANYFLOW_GATE = 0.25  # AnyFlowTransformer3DModel's gate_value default: the released stage-1 distillations'

# the variants' layers that keep one name in both namings (their projections and AnyFlow's second time
# embedder are renamed with Wan's, engine.lora.family_names.WAN)
DIFFUSERS = {"fps_embedding": "fps_embedding", "far_patch_embedding": "far_patch_embedding"}


def _frame_times(got: dict, name: str) -> tuple:
    t = got.get(name)
    frames = got["x"].shape[2] if got["x"].dim() == 5 else None
    return (None, frames) if t is not None and t.dim() == 2 else (None,)


def block_causal_mask(block_size, frames: int, per_frame: int, device) -> torch.Tensor | None:
    """The self-attention's [N, N] mask (True: attended) for blocks of `block_size` latent frames, each seeing
    itself and the blocks before it; None for blocks of one frame, where nothing is masked."""
    n = 1 if block_size is None else int(block_size.reshape(-1)[0])
    if n <= 1:
        return None
    block = torch.arange(frames, device=device) // n
    seen = block[None, :] <= block[:, None]
    return seen.repeat_interleave(per_frame, 0).repeat_interleave(per_frame, 1)


@dataclass
class SkyReelsV2(Wan):
    """Wan 2.1 with SkyReels-V2's fps conditioning and per-frame timesteps."""

    fps_embedding: object = None
    fps_projection: tuple = ()
    extra_inputs = ("fps",)

    @property
    def optional_inputs(self) -> tuple[str, ...]:
        return (*super().optional_inputs, "causal_block_size")

    def __call__(self, x, t, context, clip_fea=None, fps=None, causal_block_size=None) -> torch.Tensor:
        h = self.patch_embedding(x.to(self.dtype))
        mask = block_causal_mask(causal_block_size, h.shape[2], h.shape[3] * h.shape[4], h.device)
        return self.run(h, t, context, clip_fea, time_inputs={"fps": fps}, self_mask=mask)

    def _time(self, t, dim: int, fps=None):
        e = embed_time(self.time_embedding, t, self.dtype)
        e0 = self.time_projection(F.silu(e)).float().unflatten(1, (6, dim))
        emb = self.fps_embedding(fps.to(e0.device).round().long())
        add = self.fps_projection[1](F.silu(self.fps_projection[0](emb))).float().unflatten(1, (6, dim))
        e0 = e0 + add.repeat_interleave(e0.shape[0] // add.shape[0], dim=0)  # each sample's over its frames
        return per_frame(t, e, e0)

    def shapes_extra(self, got: dict) -> dict:
        block = {"causal_block_size": (None,)} if "causal_block_size" in got else {}
        return {"t": _frame_times(got, "t"), "fps": (None,), **block}

    def check_extra(self, got: dict, source: str) -> None:
        n, frames = got.get("causal_block_size"), got["x"].shape[2]
        if n is not None and not (
            torch.all(n == n[0]) and n[0] >= 1 and n[0] == n[0].round() and frames % int(n[0]) == 0
        ):
            raise UnsupportedModel(
                f"{source}: causal_block_size holds {n.tolist()}; it is one whole number for the batch that divides "
                f"the {frames} latent frames (SkyReels-V2's asynchronous mode; 1: synchronous)"
            )
        rows = self.fps_embedding.weight.shape[0]
        fps = got["fps"]
        if not torch.all((fps == fps.round()) & (fps >= 0) & (fps < rows)):
            raise UnsupportedModel(
                f"{source}: fps holds {fps.tolist()}; SkyReels-V2 takes the index of its frame-rate "
                f"embedding, 0 … {rows - 1} (0: 16 fps, 1: 24 fps), not the rate itself"
            )

    def random_extra(self, out: dict, g) -> dict:
        return {**out, "fps": torch.zeros(out["x"].shape[0])}

    def op_order(self, stem: tuple = (), after_block=None) -> list:
        order = super().op_order(stem, after_block)
        at = order.index(self.time_projection) + 1
        # the Embedding is read whole from the file (ops.FromFile), not streamed: not in the order
        return [*order[:at], *self.fps_projection, *order[at:]]


@dataclass
class AnyFlow(Wan):
    """Wan 2.1 whose time embedding mixes the flow map's target time r (AnyFlow)."""

    delta_embedding: tuple = ()
    extra_inputs = ("r_timestep",)

    def __call__(self, x, t, context, clip_fea=None, r_timestep=None) -> torch.Tensor:
        h = self.patch_embedding(x.to(self.dtype))
        return self.run(h, t, context, clip_fea, time_inputs={"r": r_timestep})

    def _time(self, t, dim: int, r=None):
        g = ANYFLOW_GATE
        e = (1 - g) * embed_time(self.time_embedding, t, self.dtype) + g * embed_time(
            self.delta_embedding, r, self.dtype
        )
        return per_frame(t, e, self.time_projection(F.silu(e)).float().unflatten(1, (6, dim)))

    def shapes_extra(self, got: dict) -> dict:
        return {"t": _frame_times(got, "t"), "r_timestep": _frame_times(got, "t")}  # r as t: [B] or [B, F]

    def random_extra(self, out: dict, g) -> dict:
        return {**out, "r_timestep": out["t"] * torch.rand(out["t"].shape, generator=g)}

    def op_order(self, stem: tuple = (), after_block=None) -> list:
        order = super().op_order(stem, after_block)
        at = order.index(self.time_embedding[1]) + 1
        return [*order[:at], *self.delta_embedding, *order[at:]]


def refuse(ops) -> None:
    """Refuse by name, before Wan's binder reads the blocks, the variants this forward does not compute."""
    if "far_patch_embedding" in ops:
        raise UnsupportedModel(
            f"{ops.what}: AnyFlow-FAR (compressed context frames, block-causal attention) — Loadout runs "
            "AnyFlow's bidirectional model, not FAR's: use the AnyFlow (non-FAR) checkpoint"
        )
    if "delta_embedding.0" in ops and "img_emb.proj.1" in ops:
        # AnyFlow's image tokens join the text in one cross-attention (no k_img / v_img): not Wan 2.1 I2V's
        raise UnsupportedModel(f"{ops.what}: an image-to-video AnyFlow: Loadout runs AnyFlow's text-to-video")


def bind_variant(ops, wan: Wan) -> Wan:
    """`wan` as the variant its file's layers say (or as it is)."""
    fields = {k: getattr(wan, k) for k in wan.__dataclass_fields__}
    if "fps_embedding" in ops:
        return SkyReelsV2(
            **fields, fps_embedding=ops["fps_embedding"],
            fps_projection=(ops["fps_projection.0"], ops["fps_projection.2"]),
        )  # fmt: skip
    if "delta_embedding.0" in ops:
        return AnyFlow(**fields, delta_embedding=(ops["delta_embedding.0"], ops["delta_embedding.2"]))
    return wan
