"""A forward's inputs, in the original codebases' names and conventions: checked when read from a file,
or seeded random ones of the model's shapes.

Wan 2.x (`wan.modules.model.WanModel.forward(x, t, context, clip_fea)`, batched): `x` [B, C, F, h, w] video
latents (16 channels for Wan 2.1 / 2.2 A14B, F latent frames, h and w an 8th of the pixels; the image
models' 36: latent, 4-channel mask and image latent, concatenated), `t` [B] in 0–1000, `context` [B, L,
4096] umT5 states (padded with zeros to 512 tokens inside the model), and for Wan 2.1 I2V / FLF2V
`clip_fea` [B, 257, 1280] CLIP ViT-H penultimate states of the image (FLF2V: [B, 514, 1280], the first
frame's then the last's); for VACE `vace_context` [B, 96, F, h, w], the control video's latents and masks
as its pipeline builds them, and optionally `vace_context_scale` [B], the hints' strength (default 1, the
original's `vace_context_scale`; ComfyUI's WanVaceToVideo strength). Wan 2.2 Animate
(`WanAnimateModel.forward(x, t, clip_fea, context, seq_len, y, pose_latents, face_pixel_values)`): the I2V
inputs (x's 36 channels holding y) and `pose_latents` [B, 16, F − 1, h, w] (the pose video's latents, for
the frames after the reference one) and `face_pixel_values` [B, 3, T, 512, 512] (the face video in −1…1, T =
4·(F − 2) + 1 frames: the pipeline's 77 for 21 latent frames; random inputs: 3 latent frames, 5 face frames).

UNet (`openaimodel.UNetModel.forward(x, timesteps, context, y)`): `x` [B, C, h, w] latents (C = the
model's input channels: 4, or 9 for inpainting), `timesteps` [B] float in 0–999, `context` [B, T, D],
and `y` [B, adm] for models with an ADM input. SDXL's `y` is 2816 wide: the pooled OpenCLIP-G
embedding (1280), then 256-wide sinusoidal embeddings of original height and width, crop top and
left, target height and width (generative-models `sd_xl_base.yaml` conditioner:
`ConcatTimestepEmbedderND` with outdim 256 per number, in that order); the refiner's 2560 are the
pooled 1280, original size, crop, and the aesthetic score (`sd_xl_refiner.yaml`).

FLUX.1 (`flux.model.Flux.forward`): `img` [B, L, 64] latents packed in 2×2 patches (L = h/2 · w/2 of a
16-channel latent), `img_ids` [B, L, 3] (0, row, column of each patch), `txt` [B, T, 4096] T5 states,
`txt_ids` [B, T, 3] (zeros), `timesteps` [B] in 0–1, `y` [B, 768] pooled CLIP-L, and `guidance` [B] for
dev (BFL's `sampling.prepare` and `cli.py`: 512 T5 tokens for dev, 256 for schnell, guidance 3.5).

SD3 / SD3.5 (`mmditx.MMDiTX.forward(x, t, y, context)`): `x` [B, 16, h, w] latents (h, w an 8th of the
pixels, even), `t` [B] in 0–1000 (1000·sigma), `y` [B, 2048] pooled CLIP-L (768) then CLIP-G (1280),
`context` [B, L, 4096]: CLIP-L/G's hidden states (768 + 1280, zero-padded to 4096) then T5-XXL's
(SD3's reference sampling: 77 + 77 tokens).

Qwen-Image (its pipeline around `QwenImageTransformer2DModel`): `x` [B, 16, h, w] latents (one frame;
packed into 2×2 patches inside, h and w even), `timesteps` [B] in 0–1, `context` [B, T, 3584]
Qwen2.5-VL states; for Qwen-Image-Edit optionally `ref_latents` [B, 16, h', w'], the reference image's
latents (its own size, h' and w' even), which the edit pipelines append to the image tokens. Qwen-Image-Layered:
`x` [B, 16, F, h, w], the F = layers + 1 latents it decomposes into, and `ref_latents` the input image's.
Qwen-Image 2.1 (diffusers' QwenImage21Transformer2DModel and its pipeline, on Loadout's latent convention; the release
has no other forward): `x` [B, 64, h, w] latents of its 16× VAE (unpatched, h and w even), `timesteps` [B] in 0–1
(its pipeline's t / 1000), `context` [B, T, 4096] Qwen3-VL states (diffusers' encoder_hidden_states), and
optionally `context_mask` [B, T] (its encoder_hidden_states_mask: 1 for the prompt's tokens, then 0), `img_mask`
[B, T] (1 at the positions the VL encoder reserved for the condition images' tokens, one per 2×2 latent tokens, the
same in every item; diffusers' img_mask without the target's slots, which the model appends) and `ref_latents`
[B, 64, h', w'] or [B, N, 64, h', w'] (the N condition images' latents, which fill those slots in order).

Z-Image (its release's `ZImageTransformer2DModel.forward(x, t, cap_feats)`, batched): `x` [B, 16, h, w]
latents (one frame; 2×2 patches inside, h and w even), `t` [B] in 0–1 as its pipeline passes it (1 − sigma:
1 is the clean image), `cap_feats` [B, T, 2560] Qwen3-4B states of the prompt's tokens (the pipeline keeps
the unpadded ones; the model pads them to a multiple of 32); a batch of captions of several lengths (the
release's list of unpadded captions) takes `cap_mask` [B, T] as Lumina 2 does. Lumina 2 (Lumina-Image-2.0's
`NextDiT.forward(x, t, cap_feats, cap_mask)`): the same `x` and `t`, `cap_feats` [B, T, 2304] Gemma-2-2B
states, and optionally `cap_mask` [B, T] (1 for each prompt's tokens, then 0 for its padding; default all 1).
Z-Image Omni (the release's omni mode, batched: engine.denoise.z_image_omni): the same, and optionally
`cap_lens` [B, K], `cond_latents` [B, N, 16, h', w'], `siglip_feats` [B, N, H, W, 1152].

AuraFlow (v0.1–0.3, Pony V7; diffusers' AuraFlowTransformer2DModel.forward(hidden_states, encoder_hidden_states,
timestep)): `x` [B, 4, h, w] latents (2×2 patches inside, h and w even), `t` [B] in 0–1 (its pipeline's t / 1000),
`context` [B, T, 2048] Pile-T5-XL states (256 tokens in its pipeline).

HunyuanVideo 1.0 (`hyvideo.modules.models.HYVideoDiffusionTransformer.forward(x, t, text_states, text_mask,
text_states_2, ..., guidance)`): `x` [B, C, F, h, w] video latents (16 channels; 33 for its image-to-video
release: latent, image latent, mask; 32 for SkyReels), `t` [B] in 0–1000, `text_states` [B, T, 4096]
llava-llama-3-8b states (256 tokens in its pipeline, after the template's), `text_states_2` [B, 768] pooled
CLIP-L, `guidance` [B] for the guidance-distilled release (1000 × the embedded scale, as its pipeline
passes it: 6000 by default), and optionally `text_mask` [B, T] (1 for the prompt's tokens, then 0) and, for the
token-replace image-to-video release (HunyuanVideo-I2V's second version, whose layout is t2v's), `guiding_frame_index`
[B] = 0 (ComfyUI's name): the first latent frame (the clean image's) is modulated at t = 0.

HunyuanVideo 1.5 (Tencent-Hunyuan/HunyuanVideo-1.5's transformer forward, batched): `x` [B, 65, F, h, w] (the
32-channel latent at a 16th of the pixels, the condition latent, the mask channel), `t` [B] in 0–1000,
`text_states` [B, T, 3584] Qwen2.5-VL states, and optionally `text_mask` [B, T], `byt5_text_states` [B, L,
1472] with `byt5_text_mask` [B, L] (the prompt's quoted glyph text through byT5), `vision_states` [B, 729,
1152] (the first frame's SigLIP states, i2v; absent or zeros for t2v) and `timestep_r` [B] (the MeanFlow
models' second time).

LTX-Video (ComfyUI's and the original's `forward(x, timestep, context, attention_mask, frame_rate)`, batched): `x`
[B, 128, F, h, w] latents (a 32nd of the pixels, an 8th of the frames), `timestep` [B] in 0–1 (sigma; or one
per token, [B, F·h·w], for conditioning frames at 0), `context` [B, T, 4096] T5-XXL states (128 tokens in its
pipeline), and optionally `attention_mask` [B, T] (1 for the prompt's tokens) and `frame_rate` [B] (default 25).

LTX-2 (the original's `LTXModel.forward(video, audio)`, each a `Modality`; its fields here by the stream they belong
to, batched): `video_latent` [B, 128, F, h, w] latents (a 32nd of the pixels, an 8th of the frames; one token per
latent pixel), `video_timesteps` [B] in 0–1 (sigma; or one per token, [B, F·h·w]), `video_context` [B, T, D] the
video stream's text states, `audio_latent` [B, T_a, 128] the audio latent's tokens (the audio VAE's [B, 8, T_a, 16]
patchified, channels outer: 25 a second), `audio_timesteps` [B] or [B, T_a], `audio_context` [B, T, D_a]. Where the
file holds the text connectors (the release's does), the contexts are what they take: the feature extractor's
output (LTX-2.0: [B, T, 3840] for both; LTX-2.3: [B, T, 4096] and [B, T, 2048]), T a multiple of their 128
registers (1024 tokens in its pipelines); else the connectors' outputs. Optionally `video_context_mask` /
`audio_context_mask` [B, T] (1 for the prompt's tokens, anywhere: Gemma pads on the left), `video_sigma` /
`audio_sigma` [B] (the original's Modality.sigma: LTX-2.3's prompt and cross-modal modulations; default the
timesteps, or their largest per item), `fps` [B] (diffusers' name; the video's positions, default 24) and for
LTX-2.5 `video_keyframes_mask` [B, F·h·w] (the tokens its keyframe embedding marks).

Cosmos Predict2 (ComfyUI's and the original's MiniTrainDIT `forward(x, timesteps, context, fps, ...)`, batched): `x`
[B, 16, F, h, w] Wan 2.1 VAE latents (an 8th of the pixels, h and w even), `timesteps` [B] in 0–1 (σ / (σ + 1); or
one per latent frame, [B, F]), `context` [B, T, 1024] T5-XXL states (512 tokens, the padding zeroed, in its
pipelines), and optionally, for Video2World, `condition_mask` [B, 1, F, h, w] (1 on the given frames) and `fps`
[B].

Mochi 1 (Genmo's `AsymmDiTJoint.forward(x, sigma, y_feat, y_mask)`, batched; its lists of one text encoder's
features and mask as the tensors): `x` [B, 12, F, h, w] latents (an 8th of the pixels, a 6th of the frames; 2×2
patches inside, h and w even), `sigma` [B] in 0–1 (1 is noise; diffusers' `timestep` is 1000 · (1 − sigma)),
`y_feat` [B, T, 4096] T5-XXL states (256 tokens in its pipeline), and optionally `y_mask` [B, T] (1 for the
prompt's tokens, first; all 0 for the empty negative prompt, as its pipeline zeroes it; default all 1).

Stable Cascade (Stability-AI/StableCascade's `StageC.forward(x, r, clip_text, clip_text_pooled, clip_img)` and
`StageB.forward(x, r, effnet, clip)`; diffusers' StableCascadeUNet calls them sample, timestep_ratio, clip_text,
clip_text_pooled, clip_img and effnet, clip_text_pooled): Stage C `x` [B, 16, h, w] (ceil(px / 42.67) a side), `r` [B]
the noise ratio in 0–1, `clip_text` [B, T, 1280] CLIP-bigG states, `clip_text_pooled` [B, 1, 1280], `clip_img` [B, 1,
768]; Stage B `x` [B, 4, h, w] (10.67 × Stage C's latent), `r`, `effnet` [B, 16, h', w'] (Stage C's output), `clip`
[B, 1, 1280] (the pooled prompt), and optionally `pixels` [B, 3, h'', w''] (default zeros of 8 × 8).

HunyuanImage 2.1 (its transformer's forward, batched): `x` [B, 64, h, w] latents (a 32nd of the pixels), `t` [B] in
0–1000, `text_states` [B, T, 3584] Qwen2.5-VL states, `guidance` [B] for the guidance-distilled model (1000 × the
scale), and optionally `text_mask` [B, T], `byt5_text_states` [B, L, 1472] with `byt5_text_mask` [B, L] (glyph
text) and `timestep_r` [B] (the MeanFlow model's second time).

Sana (NVlabs' `SanaMS.forward(x, timestep, y, mask)`, batched): `x` [B, 32, h, w] DC-AE latents (a 32nd of the
pixels), `timesteps` [B] in 0–1000, `context` [B, T, 2304] Gemma 2 2B states (300 tokens in its pipeline), and
optionally `context_mask` [B, T]. PixArt-α / Σ (its `forward(x, timestep, y, mask, data_info)`, batched): `x`
[B, 4, h, w] SD-VAE latents, `timestep` [B] in 0–1000, `y` [B, T, 4096] T5-XXL states (the original's y [B, 1, T, D]
without its singleton axis), optionally `mask` [B, T], and for α 1024 data_info's `img_hw` [B, 2], `aspect_ratio` [B, 1].

Hunyuan-DiT (the release's `HunYuanDiT.forward(x, t, encoder_hidden_states, text_embedding_mask,
encoder_hidden_states_t5, text_embedding_mask_t5, image_meta_size, style)`): `x` [B, 4, h, w] SD-VAE latents, `t` [B] in
0–1000, `encoder_hidden_states` [B, 77, 1024] (its CLIP's: Chinese BERT-large states), `encoder_hidden_states_t5` [B,
256, 2048] (mT5-XL states), optionally `text_embedding_mask` [B, 77] / `text_embedding_mask_t5` [B, 256] (default: every
token), and for v1.0 / v1.1 `image_meta_size` [B, 6] (default: 1024, 1024, the latent's pixel width and height, 0, 0)
and `style` [B] (default 0). Its 2-D RoPE (the release's cos_cis_img / sin_cis_img) is computed from x's grid.

Krea 2 (diffusers' Krea2Transformer2DModel, on Loadout's latent convention): `x` [B, 16, h, w] latents (2×2 patches
inside, h and w even), `timesteps` [B] in 0–1 (1 is noise), `context` [B, T, L, 2560]: each prompt token's hidden
states from L (12) layers of Qwen3-VL, and optionally `context_mask` [B, T] (1 for the prompt's tokens).

HiDream-I1 (diffusers' HiDreamImageTransformer2DModel.forward, HiDream-ai's release names): `hidden_states` [B, 16, h,
w] latents (2×2 patches inside, h and w even), `timesteps` [B] in 0–1000, `encoder_hidden_states_t5` [B, T, 4096]
T5-XXL states, `encoder_hidden_states_llama3` [32, B, T', 4096] — the stack of Llama 3.1 8B's 32 layers' states (its
`hidden_states[1:]`; 128 tokens each in its pipeline), `pooled_embeds` [B, 2048] (pooled CLIP-L then CLIP-G), and
optionally `max_seq` [B]: the tokens a non-square latent is padded to (default 4096; HiDream-E1-Full's config 4608,
E1.1's pipeline 8192, whose `hidden_states` are the target's and the reference image's latents side by side).

Text encoders (transformers' CLIPTextModel / T5EncoderModel forward): `input_ids` [B, T] token ids (77
for CLIP, 512 for T5 when random).

Chroma: FLUX.1's `img`, `img_ids`, `txt`, `txt_ids` and `timesteps` (0–1); no pooled CLIP vector and no
guidance input (its pipelines embed guidance 0, as diffusers' ChromaTransformer2DModel does).

FLUX.2 (BFL's `Flux2.forward`): `img` [B, L, 128] (2×2 patches of the 32-channel latent), `img_ids` [B, L, 4]
(0, row, column, 0), `txt` [B, T, D] (D: [dev] 15360, three Mistral Small 3.1 layers' states; [klein] 4B
7680 and 9B 12288, three Qwen3 layers'), `txt_ids` [B, T, 4] (0, 0, 0, i), `timesteps` [B] in 0–1, and for
[dev] `guidance` [B] (its pipeline's default 4); no pooled vector.

FLUX.3 (diffusers' Flux3Transformer2DModel.forward; BFL's own forward is not published, its converter gives only the
weights' names): `hidden_states` [B, L, 128] (2×2 patches of the 32-channel latent), `encoder_hidden_states` [B, T,
20480] (8 stacked Qwen3-VL layers' states; its pipeline pads the prompt to a multiple of 80 tokens), `timestep` [B] in
0–1 (1 is noise), `img_ids` [B, L, 4] (0, 0.5·row, 0.5·column, 0: diffusers' [L, 4] with a batch axis), `txt_ids`
[B, T, 4] (0, 0, 0, i), and for the step-distilled (flow-map) model `target_timestep` [B] (the time the step jumps to:
the next sigma, 0 after the last); optionally the reference images' `image_cond_hidden_states` [B, L', 128] and their
`image_cond_ids` [B, L', 4] (l = −1, −2, … per image). Random: one reference image of the target's size.

MiniMax-H3 (diffusers' MiniMaxH3Transformer3DModel.forward): `hidden_states` [B, Nv, 96], `audio_hidden_states` [B, Na,
32], `encoder_hidden_states` [B, Nt, 5120], and one packed layout the batch shares, without a batch axis (the model's
`unbatched`): `timestep` [K], `timestep_indices` / `token_tags` [S], `position_ids` [S, 3], `video_indices` [Nv],
`audio_indices` [Na], `text_indices` [Nt] (engine.denoise.minimax_h3).
"""

