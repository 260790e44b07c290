"""Qwen-Image 2.1's VAE: the Wan 2.2 VAE network (engine.vae.wan) with 2-D convolutions, for single images.

Facts, from reading diffusers' AutoencoderKLQwenImage21 (`autoencoder_kl_qwenimage21.py`, Apache-2.0) line by
line against AutoencoderKLWan (`autoencoder_kl_wan.py`) in its Wan 2.2 configuration (is_residual, patch 2,
z 48), and its pipeline (`pipelines/qwenimage21/pipeline_qwenimage21.py`). What differs:
  1. Every "causal 3-D" convolution is an nn.Conv2d (QwenImage21CausalConv3d): 4-D weights [out, in, kh, kw],
     the time axis squeezed away, zero padding in space only, and a feature cache refused -- a decode or an
     encode is one frame. Wan's 3x3x3 causal convolution on a clip's first frame sees two zero frames before
     it, so only its last time slice acts: the 2-D convolution is that network on one frame. Here it is a
     1x3x3 causal convolution (`WanConfig.frame`: no history frames, the 4-D weight viewed as 5-D), so the
     Wan code -- residual levels, chunking, spatial tiles, out-of-memory retries -- runs it unchanged.
  2. The resamples' `time_conv`s are 1x1 (Wan: (3, 1, 1)). On a clip's first frame both skip them
     (upsample3d marks its cache "Rep", downsample3d caches the frame), so for one frame they never run;
     they are loaded (strictly) and left unused.
  3. Configuration: z 64 (Wan 2.2: 48); base_dim 96, decoder_base_dim 144 (Wan 2.2: 160 / 256); dim_mult
     [1, 2, 4, 8, 8] -- four 2x levels, 16x spatial with no patchify (patch_size None; Wan 2.2: patch 2 on
     three levels); temperal_downsample [False, True, True, True] (its scale_factor_temporal 8 means
     nothing for one frame: time_factor 1 here); 4 image channels in and out (RGBA; the pipeline converts
     condition images to RGBA, and Loadout keeps the first three planes of a decode, as for Qwen-Image-Layered).
  4. latents_mean / latents_std: 64 values each (LATENT_FORMATS["qwen_image21"]); the pipeline decodes
     `latents * std + mean` -- VAE space, which is what Loadout's decode takes, as for Wan.
  5. The same: AvgDown3D / DupUp3D shortcuts ("Copied from" Wan's), RMS norms with `gamma` shaped
     [C, 1, 1, 1] (images=False), the middle block's single-head attention within a frame, SiLU (fixed,
     not configurable), the residual decoder's unhalved widths, clamping the output to [-1, 1].
No original (non-diffusers) naming is known: diffusers' single-file converter has no entry for this VAE.
"""

from __future__ import annotations

import torch
from torch import nn


def lift_frame_convs(sd: dict[str, torch.Tensor], model: nn.Module) -> dict[str, torch.Tensor]:
    """The file's 4-D convolution weights as the 1xkxk 5-D weights of the model's causal convolutions (a
    view: no copy); the attention's and the resamples' 2-D convolutions, and everything else, as they are."""
    expected = model.state_dict()
    out = {}
    for k, v in sd.items():
        e = expected.get(k)
        if e is not None and e.dim() == 5 and v.dim() == 4 and e.shape[2] == 1:
            v = v.unsqueeze(2)
        out[k] = v
    return out
