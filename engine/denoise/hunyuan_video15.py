"""HunyuanVideo 1.5's transformer (8.3B: text-to-video and image-to-video, 480p / 720p, and the step-distilled
and MeanFlow super-resolution variants), run on the component's own castable ops, in Tencent's, ComfyUI's or
diffusers' naming — HunyuanVideo 1.0's blocks (engine.denoise.hunyuan_video) with 1.5's own inputs.

Architecture facts, from Tencent-Hunyuan/HunyuanVideo-1.5 and diffusers' `HunyuanVideo15Transformer3DModel` (written
from that description, nothing copied):

* x [B, 65, F, H, W]: the 32-channel latent (16× spatial, 4× temporal VAE), a 32-channel condition latent
  (the first frame's for i2v, zeros for t2v) and a mask channel, patched 1×1×1 (`img_in.proj`); 32 channels
  out. Width 2048, 16 heads of 128, 54 double blocks and no single block; RoPE as 1.0's.
* vec = time_in(emb(t)) [+ time_r_in(emb(timestep_r)) for the MeanFlow models]: no pooled text vector and
  no guidance embedder.
* Text: Qwen2.5-VL states [B, T, 3584] through 1.0's token refiner; each text token a padded query of the
  refiner does not see (the mask is on the keys); then `cond_type_embedding` row 0 added.
* Glyph text: byT5 states [B, L, 1472] through `byt5_in` — LayerNorm (affine, eps 1e-5), fc1 (→ 2048), GELU,
  fc2, GELU, fc3 (→ width) —, plus row 1.
* Image (i2v): SigLIP states [B, 729, 1152] through `vision_in.proj` — LayerNorm, Linear, GELU, Linear,
  LayerNorm (eps 1e-5) —, plus row 2. For t2v (no image, or an all-zero one, as its pipeline passes)
  those tokens are left out of every attention.
* Every query attends to the image tokens and to the valid text, glyph and image tokens (their masks): the
  order the pipeline packs them in is immaterial, as no RoPE reaches them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, layer_norm_with, mlp2, timestep_embedding
from .hunyuan_video import HunyuanVideo, _mask
from .hunyuan_video_bind import BYT5, bind_with_own, byt5_project

PATCH = (1, 1, 1)
LN_EPS = 1e-5  # torch's LayerNorm default: the byT5 and image projections' norms
IMAGE_TOKENS = 729  # SigLIP so400m at 384 px: 27 × 27 patches


@dataclass
class HunyuanVideo15(HunyuanVideo):
    """A bound HunyuanVideo 1.5 transformer: call it with x, t, text_states [, text_mask] [, byt5_text_states,
    byt5_text_mask] [, vision_states] [, timestep_r]."""

    cond_type: object = None
    byt5: tuple | None = None  # (LayerNorm, fc1, fc2, fc3)
    vision: tuple | None = None  # (LayerNorm, Linear, Linear, LayerNorm)
    time_r: tuple | None = None
    family = "hunyuan_video15"
    patch = PATCH

    @property
    def byt5_dim(self) -> int:
        from .common import wshape

        return wshape(self.byt5[1])[1] if self.byt5 else 0

    @property
    def image_dim(self) -> int:
        from .common import wshape

        return wshape(self.vision[1])[1] if self.vision else 0

    def __call__(self, x, t, text_states, text_mask=None, byt5_text_states=None, byt5_text_mask=None,
                 vision_states=None, timestep_r=None) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        img, pe = self._patches(x)
        vec = mlp2(self.time_in, timestep_embedding(t.float(), 256).to(dt))
        if self.time_r is not None and timestep_r is not None:
            vec = vec + mlp2(self.time_r, timestep_embedding(timestep_r.float(), 256).to(dt))
        b, dev = x.shape[0], x.device
        mask = _mask(text_mask)
        txt = self._refine(text_states, t, mask)
        rows = self.cond_type.cast_params(txt)[0]  # the three token types' rows: text, glyph, image
        parts, masks = [txt + rows[0]], [_full(text_mask, txt)]
        if self.byt5 is not None and byt5_text_states is not None:
            parts.append(byt5_project(self.byt5, byt5_text_states.to(dt)) + rows[1])
            masks.append(_full(byt5_text_mask, parts[-1]))
        if self.vision is not None:
            n_in, fc1, fc2, n_out = self.vision
            v = (
                vision_states
                if vision_states is not None
                else torch.zeros(b, IMAGE_TOKENS, self.image_dim, device=dev)
            )
            i2v = vision_states is not None and bool((vision_states != 0).any())
            e = (
                layer_norm_with(n_out, fc2(F.gelu(fc1(layer_norm_with(n_in, v.to(dt), LN_EPS)))), LN_EPS)
                + rows[2]
            )
            if i2v:  # t2v: the (zero) image's tokens are in no attention
                parts.insert(0, e)
                masks.insert(0, torch.ones(e.shape[:2], dtype=torch.bool, device=dev))
        keys = torch.cat(masks, dim=1)
        return self._run(x.shape, img, torch.cat(parts, dim=1), None if keys.all() else keys, vec, pe)

    @staticmethod
    def _refiner_mask(mask: torch.Tensor) -> torch.Tensor:
        return mask[:, None, None, :]  # the prompt's tokens, as keys (a padded row is dropped afterwards)

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, *(self.time_r or ()), *self.txt_t, *self.txt_c, self.txt_proj]
        for blk in self.refiner:
            order += blk.ops()
        order += [self.cond_type, *(self.byt5 or ()), *(self.vision or ())]
        for i, s in self.doubles:
            order += [i.mod, s.mod, *i.ops_before_attention(), *s.ops_before_attention(),
                      i.proj, i.mlp_in, i.mlp_out, s.proj, s.mlp_in, s.mlp_out]  # fmt: skip
        for blk in self.singles:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def _full(mask, like: torch.Tensor) -> torch.Tensor:
    """A [B, T] boolean mask of `like`'s tokens (all of them where `mask` is None)."""
    if mask is None:
        return torch.ones(like.shape[:2], dtype=torch.bool, device=like.device)
    return mask.bool()


