"""The video VAEs' memory coefficients (engine.vae.estimate reads them; moved here when estimate.py passed 500
lines): channels alive per output pixel, per unit of each family's width, measured as each comment says."""

from __future__ import annotations

# Wan-family video VAEs (engine.vae.wan): channels alive per output pixel, per unit of the last level's
# width per output pixel (`ch`: 96 for Wan 2.1 / Qwen-Image, 256 / 2x2 = 64 for Wan 2.2). The encoder's
# (k_act): per pixel of its chunk's frames. The decoder's chunk: K_VIDEO_FRAME per output frame plus
# K_VIDEO_CHUNK once -- its full-resolution levels convolve one frame at a time (engine.vae.causal_conv's
# rolling buffer), so what grows with the frames is x and h of a residual block; the buffer, one frame's
# upsampling and the conv outputs do not. Calibrated on CPU, float32, fresh processes, peak RSS less the
# result and the head (reduced-width decoders at 832x480 with 1, 5, 9 and 13 frames, whole frames and
# 512-px tiles; `bench_vae_video.py --family wan21|wan22` prints estimate vs measured): Wan 2.1 2.0 per
# frame + 3.3, Wan 2.2 3.9 + 7 (its shortcuts read the level's input at the end); the figures below carry
# ~25 % over that. The head (middle block) keeps ~8 tensors of its width per latent pixel of the chunk,
# and its output for every latent frame waits for the tiles.
# The encoder's, per pixel of one frame (a clip: clip_estimate.ENCODE_CLIP_GROWTH): `bench_vae_encode.py` (dim
# 16, 512x512, one frame, CPU float32, fresh processes): Wan 2.1 18.3 per unit of ch, Wan 2.2 16.4; ~25 % over.
# Qwen-Image 2.1's VAE (engine.vae.qwen_image21) is Wan 2.2's residual network -- the same levels, shortcuts and
# widths per level relative to `ch` -- on one frame, its convolutions 1x3x3 (no history frames in their
# buffers): Wan 2.2's figures, an upper bound there. `bench_vae_video.py --family qwen_image21 --size 1024x1024
# --latent-frames 1` (dim 16, CPU, 2 threads): estimate / measured peak 1.76 whole, 1.31 at 512-px tiles, 1.52 at 256.
K_VIDEO_ENCODE = {"wan21": 23.0, "wan22": 20.5, "qwen_image21": 43.5}
K_VIDEO_FRAME = {"wan21": 2.5, "wan22": 4.8, "qwen_image21": 4.8}
K_VIDEO_CHUNK = {"wan21": 4.0, "wan22": 8.0, "qwen_image21": 8.0}
# Between chunks every causal convolution keeps its last 2 input frames (engine.vae.causal_conv.Stream):
# at 13 frames in chunks of one latent frame, 30 (Wan 2.1) and 46 (Wan 2.2) per unit of ch over the
# single-chunk decode, carried ~20 % over. On a GPU a chunk also keeps the previous cache as its retry
# snapshot: twice that when the snapshot stays on the device, once when it waits in host RAM
# (engine.vae.choice.snapshot_for decides).
K_VIDEO_CACHE = {"wan21": 36.0, "wan22": 55.0, "qwen_image21": 0.0}  # one frame: nothing is carried
# Mochi (engine.vae.mochi; per-frame GroupNorm + SiLU into a tensor of its own, then convolutions a frame at a
# time over it, in place): `bench_vae_video.py --child` with family mochi, dim 32 (widths 32/64/128/192, the
# release's blocks), 832x480, whole frames, one chunk, CPU float32, 2 threads, fresh processes: peak RSS above
# the process 430 MB at 1 latent frame (1 output frame), 1529 MB at 2 (7 frames) -- 3.6 units of ch per output
# frame, ~4.8 once; carried ~25 % over. The cache is counted, not measured: 2 frames per causal convolution,
# summed over the blocks at their widths and resolutions (12 + 6 + 4 + 2.25 units), ~25 % over.
K_VIDEO_FRAME["mochi"], K_VIDEO_CHUNK["mochi"], K_VIDEO_CACHE["mochi"] = 4.5, 6.0, 30.0
# Its encoder (engine.vae.mochi_encoder; the first frame alone, then 6 at a time): fresh processes, CPU float32, 2
# threads, a half-width model (encoder widths 32/64/128/192, the release's blocks and attention; ch 64), peak RSS
# above the loaded process once its weights were paged in: one frame 4.1 per unit of ch per pixel at 512x512 (5.3 at
# 256x256), carried ~25 % over. A clip holds a chunk of 6 frames (7 frames at 256x256: 34) and, growing with the
# clip, every earlier frame's attention keys and values (13 frames: 52; ~2.6 per frame of the clip).
K_VIDEO_ENCODE["mochi"] = 5.5
K_VIDEO_HEAD = 8.0
# ViT decoders (MiniMax-H3's, engine.vae.minimax_h3): the release's own tiles (256 px, overlaps of at least 64)
# and chunks of latent frames define the output, so the estimate only says what they take. Per token of a
# tile's chunk (chunk + overlap latent frames x its latent pixels): K_VIT_TOKEN values of the width alive at
# the worst moment (the float32 residual, the norm's output, the SwiGLU's 8-wide projection and product),
# plus every tile of a chunk waiting as float32 output on the CPU for the stitch, then the result.
VIT_KINDS = ("minimax_h3",)
VIT_TILE = (256, 64)
K_VIT_TOKEN = 16.0
VIT_CHUNK = 5  # MiniMax-H3: latent frames a chunk advances by (engine.vae.minimax_h3)
VIT_CHUNK_FRAMES = 7  # and the latent frames it reads: 2 more
# MiniMax-H3's encoder (engine.vae.minimax_h3_encoder): per pixel, per unit of its first width (`enc_ch`; the release's
# 128 where a header gives none). CPU, float32, 2 threads, fresh processes, peak RSS above the loaded process, widths
# 32 .. 256: one frame at 256x256 220 MB (27.5), at 512x512 608 MB whole (19), 294 MB in the release's tiles (35 per
# pixel of one tile: they run one at a time, `act_pixels`); 9 frames at 512x512 whole 1536 MB (48 per frame pixel).
# diffusers' there: 232 MB tiled, 336 whole, 3486 at 9 frames. The tiled figure, 25 % over:
VIT_ENC_CH, K_VIDEO_ENCODE["minimax_h3"] = 128, 44.0
VIDEO_KINDS = ("wan21", "wan22", "qwen_image21", *VIT_KINDS)
# LTX-Video (engine.vae.ltx, kind "ltxv"): `ch` is the last level's width per output pixel (128 / 4x4 = 8
# for the releases), time_factor 8, 32x. Its blocks run whole chunks (no rolling buffer), nothing is
# carried between chunks, and each chunk decodes with `time_context` latent frames of context a side
# (VaeSpec.time_context). Measured on the CPU (float32, 2 threads, fresh processes, peak RSS less the
# loaded process and the result; a reduced 0.9.5-layout decoder, widths 128 -> 16 -- the releases' 8:1 --
# 2 blocks a level, whole clips of 2 and 3 latent frames at 256^2 and 384^2): 6.6-8.3 per counted output
# frame (time_factor per latent frame) and per unit of ch, nothing measurable per chunk; carried ~25 % over.
LTX_K_FRAME, LTX_K_CHUNK = 10.5, 4.0
# LTX-2's video VAE ("ltx2") is the same decoder, its borders mirrored: the same figures.
# The encoder (engine.vae.ltx_encoder; built where the file holds it), per encoded pixel of one frame and per unit
# of ch (the releases' encoders start at width 128 = 8 x 4x4, as their decoders end): measured on the CPU (float32,
# 2 threads, fresh processes after a warm-up encode, glibc's mmap threshold fixed so that freed tensors leave the
# RSS: peak RSS above the loaded process; quarter-width encoders, widths from 32, the releases' blocks) at 512x512:
# an image 29.5 (0.9.5's / LTX-2's; 0.9.0's 8.3), carried ~30 % over (a clip: clip_estimate's growth; diffusers'
# whole pass: 55, 63, 111 at 1, 9, 17 frames).
# Whatever the size, oneDNN reorders a float32 convolution's weight for each call: 2x its bytes held (a
# 2048-wide 3x3x3 one, the released 0.9.5 / LTX-2 middle block's: 877 MB), counted once (spec_of: the file's).
LTX_ENCODE_FIXED = 2 * 4 * 27 * 2048**2
LTX_K_ENCODE = 38.5
for _k in ("ltxv", "ltx2"):
    K_VIDEO_ENCODE[_k] = LTX_K_ENCODE
    K_VIDEO_FRAME[_k] = LTX_K_FRAME
    K_VIDEO_CHUNK[_k] = LTX_K_CHUNK
    K_VIDEO_CACHE[_k] = 0.0