from __future__ import annotations

import torch

from ..errors import FormatError
from .input_shapes import batch_axis, shapes

UNET_INPUTS = ("x", "timesteps", "context", "y")
FLUX_INPUTS = ("img", "img_ids", "txt", "txt_ids", "timesteps", "y", "guidance")
WAN_INPUTS = ("x", "t", "context")
MMDIT_INPUTS = ("x", "t", "y", "context")
QWEN_INPUTS = ("x", "timesteps", "context")
NEXTDIT_INPUTS = ("x", "t", "cap_feats")
AURAFLOW_INPUTS = ("x", "t", "context")
HUNYUAN_INPUTS = ("x", "t", "text_states", "text_states_2", "guidance")
HUNYUAN_TOKENS = 256  # the HunyuanVideo pipeline's text_len
HUNYUAN15_INPUTS = ("x", "t", "text_states")
FRAMEPACK_IMAGE_TOKENS = 729  # SigLIP so400m at 384 px
# FramePack's (lllyasviel's `hunyuan_video_packed.py` forward names): the first frame's SigLIP states and the history
FRAMEPACK_OPTIONAL = ("image_embeddings", "latent_indices", "clean_latents", "clean_latent_indices", "clean_latents_2x",
                      "clean_latent_2x_indices", "clean_latents_4x", "clean_latent_4x_indices")  # fmt: skip