# (Tencent's / ComfyUI's paths, diffusers' paths) of 1.5's own layers
_OWN = {
    "cond_type": (("cond_type_embedding",), ("cond_type_embed",)),
    "byt5": BYT5,
    "vision": (("vision_in.proj.0", "vision_in.proj.1", "vision_in.proj.3", "vision_in.proj.4"),
               ("image_embedder.norm_in", "image_embedder.linear_1", "image_embedder.linear_2",
                "image_embedder.norm_out")),
    "time_r": (("time_r_in.mlp.0", "time_r_in.mlp.2"),
               ("time_embed.timestep_embedder_r.linear_1", "time_embed.timestep_embedder_r.linear_2")),
}  # fmt: skip


def bind_hunyuan_video15(
    ops: Ops, mods: dict, architecture: str, dtype: torch.dtype
) -> tuple[str, HunyuanVideo15]:
    """(naming, the forward) of a HunyuanVideo 1.5 transformer in any of its three namings."""
    naming, ops, fields, own = bind_with_own(ops, mods, PATCH, _OWN)
    if own["cond_type"] is None:
        raise UnsupportedModel(
            f"{ops.what}: no cond_type_embedding — not a HunyuanVideo 1.5 transformer Loadout can run"
        )
    model = HunyuanVideo15(architecture=architecture, dtype=dtype, **fields, cond_type=own["cond_type"][0],
                           byt5=own["byt5"], vision=own["vision"], time_r=own["time_r"])  # fmt: skip
    if model.vector_in is not None or model.guidance_in is not None:
        raise UnsupportedModel(
            f"{ops.what}: a pooled-text or guidance embedder beside 1.5's layers: not a release"
        )
    return naming, model
