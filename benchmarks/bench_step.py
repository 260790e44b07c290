"""A sampling step on the CPU, fully resident and 50 % / 10 % resident with the rest streamed from the disk
tier — against diffusers on the same weights. `--family` picks the model:

  * sd15 (default): the SD1.5 UNet at a 64×64 latent (512×512 pixels);
  * flux: FLUX.1-dev at its real width (3072, 24 heads, MLP 12288, T5 4096 / CLIP 768 inputs) at reduced
    depth (1 double and 2 single blocks: 0.62 B parameters, 2.5 GB) at 256×256 pixels with 512 T5 tokens;
  * wan: Wan 2.1 T2V 1.3B at its real width (1536, 12 heads, FFN 8960, umT5 4096 context) at reduced
    depth (4 blocks) on one 480×480 latent frame (900 tokens) with 512 context tokens;
  * wan_narrow: Wan 2.1 at the 1.3B's full depth (30 blocks) but one 128-wide head (FFN 256) on a
    64×64-pixel frame: ~360 modules of ~70 KB, so a step is almost nothing but the cost each op pays
    around its arithmetic (a streamed module's hand-over included). On a GPU small models are bound by
    that cost (launching, not computing): this is where it shows on a CPU. `make bench-check` runs it.
  * wan_i2v: `wan` with Wan 2.1 I2V's image branch (36 input channels, CLIP image features through
    img_emb, a second attention in every cross-attention) on the same frame, 257 image tokens.
  * wan_animate2: Wan-Animate-2 (Wan 2.1 I2V's network with the in-context self-attention over a driving video's
    keys and values) at the 1.3B's width (1536, 12 heads, FFN 8960) and 4 blocks: two 480×480 latent frames (the
    reference image slot and one frame) and one driving frame, extracted in the first step and cached after.
  * flux2: FLUX.2 [klein] 4B at its real width (3072, 24 heads, SwiGLU 9216, Qwen3 7680-wide text states, no
    guidance) at reduced depth (1 double and 2 single blocks with the three shared modulations: 0.66 B
    parameters, 2.6 GB) at 256×256 pixels with 512 text tokens.
  * flux3: FLUX.3 at its real width (3072, 24 heads of 128, SwiGLU 9216, 20480-wide stacked Qwen3-VL text states)
    at reduced depth (1 per-mode block of each mode and 2 single blocks: 0.86 B parameters, 3.4 GB) at 256×256
    pixels with a 256×256 reference image (its random step: twice the image tokens) and 160 text tokens.
  * lumina2 / qwen_image: Lumina-Image 2.0 (2304 wide, 1 + 1 + 1 blocks) and Qwen-Image (3072 wide, 1 block)
    at their real widths, 512×512.
  * qwen_edit: Qwen-Image-Edit 2511 (`qwen_image` with its t = 0 modulation of the reference image's rows) at
    512×512 with a 512×512 reference image (twice the image tokens).
  * auraflow: AuraFlow v0.3 / Pony V7 at its real width (3072, 12 heads of 256, SwiGLU 8192, Pile-T5-XL's
    2048-wide states, its 64×64 position grid) at 1 double and 2 single blocks, 512×512, 256 text tokens.
  * hunyuan_video: HunyuanVideo 1.0 at its real width (3072, 24 heads, MLP 12288, llava 4096-wide text
    states through its 2-block token refiner, CLIP-L 768 pooled, guidance) at 1 double and 2 single blocks,
    one 256×256 latent frame, 256 text tokens.
  * hunyuan_video15: HunyuanVideo 1.5 at its real width (2048, 16 heads, Qwen2.5-VL 3584 text, byT5 and SigLIP
    projections) at 2 double blocks, one 512×512 frame (its 16× VAE: 1024 tokens), t2v.
  * ltxv: LTX-Video 2B at its real width (2048, 32 heads of 64, T5 4096 text) at 2 blocks, one 1024×1024 frame
    (its 32× VAE: 1024 tokens), 128 text tokens.
  * cosmos: Cosmos Predict2 2B Text2Image at its real width (2048, 16 heads, T5 1024 text, AdaLN-LoRA 256) at 2
    blocks, 512×512 (1024 tokens), 512 text tokens.
  * cosmos1: Cosmos 1.0 7B Text2World at its real width (4096, 32 heads, T5 1024 text, learnable position
    embeddings) at 2 of its 28 blocks, 512×512 (1024 tokens), 512 text tokens.
  * krea2: Krea 2 at its real width (6144, 48 heads on 12 K/V heads, SwiGLU 16384, a fusion of 12 Qwen3-VL
    2560-wide layers) at 1 block, 512×512 (1024 tokens), 256 text tokens.
  * mochi: Mochi 1 at its real width (visual 3072: 24 heads of 128, SwiGLU 8192; text 1536; T5-XXL 4096 through
    the attention pool) at 2 of its 48 blocks (the last leaving the text as it is), one 848×480 latent frame
    (1590 tokens), 256 T5 tokens.
  * bria / bria_fibo: Bria 3.2 and Bria FIBO at their real width (3072, 24 heads of 128, FLUX.1's blocks, 4096-wide
    text; FIBO a 2048-wide text-encoder layer per block) at 1 + 2 of their 19 + 38 blocks, 512×512 pixels (1024
    image tokens) with 128 (FIBO: 512) text tokens.
  * ernie_image: ERNIE-Image at its real width (3072, 24 heads of 128, a GELU-gated MLP of 8192, 2560-wide text)
    at 2 of its 24 layers (0.33 B parameters, 1.3 GB) at 512×512 pixels (1024 image tokens) with 256 text tokens.
  * glm_image: GLM-Image at its real width (2560, 64 heads of 40, a 4x MLP, 1472-wide glyph states, the prior's
    16384-token codebook) at 2 of its 30 blocks, 512×512 pixels (1024 image tokens) with 64 glyph tokens.
  * ideogram4: Ideogram 4 at its real width (4608, 18 heads of 256, SwiGLU 12288, 53248-wide text features) at 1 of
    its 34 layers, 512×512 pixels (1024 image rows) after 256 prompt rows.
  * nucleus_image: NucleusMoE-Image at its real width (2048, 16 heads of 128 over 4 key heads, 64 experts of 1344 and a
    shared one, Qwen3-VL's 4096-wide text) at 1 dense + 1 MoE of its 3 + 29 blocks, 512×512 (1024 image tokens), 256 text
    tokens; the MoE block's packed experts are 2.1 GB of its 2.5 GB (float32).
  * bria_fibo2: Bria FIBO 2 at its real width (3584, 28 heads of 128, SwiGLU 9536, 7680-wide text) at 2 of its 44
    layers (one an injection block), 1 of 2 refiner and Perceiver layers, 512×512 (1024 image tokens), 512 prompt tokens
    (320 gist tokens).
  * longcat_image: LongCat-Image at its real width (3072, 24 heads of 128, FLUX.1's 4x MLP, Qwen2.5-VL 3584-wide text)
    at 1 + 1 of its 19 + 38 double / single blocks, 512×512 (1024 image tokens) with its 512 text tokens.
  * ovis_image: Ovis-Image at its real width (3072, 24 heads of 128, SwiGLU 2 x 12288, 2048-wide text) at 1 + 1 of its
    6 + 27 double / single blocks, 512×512 (1024 image tokens) with its 256 text tokens.
  * minimax_h3: MiniMax-H3 at its real width (5376, 56 heads of 128, SwiGLU 14336, 5120-wide text, per-(level,
    modality) AdaLN) at 1 of its 50 blocks and 1 of its 2 refiner blocks, one 512×512 frame packed with 256 text and
    7 audio rows (519 rows).
  * prx: PRX at its real width (1792, 28 heads of 64, a GELU-gated MLP of 6272, T5Gemma's 2304-wide text) at 2 of its
    16 blocks, 512×512 (the FLUX.1 VAE's 64×64 latent in 2×2 patches: 1024 tokens), 256 text tokens.
  * joyimage: JoyImage Edit at its real width (3072, 24 heads of 128, two streams, Qwen3-VL's 4096-wide text) at 2 of
    its 20 blocks, a 512×512 edit with a 512×512 reference image (2048 image tokens), 256 text tokens.
  * kandinsky5: Kandinsky 5 T2V Lite at its real width (1792, 28 heads of 64, a GELU MLP of 7168, Qwen2.5-VL 3584 text,
    CLIP 768 pooled, visual conditioning) at 2 + 2 of its 2 + 32 blocks, one 768×512 latent frame (1536 tokens), 256 text
    tokens.
  * sana_video: SANA-Video 2B at its real width (2240, 20 heads of 112, a 3x Mix-FFN with its temporal conv, Gemma 2
    2304-wide captions) at 2 of its 20 blocks, one 832×480 latent frame (1560 tokens), 300 text tokens.
  * motif_video: Motif-Video at diffusers' default width (3072, 24 heads of 128, FLUX.1's blocks, 4096-wide text; the
    release's own config was not at hand) at 1 + 1 of its 20 + 40 double / single blocks, one 512×512 latent frame
    (1024 video tokens) with its 512 text tokens.
  * kandinsky6: Kandinsky 6 at diffusers' default width (video and audio 4096, 32 heads of 128, GELU MLPs of 16384, the
    released cross gates and cross-modal RoPE) at 1 + 1 text blocks and 1 of its 60 fused blocks, one 768×512 latent
    frame (1536 tokens) with 4 audio tokens, 256 text tokens.
  * kandinsky6_sr: Kandinsky 6 SR at its real width (1792, 28 heads of 64, a GELU MLP of 7168, 64 K-VAE channels and the
    piflow checkpoints' 640-wide output) at 2 of its 32 blocks, one 512×512 tile's latent frame (1024 tokens: inside
    NABLA's window, so every block is kept, as diffusers' flex attention on the CPU keeps them).
  * stable_cascade_c: Stable Cascade's Stage C (the prior) at its real width (2048, 32 heads of 64, CLIP-bigG 1280
    text and pooled, 768 image) at 1 + 1 of its 8 + 24 layers per half, 1024×1024 (its 24×24 latent), 77 tokens.
  * z_image: Z-Image at its real width (3840, 30 heads of 128, SwiGLU 10240, Qwen3-4B 2560 captions) at
    reduced depth (1 main layer, 1 noise and 1 caption refiner: 0.56 B parameters, 2.2 GB) at 512×512
    pixels (1024 image tokens) with 128 caption tokens.

The weights: every key and shape of the SD1.5 UNet (the reference manifest), dense random float32
(3.4 GB), saved in diffusers' naming (diffusers' own converter), so both sides read one file. Each
configuration runs in its own process (a clean peak RSS) for --steps forward passes on the same seeded
inputs; s/step is the median, peak is the process's peak RSS above its level before the model was
loaded (Loadout's `peak_device_bytes` on the CPU).

Baselines, measured in the same run:
  * diffusers plain: UNet2DConditionModel holding the whole model in RAM.
  * diffusers group offload: the same model with `apply_group_offloading(offload_type="leaf_level",
    offload_to_disk_path=<a temporary folder>)` on exactly the modules Loadout streams at that residency
    (diffusers writes each to its own file once, then loads it from there before every use). Its peak is
    taken after that set-up (which needs the whole model in RAM once), so it counts the steps alone; its
    parameters are private copies (not views of the file, as the plain model's are), so what it offloads
    really leaves the process.
Each line printed is one figure in the guard's format (benchmarks/_record.py: `value` our median s/step,
`baseline_value` the baseline's, `ratio` paired as below, `goal`, `better`, peaks, ...): Loadout full /
diffusers plain (goal ≤ 1.1), Loadout partial / Loadout full (goal ≤ 1.3 at 50 %), Loadout partial /
diffusers group offload at the same residency (goal ≤ 1), and the outputs (a partial step equals the full
one bit for bit; diffusers' within 1e-3, relative L2); a table goes to stderr. `make bench-full` runs it.

The file stays in the page cache between runs (nothing is dropped): "disk tier" here is the file's
cached pages, which Loadout maps for each streamed module (a warm cache). How cheap that mapping is
depends on how the file came into the cache (Linux 6.x, ext4 with large folios): in 2 MiB folios when
it was read from disk or written in large writes, in 4 KiB pages where it was written a small piece at
a time (mapping 1 GB: ~2 ms against ~70 ms; streaming SD1.5 at 10 % maps 3.1 GB per step, and its
unmapping costs as much again). The bench drops the file from the cache once at its start and reads
it back sequentially (see main); `# cache` says how much of it was in 2 MiB folios at the end.

On a shared machine the figures move a lot: each configuration runs in --rounds interleaved rounds and
`ratio` is the median over rounds of the two configurations' ratio within a round (neighbours in time),
`ours_s` / `baseline_s` the medians of all pooled steps; `ratio_best` compares the fastest steps (load only
ever adds time) and `ratio_cpu` the process CPU time per step (every thread: the reader's too).

Usage: bench_step.py [--family sd15|flux|flux2|flux3|wan|wan_narrow|wan_i2v|wan_animate2|z_image|lumina2|qwen_image|qwen_edit|auraflow|hunyuan_video|hunyuan_video15|ltxv|cosmos|cosmos1|krea2|pixart|hidream|mochi|stable_cascade_c|minimax_h3|ernie_image|kandinsky5|kandinsky6|kandinsky6_sr|longcat_image|ovis_image|prx|joyimage|glm_image|ideogram4|bria|bria_fibo|bria_fibo2|motif_video|nucleus_image|sana_video] [--steps N] [--rounds R] [--dir DIR]  (DIR keeps the
weights file between runs)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
MANIFEST = ROOT.parent / "shared" / "data" / "manifests" / "sd15_ldm_single_file.json"
PREFIX = "model.diffusion_model."
# diffusers' config of the SD1.5 UNet (runwayml/stable-diffusion-v1-5 unet/config.json values)
SD15 = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    cross_attention_dim=768, attention_head_dim=8,
)  # fmt: skip
SIZE = (512, 512)
# FLUX.1-dev's width (black-forest-labs/flux util.py configs["flux-dev"]) at 1 double + 2 single blocks
FLUX = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2, attention_head_dim=128,
            num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
            axes_dims_rope=(16, 56, 56))  # fmt: skip
# Wan 2.1 T2V 1.3B's width (Wan2.1 configs/wan_t2v_1_3B.py: dim 1536, ffn 8960, 12 heads) at 4 blocks
WAN = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
           text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=4, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
           eps=1e-6, rope_max_seq_len=1024)  # fmt: skip
WAN_NARROW = {**WAN, "num_attention_heads": 1, "ffn_dim": 256, "num_layers": 30}
# Wan 2.1 I2V at that width (Wan2.1 configs/wan_i2v_14B.py: 36 input channels, CLIP ViT-H image features
# of 1280 through img_emb and k_img / v_img in every cross-attention; diffusers' image_dim / added_kv_proj_dim)
WAN_I2V = {**WAN, "in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 1536}
# Wan-Animate-2 (diffusers' WanAnimate2Transformer3DModel: the 14B's network) at that width and depth
WAN_ANIMATE2 = dict(in_dim=36, dim=1536, ffn_dim=8960, num_heads=12, num_layers=4)
# FLUX.2 [klein] 4B's width (black-forest-labs/FLUX.2-klein-4B transformer config: 24 heads of 128, Qwen3-4B
# states of three layers, 7680 wide, no guidance embedder) at 1 double + 2 single blocks
FLUX2 = dict(num_layers=1, num_single_layers=2, attention_head_dim=128, num_attention_heads=24, joint_attention_dim=7680,
             guidance_embeds=False)  # fmt: skip
# FLUX.3's width (diffusers' Flux3Transformer2DModel defaults: 24 heads of 128, text 20480 = 8 Qwen3-VL layers; the
# base, not the flow map) at 1 per-mode block of each mode and 2 single blocks
FLUX3 = dict(num_layers=1, num_single_layers=2)
# Z-Image's width (diffusers' ZImageTransformer2DModel defaults: Tongyi-MAI/Z-Image-Turbo's config) at 1 layer
# and 1 + 1 refiners
Z_IMAGE = dict(n_layers=1, n_refiner_layers=1)
# Lumina-Image 2.0's width (diffusers' Lumina2Transformer2DModel defaults: 2304, 24 heads on 8 K/V heads,
# Gemma-2-2B's 2304-wide states) at 1 layer and 1 + 1 refiners
LUMINA2 = dict(num_layers=1, num_refiner_layers=1, cap_feat_dim=2304)
# Qwen-Image's width (diffusers' QwenImageTransformer2DModel defaults: 3072, 24 heads, Qwen2.5-VL's 3584) at 1 block
QWEN_IMAGE = dict(num_layers=1)
# AuraFlow v0.3's width (diffusers' AuraFlowTransformer2DModel defaults: 3072, 12 heads of 256, Pile-T5-XL's 2048;
# the release's 64 x 64 position grid) at 1 double and 2 single blocks
AURAFLOW = dict(num_mmdit_layers=1, num_single_dit_layers=2, sample_size=128, pos_embed_max_size=4096)
# HunyuanVideo 1.0's width (diffusers' HunyuanVideoTransformer3DModel defaults: tencent/HunyuanVideo's config) at
# 1 double and 2 single blocks, its 2 refiner blocks
HUNYUAN_VIDEO = dict(num_layers=1, num_single_layers=2)
# HunyuanVideo 1.5's, LTX-Video 2B's, Cosmos Predict2 2B Text2Image's and Krea 2's widths (diffusers' defaults: their
# releases' configs; Cosmos: the 2.0 2B Text2Image config of diffusers' converter) at reduced depth
HUNYUAN_VIDEO15 = dict(num_layers=2)
LTXV = dict(num_layers=2)
COSMOS = dict(num_attention_heads=16, num_layers=2, rope_scale=(1.0, 4.0, 4.0), extra_pos_embed_type=None)
KREA2 = dict(num_layers=1)
# PixArt-Σ XL/2 1024 (diffusers' defaults are XL/2's: 16 heads of 72, 1152 wide; T5-XXL captions; Σ has no size
# conditions) at 2 of its 28 blocks
PIXART = dict(num_layers=2, caption_channels=4096, sample_size=128, use_additional_conditions=False)
# Hunyuan-DiT v1.2's DiT-g/2 (Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers' transformer config: 16 heads of 88, 1408
# wide, MLP 6144, CLIP 77 x 1024 + mT5 256 x 2048, no style / size conditions) at 4 of its 40 blocks: block 3 takes
# block 0's long skip
HUNYUAN_DIT = dict(num_attention_heads=16, attention_head_dim=88, in_channels=4, patch_size=2, hidden_size=1408,
                   num_layers=4, mlp_ratio=4.3637, sample_size=128, use_style_cond_and_image_meta_size=False)  # fmt: skip
# Qwen-Image 2.1's width (diffusers' QwenImage21Transformer2DModel defaults: 4096, 32 heads of 128, SwiGLU 12288,
# Qwen3-VL's 4096, 64 unpatched latent channels) at 1 of its 32 blocks
QWEN_IMAGE21 = dict(num_layers=1)
# HiDream-I1's width (its transformer config: 20 heads of 128, 4 routed experts with 2 active, T5 and Llama 3.1
# captions 4096 wide, pooled CLIP 2048, RoPE axes 64/32/32) at 1 double- and 1 single-stream block
HIDREAM = dict(
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=128,
    num_attention_heads=20,
    caption_channels=[4096, 4096],
    text_emb_dim=2048,
    num_routed_experts=4,
    num_activated_experts=2,
    axes_dims_rope=(64, 32, 32),
    max_resolution=(128, 128),
    llama_layers=[0, 1],
)
# Mochi 1's width (diffusers' MochiTransformer3DModel defaults: genmo/mochi-1-preview's config, 24 heads of 128, text
# 1536, T5-XXL 4096) at 2 of its 48 blocks
MOCHI = dict(num_layers=2)
# ERNIE-Image's width (diffusers' ErnieImageTransformer2DModel defaults) at 2 of its 24 layers
ERNIE_IMAGE = dict(num_layers=2)
# PRX's width (diffusers' PRXTransformer2DModel defaults) at 2 of its 16 blocks
PRX = dict(depth=2)
# JoyImage Edit's width (diffusers' JoyImageEditTransformer3DModel defaults) at 2 of its 20 blocks
JOYIMAGE = dict(num_layers=2)
# LongCat-Image's and Ovis-Image's widths (diffusers' LongCatImage / OvisImageTransformer2DModel defaults) at one double and
# one single block
LONGCAT_IMAGE = dict(num_layers=1, num_single_layers=1)
OVIS_IMAGE = dict(num_layers=1, num_single_layers=1)
# MiniMax-H3's width (diffusers' MiniMaxH3Transformer3DModel defaults: MiniMaxAI/MiniMax-H3's config) at 1 of its 50
# blocks and 1 of its 2 token refiner blocks
MINIMAX_H3 = dict(num_layers=1, num_refiner_layers=1)
# Bria 3.2's and FIBO's width (diffusers' BriaTransformer2DModel / BriaFiboTransformer2DModel defaults) at 1 + 2 of
# their 19 + 38 blocks
BRIA = dict(num_layers=1, num_single_layers=2)
# GLM-Image's width (diffusers' GlmImageTransformer2DModel defaults) at 2 of its 30 blocks
GLM_IMAGE = dict(num_layers=2)
# Ideogram 4's width (diffusers' Ideogram4Transformer2DModel defaults) at 1 of its 34 layers
IDEOGRAM4 = dict(num_layers=1)
# NucleusMoE-Image (its transformer/config.json) at 1 dense and 1 MoE block (capacity 2, as its blocks past 4)
NUCLEUS_IMAGE = dict(num_layers=2, num_key_value_heads=4, joint_attention_dim=4096, num_experts=64, out_channels=16,
                     dense_moe_strategy="leave_first_block_dense", capacity_factors=[0.0, 2.0])  # fmt: skip
# Bria FIBO 2's width (diffusers' BriaFibo2Transformer2DModel defaults) at 2 of its 44 layers, one an injection block
BRIA_FIBO2 = dict(n_layers=2, n_refiner_layers=1, perceiver_num_layers=1, injection_layer_ids=(1,))
# Kandinsky 5 T2V Lite (Kandinsky-5 configs/config_5s_sft.yaml) at 2 of its 2 text and 2 of its 32 visual blocks
KANDINSKY5 = dict(in_visual_dim=16, out_visual_dim=16, time_dim=512, model_dim=1792, ff_dim=7168, num_text_blocks=2,
                  num_visual_blocks=2, axes_dims=(16, 24, 24), visual_cond=True)  # fmt: skip
# SANA-Video 2B (diffusers' convert_sana_video_to_diffusers.py: the default width, a 3x Mix-FFN) at 2 of its 20 blocks
SANA_VIDEO = dict(num_layers=2, mlp_ratio=3.0)
# Motif-Video at diffusers' MotifVideoTransformer3DModel defaults (width 3072) at 1 + 1 of its 20 + 40 blocks
MOTIF_VIDEO = dict(num_layers=1, num_single_layers=1)
KANDINSKY6 = dict(num_text_blocks=1, num_visual_blocks=1, ca_rope=True, cross_gates=True, fix_modulation=True)
KANDINSKY6_SR = dict(num_visual_blocks=2)
# Stable Cascade's Stage C (stabilityai/stable-cascade-prior's prior/config.json: 2048 wide, 32 heads, CTA levels joined by
# 1x1 mappings, sca and crp) at one layer of each level's 8 / 24 per half
_CTA = ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock")
STABLE_CASCADE_C = dict(down_num_layers_per_block=(1, 1), up_num_layers_per_block=(1, 1), block_types_per_layer=(_CTA, _CTA),
                        clip_text_in_channels=1280, clip_image_in_channels=768, dropout=(0.0, 0.0), switch_level=(False,))  # fmt: skip
# family -> (size in pixels, the component Loadout steps, the architecture it is bound as)
FAMILIES = {"sd15": ((512, 512), "unet", "sd1"), "flux": ((256, 256), "transformer", "flux1_dev"),
            "wan": ((480, 480), "transformer", "wan21"), "wan_narrow": ((64, 64), "transformer", "wan21"),
            "wan_i2v": ((480, 480), "transformer", "wan21"), "z_image": ((512, 512), "transformer", "z_image"),
            "flux2": ((256, 256), "transformer", "flux2"), "flux3": ((256, 256), "transformer", "flux3"),
            "lumina2": ((512, 512), "transformer", "lumina2"),
            "qwen_image": ((512, 512), "transformer", "qwen_image"),
            "auraflow": ((512, 512), "transformer", "auraflow"),
            "hunyuan_video": ((256, 256), "transformer", "hunyuan_video"),
            "hunyuan_video15": ((512, 512), "transformer", "hunyuan_video15"),
            "ltxv": ((1024, 1024), "transformer", "ltxv"),
            "cosmos": ((512, 512), "transformer", "cosmos_predict2"),
            "krea2": ((512, 512), "transformer", "krea2"),
            "pixart": ((1024, 1024), "transformer", "pixart"),
            "hunyuan_dit": ((1024, 1024), "transformer", "hunyuan_dit"),
            "hidream": ((512, 512), "transformer", "hidream"),
            "mochi": ((848, 480), "transformer", "mochi"),
            "minimax_h3": ((512, 512), "transformer", "minimax_h3"),
            "stable_cascade_c": ((1024, 1024), "unet", "stable_cascade_c"),
            "qwen_image21": ((1024, 1024), "transformer", "qwen_image21"),
            "qwen_edit": ((512, 512), "transformer", "qwen_image"),
            "ernie_image": ((512, 512), "transformer", "ernie_image"),
            "wan_animate2": ((480, 480), "transformer", "wan22")}  # fmt: skip
FAMILIES |= {
    "bria": ((512, 512), "transformer", "bria"),
    "bria_fibo": ((512, 512), "transformer", "bria_fibo"),
}
FAMILIES["glm_image"] = ((512, 512), "transformer", "glm_image")
FAMILIES["ideogram4"] = ((512, 512), "transformer", "ideogram4")
FAMILIES["kandinsky5"] = ((768, 512), "transformer", "kandinsky5")
# the families whose diffusers side bench_families.run_diffusers runs
FAMILIES_RUN_BY_BENCH_FAMILIES = ("hunyuan_video15", "ltxv", "cosmos", "krea2", "pixart", "qwen_image21", "flux3",
                                  "hunyuan_dit", "mochi", "stable_cascade_c", "ernie_image", "wan_animate2")  # fmt: skip
FAMILIES_RUN_BY_BENCH_FAMILIES += ("minimax_h3",)
FAMILIES_RUN_BY_BENCH_FAMILIES += ("bria", "bria_fibo")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("glm_image",)
FAMILIES_RUN_BY_BENCH_FAMILIES += ("ideogram4",)
FAMILIES["prx"] = ((512, 512), "transformer", "prx")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("prx",)
FAMILIES["joyimage"] = ((512, 512), "transformer", "joyimage")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("joyimage",)
FAMILIES["longcat_image"] = ((512, 512), "transformer", "longcat_image")
FAMILIES["ovis_image"] = ((512, 512), "transformer", "ovis_image")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("longcat_image", "ovis_image")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("kandinsky5",)
FAMILIES["sana_video"] = ((832, 480), "transformer", "sana_video")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("sana_video",)
FAMILIES["nucleus_image"] = ((512, 512), "transformer", "nucleus_image")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("nucleus_image",)
FAMILIES["motif_video"] = ((512, 512), "transformer", "motif_video")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("motif_video",)
# Cosmos 1.0 7B Text2World's width (diffusers' CosmosTransformer3DModel defaults: its converter's 1.0 7B config,
# learnable position embeddings) at 2 of its 28 blocks
COSMOS1 = dict(num_layers=2)
FAMILIES["cosmos1"] = ((512, 512), "transformer", "cosmos_predict1")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("cosmos1",)
FAMILIES["bria_fibo2"] = ((512, 512), "transformer", "bria_fibo2")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("bria_fibo2",)
FAMILIES["kandinsky6"] = ((768, 512), "transformer", "kandinsky6")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("kandinsky6",)
FAMILIES["kandinsky6_sr"] = ((512, 512), "transformer", "kandinsky6_sr")
FAMILIES_RUN_BY_BENCH_FAMILIES += ("kandinsky6_sr",)
# Qwen-Image-Edit 2511 (`qwen_edit`): Qwen-Image's width and depth above, diffusers' zero_cond_t (ComfyUI's
# `__index_timestep_zero__` marker in the file), a 512x512 reference image's latents beside the 512x512 output
EDIT_REFERENCE = (64, 64)


def _wan(family: str) -> dict:
    return {"wan_narrow": WAN_NARROW, "wan_i2v": WAN_I2V}.get(family, WAN)


def _diffusers_model(family: str):
    """diffusers' model of the family on the meta device."""
    import torch

    with torch.device("meta"):
        if family == "flux":
            from diffusers import FluxTransformer2DModel

            return FluxTransformer2DModel(**FLUX)
        if family == "wan_animate2":
            from diffusers import WanAnimate2Transformer3DModel

            return WanAnimate2Transformer3DModel(**WAN_ANIMATE2)
        if family.startswith("wan"):
            from diffusers import WanTransformer3DModel

            return WanTransformer3DModel(**_wan(family))
        if family == "flux2":
            from diffusers import Flux2Transformer2DModel

            return Flux2Transformer2DModel(**FLUX2)
        if family == "flux3":
            from diffusers import Flux3Transformer2DModel

            return Flux3Transformer2DModel(**FLUX3)
        if family == "z_image":
            from diffusers import ZImageTransformer2DModel

            return ZImageTransformer2DModel(**Z_IMAGE)
        if family == "lumina2":
            from diffusers import Lumina2Transformer2DModel

            return Lumina2Transformer2DModel(**LUMINA2)
        if family in ("qwen_image", "qwen_edit"):
            from diffusers import QwenImageTransformer2DModel

            return QwenImageTransformer2DModel(**QWEN_IMAGE, zero_cond_t=family == "qwen_edit")
        if family == "auraflow":
            from diffusers import AuraFlowTransformer2DModel

            return AuraFlowTransformer2DModel(**AURAFLOW)
        if family == "hunyuan_video":
            from diffusers import HunyuanVideoTransformer3DModel

            return HunyuanVideoTransformer3DModel(**HUNYUAN_VIDEO)
        if family == "hunyuan_video15":
            from diffusers import HunyuanVideo15Transformer3DModel

            return HunyuanVideo15Transformer3DModel(**HUNYUAN_VIDEO15)
        if family == "ltxv":
            from diffusers import LTXVideoTransformer3DModel

            return LTXVideoTransformer3DModel(**LTXV)
        if family == "cosmos":
            from diffusers import CosmosTransformer3DModel

            return CosmosTransformer3DModel(**COSMOS)
        if family == "cosmos1":
            from diffusers import CosmosTransformer3DModel

            return CosmosTransformer3DModel(**COSMOS1)
        if family == "krea2":
            from diffusers import Krea2Transformer2DModel

            return Krea2Transformer2DModel(**KREA2)
        if family == "qwen_image21":
            from diffusers import QwenImage21Transformer2DModel

            return QwenImage21Transformer2DModel(**QWEN_IMAGE21)
        if family == "pixart":
            from diffusers import PixArtTransformer2DModel

            return PixArtTransformer2DModel(**PIXART)
        if family == "hunyuan_dit":
            from diffusers import HunyuanDiT2DModel

            return HunyuanDiT2DModel(**HUNYUAN_DIT)
        if family == "hidream":
            from diffusers import HiDreamImageTransformer2DModel

            return HiDreamImageTransformer2DModel(**HIDREAM)
        if family == "mochi":
            from diffusers import MochiTransformer3DModel

            return MochiTransformer3DModel(**MOCHI)
        if family == "ernie_image":
            from diffusers import ErnieImageTransformer2DModel

            return ErnieImageTransformer2DModel(**ERNIE_IMAGE)
        if family == "ideogram4":
            from diffusers import Ideogram4Transformer2DModel

            return Ideogram4Transformer2DModel(**IDEOGRAM4)
        if family == "nucleus_image":
            from diffusers import NucleusMoEImageTransformer2DModel

            return NucleusMoEImageTransformer2DModel(**NUCLEUS_IMAGE)
        if family == "glm_image":
            from diffusers import GlmImageTransformer2DModel

            return GlmImageTransformer2DModel(**GLM_IMAGE)
        if family == "prx":
            from diffusers import PRXTransformer2DModel

            return PRXTransformer2DModel(**PRX)
        if family == "joyimage":
            from diffusers import JoyImageEditTransformer3DModel

            return JoyImageEditTransformer3DModel(**JOYIMAGE)
        if family == "kandinsky5":
            from diffusers import Kandinsky5Transformer3DModel

            return Kandinsky5Transformer3DModel(**KANDINSKY5)
        if family == "sana_video":
            from diffusers import SanaVideoTransformer3DModel

            return SanaVideoTransformer3DModel(**SANA_VIDEO)
        if family == "kandinsky6":
            from diffusers import Kandinsky6Transformer3DModel

            return Kandinsky6Transformer3DModel(**KANDINSKY6)
        if family == "kandinsky6_sr":
            from diffusers import Kandinsky6SRTransformer3DModel

            return Kandinsky6SRTransformer3DModel(**KANDINSKY6_SR)
        if family == "minimax_h3":
            from diffusers import MiniMaxH3Transformer3DModel

            return MiniMaxH3Transformer3DModel(**MINIMAX_H3)
        if family == "bria":
            from diffusers import BriaTransformer2DModel

            return BriaTransformer2DModel(**BRIA)
        if family == "bria_fibo":
            from diffusers import BriaFiboTransformer2DModel

            return BriaFiboTransformer2DModel(**BRIA)
        if family == "bria_fibo2":
            from diffusers.models.transformers.transformer_bria_fibo2 import BriaFibo2Transformer2DModel

            return BriaFibo2Transformer2DModel(**BRIA_FIBO2)
        if family == "longcat_image":
            from diffusers import LongCatImageTransformer2DModel

            return LongCatImageTransformer2DModel(**LONGCAT_IMAGE)
        if family == "ovis_image":
            from diffusers import OvisImageTransformer2DModel

            return OvisImageTransformer2DModel(**OVIS_IMAGE)
        if family == "motif_video":
            from diffusers import MotifVideoTransformer3DModel

            return MotifVideoTransformer3DModel(**MOTIF_VIDEO)
        if family == "stable_cascade_c":
            from diffusers import StableCascadeUNet

            return StableCascadeUNet(**STABLE_CASCADE_C)
        from diffusers import UNet2DConditionModel

        return UNet2DConditionModel(**SD15)