HUNYUAN_IMAGE_OPTIONAL = ("text_mask", "byt5_text_states", "byt5_text_mask", "timestep_r")
HUNYUAN_IMAGE_GUIDANCE = 3500.0  # 1000 × the distilled model's default guidance 3.5
LTXV_INPUTS = ("x", "timestep", "context")
LTX2_INPUTS = (
    "video_latent",
    "video_timesteps",
    "video_context",
    "audio_latent",
    "audio_timesteps",
    "audio_context",
)
LTX2_OPTIONAL = ("video_context_mask", "audio_context_mask", "video_sigma", "audio_sigma", "fps")
LTX2_FRAMES = 3  # latent frames of a random LTX-2 step (17 pixel frames; catalog.measured.STEP_FRAMES)
LTX2_TOKENS = 1024  # the LTX-2 pipelines' text length (Gemma's max_length)
COSMOS_INPUTS = ("x", "timesteps", "context")
FLUX3_INPUTS = ("hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids")
FLUX3_OPTIONAL = ("image_cond_hidden_states", "image_cond_ids")  # a reference image's tokens
FLUX3_TOKENS = 160  # two of the pipeline's 80-token pad multiples
KREA2_INPUTS = ("x", "timesteps", "context")
KREA2_TOKENS = 256
SANA_TOKENS = 300  # the Sana pipeline's max_sequence_length
SPRINT_GUIDANCE = 4.5 * 0.1  # SanaSprintPipeline's default guidance_scale x its guidance_embeds_scale
PIXART_INPUTS = ("x", "timestep", "y")  # PixArt's `forward(x, timestep, y, mask, data_info)`
PIXART_TOKENS = 300  # PixArt-Σ's pipeline max_sequence_length (α: 120)
MOCHI_INPUTS = ("x", "sigma", "y_feat")  # AsymmDiTJoint's `forward(x, sigma, y_feat, y_mask)`
MOCHI_TOKENS = 256  # its pipeline's MAX_T5_TOKEN_LENGTH
HUNYUAN_DIT_INPUTS = ("x", "t", "encoder_hidden_states", "encoder_hidden_states_t5")
HUNYUAN_DIT_OPTIONAL = ("text_embedding_mask", "text_embedding_mask_t5")
COSMOS_TOKENS = 512  # the Cosmos Predict2 pipelines' T5 length
HIDREAM_INPUTS = ("hidden_states", "timesteps", "encoder_hidden_states_t5", "encoder_hidden_states_llama3",
                  "pooled_embeds")  # fmt: skip
