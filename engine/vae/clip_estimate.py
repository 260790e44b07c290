"""Memory a video VAE's encode of a clip will need (engine.vae.estimate's figures for one frame, grown as each
encoder was measured to grow with the frames it holds at once). Torch-free, as engine.vae.estimate."""

from __future__ import annotations

from .estimate import RUNTIME_BYTES, VaeSpec, act_pixels

# A clip's encode against one frame's (K_VIDEO_ENCODE), as (growth per further frame, most): Wan's encoder runs
# chunks of 4 frames (the first alone), its causal state carried (engine.vae.wan), so a clip costs a chunk's
# activations and its cache whatever its length. `bench_vae_encode.py` (dim 16, 512x512, CPU float32, fresh
# processes), peak RSS above the process less the clip's copies: Wan 2.1 1.66x one frame's at 5 frames, 1.74x at
# 9; Wan 2.2 1.4x / 1.64x. HunyuanVideo's encodes up to 17 frames whole (its GroupNorms span them; longer clips
# in diffusers' 17-frame tiles): 4.4x at 5 frames, 7.7x at 9 (widths 32, 512x512, the weights paged in first).
# HunyuanVideo 1.5's runs a first frame alone, then chunks of 4, which cost far more: 8.7x at 5 frames, 12.4x at
# 9, no more at 17. A kind not listed encodes its clip whole: one frame's more for each.
ENCODE_CLIP_GROWTH = {"wan21": (0.2, 1.75), "wan22": (0.2, 1.75), "qwen_image21": (0.0, 1.0)}
ENCODE_CLIP_GROWTH["hunyuan_video"] = (0.85, 1 + 0.85 * 16)
ENCODE_CLIP_GROWTH["hunyuan_video15"] = (2.0, 13.0)
# LTX's runs a first chunk of 9 frames, then 8 at a time with every causal convolution's last 2 input frames
# carried (engine.vae.ltx_encoder): 1.9x one frame's at 9 frames, 3.7x at 17, 4.0x at 25 and after.
ENCODE_CLIP_GROWTH["ltxv"] = ENCODE_CLIP_GROWTH["ltx2"] = (0.35, 4.1)
# Kandinsky 6 SR's (the first frame alone, then 4 at a time, the history carried): 3.0x one frame's at 5 frames,
# 4.1x at 9, 4.3x at 13. Mochi's carries every earlier frame's attention keys and values, so a clip never stops
# growing: 6.4x at 7 frames (256x256), 9.8x at 13 (engine.vae.mochi_encoder).
ENCODE_CLIP_GROWTH["kandinsky6_sr"] = (0.5, 4.5)
ENCODE_CLIP_GROWTH["mochi"] = (0.9, float("inf"))
# MiniMax-H3's (engine.vae.minimax_h3_encoder: 17-frame clips in chunks of 1 + 4 + 4 + 4 + 4 frames): 2.5x one
# frame's at 9 frames, whole (512x512); no more after a chunk.
ENCODE_CLIP_GROWTH["minimax_h3"] = (0.4, 3.0)
# Cosmos 1.0's tokenizer (engine.vae.cosmos_encoder: the first frame alone, then 8 at a time, the middle block's keys
# and values carried): 3.9x one frame's at 9 frames, 4.8x at 17 (the release's widths, 512x512).
ENCODE_CLIP_GROWTH["cosmos_predict1"] = (0.4, 6.0)


def encode_clip_bytes(spec: VaeSpec, pixels: int, frames: int, esize: int, full: bool = True) -> int:
    """A video VAE encoding `frames` frames of `pixels` each: its activations over the frames it holds at
    once, plus the clip itself (float32 in RAM, scaled to the VAE's range, cast to the compute dtype);
    `full`: the runtime and the weights included."""
    growth, most = ENCODE_CLIP_GROWTH.get(spec.kind, (1.0, float(frames)))
    factor = min(1 + growth * (frames - 1), most)
    own = (
        spec.k_act("encode") * act_pixels(spec, "encode", pixels) * factor * esize
        + 3 * frames * pixels * (8 + esize)
        + spec.encode_fixed
    )
    return int(own + (RUNTIME_BYTES + spec.weight_bytes if full else 0))