VIDEO_KINDS += ("ltxv", "ltx2")
VIDEO_KINDS += ("mochi",)
# Kandinsky 6 SR's K-VAE (engine.vae.kandinsky6_sr): per unit of `ch` (its full-resolution width, 16) far more
# than Wan's -- level 1's width (16 ch) is upsampled to full resolution before level 0 narrows it, every
# latent-conditioned norm holds two expanded maps beside its output, and a chunk runs whole (no frame slices in
# the full-resolution levels). Measured on the CPU as the Wan figures were (float32, 2 threads, fresh processes,
# peak RSS less the result and the head; an eighth-width decoder, widths (2, 32, 64, 128, 256), z 64): at 256x256,
# one latent frame 277 per unit of ch per output pixel, 3 latent frames in one chunk (9 frames) 587, 2 in chunks
# of one 484 (the carried history: +207), 3 in chunks of two 578; at 512x256 486-488. Fitted (4 frames counted a
# latent frame, as video_chunk_bytes counts them): 39 a frame, 122 a chunk, 207 the cache, carried ~25 % over.
VIDEO_KINDS += ("kandinsky6_sr",)
# Its encoder (an image is one frame; a clip runs its first frame alone, then 4 at a time, the causal history in
# a Stream): fresh processes, CPU float32, 2 threads, a quarter-width model (encoder widths (4, 32, 64, 128, 256)),
# peak RSS above the loaded process once its weights were paged in (a 16x16 encode first): one frame 27.6 per unit
# of ch per pixel at 512x512, 15.5 at 1024x1024 (~65 MB of it a constant); the eighth-width model the same per ch.
# A 9-frame clip at 512x512 112 (a chunk of 4 frames and the carried history), 5 frames 83, 13 frames 118: after
# the second chunk a frame adds only its latent. Carried ~25 % over the image's figure.
K_VIDEO_ENCODE["kandinsky6_sr"] = 35.0
K_VIDEO_FRAME["kandinsky6_sr"] = 48.0
K_VIDEO_CHUNK["kandinsky6_sr"] = 150.0
K_VIDEO_CACHE["kandinsky6_sr"] = 250.0
# The HunyuanVideo VAE (engine.vae.hunyuan_video): GroupNorms, and its last up block doubles space at width
# 2 ch (256 for the release's 128). Measured as Wan's (`bench_vae_video.py`'s child, --family hunyuan_video,
# dim 32, CPU float32, fresh processes, whole frames of 256x256): peak RSS above the process before the decode
# 463 MB at 5 frames, 895 MB at 13, i.e. 6.4 per frame per unit of ch, carried 25 % over as Wan's; the chunk
# and cache figures are not measured (Wan 2.2's).
K_VIDEO_FRAME["hunyuan_video"] = 8.0
K_VIDEO_CHUNK["hunyuan_video"] = 8.0
K_VIDEO_CACHE["hunyuan_video"] = 60.0
# Its encoder (engine.vae.hunyuan_video_encoder; clips whole, its GroupNorms spanning the frames):
# `bench_vae_encode.py --family hunyuan_video --dim 32` (widths 32 x (1, 2, 4, 4), 512x512, CPU float32, fresh
# processes, the weights paged in before): 211-245 MB for one frame = 6.3-7.3 per encoded pixel per unit of ch,
# carried ~20 % over the higher (a clip: clip_estimate.ENCODE_CLIP_GROWTH).
K_VIDEO_ENCODE["hunyuan_video"] = 8.5
# HunyuanVideo 1.5's (engine.vae.hunyuan_video15): RMS norms as Wan's, depth-to-space upsampling that holds
# the conv's output and the unfolded input at once. Measured the same way (--family hunyuan_video15, dim 32):
# 443 MB at 5 frames, 735 MB at 13 = 4.4 per frame per unit of ch, 25 % over: 5.5. Chunk and cache, with the
# weights paged in before the count (two runs each, 256x256): 13 frames whole 522-631 MB, in chunks of one latent
# frame 311-362 MB, 9 frames in chunks of one 294-391 MB -- ~15-20 per unit of ch for a chunk and the history
# it carries (Wan 2.2's 8 + 55 had been assumed); 6 + 24 keeps the estimate 1.1-1.5x over those.
# Its encoder (engine.vae.hunyuan_video15_encoder: chunks of 1, then 4 frames), measured as HunyuanVideo's
# (widths 32 x (1, 2, 4, 8, 8), 512x512): 112 MB for one frame = 3.3 per pixel per unit of ch, 25 % over: 4.2.
for _k, _v in (K_VIDEO_FRAME, 5.5), (K_VIDEO_CHUNK, 6.0), (K_VIDEO_CACHE, 24.0), (K_VIDEO_ENCODE, 4.2):
    _k["hunyuan_video15"] = _v