HIDREAM_TOKENS = 128  # the HiDream pipeline's max_sequence_length (T5 and Llama alike)
LATENT_16 = 16
ANIMA_TOKENS = 128  # a prompt's Qwen3 states and T5 ids (random inputs)
LTXV_TOKENS = 128  # the LTX-Video pipeline's max_sequence_length
HUNYUAN15_OPTIONAL = ("text_mask", "byt5_text_states", "byt5_text_mask", "vision_states", "timestep_r")
HUNYUAN_GUIDANCE = 6000.0  # 1000 × its sample_video.py's default embedded guidance scale 6.0
IMAGE_PATCHED = (
    "mmdit",
    "qwen_image",
    "nextdit",
    "auraflow",
    "krea2",
    "pixart",
    "hunyuan_dit",
    "hidream",
)  # `x` (HiDream: `hidden_states`) a [B, C, h, w] latent in 2×2 patches
# video families' `x` [B, C, F, h, w]: (the side of a spatial patch, the VAE's spatial compression)
IMAGE_LATENT = {
    "hunyuan_image21": (1, 32),
    "sana": (1, 32),
    "stable_cascade_c": (1, 42),  # its pipeline's 42.67 px per latent pixel
    "stable_cascade_b": (2, 4),  # 10.67 latent pixels per Stage C one: 4 px each, in 2×2 patches
}  # other image families' (patch side, VAE compression)
VIDEO_LATENT = {
    "wan": (2, 8),
    "hunyuan_video": (2, 8),
    "hunyuan_video15": (1, 16),
    "ltxv": (1, 32),
    "ltx2": (1, 32),  # its video stream's latent (the audio tokens ride along)
    "cosmos": (2, 8),
    "mochi": (2, 8),
}
PATCHED = (
    *IMAGE_PATCHED,
    "wan",
    "hunyuan_video",
    "mochi",
    "wan_animate2",
)  # (HunyuanVideo 1.5 patches 1×1×1)  # families whose `x` is cut into 2×2 patches
TEXT_INPUTS = ("input_ids",)
QWEN_TOKENS = 256  # Qwen2.5-VL prompt states (the pipeline drops its 34-token system prefix)
LAYERED_FRAMES = 5  # Qwen-Image-Layered's pipeline default: 4 layers and the composite
NEXTDIT_TOKENS = 128  # a prompt's Qwen3 states, chat template included (Z-Image keeps only the real tokens)
AURAFLOW_TOKENS = 256  # the AuraFlow pipeline's max_sequence_length
MMDIT_TOKENS = 154  # CLIP-L/G's 77 tokens then T5's 77 (SD3's reference sampling)
CHROMA_INPUTS = FLUX_INPUTS[:5]
WAN_TOKENS = 512
CLIP_TOKENS = 257  # one image's CLIP ViT-H/14 tokens (Wan 2.1 I2V)
UNET_TOKENS = 77
FLUX_TOKENS = {"flux1_dev": 512, "flux1_schnell": 256, "chroma": 512, "flux2": 512}
FLUX_GUIDANCE = 3.5
FLUX2_GUIDANCE = 4.0  # the FLUX.2 [dev] pipeline's default guidance
SDXL_ADM = 2816
REFINER_ADM = 2560
POOLED = 1280
AESTHETIC = 6.0  # the refiner's default aesthetic score (generative-models sampling helpers)


