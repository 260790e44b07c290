"""HunyuanImage 2.1's transformer (17B text-to-image, and its guidance- and MeanFlow-distilled variants), run on the
component's own castable ops, in Tencent's, ComfyUI's or diffusers' naming — HunyuanVideo 1.0's double and single
blocks and token refiner (engine.denoise.hunyuan_video) on a 2-D latent.

Architecture facts, from Tencent-Hunyuan/HunyuanImage-2.1 and diffusers' `HunyuanImageTransformer2DModel` (written from
that description, nothing copied):

* x [B, 64, H, W]: the 32× VAE's 64-channel latent, patched 1×1 (`img_in.proj`, a Conv2d) → tokens in (row, column)
  order; width 3584 (28 heads of 128), 20 double and 40 single blocks; 64 channels out.
* RoPE on two axes (row, column) of 64 dimensions each, theta 256, interleaved pairs, on the image tokens only.
* vec = time_in(emb(t)) (t in 0–1000); the MeanFlow model averages it with time_r_in(emb(timestep_r)); the
  guidance-distilled one adds guidance_in(emb(guidance)) (1000 × the scale); no pooled text vector.
* Text: Qwen2.5-VL states [B, T, 3584] through 1.0's token refiner; glyph text: byT5 states [B, L, 1472] through
  `byt5_in` (LayerNorm eps 1e-5, fc1 → 2048, GELU, fc2, GELU, fc3 → width), beside it in the text sequence (no RoPE
  reaches text, so their order is immaterial); every query attends to the image and the valid text tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import UnsupportedModel
from .common import Ops, mlp2, timestep_embedding
from .flux import rope_table
from .hunyuan_video import THETA, HunyuanVideo, _mask
from .hunyuan_video_bind import BYT5, bind_with_own, byt5_project

PATCH = (1, 1)
AXES = (64, 64)
LN_EPS = 1e-5


@dataclass
class HunyuanImage21(HunyuanVideo):
    """A bound HunyuanImage 2.1 transformer: call it with x, t, text_states [, text_mask] [, byt5_text_states,
    byt5_text_mask] [, guidance] [, timestep_r]."""

    byt5: tuple | None = None  # (LayerNorm, fc1, fc2, fc3)
    time_r: tuple | None = None
    family = "hunyuan_image21"
    patch = PATCH

    @property
    def byt5_dim(self) -> int:
        from .common import wshape

        return wshape(self.byt5[1])[1] if self.byt5 else 0

    def __call__(self, x, t, text_states, text_mask=None, byt5_text_states=None, byt5_text_mask=None, guidance=None,
                 timestep_r=None) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        img, pe = self._patches(x)
        vec = mlp2(self.time_in, timestep_embedding(t.float(), 256).to(dt))
        if (
            self.time_r is not None and timestep_r is not None
        ):  # MeanFlow: the mean of the two times' embeddings
            vec = (vec + mlp2(self.time_r, timestep_embedding(timestep_r.float(), 256).to(dt))) / 2
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError("this HunyuanImage takes a `guidance` input (1000 × the guidance scale)")
            vec = vec + mlp2(self.guidance_in, timestep_embedding(guidance.float(), 256).to(dt))
        mask = _mask(text_mask)
        txt = self._refine(text_states, t, mask)
        if self.byt5 is not None and byt5_text_states is not None:
            g = byt5_project(self.byt5, byt5_text_states.to(dt))
            b = x.shape[0]
            glyph = (
                byt5_text_mask.bool()
                if byt5_text_mask is not None
                else torch.ones(g.shape[:2], dtype=torch.bool)
            )
            prompt = mask if mask is not None else torch.ones(txt.shape[:2], dtype=torch.bool)
            txt = torch.cat([g, txt], dim=1)
            mask = torch.cat([glyph.to(x.device).expand(b, -1), prompt.to(x.device)], dim=1)
            mask = None if bool(mask.all()) else mask
        return self._run(x.shape, img, txt, mask, vec, pe)

    def _patches(self, x):
        b, _, h, w = x.shape
        img = self.img_in(x.to(self.dtype)).flatten(2).transpose(1, 2)  # [B, H·W, D], (row, column) order
        grid = torch.meshgrid(
            *(torch.arange(n, device=x.device, dtype=torch.float32) for n in (h, w)), indexing="ij"
        )
        ids = torch.stack(grid, dim=-1).reshape(1, h * w, 2).expand(b, -1, -1)
        return img, rope_table(ids, AXES, THETA)

    def _unpatch(self, out: torch.Tensor, shape) -> torch.Tensor:
        b, _, h, w = shape
        return out.transpose(1, 2).reshape(b, -1, h, w)

    def op_order(self) -> list:
        order = super().op_order()
        extra = [*(self.time_r or ())]
        i = order.index(self.time_in[1]) + 1
        order[i:i] = extra
        j = order.index(self.refiner[-1].fc2) + 1 if self.refiner else order.index(self.txt_proj) + 1
        order[j:j] = list(self.byt5 or ())
        return order


# (Tencent's / ComfyUI's paths, diffusers' paths) of 2.1's own layers
_OWN = {
    "byt5": BYT5,
    "time_r": (("time_r_in.mlp.0", "time_r_in.mlp.2"),
               ("time_guidance_embed.timestep_embedder_r.linear_1", "time_guidance_embed.timestep_embedder_r.linear_2")),
}  # fmt: skip


def bind_hunyuan_image(
    ops: Ops, mods: dict, architecture: str, dtype: torch.dtype
) -> tuple[str, HunyuanImage21]:
    """(naming, the forward) of a HunyuanImage 2.1 transformer in any of its three namings."""
    naming, ops, fields, own = bind_with_own(ops, mods, PATCH, _OWN)
    if fields["vector_in"] is not None:
        raise UnsupportedModel(
            f"{ops.what}: a pooled-text embedder beside HunyuanImage 2.1's layers: not a release"
        )
    return naming, HunyuanImage21(
        architecture=architecture, dtype=dtype, **fields, byt5=own["byt5"], time_r=own["time_r"]
    )
