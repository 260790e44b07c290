"""Diffusion backbones (UNets and DiTs): which architecture, variant and prediction, from keys and shapes.

The rules follow how each architecture is built, with facts taken from (and cited to) these sources —
never their code:
* ComfyUI `comfy/model_detection.py` (@006dd0ae), `detect_unet_config`: the fingerprint key of each family
  (`joint_blocks.0.context_block.attn.qkv.weight` MMDiT, `double_blocks.0.img_attn.norm.key_norm.scale`
  Flux, `double_layers.0.attn.w1q.weight` AuraFlow, `mlp_t5.0.weight` HunyuanDiT, `clf.1.weight` Stable
  Cascade with `clip_txt_mapper` for stage C and `clip_mapper` for stage B), MMDiT depth = hidden / 64,
  Flux `guidance_embed` = presence of `guidance_in`, UNet context dim from `attn2.to_k.weight`.shape[1]
  and ADM width from `label_emb.0.0.weight`.shape[1], video UNets from `time_stack` blocks.
* ComfyUI `unet_config_from_diffusers_unet` (same file): SD1.5 context 768, SD2.1 1024, SDXL 2048 with
  adm 2816, SDXL refiner model_channels 384, context 1280, adm 2560; unCLIP SD2.1 adm 1536 / 2048;
  inpainting 9 input channels, instruct-pix2pix 8.
* diffusers `loaders/single_file_utils.py` CHECKPOINT_KEY_NAMES: `sd35_large` has `joint_blocks.37`
  (38 blocks), SD3.5 medium is the MMDiT-X with `x_block.attn2`; `instruct-pix2pix` and `inpainting`
  are told apart by `input_blocks.0.0.weight` in-channels.
* ComfyUI `comfy/model_base.py`: the training objective of single-objective families — HunyuanDiT
  V_PREDICTION, PixArt EPS, SVD_img2vid V_PREDICTION_EDM; SD3 / Flux / AuraFlow are rectified flow.
* diffusers `scripts/convert_hunyuandit_to_diffusers.py`: diffusers HunyuanDiT keys
  (`time_extra_emb.pooler.q_proj`, `text_embedder`); diffusers Flux / SD3 / AuraFlow transformer namings
  (`x_embedder` + `single_transformer_blocks`, `transformer_blocks.N.attn.add_q_proj` + `pos_embed.proj`,
  `joint_transformer_blocks` + `register_tokens`).
"""

from __future__ import annotations

from . import (
    dits,
    dits_2026,
    ernie_image,
    flux,
    flux3,
    flux_likes,
    hunyuan,
    image_dits,
    kandinsky,
    minimax_h3,
    nextdit,
    unets,
    video_dits,
    wan,
)
from .backbone import Backbone
from .keys import KeyIndex

# UNets first: their keys are definitive and cheap to test, so the many SD1 / SDXL files of a library scan
# skip the transformer rules. Among transformers, families whose blocks another family shares come before
# it (HunyuanVideo's stem before FLUX's blocks).
PROBES = (
    unets.ldm_unet,
    unets.diffusers_unet,
    wan.wan,
    dits_2026.nucleus_image,
    image_dits.qwen_image,
    image_dits.qwen_image21,
    image_dits.krea2,
    image_dits.hidream,
    dits_2026.sana_video,
    dits_2026.sana_wm,
    image_dits.sana,
    dits_2026.bria_fibo2,
    nextdit.nextdit,
    dits_2026.ideogram4,
    dits_2026.prx,
    dits_2026.glm_image,
    dits_2026.joyimage,
    video_dits.ltx,
    video_dits.mochi,
    video_dits.cosmos,
    dits_2026.cosmos3,
    kandinsky.kandinsky,
    hunyuan.hunyuan,
    dits.mmdit,
    flux_likes.flux_likes,
    flux3.flux3,
    flux.flux,
    dits.auraflow,
    dits.hunyuan,
    dits.pixart,
    dits.cascade,
    ernie_image.ernie_image,
    minimax_h3.minimax_h3,
)


def find_backbone(ix: KeyIndex) -> Backbone | None:
    """The diffusion backbone in these keys (any prefix), or None when there is none."""
    for probe in PROBES:
        b = probe(ix)
        if b is not None:
            return b
    return None