def optional_names(model) -> tuple[str, ...]:
    """Inputs `model` takes when a file gives them (and otherwise runs at their default)."""
    if hasattr(model, "step_optional"):  # a self-described family (engine.denoise.SELF_DESCRIBED)
        return tuple(model.step_optional)
    if getattr(model, "family", "") == "wan" and hasattr(model, "optional_inputs"):
        return model.optional_inputs  # VACE's hint strength; ChronoEdit's RoPE skip (engine.denoise.wan)
    if getattr(model, "family", "") == "wan_animate2":
        return ("is_uncondtion",)  # diffusers' (its spelling): the unconditional samples skip block 9, [B]
    if getattr(model, "family", "") == "nextdit":
        if model.omni:  # Z-Image Omni's pieces, condition images and their SigLIP grids
            from .z_image_omni import OPTIONAL

            return OPTIONAL
        return ("cap_mask",)  # the captions' mask, [B, T] (captions of several lengths); default: every token
    if getattr(model, "family", "") == "qwen_image":
        return ("ref_latents",)  # Qwen-Image-Edit's reference image, [B, 16, h', w']
    if getattr(model, "family", "") == "qwen_image21":  # a padded prompt; condition images and their slots
        from .qwen_image21 import OPTIONAL

        return OPTIONAL
    if getattr(model, "family", "") == "hunyuan_video":
        if getattr(model, "clean", None) is not None or getattr(model, "image_proj", None) is not None:
            return ("text_mask", *FRAMEPACK_OPTIONAL)
        # the prompt's tokens, [B, T] (default: every token); the token-replace I2V's guiding frame, [B] (0)
        return ("text_mask", "guiding_frame_index")
    if getattr(model, "family", "") == "hunyuan_video15":
        return HUNYUAN15_OPTIONAL
    if getattr(model, "family", "") == "ltxv":
        return ("attention_mask", "frame_rate")
    if getattr(model, "family", "") == "ltx2":
        return LTX2_OPTIONAL + (("video_keyframes_mask",) if model.keyframes else ())
    if getattr(model, "family", "") in ("krea2", "sana"):
        return ("context_mask",)
    if getattr(model, "family", "") == "pixart":  # the prompt's tokens; α 1024's size conditions
        return ("mask", "img_hw", "aspect_ratio") if model.micro is not None else ("mask",)
    if getattr(model, "family", "") == "hunyuan_dit":  # the prompts' tokens; v1.0 / v1.1's size and style
        return HUNYUAN_DIT_OPTIONAL + (("image_meta_size", "style") if model.style is not None else ())
    if getattr(model, "family", "") == "hunyuan_image21":
        return HUNYUAN_IMAGE_OPTIONAL
    if getattr(model, "family", "") == "mochi":
        return ("y_mask",)  # the prompt's tokens, [B, T]; default: every token
    if getattr(model, "family", "") == "flux3":
        return FLUX3_OPTIONAL
    if getattr(model, "family", "") == "stable_cascade":  # Stage B's pixels [B, 3, h, w]; default 8×8 zeros
        return ("pixels",) if model.effnet is not None else ()
    if getattr(model, "family", "") == "hidream":
        return ("max_seq",)  # the tokens a non-square latent is padded to, [B]; default 4096
    if getattr(model, "family", "") == "cosmos":
        anima = ("t5xxl_weights",) if model.adapter is not None else ()
        return (("condition_mask", "fps") if model.video2world else ()) + anima
    return ()