def real_rotary_tables(model, family: str) -> None:
    """The rotary tables diffusers computes when a model is built (Wan's, Lumina 2's and Qwen-Image's (1 and 2.1),
    PixArt's sin-cos table, are made on the meta device with it here): built again, real."""
    if family == "wan_animate2":  # its rotary tables are made per call
        return
    if family.startswith("wan"):
        from diffusers.models.transformers.transformer_wan import WanRotaryPosEmbed

        cfg = _wan(family)
        model.rope = WanRotaryPosEmbed(cfg["attention_head_dim"], cfg["patch_size"], cfg["rope_max_seq_len"])
    elif family == "lumina2":
        from diffusers.models.transformers.transformer_lumina2 import Lumina2RotaryPosEmbed

        c = model.config
        model.rope_embedder = Lumina2RotaryPosEmbed(10000, c.axes_dim_rope, c.axes_lens, c.patch_size)
    elif family == "pixart":  # its patch embedding's fixed sin-cos table (a buffer the file does not hold)
        from diffusers.models.embeddings import get_2d_sincos_pos_embed

        pe = model.pos_embed
        table = get_2d_sincos_pos_embed(pe.pos_embed.shape[-1], (pe.height, pe.width), base_size=pe.base_size,
                                        interpolation_scale=pe.interpolation_scale)  # fmt: skip
        pe.pos_embed = table.float().unsqueeze(0)
    elif (
        family == "qwen_image21"
    ):  # its rotary table and its timestep frequencies (a buffer the file does not hold)
        from diffusers.models.transformers import transformer_qwenimage21 as q21

        model.pos_embed = q21.QwenImage21Rope(theta=10000, axes_dim=list(model.config.axes_dims_rope))
        model.time_text_embed.time_proj = q21.QwenImage21TemporalTimesteps(timestep_dim=256)
    elif family == "minimax_h3":  # its rotary frequencies (a buffer the file does not hold)
        from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3RotaryPosEmbed

        model.rope = MiniMaxH3RotaryPosEmbed(model.config.rope_freq_dim, model.config.rope_theta)
    elif family == "kandinsky5":  # its rotary tables and timestep frequencies (made when built)
        from diffusers.models.transformers import transformer_kandinsky as k5

        c = model.config
        model.time_embeddings.freqs = k5.get_freqs(c.model_dim // 2)
        model.text_rope_embeddings = k5.Kandinsky5RoPE1D(sum(c.axes_dims))
        model.visual_rope_embeddings = k5.Kandinsky5RoPE3D(c.axes_dims)
    elif family == "kandinsky6":  # its rotary tables (buffers the file does not hold)
        from diffusers.models.transformers import transformer_kandinsky6 as k6

        c, head = model.config, sum(model.config.axes_dims)
        model.visual_rope_embeddings = k6.Kandinsky6RoPE3D(c.axes_dims)
        model.video_text_rope_embeddings = k6.Kandinsky6RoPE1D(head)
        model.audio_text_rope_embeddings = k6.Kandinsky6RoPE1D(head)
        model.audio_rope_embeddings = k6.Kandinsky6RoPE1D(head, freqs_scaling=c.audio_freqs_scaling)
    elif family == "kandinsky6_sr":  # its rotary tables (buffers the file does not hold)
        from diffusers.models.transformers.transformer_kandinsky6_sr import Kandinsky6SRRoPE3D

        model.visual_rope_embeddings = Kandinsky6SRRoPE3D(model.config.axes_dims)
    elif family in ("qwen_image", "qwen_edit"):
        from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope

        model.pos_embed = QwenEmbedRope(
            theta=10000, axes_dim=list(model.config.axes_dims_rope), scale_rope=True
        )
    elif family == "sana_video":  # Wan's rotary tables (buffers the file does not hold)
        from diffusers.models.transformers.transformer_sana_video import WanRotaryPosEmbed

        c = model.config
        model.rope = WanRotaryPosEmbed(c.attention_head_dim, c.patch_size, c.rope_max_seq_len)
    elif family == "nucleus_image":  # its rotary tables (plain tensors made when built)
        from diffusers.models.transformers.transformer_nucleusmoe_image import NucleusMoEEmbedRope

        model.pos_embed = NucleusMoEEmbedRope(10000, list(model.config.axes_dims_rope), scale_rope=True)
    elif family == "ideogram4":  # its rotary frequencies (a buffer the file does not hold)
        from diffusers.models.transformers.transformer_ideogram4 import Ideogram4MRoPE

        c = model.config
        model.rotary_emb = Ideogram4MRoPE(c.attention_head_dim, c.rope_theta, tuple(c.mrope_section))


def write_random(path: Path, family: str, dtype=None) -> None:
    """Dense random weights of diffusers' model (its own naming), float32 unless `dtype`: matrices
    ~ N(0, 1/fan_in), norm scales ~ 1, the rest small."""
    import torch

    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, t in _diffusers_model(family).state_dict().items():
        shape = tuple(t.shape)
        r = torch.randn(shape, generator=g)
        if k.endswith("pad_token"):  # Z-Image's learned padding rows
            sd[k] = r
        elif ".experts." in k:  # packed experts [E, in, out] (NucleusMoE-Image): fan-in is the middle axis
            sd[k] = r / math.sqrt(shape[1])
        elif len(shape) >= 2 and "scale_shift_table" not in k:
            sd[k] = r / math.sqrt(math.prod(shape[1:]))
        else:
            sd[k] = (1.0 if "norm" in k and k.endswith("weight") else 0.0) + 0.1 * r
        if dtype is not None:
            sd[k] = sd[k].to(dtype)
    if family == "qwen_edit":  # Edit 2511: its reference rows are modulated at t = 0
        sd["__index_timestep_zero__"] = torch.zeros(0)
    save_tensors(path, sd)


def write_weights(path: Path) -> None:
    import torch
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    from engine.formats.safetensors import save_tensors

    tensors = json.loads(MANIFEST.read_text())["tensors"]
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, v in tensors.items():
        if k.startswith(PREFIX):
            shape = tuple(v["shape"])
            if len(shape) >= 2:
                sd[k] = torch.randn(shape, generator=g) / math.sqrt(math.prod(shape[1:]))
            else:
                sd[k] = (1.0 if k.endswith("weight") else 0.0) + 0.1 * torch.randn(shape, generator=g)
    save_tensors(path, convert_ldm_unet_checkpoint(sd, SD15))


# -- workers (each in its own process) --------------------------------------------------------------------


def _inputs(model: str, family: str):
    from engine import denoise
    from engine.model import Component

    size, comp, arch = FAMILIES[family]
    x = denoise.bind(Component(comp, model, ""), arch).random_inputs(*size, seed=0)
    if family == "qwen_edit":
        import torch

        x["ref_latents"] = torch.randn(1, 16, *EDIT_REFERENCE, generator=torch.Generator().manual_seed(1))
    return x


def weights_only(sd: dict) -> dict:
    """The state dict without ComfyUI's markers (`__index_timestep_zero__`: Edit 2511), which no model holds."""
    return {k: v for k, v in sd.items() if not k.startswith("__")}


def step_inputs(model: str, family: str) -> str | None:
    """An --inputs file for the families whose step takes more than seeded random inputs (Qwen-Image-Edit's
    reference image): the same tensors `_inputs` gives diffusers' side, written beside the weights."""
    if family != "qwen_edit":
        return None
    from engine.formats.safetensors import save_tensors

    path = model + ".inputs.safetensors"
    save_tensors(path, _inputs(model, family))
    return path


def _run_diffusers(model, family: str, x: dict):
    """diffusers' forward on Loadout's (the original codebases') input names."""
    if family == "flux2":
        return model(hidden_states=x["img"], encoder_hidden_states=x["txt"], timestep=x["timesteps"],
                     img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0], guidance=x.get("guidance")).sample  # fmt: skip
    if family == "flux":
        return model(hidden_states=x["img"], encoder_hidden_states=x["txt"], pooled_projections=x["y"],
                     timestep=x["timesteps"], img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0],
                     guidance=x["guidance"]).sample  # fmt: skip
    if family == "wan_animate2":  # its two calls (bench_families)
        from bench_families import run_diffusers

        return run_diffusers(model, family, x)
    if family.startswith("wan"):
        return model(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["context"],
                     encoder_hidden_states_image=x.get("clip_fea")).sample  # fmt: skip
    if family == "z_image":  # lists of [C, F, H, W] frames and of [T, D] captions
        import torch

        out = model([f.unsqueeze(1) for f in x["x"]], x["t"], list(x["cap_feats"]), return_dict=False)[0]
        return torch.stack([f.squeeze(1) for f in out])
    if family == "lumina2":  # every caption token kept
        import torch

        return model(x["x"], x["t"], x["cap_feats"], torch.ones(x["cap_feats"].shape[:2], dtype=torch.bool,
                                                                 device=x["x"].device), return_dict=False)[0]  # fmt: skip
    if family == "auraflow":
        return model(hidden_states=x["x"], encoder_hidden_states=x["context"], timestep=x["t"]).sample
    if family == "hidream":  # Loadout's input names are diffusers' forward's
        return model(**x).sample
    if family in FAMILIES_RUN_BY_BENCH_FAMILIES:
        from bench_families import run_diffusers

        return run_diffusers(model, family, x)
    if family == "hunyuan_video":  # every text token kept
        import torch

        mask = torch.ones(x["text_states"].shape[:2], device=x["x"].device)
        return model(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["text_states"],
                     encoder_attention_mask=mask, pooled_projections=x["text_states_2"],
                     guidance=x["guidance"]).sample  # fmt: skip
    if family in (
        "qwen_image",
        "qwen_edit",
    ):  # 2x2 patches, channels first, in and out; the reference's after
        import torch

        def pack(t):
            b, c, h, w = t.shape
            return t.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)

        b, c, h, w = x["x"].shape
        shapes, img = [(1, h // 2, w // 2)], pack(x["x"])
        if "ref_latents" in x:
            shapes.append((1, x["ref_latents"].shape[2] // 2, x["ref_latents"].shape[3] // 2))
            img = torch.cat([img, pack(x["ref_latents"])], 1)
        out = model(hidden_states=img, encoder_hidden_states=x["context"], timestep=x["timesteps"],
                    img_shapes=[shapes] * b).sample[:, : (h // 2) * (w // 2)]  # fmt: skip
        return out.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    return model(x["x"], x["timesteps"], x["context"]).sample


def write_lora(path: Path, rank: int = 16) -> None:
    """A kohya LoRA (float32, rank `rank`) over every UNet module an SD1 LoRA trains (264 with the text
    encoder's; its 192 UNet ones patch the step): down ~ N(0, 1/in), up small."""
    import torch

    from engine.catalog.demo_weights import sd1_lora_modules
    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(3)
    t = {}
    for name, i, o, conv in sd1_lora_modules():
        k = (1, 1) if conv else ()
        t[f"{name}.lora_down.weight"] = torch.randn(rank, i, *k, generator=g) / i**0.5
        t[f"{name}.lora_up.weight"] = torch.randn(o, rank, *k, generator=g) * 0.01
        t[f"{name}.alpha"] = torch.tensor(float(rank))
    save_tensors(str(path), t)


def worker_loadout(
    model: str, family: str, budget: float | None, steps: int, out: str, lora: str | None = None
) -> dict:
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.requests import StackItem, Step

    e = Engine()
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget))
    stack = (StackItem(lora, 1.0, 1.0),) if lora else ()
    r = e.run(Step(model, stack or None, inputs=step_inputs(model, family), size=FAMILIES[family][0], steps=steps,
                   out=out))  # fmt: skip
    if lora:
        assert r.loras and r.loras[0]["mapped"] > 0, r.loras
    layers = r.snapshot.get(r.component).layers
    return {
        "steps": list(r.step_seconds), "cpu": list(r.step_cpu_seconds), "peak": r.peak_device_bytes,
        "resident": r.resident_bytes, "streamed": r.streamed_bytes_per_step, "prefetched": r.prefetched,
        "mode": r.mode, "streamed_modules": [p for p, tier, _ in layers if tier != "device"],
    }  # fmt: skip


def worker_diffusers(model: str, family: str, modules: list[str], steps: int, out: str, folder: str) -> dict:
    import torch
    from diffusers.hooks import apply_group_offloading
    from safetensors.torch import load_file

    from engine.formats.safetensors import save_tensors
    from engine.stepping import PeakMeter

    inputs = _inputs(model, family)
    meter = PeakMeter("cpu")
    unet = _diffusers_model(family)
    sd = load_file(model)  # safetensors maps the file: the parameters stay views of it (as from_pretrained's)
    unet.load_state_dict(weights_only(sd), assign=True)
    del sd
    real_rotary_tables(unet, family)
    unet.eval()
    if modules:
        # Private copies first: the group hooks read every offloaded tensor once to write it to disk, which
        # would leave the file's pages mapped (counted in RSS) while the resident views keep the mapping.
        for prm in unet.parameters():
            prm.data = prm.data.clone()
    for i, name in enumerate(modules):  # one folder each: diffusers names a leaf's file by its name below
        apply_group_offloading(unet.get_submodule(name), onload_device=torch.device("cpu"), offload_type="leaf_level",
                               offload_to_disk_path=os.path.join(folder, str(i)))  # fmt: skip
    if modules:
        import gc

        from engine.memory import trim_heap

        gc.collect()
        trim_heap()
        base = meter.base
        meter = PeakMeter("cpu")  # steps only (the set-up held the whole model once); same baseline
        meter.base = base
    times, cpu = [], []
    with torch.inference_mode():
        for _ in range(steps):
            t0, c0 = time.perf_counter(), time.process_time()
            y = _run_diffusers(unet, family, inputs)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    save_tensors(out, {"out": y.float()})
    return {"steps": times, "cpu": cpu, "peak": meter.read()}


def cached_in_large_folios(path: Path) -> int:
    """Bytes of the file the kernel maps with 2 MiB entries (Linux smaps' FilePmdMapped) once all of it
    is mapped and populated: how much of its page cache is in huge folios (0 where unknown)."""
    import mmap
    import re

    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        try:
            m.madvise(getattr(mmap, "MADV_POPULATE_READ", 22))
            smaps = Path("/proc/self/smaps").read_text()
        except (OSError, ValueError):
            return 0
        finally:
            m.close()
    at = smaps.find(str(path))
    found = re.search(r"FilePmdMapped:\s+(\d+) kB", smaps[at:]) if at >= 0 else None
    return int(found.group(1)) * 1024 if found else 0


# -- the driver ---------------------------------------------------------------------------------------------


def _spawn(family: str, *args: str) -> dict:
    r = subprocess.run([sys.executable, __file__, "--family", family, "--worker", *args], capture_output=True,
                       text=True)  # fmt: skip
    if r.returncode != 0:
        raise SystemExit(f"worker {args[0]} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--steps", type=int, default=3, help="forward passes per process (the first is reported apart)"
    )
    ap.add_argument("--rounds", type=int, default=2, help="times each configuration runs, interleaved")
    ap.add_argument("--dir", type=Path)
    ap.add_argument("--family", choices=tuple(FAMILIES), default="sd15")
    ap.add_argument("--worker", nargs="+")
    a = ap.parse_args()
    if a.worker:
        kind, model, steps, out, *rest = a.worker
        if kind == "loadout":
            budget = None if rest[0] == "none" else float(rest[0])
            res = worker_loadout(model, a.family, budget, int(steps), out, *rest[1:])
        else:
            res = worker_diffusers(model, a.family, json.loads(rest[0]), int(steps), out, rest[1])
        print(json.dumps(res))
        return

    if a.dir is not None:
        a.dir.mkdir(parents=True, exist_ok=True)
        _measure(a, a.dir)
        return
    d = Path(tempfile.mkdtemp(prefix="bench_step_"))
    try:
        _measure(a, d)
    finally:  # 3.4 GB of weights (SD1.5) and the outputs: gone unless --dir keeps them
        shutil.rmtree(d, ignore_errors=True)


def _measure(a: argparse.Namespace, d: Path) -> None:
    import torch

    from engine.formats.safetensors import SafetensorsFile

    fam = a.family
    model = d / (
        "sd15_unet_diffusers.safetensors" if fam == "sd15" else f"{fam}_reduced_diffusers.safetensors"
    )
    if not model.exists():
        t0 = time.perf_counter()
        write_weights(model) if fam == "sd15" else write_random(model, fam)
        print(f"# wrote {model} ({model.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t0:.0f} s")
    total = model.stat().st_size
    # The same cache for every run, whatever came before: the file dropped, then read once from disk in
    # plain sequential reads (as a copy or a checksum reads it) -- the kernel caches it in large folios.
    # Left to the first run, the cache depends on who runs first: diffusers' load_file faults the file
    # in 4 KiB pages, and every streamed step then maps 3.1 GB of them (10 %: ~0.4 s/step more CPU).
    from bench_load import drop_cache

    drop_cache(model)
    with open(model, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    steps = str(a.steps)
    runs: dict[str, list[dict]] = {}
    lora = d / "sd15_lora_r16.safetensors"
    if fam == "sd15" and not lora.exists():
        write_lora(lora)

    def out(name: str) -> str:
        return str(d / f"out_{name}.safetensors")

    def record(name: str, r: dict) -> dict:
        runs.setdefault(name, []).append(r)
        return r

    # Rounds run every configuration once each, in the same order, so all of them see the machine's load
    # changing alike; the steps of every round are pooled.
    for _ in range(a.rounds):
        record("diffusers plain", _spawn(fam, "diffusers", str(model), steps, out("dplain"), "[]", str(d)))
        full_run = record("loadout full", _spawn(fam, "loadout", str(model), steps, out("full"), "none"))
        if fam == "sd15":  # a LoRA over every trained module: baked for the run, roomy and with no room
            record("loadout lora", _spawn(fam, "loadout", str(model), steps, out("lora"), "none", str(lora)))
            gb = f"{full_run['resident'] / 1024**3:.4f}"  # the weights' bytes: no room for a second copy
            record(
                "loadout lora tight", _spawn(fam, "loadout", str(model), steps, out("lorat"), gb, str(lora))
            )
        for pct in (50, 10):
            gb = total * pct / 100 / 1024**3
            lo = record(
                f"loadout {pct}%", _spawn(fam, "loadout", str(model), steps, out(f"l{pct}"), f"{gb:.4f}")
            )
            with tempfile.TemporaryDirectory(dir=d) as folder:
                mods = json.dumps(lo["streamed_modules"])
                record(
                    f"diffusers group {pct}%",
                    _spawn(fam, "diffusers", str(model), steps, out(f"d{pct}"), mods, folder),
                )

    import statistics

    def stat(name: str) -> dict:
        rs = runs[name]
        later = [t for r in rs for t in r["steps"][1:]] or [r["steps"][0] for r in rs]
        return {
            "median_s": statistics.median(later), "best_s": min(later), "first_s": statistics.median(r["steps"][0] for r in rs),
            "cpu_s": statistics.median(c for r in rs for c in r["cpu"][1:] or r["cpu"]),
            "peak": max(r["peak"] for r in rs), "resident": rs[0].get("resident", 0),
            "streamed": rs[0].get("streamed", 0), "prefetched": rs[0].get("prefetched"),
        }  # fmt: skip

    st = {k: stat(k) for k in runs}
    print(
        f"# cache: {cached_in_large_folios(model) / 1e9:.2f} of {total / 1e9:.2f} GB in 2 MiB folios",
        file=sys.stderr,
    )

    def o(name: str):
        return SafetensorsFile(out(name)).tensor("out").clone().double()

    title = {"sd15": "SD1.5 UNet, 64x64 latent", "flux": "FLUX.1-dev width, 1+2 blocks, 256x256",
             "wan": "Wan 2.1 1.3B width, 4 blocks, one 480x480 frame",
             "wan_narrow": "Wan 2.1 1.3B depth (30 blocks), one 128-wide head, one 64x64 frame",
             "wan_i2v": "Wan 2.1 I2V at the 1.3B width, 4 blocks, one 480x480 frame",
             "z_image": "Z-Image width, 1 layer + 1 + 1 refiners, 512x512",
             "flux2": "FLUX.2 [klein] 4B width, 1+2 blocks, 256x256",
             "flux3": "FLUX.3 width, 1+1+1 per-mode + 2 single blocks, 256x256 with a 256x256 reference",
             "lumina2": "Lumina 2 width, 1 layer + 1 + 1 refiners, 512x512",
             "qwen_image": "Qwen-Image width, 1 block, 512x512",
             "auraflow": "AuraFlow width, 1+2 blocks, 512x512",
             "hunyuan_video": "HunyuanVideo width, 1+2 blocks, one 256x256 frame",
             "hunyuan_video15": "HunyuanVideo 1.5 width, 2 blocks, one 512x512 frame",
             "ltxv": "LTX-Video 2B width, 2 blocks, one 1024x1024 frame",
             "cosmos": "Cosmos Predict2 2B width, 2 blocks, 512x512",
             "krea2": "Krea 2 width, 1 block, 512x512",
             "wan_animate2": "Wan-Animate-2 at the 1.3B width, 4 blocks, two 480x480 frames and a driving frame",
             "qwen_edit": "Qwen-Image-Edit 2511 width, 1 block, 512x512 with a 512x512 reference",
             "ernie_image": "ERNIE-Image width, 2 layers, 512x512",
             "prx": "PRX width, 2 blocks, 512x512",
             "joyimage": "JoyImage Edit width, 2 blocks, 512x512 with a 512x512 reference",
             "kandinsky5": "Kandinsky 5 T2V Lite width, 2+2 blocks, one 768x512 frame",
             "sana_video": "SANA-Video 2B width, 2 blocks, one 832x480 frame",
             "nucleus_image": "NucleusMoE-Image width, 1 dense + 1 MoE block (64 experts), 512x512",
             "kandinsky6": "Kandinsky 6 width, 1+1 text blocks, 1 fused block, one 768x512 frame with audio",
             "kandinsky6_sr": "Kandinsky 6 SR width, 2 blocks, one 512x512 tile's frame",
             "stable_cascade_c": "Stable Cascade Stage C width, 1 + 1 layers per half, 1024x1024"}.get(fam)  # fmt: skip
    if title is None:  # the families named in the module's docstring only
        title = "{} at its real width, reduced depth, {}x{}".format(fam, *FAMILIES[fam][0])
    print(f"# {title}, float32, CPU ({torch.get_num_threads()} threads); {a.rounds} round(s) of "
          f"{a.steps} steps; s/step over the steps after each process's first", file=sys.stderr)  # fmt: skip
    for name, r in st.items():
        print(f"# {name:<20} median {r['median_s']:6.2f} s  best {r['best_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  "
              f"first {r['first_s']:6.2f} s  peak {r['peak'] / 1e9:5.2f} GB  resident {r['resident'] / 1e9:5.2f} GB  "
              f"streamed {r['streamed'] / 1e9:5.2f} GB/step" + (f"  prefetched {r['prefetched']:.0%}" if r["prefetched"] is not None else ""),
              file=sys.stderr)  # fmt: skip

    def paired(ours: str, baseline: str, key: str) -> float:
        """The median over rounds of ours / baseline within a round (neighbours in time: the machine's
        load drifts less between them than across the whole run)."""
        rs = [statistics.median(o_[key][1:] or o_[key]) / statistics.median(b_[key][1:] or b_[key])
              for o_, b_ in zip(runs[ours], runs[baseline], strict=True)]  # fmt: skip
        return statistics.median(rs)

    from _record import record

    def name_of(name: str) -> str:
        return name if fam == "sd15" else f"{fam}_{name}"

    def line(name: str, ours: str, baseline: str, goal: float | None) -> None:
        """One figure in the guard's format (benchmarks/_record.py): judged by the paired ratio."""
        o_, b_ = st[ours], st[baseline]
        record(name_of(name), o_["median_s"], "s", baseline=baseline, baseline_value=b_["median_s"],
               ratio=paired(ours, baseline, "steps"), goal=goal, better="lower", ours=ours,
               ratio_best=round(o_["best_s"] / b_["best_s"], 3), ratio_cpu=round(paired(ours, baseline, "cpu"), 3),
               ours_first_s=round(o_["first_s"], 3), baseline_first_s=round(b_["first_s"], 3),
               ours_peak_bytes=o_["peak"], baseline_peak_bytes=b_["peak"],
               streamed_bytes_per_step=o_["streamed"], prefetched=o_["prefetched"], rounds=a.rounds)  # fmt: skip

    # issue 15's goals: full <= 1.1x diffusers' plain model, 50 % resident <= 1.3x full on the CPU, and
    # ahead of diffusers' group offload at the same residency
    line("step_full_vs_diffusers", "loadout full", "diffusers plain", 1.1)
    for pct in (50, 10):
        line(f"step_{pct}pct_vs_full", f"loadout {pct}%", "loadout full", 1.3 if pct == 50 else None)
        line(f"step_{pct}pct_vs_group_offload", f"loadout {pct}%", f"diffusers group {pct}%", 1.0)
    if fam == "sd15":
        # on the CPU the LoRA is baked in place into the file's mapping: no second copy, no on-the-fly
        line("step_lora_vs_full", "loadout lora", "loadout full", None)
        line("step_lora_no_room_vs_full", "loadout lora tight", "loadout full", None)
    full = o("full")
    same = all(torch.equal(o(f"l{p}"), full) for p in (50, 10))
    err = float((full - o("dplain")).norm() / o("dplain").norm())
    # the outputs, judged too: a partial step is the full step bit for bit; diffusers within the tests' 1e-3
    record(
        name_of("step_partial_equals_full"), float(same), "bool", judged="value", goal=1.0, better="higher"
    )
    record(name_of("step_rel_l2_vs_diffusers"), err, "", judged="value", goal=1e-3, better="lower")


if __name__ == "__main__":
    main()
