"""FramePack's transformer (lllyasviel's next-frame-section image-to-video model on HunyuanVideo 1.0), run on the
component's own castable ops — HunyuanVideo's blocks (engine.denoise.hunyuan_video) with FramePack's history
embedders and image projection, in diffusers' naming as its files are (or HunyuanVideo's others).

Architecture facts, from lllyasviel/FramePack `diffusers_helper/models/hunyuan_video_packed.py` and diffusers'
`HunyuanVideoFramepackTransformer3DModel` (written from that description, nothing copied):

* The section being denoised, x [B, 16, F, H, W], is patched as HunyuanVideo's, its RoPE frames at `latent_indices`
  (default 0..F-1).
* History, each optional with its own frame indices: `clean_latents` through `clean_x_embedder.proj` ((1, 2, 2)
  patches); `clean_latents_2x` and `clean_latents_4x`, replicate-padded to whole (2, 4, 4) and (4, 8, 8) cells,
  through `proj_2x` / `proj_4x`. Their RoPE: the full-resolution table at their frame indices, padded the same way
  and averaged over each (2, 2, 2) or (4, 4, 4) cell of (frame, row, column) tokens (cosines and sines averaged,
  as the original does). The image sequence is [4x, 2x, clean, x]; only x's tokens are read out.
* The first frame's SigLIP states [B, 729, 1152] through `image_projection` (up → 3 × width, SiLU, down) come before
  the prompt's tokens in the text sequence, always attended.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .common import mlp2, timestep_embedding
from .flux import rope_table
from .hunyuan_video import AXES, THETA, HunyuanVideo, _mask

HISTORY = ((1, 2, 2), (2, 4, 4), (4, 8, 8))  # the clean, 2x and 4x embedders' kernels (= strides)


@dataclass
class FramePack(HunyuanVideo):
    """A bound FramePack transformer: HunyuanVideo's inputs, and FramePack's image and history ones."""

    clean: tuple | None = None  # proj, proj_2x, proj_4x
    image_proj: tuple | None = None  # up, down
    family = "hunyuan_video"

    def __call__(self, x, t, text_states, text_states_2, guidance=None, text_mask=None, image_embeddings=None,
                 latent_indices=None, clean_latents=None, clean_latent_indices=None, clean_latents_2x=None,
                 clean_latent_2x_indices=None, clean_latents_4x=None, clean_latent_4x_indices=None) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        b, _, f, h, w = x.shape
        gh, gw = h // 2, w // 2
        frames = (
            latent_indices
            if latent_indices is not None
            else torch.arange(f, device=x.device)[None].expand(b, -1)
        )
        img = self.img_in(x.to(dt)).flatten(2).transpose(1, 2)
        pe = self._table(frames, gh, gw)
        n_x = img.shape[1]
        history = ((clean_latents, clean_latent_indices), (clean_latents_2x, clean_latent_2x_indices),
                   (clean_latents_4x, clean_latent_4x_indices))  # fmt: skip
        for (lat, idx), op, kernel in zip(history, self.clean or (None,) * 3, HISTORY, strict=True):
            if lat is None or idx is None or op is None:
                continue
            tokens = op(_pad(lat.to(dt), kernel)).flatten(2).transpose(1, 2)
            table = self._table(idx, gh, gw)
            if kernel != HISTORY[0]:
                table = _pool(
                    table, idx.shape[1], gh, gw, tuple(k // 2 if i else k for i, k in enumerate(kernel))
                )
            img, pe = torch.cat([tokens, img], dim=1), torch.cat([table, pe], dim=2)  # earlier history first
        vec = mlp2(self.time_in, timestep_embedding(t.float(), 256).to(dt))
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError(
                    "this FramePack takes a `guidance` input (1000 × the distilled guidance scale)"
                )
            vec = vec + mlp2(self.guidance_in, timestep_embedding(guidance.float(), 256).to(dt))
        if self.vector_in is not None:
            vec = vec + mlp2(self.vector_in, text_states_2.to(dt))
        mask = _mask(text_mask)
        txt = self._refine(text_states, t, mask)
        if self.image_proj is not None and image_embeddings is not None:
            up, down = self.image_proj
            image = down(F.silu(up(image_embeddings.to(dt))))
            txt = torch.cat([image, txt], dim=1)
            if mask is not None:
                mask = torch.cat([mask.new_ones(b, image.shape[1]), mask], dim=1)
        out = self._run((b, 0, f, h, w), img, txt, mask, vec, pe, keep=n_x)
        return out

    def _table(self, frames: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
        """[B, 1, n·gh·gw, 64, 2, 2]: RoPE at frames × the full-resolution grid of 2×2 patches."""
        b, n = frames.shape
        dev = frames.device
        ids = torch.zeros(b, n, gh, gw, 3, device=dev)
        ids[..., 0] = frames.float()[:, :, None, None]
        ids[..., 1] = torch.arange(gh, device=dev, dtype=torch.float32)[:, None]
        ids[..., 2] = torch.arange(gw, device=dev, dtype=torch.float32)[None, :]
        return rope_table(ids.reshape(b, n * gh * gw, 3), AXES, THETA)

    def op_order(self) -> list:
        order = super().op_order()
        i = order.index(self.img_in) + 1
        order[i:i] = list(self.clean or ())
        j = order.index(self.doubles[0][0].mod) if self.doubles else order.index(self.final_mod)
        order[j:j] = list(self.image_proj or ())
        return order


def _pad(x: torch.Tensor, kernel) -> torch.Tensor:
    """Replicate-pad [B, C, T, H, W] up to whole cells of `kernel`."""
    pads = [(-n) % k for n, k in zip(x.shape[2:], kernel, strict=True)]
    if not any(pads):
        return x
    return F.pad(x, (0, pads[2], 0, pads[1], 0, pads[0]), mode="replicate")


def _pool(table: torch.Tensor, n: int, gh: int, gw: int, cell) -> torch.Tensor:
    """A full-resolution RoPE table averaged over (frame, row, column) cells, as the history tokens are coarser."""
    b = table.shape[0]
    grid = table.reshape(b, n, gh, gw, -1).permute(0, 4, 1, 2, 3)  # [B, 256, n, gh, gw]
    grid = F.avg_pool3d(_pad(grid, cell), cell, stride=cell)
    return grid.flatten(2).transpose(1, 2).reshape(b, 1, -1, *table.shape[-3:])