def names(model) -> tuple[str, ...]:
    """The input names `model` takes, required first."""
    if hasattr(model, "step_inputs"):  # a self-described family (engine.denoise.SELF_DESCRIBED)
        return tuple(model.step_inputs)
    if hasattr(model, "model_channels"):
        return UNET_INPUTS if model.adm_channels else UNET_INPUTS[:3]
    if getattr(model, "family", "") == "wan_animate2":  # diffusers' names (engine.denoise.wan_animate2)
        return model.own_inputs()
    if getattr(model, "family", "") == "wan":
        extra = (("clip_fea",) if model.image_dim else ()) + (
            ("vace_context",) if model.vace_channels else ()
        )
        extra += getattr(model, "extra_inputs", ())  # Wan Animate's (engine.denoise.wan_animate)
        return (*WAN_INPUTS, *extra)
    if getattr(model, "family", "") in ("chroma", "flux2"):  # no pooled vector; FLUX.2 [dev] a guidance
        return CHROMA_INPUTS + (("guidance",) if model.guidance_in is not None else ())
    if getattr(model, "family", "") == "mmdit":
        return MMDIT_INPUTS
    if getattr(model, "family", "") in ("qwen_image", "qwen_image21"):
        return QWEN_INPUTS
    if getattr(model, "family", "") == "nextdit":
        return NEXTDIT_INPUTS
    if getattr(model, "family", "") == "auraflow":
        return AURAFLOW_INPUTS
    if getattr(model, "family", "") == "hunyuan_video":
        return HUNYUAN_INPUTS if model.guidance_in is not None else HUNYUAN_INPUTS[:4]
    if getattr(model, "family", "") == "hunyuan_video15":
        return HUNYUAN15_INPUTS
    if getattr(model, "family", "") == "ltxv":
        return LTXV_INPUTS
    if getattr(model, "family", "") == "ltx2":
        return LTX2_INPUTS
    if getattr(model, "family", "") in ("krea2", "sana"):
        return KREA2_INPUTS + (("guidance",) if getattr(model, "guidance", None) is not None else ())
    if getattr(model, "family", "") == "pixart":
        return PIXART_INPUTS
    if getattr(model, "family", "") == "mochi":
        return MOCHI_INPUTS
    if getattr(model, "family", "") == "stable_cascade":
        return model.inputs
    if getattr(model, "family", "") == "hunyuan_dit":
        return HUNYUAN_DIT_INPUTS
    if getattr(model, "family", "") == "hunyuan_image21":
        return HUNYUAN15_INPUTS + (("guidance",) if model.guidance_in is not None else ())
    if getattr(model, "family", "") == "flux3":  # the flow map's time it jumps to
        return FLUX3_INPUTS + (("target_timestep",) if model.flow_map else ())
    if getattr(model, "family", "") == "hidream":
        return HIDREAM_INPUTS
    if getattr(model, "family", "") == "cosmos":
        return COSMOS_INPUTS + (("t5xxl_ids",) if model.adapter is not None else ())
    # MiniMax-H3: diffusers' forward arguments (engine.denoise.minimax_h3)
    if getattr(model, "family", "") == "minimax_h3":
        from .minimax_h3 import INPUTS

        return INPUTS
    if getattr(model, "family", "") == "text":
        return TEXT_INPUTS
    return FLUX_INPUTS if model.guidance_in is not None else FLUX_INPUTS[:6]