VIDEO_KINDS += ("hunyuan_video", "hunyuan_video15")
# A middle block whose attention is causal over frames keeps every earlier latent frame's keys and values
# (2 x its width per latent pixel) in the head's stream until the clip's last chunk: the HunyuanVideo VAEs
K_VIDEO_KV = {"hunyuan_video": 2.0, "hunyuan_video15": 2.0}
# Cosmos 1.0's tokenizer (engine.vae.cosmos): per-frame GroupNorms (one group) and factorized convolutions; its last up
# block runs at 1/4 of the output's size and frames (`ch` = that block's width / 16, as LTX's: 16 in the release), the
# unpatching writes the output. Measured at the release's widths (`bench_vae_video.py --family cosmos_predict1 --dim
# 128`: decoder 512 .. 256, CPU float32, 2 threads, fresh processes, peak RSS above the process with its weights paged
# in) at 512x512: 1 latent frame whole 241 MB, 3 whole 827 MB, 3 in chunks of one 921 MB (every temporal conv's two
# carried frames: ~32 units, the sum of the blocks' widths at their sizes), 256-px tiles 267-305 MB -- 1.6-1.7 per
# counted output frame per unit of ch. The figures below put the estimate 1.25-1.7x over those. A reduced-width file
# reads low: fixed costs (the middle block's attention blocks) weigh more there.
# Its middle block's attention over frames keeps every earlier latent frame's keys and values.
VIDEO_KINDS += ("cosmos_predict1",)
K_VIDEO_FRAME["cosmos_predict1"] = 2.2
K_VIDEO_CHUNK["cosmos_predict1"] = 2.0
K_VIDEO_CACHE["cosmos_predict1"] = 40.0
# Its encoder (engine.vae.cosmos_encoder: the first frame alone, then 8 at a time): `bench_vae_encode.py --family
# cosmos_predict1 --dim 128` (the release's widths, 512x512, CPU float32, fresh processes, the weights paged in first):
# one frame 167-183 MB = 10-11 per unit of ch per pixel, carried ~25 % over; a clip clip_estimate's growth (the
# estimate then 1.2x / 1.35x / 1.5x the measure at 1 / 9 / 17 frames).
K_VIDEO_ENCODE["cosmos_predict1"] = 13.5
K_VIDEO_KV["cosmos_predict1"] = 2.0