def check_inputs(model, tensors: dict, source: str) -> dict:
    """The inputs a forward of `model` takes, from `tensors` (read from `source`), in float32 (ids and
    all); a missing or misshapen one is a FormatError that says what was expected."""
    want = names(model)
    missing = [n for n in want if n not in tensors]
    if missing:
        raise FormatError(
            f"{source}: missing input(s) {', '.join(missing)}; this model takes {', '.join(want)}"
        )
    got = {n: tensors[n].float() for n in (*want, *(o for o in optional_names(model) if o in tensors))}
    for n, t in got.items():  # every input has a batch axis; a bare number has none to read
        if t.dim() == 0:
            raise FormatError(f"{source}: input {n} is a single number; it needs a batch axis ([B, ...])")
    b = got[want[0]].shape[0]
    expect = shapes(model, got)
    for n, shape in expect.items():
        t = got[n]
        ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape, strict=True))
        # MiniMax-H3's packed layout: one for the whole batch
        unbatched = n in getattr(model, "unbatched", ())
        if not ok or (not unbatched and t.shape[batch_axis(n)] != b):
            want_s = "[" + ", ".join("·" if s is None else str(s) for s in shape) + "]"
            raise FormatError(f"{source}: input {n} has shape {list(t.shape)}; expected {want_s} (batch {b})")
        if t.numel() == 0:
            raise FormatError(f"{source}: input {n} has shape {list(t.shape)}: it holds no values")
        if not torch.isfinite(t).all():
            raise FormatError(f"{source}: input {n} holds NaN or infinite values: the output would be too")
    if hasattr(model, "check_extra"):  # Wan Animate: the face video's frames against the latents'
        model.check_extra(got, source)
    masks = ("cap_mask", "text_mask", "byt5_text_mask", "attention_mask", "context_mask", "mask", "y_mask",
             "text_embedding_mask", "text_embedding_mask_t5")  # fmt: skip
    for n in masks:
        if n in got:
            _check_mask(got[n], source, n)
    if getattr(model, "family", "") == "ltx2":
        _check_ltx2(model, got, source)
    for n in ("x", "ref_latents", "hidden_states"):
        if n in got and getattr(model, "family", "") in PATCHED and any(s % 2 for s in got[n].shape[-2:]):
            raise FormatError(
                f"{source}: input {n} has shape {list(got[n].shape)}: its height and width must be even "
                "(the model reads 2×2 patches of the latent)"
            )
    if "guiding_frame_index" in got and (got["guiding_frame_index"] != 0).any():
        raise FormatError(
            f"{source}: input guiding_frame_index holds values other than 0: HunyuanVideo-I2V's guiding frame is the "
            "first latent frame (0), the clean image's"
        )
    if getattr(model, "family", "") == "hidream":  # a non-square latent fits the padding it gets
        model.padded_length(*got["hidden_states"].shape[-2:], got.get("max_seq"), source)
    return got


def _check_mask(mask: torch.Tensor, source: str, name: str) -> None:
    """A caption's mask as the original forwards read it: 1 for each caption's tokens, first, then 0."""
    if not ((mask == 0) | (mask == 1)).all():
        raise FormatError(f"{source}: input {name} holds values other than 0 and 1")
    for i, row in enumerate(mask):
        n = int(row.sum())
        # a prompt may quote no glyph text; Mochi's empty negative prompt marks no token
        if (n == 0 and name not in ("byt5_text_mask", "y_mask")) or not row[:n].all():
            what = "marks no token" if n == 0 else "has a 0 before its last 1 (the tokens come first)"
            raise FormatError(f"{source}: input {name} of item {i} {what}")


def _check_ltx2(model, got: dict, source: str) -> None:
    """LTX-2's text: each mask 0 and 1 with a token in every item (anywhere: Gemma pads on the left); where the
    file holds a stream's text connector, its text as many tokens as a multiple of the connector's registers."""
    for n in ("video_context_mask", "audio_context_mask"):
        if n in got:
            mask = got[n]
            if not ((mask == 0) | (mask == 1)).all():
                raise FormatError(f"{source}: input {n} holds values other than 0 and 1")
            empty = (~mask.bool().any(dim=1)).nonzero()
            if len(empty):
                raise FormatError(f"{source}: input {n} of item {int(empty[0])} marks no token")
    for n, stream in (("video_context", model.video), ("audio_context", model.audio)):
        if stream.connector is not None and got[n].shape[1] % stream.connector.registers:
            r = stream.connector.registers
            raise FormatError(
                f"{source}: input {n} has {got[n].shape[1]} tokens; the file's text connectors take a multiple of "
                f"{r} (their registers fill the padding: pad the prompt to {LTX2_TOKENS}, as its pipelines do)"
            )
