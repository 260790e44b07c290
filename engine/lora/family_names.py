"""Original (as ComfyUI repackages the releases) <-> diffusers module paths of the 2025-26 DiT families.

Trainers name a module after the model class they trained: musubi-tuner and diffusion-pipe after the
original release (Wan's `blocks.N.self_attn.q`), ai-toolkit and diffusers/PEFT after diffusers'
classes (`blocks.N.attn1.to_q`). A LoRA must land on a base stored in either naming, so each family
here is a table of (original, diffusers) module-path templates, `{n}` standing for a block number,
read in both directions. Where the original fuses what diffusers splits (Z-Image's and Lumina 2's
`attention.qkv`), the diffusers names reach row blocks of the fused weight.

Facts (cited, not copied) from diffusers `loaders/single_file_utils.py`: `convert_wan_transformer_to_
diffusers` (Wan 2.1/2.2, VACE, i2v image embedder, Animate), `convert_z_image_transformer_checkpoint_to_diffusers`,
`convert_lumina2_to_diffusers`, `convert_auraflow_transformer_checkpoint_to_diffusers` and
`convert_krea2_transformer_checkpoint_to_diffusers`, `convert_flux3_transformer_checkpoint_to_diffusers`, and diffusers'
`convert_cosmos_to_diffusers.py` script. PixArt's, Sana's, Mochi 1's and Hunyuan-DiT's tables are in
engine.lora.family_names_dits (with their fused modules and swapped halves); this module lists every table (`tables_for`).
A family whose release already uses the diffusers names (Qwen-Image) needs no table: its LoRAs reach the base by its own
names. Qwen-Image 2.1's ComfyUI files keep diffusers' names but fuse each block's SwiGLU `img_mlp.gate_layer` and
`img_mlp.proj` into `img_mlp.gate_up`, gate rows first (`convert_qwen_image21_transformer_checkpoint_to_diffusers`):
diffusers' two names reach its row halves.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from .dit_names import View
from .family_names_dits import HUNYUAN_DIT, MINIMAX_H3, MOCHI, PIXART, SANA, other_names_of, template_pattern

# Wan 2.1 / 2.2 (t2v, i2v, ti2v, VACE, fun): the rename is one-to-one.
_WAN_BLOCK = (
    ("self_attn.q", "attn1.to_q"),
    ("self_attn.k", "attn1.to_k"),
    ("self_attn.v", "attn1.to_v"),
    ("self_attn.o", "attn1.to_out.0"),
    ("self_attn.norm_q", "attn1.norm_q"),
    ("self_attn.norm_k", "attn1.norm_k"),
    ("cross_attn.q", "attn2.to_q"),
    ("cross_attn.k", "attn2.to_k"),
    ("cross_attn.v", "attn2.to_v"),
    ("cross_attn.o", "attn2.to_out.0"),
    ("cross_attn.norm_q", "attn2.norm_q"),
    ("cross_attn.norm_k", "attn2.norm_k"),
    ("cross_attn.k_img", "attn2.add_k_proj"),
    ("cross_attn.v_img", "attn2.add_v_proj"),
    ("cross_attn.norm_k_img", "attn2.norm_added_k"),
    ("ffn.0", "ffn.net.0.proj"),
    ("ffn.2", "ffn.net.2"),
    # The original's norm3 (the affine norm before cross-attention) is diffusers' norm2.
    ("norm3", "norm2"),
    # VACE blocks' projections in and out of the control stream.
    ("before_proj", "proj_in"),
    ("after_proj", "proj_out"),
)
_WAN_TOP = (
    ("patch_embedding", "patch_embedding"),
    ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
    ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
    ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
    ("time_projection.1", "condition_embedder.time_proj"),
    ("img_emb.proj.0", "condition_embedder.image_embedder.norm1"),
    ("img_emb.proj.1", "condition_embedder.image_embedder.ff.net.0.proj"),
    ("img_emb.proj.3", "condition_embedder.image_embedder.ff.net.2"),
    ("img_emb.proj.4", "condition_embedder.image_embedder.norm2"),
    ("head.head", "proj_out"),
    ("vace_patch_embedding", "vace_patch_embedding"),
    # SkyReels-V2's fps projection (SkyworkAI's Sequential); AnyFlow's second time embedder (diffusers' names
    # only: engine.denoise.wan_variants names it as Wan's time_embedding)
    ("fps_projection.0", "fps_projection.net.0.proj"),
    ("fps_projection.2", "fps_projection.net.2"),
    ("delta_embedding.0", "condition_embedder.delta_embedder.linear_1"),
    ("delta_embedding.2", "condition_embedder.delta_embedder.linear_2"),
)
# Wan 2.2 Animate's own modules (diffusers' generate_face_adapter_mappings / generate_motion_encoder_mappings in
# convert_wan_transformer_to_diffusers): the face adapter's fuser blocks, the face encoder's convs, the motion
# encoder's mapping network and appearance CNN (its residual block i is the release's convs.i+1; 7 in the release).
# The fused linear1_kv (to_k, to_v) and the last conv (convs.n+1) are _add_animate's.
_ANIMATE = (
    *((f"face_adapter.fuser_blocks.{{n}}.{o}", f"face_adapter.{{n}}.{d}")
      for o, d in (("linear1_q", "to_q"), ("linear2", "to_out"), ("q_norm", "norm_q"), ("k_norm", "norm_k"))),
    *((f"face_encoder.{c}.conv", f"face_encoder.{c}") for c in ("conv1_local", "conv2", "conv3")),
    ("motion_encoder.enc.fc.{n}", "motion_encoder.motion_network.{n}"),
    ("motion_encoder.enc.net_app.convs.0.0", "motion_encoder.conv_in"),
    *((f"motion_encoder.enc.net_app.convs.{i + 1}.{o}", f"motion_encoder.res_blocks.{i}.{d}")
      for i in range(7) for o, d in (("conv1.0", "conv1"), ("conv2.1", "conv2"), ("skip.1", "conv_skip"))),
)  # fmt: skip
WAN: tuple[tuple[str, str], ...] = (
    *_WAN_TOP,
    *_ANIMATE,
    *((f"blocks.{{n}}.{o}", f"blocks.{{n}}.{d}") for o, d in _WAN_BLOCK),
    *((f"vace_blocks.{{n}}.{o}", f"vace_blocks.{{n}}.{d}") for o, d in _WAN_BLOCK),
)

# Wan-Animate-2: the release wraps each Wan block (`blocks.N.block.…`); diffusers unwraps it and renames only the
# attentions' projections (`convert_wan_animate_2_transformer_to_diffusers`); its other modules keep one name.
_ANIMATE2_ATTN = (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"), ("norm_q", "norm_q"),
                  ("norm_k", "norm_k"), ("k_img", "add_k_proj"), ("v_img", "add_v_proj"), ("norm_k_img", "norm_added_k"))  # fmt: skip
WAN_ANIMATE2: tuple[tuple[str, str], ...] = (
    *((f"blocks.{{n}}.block.{a}.{o}", f"blocks.{{n}}.{a}.{d}") for a in ("self_attn", "cross_attn") for o, d in _ANIMATE2_ATTN),
    *((f"blocks.{{n}}.block.{m}", f"blocks.{{n}}.{m}") for m in ("ffn.0", "ffn.2", "norm3")),
)  # fmt: skip
# Z-Image (NextDiT with a single fused qkv, equal thirds) in diffusers' ZImageTransformer2DModel form; Z-Image Omni's
# SigLIP refiner blocks are named as the others (the converter's `.attention.out` / `.attention.qkv` renames hold for
# every stack), without their adaLN.
_NEXTDIT_STACKS = ("layers", "noise_refiner", "context_refiner")
_ZIMAGE_STACKS = (*_NEXTDIT_STACKS, "siglip_refiner")
_ZIMAGE_BLOCK = (
    ("attention.out", "attention.to_out.0"),
    ("attention.q_norm", "attention.norm_q"),
    ("attention.k_norm", "attention.norm_k"),
    *((f"feed_forward.w{i}", f"feed_forward.w{i}") for i in (1, 2, 3)),
    ("adaLN_modulation.0", "adaLN_modulation.0"),
)
Z_IMAGE: tuple[tuple[str, str], ...] = (
    ("x_embedder", "all_x_embedder.2-1"),
    ("final_layer.linear", "all_final_layer.2-1.linear"),
    ("final_layer.adaLN_modulation.1", "all_final_layer.2-1.adaLN_modulation.1"),
    ("cap_embedder.1", "cap_embedder.1"),
    ("t_embedder.mlp.0", "t_embedder.mlp.0"),
    ("t_embedder.mlp.2", "t_embedder.mlp.2"),
    *((f"{s}.{{n}}.{o}", f"{s}.{{n}}.{d}") for s in _ZIMAGE_STACKS for o, d in _ZIMAGE_BLOCK),
)
# Lumina 2 (NextDiT, grouped-query fused qkv) in diffusers' Lumina2Transformer2DModel form.
_LUMINA_BLOCK = (
    ("attention.out", "attn.to_out.0"),
    ("attention.q_norm", "attn.norm_q"),
    ("attention.k_norm", "attn.norm_k"),
    *((f"feed_forward.w{i}", f"feed_forward.linear_{i}") for i in (1, 2, 3)),
    ("adaLN_modulation.1", "norm1.linear"),
)
LUMINA2: tuple[tuple[str, str], ...] = (
    ("x_embedder", "x_embedder"),
    ("cap_embedder.1", "time_caption_embed.caption_embedder.1"),
    ("t_embedder.mlp.0", "time_caption_embed.timestep_embedder.linear_1"),
    ("t_embedder.mlp.2", "time_caption_embed.timestep_embedder.linear_2"),
    ("final_layer.adaLN_modulation.1", "norm_out.linear_1"),
    ("final_layer.linear", "norm_out.linear_2"),
    *((f"{s}.{{n}}.{o}", f"{s}.{{n}}.{d}") for s in _NEXTDIT_STACKS for o, d in _LUMINA_BLOCK),
)
# HunyuanVideo 1.0 / 1.5 and HunyuanImage 2.1: Tencent's release names (what musubi-tuner and
# diffusion-pipe train) <-> ComfyUI's (FLUX-style blocks: `img_attn.qkv`, `img_mlp.0`, `img_mod.lin`).
# Facts: Tencent/HunyuanVideo `hyvideo/modules/models.py` and the names diffusers'
# `convert_hunyuan_video_transformer_to_diffusers` reads; ComfyUI's `comfy/ldm/hunyuan_video/model.py`.
_HY_STREAM = (
    ("{s}_mod.linear", "{s}_mod.lin"),
    ("{s}_attn_qkv", "{s}_attn.qkv"),
    ("{s}_attn_proj", "{s}_attn.proj"),
    ("{s}_mlp.fc1", "{s}_mlp.0"),
    ("{s}_mlp.fc2", "{s}_mlp.2"),
)
_HY_REFINER = (
    ("self_attn_qkv", "self_attn.qkv"),
    ("self_attn_proj", "self_attn.proj"),
    ("mlp.fc1", "mlp.0"),
    ("mlp.fc2", "mlp.2"),
)
HUNYUAN: tuple[tuple[str, str], ...] = (
    *(
        (f"double_blocks.{{n}}.{t.format(s=s)}", f"double_blocks.{{n}}.{c.format(s=s)}")
        for s in ("img", "txt")
        for t, c in _HY_STREAM
    ),
    ("single_blocks.{n}.modulation.linear", "single_blocks.{n}.modulation.lin"),
    *(
        (
            f"txt_in.individual_token_refiner.blocks.{{n}}.{t}",
            f"txt_in.individual_token_refiner.blocks.{{n}}.{c}",
        )
        for t, c in _HY_REFINER
    ),
    *((f"{e}.mlp.0", f"{e}.in_layer") for e in ("time_in", "guidance_in", "txt_in.t_embedder")),
    *((f"{e}.mlp.2", f"{e}.out_layer") for e in ("time_in", "guidance_in", "txt_in.t_embedder")),
    ("txt_in.c_embedder.linear_1", "txt_in.c_embedder.in_layer"),
    ("txt_in.c_embedder.linear_2", "txt_in.c_embedder.out_layer"),
)
# LTX-Video / LTX-2: the release keeps diffusers' tree under a few other names (diffusers'
# `convert_ltx_transformer_checkpoint_to_diffusers`, `convert_ltx2_transformer_to_diffusers` and its conversion
# script's LTX-2.3 table): the patch embeddings and the adaLN-single modules (each a timestep embedder and a
# linear): the streams' own, LTX-2's cross-modal ones and LTX-2.3's prompt ones.
_LTX_ADALN = (
    ("adaln_single", "time_embed"),
    ("audio_adaln_single", "audio_time_embed"),
    ("av_ca_video_scale_shift_adaln_single", "av_cross_attn_video_scale_shift"),
    ("av_ca_a2v_gate_adaln_single", "av_cross_attn_video_a2v_gate"),
    ("av_ca_audio_scale_shift_adaln_single", "av_cross_attn_audio_scale_shift"),
    ("av_ca_v2a_gate_adaln_single", "av_cross_attn_audio_v2a_gate"),
    ("prompt_adaln_single", "prompt_adaln"),
    ("audio_prompt_adaln_single", "audio_prompt_adaln"),
)
LTX: tuple[tuple[str, str], ...] = (
    ("patchify_proj", "proj_in"),
    ("audio_patchify_proj", "audio_proj_in"),
    *(
        (f"{o}.{s}", f"{d}.{s}")
        for o, d in _LTX_ADALN
        for s in ("linear", "emb.timestep_embedder.linear_1", "emb.timestep_embedder.linear_2")
    ),
)

# AuraFlow v0.1–0.3 / Pony V7: the release's names (ComfyUI's files) <-> diffusers' AuraFlowTransformer2DModel, one
# to one (diffusers' `convert_auraflow_transformer_checkpoint_to_diffusers`); the final modulation (`modF.1` /
# `norm_out.linear`) holds its halves in the other order: other_names gives it with a swap view.
_AURA_DOUBLE = (
    ("modX.1", "norm1.linear"),
    ("modC.1", "norm1_context.linear"),
    *((f"attn.w2{a}", f"attn.to_{a}") for a in "qkv"),
    ("attn.w2o", "attn.to_out.0"),
    *((f"attn.w1{a}", f"attn.add_{a}_proj") for a in "qkv"),
    ("attn.w1o", "attn.to_add_out"),
)
_AURA_SINGLE = (
    ("modCX.1", "norm1.linear"),
    *((f"attn.w1{a}", f"attn.to_{a}") for a in "qkv"),
    ("attn.w1o", "attn.to_out.0"),
)
_AURA_MLP = (("c_fc1", "linear_1"), ("c_fc2", "linear_2"), ("c_proj", "out_projection"))
AURAFLOW: tuple[tuple[str, str], ...] = (
    ("init_x_linear", "pos_embed.proj"),
    ("t_embedder.mlp.0", "time_step_proj.linear_1"),
    ("t_embedder.mlp.2", "time_step_proj.linear_2"),
    ("cond_seq_linear", "context_embedder"),
    ("final_linear", "proj_out"),
    *((f"double_layers.{{n}}.{o}", f"joint_transformer_blocks.{{n}}.{d}") for o, d in _AURA_DOUBLE),
    *((f"single_layers.{{n}}.{o}", f"single_transformer_blocks.{{n}}.{d}") for o, d in _AURA_SINGLE),
    *(
        (f"{s}.{{n}}.{m}.{o}", f"{t}.{{n}}.{f}.{d}")
        for s, m, t, f in (
            ("double_layers", "mlpX", "joint_transformer_blocks", "ff"),
            ("double_layers", "mlpC", "joint_transformer_blocks", "ff_context"),
            ("single_layers", "mlp", "single_transformer_blocks", "ff"),
        )  # fmt: skip
        for o, d in _AURA_MLP
    ),
)
_AURA_FINAL = ("modF.1", "norm_out.linear")

# Cosmos Predict2 / Anima: the release's MiniTrainDIT names <-> diffusers' CosmosTransformer3DModel, one to one
# (diffusers' `convert_cosmos_to_diffusers.py`, COSMOS_2_0 renames).
_COSMOS_ATTN = (("q_proj", "to_q"), ("k_proj", "to_k"), ("v_proj", "to_v"), ("output_proj", "to_out.0"))
COSMOS: tuple[tuple[str, str], ...] = (
    ("x_embedder.proj.1", "patch_embed.proj"),
    ("t_embedder.1.linear_1", "time_embed.t_embedder.linear_1"),
    ("t_embedder.1.linear_2", "time_embed.t_embedder.linear_2"),
    ("final_layer.adaln_modulation.1", "norm_out.linear_1"),
    ("final_layer.adaln_modulation.2", "norm_out.linear_2"),
    ("final_layer.linear", "proj_out"),
    ("t_embedding_norm", "time_embed.norm"),
    *(
        (f"blocks.{{n}}.{a}.{o}", f"transformer_blocks.{{n}}.{b}.{d}")
        for a, b in (("self_attn", "attn1"), ("cross_attn", "attn2"))
        for o, d in (*_COSMOS_ATTN, ("q_norm", "norm_q"), ("k_norm", "norm_k"))
    ),
    ("blocks.{n}.mlp.layer1", "transformer_blocks.{n}.ff.net.0.proj"),
    ("blocks.{n}.mlp.layer2", "transformer_blocks.{n}.ff.net.2"),
    *(
        (f"blocks.{{n}}.adaln_modulation_{m}.{i}", f"transformer_blocks.{{n}}.{norm}.linear_{i}")
        for m, norm in (("self_attn", "norm1"), ("cross_attn", "norm2"), ("mlp", "norm3"))
        for i in (1, 2)
    ),
)
# Cosmos 1.0: NVIDIA's 1.0 names (each block's parts nested: `blocks.blockN.blocks.{0,1,2}.block`) <-> diffusers'
# CosmosTransformer3DModel, one to one (diffusers' `convert_cosmos_to_diffusers.py`, COSMOS_1_0 renames).
_C1_ATTN = (("to_q.0", "to_q"), ("to_k.0", "to_k"), ("to_v.0", "to_v"), ("to_out.0", "to_out.0"), ("to_q.1", "norm_q"),
            ("to_k.1", "norm_k"))  # fmt: skip
COSMOS1: tuple[tuple[str, str], ...] = (
    ("x_embedder.proj.1", "patch_embed.proj"),
    ("t_embedder.1.linear_1", "time_embed.t_embedder.linear_1"),
    ("t_embedder.1.linear_2", "time_embed.t_embedder.linear_2"),
    ("final_layer.adaLN_modulation.1", "norm_out.linear_1"),
    ("final_layer.adaLN_modulation.2", "norm_out.linear_2"),
    ("final_layer.linear", "proj_out"),
    ("affline_norm", "time_embed.norm"),
    *(
        (f"blocks.block{{n}}.blocks.{j}.block.attn.{o}", f"transformer_blocks.{{n}}.attn{j + 1}.{d}")
        for j in (0, 1)
        for o, d in _C1_ATTN
    ),  # fmt: skip
    ("blocks.block{n}.blocks.2.block.layer1", "transformer_blocks.{n}.ff.net.0.proj"),
    ("blocks.block{n}.blocks.2.block.layer2", "transformer_blocks.{n}.ff.net.2"),
    *(
        (
            f"blocks.block{{n}}.blocks.{j}.adaLN_modulation.{i}",
            f"transformer_blocks.{{n}}.norm{j + 1}.linear_{i}",
        )
        for j in range(3)
        for i in (1, 2)
    ),  # fmt: skip
)
# Krea 2: the release's names <-> diffusers' Krea2Transformer2DModel, one to one (diffusers'
# `convert_krea2_transformer_checkpoint_to_diffusers`), the text-fusion blocks named as the main ones.
_KREA_BLOCK = (("attn.wq", "attn.to_q"), ("attn.wk", "attn.to_k"), ("attn.wv", "attn.to_v"), ("attn.wo", "attn.to_out.0"),
               ("attn.gate", "attn.to_gate"), ("mlp.gate", "ff.gate"), ("mlp.up", "ff.up"), ("mlp.down", "ff.down"),
               ("attn.qknorm.qnorm", "attn.norm_q"), ("attn.qknorm.knorm", "attn.norm_k"), ("prenorm", "norm1"),
               ("postnorm", "norm2"))  # fmt: skip
KREA2: tuple[tuple[str, str], ...] = (
    ("first", "img_in"),
    ("tmlp.0", "time_embed.linear_1"),
    ("tmlp.2", "time_embed.linear_2"),
    ("tproj.1", "time_mod_proj"),
    ("txtmlp.1", "txt_in.linear_1"),
    ("txtmlp.0", "txt_in.norm"),
    ("txtmlp.3", "txt_in.linear_2"),
    ("txtfusion.projector", "text_fusion.projector"),
    ("last.linear", "final_layer.linear"),
    ("last.norm", "final_layer.norm"),
    *((f"blocks.{{n}}.{o}", f"transformer_blocks.{{n}}.{d}") for o, d in _KREA_BLOCK),
    *(
        (f"txtfusion.{s}.{{n}}.{o}", f"text_fusion.{s}.{{n}}.{d}")
        for s in ("layerwise_blocks", "refiner_blocks")
        for o, d in _KREA_BLOCK
    ),
)

# FLUX.3: BFL's names <-> diffusers' Flux3Transformer2DModel, one to one (diffusers'
# `convert_flux3_transformer_checkpoint_to_diffusers`; its FLUX.3 LoRA converter
# `_convert_non_diffusers_flux3_lora_to_diffusers` renames the same block parts); the final adaLN's halves are swapped.
_F3_BLOCK = (("q_proj", "attn.to_q"), ("k_proj", "attn.to_k"), ("v_proj", "attn.to_v"), ("attn_out", "attn.to_out.0"),
             ("mlp_in", "ff.linear_in"), ("mlp_out", "ff.linear_out"), ("norm.query_norm", "attn.norm_q"),
             ("norm.key_norm", "attn.norm_k"))  # fmt: skip
_F3_STACKS = (("content_mode_blocks.image", "mode_blocks.image"), ("content_mode_blocks.image_cond", "mode_blocks.image_cond"),
              ("txt_mode_blocks", "txt_mode_blocks"), ("single_blocks", "single_transformer_blocks"))  # fmt: skip
_F3_FINAL = ("final_layer.image.adaLN_modulation.1", "norm_out.linear")
FLUX3: tuple[tuple[str, str], ...] = (
    ("emb_in.image", "x_embedders.image"),
    ("emb_in.image_cond", "x_embedders.image_cond"),
    ("txt_in", "context_embedder"),
    *(
        (f"{o}.{a}", f"{d}.linear_{b}")
        for o, d in (("time_in", "timestep_embedder"), ("ref_time_in", "target_timestep_embedder"))
        for a, b in (("in_layer", 1), ("out_layer", 2))
    ),  # fmt: skip
    *(
        (f"{s}.{m}.lin", f"{s}.{m}.linear")
        for s in ("early_stream_modulations", "single_stream_modulations")
        for m in ("image", "image_cond", "txt")
    ),  # fmt: skip
    ("final_layer.image.linear", "proj_out"),
    *((f"{o}.{{n}}.{a}", f"{d}.{{n}}.{b}") for o, d in _F3_STACKS for a, b in _F3_BLOCK),
)


def _table(pairs: tuple[tuple[str, str], ...]) -> tuple[tuple[re.Pattern, str, re.Pattern, str], ...]:
    return tuple((template_pattern(o), d, template_pattern(d), o) for o, d in pairs)


_ALL = (WAN, WAN_ANIMATE2, Z_IMAGE, LUMINA2, HUNYUAN, LTX, AURAFLOW, COSMOS, KREA2, PIXART, SANA, FLUX3, MOCHI,
        HUNYUAN_DIT, MINIMAX_H3, COSMOS1)  # fmt: skip
_TABLES = {id(t): _table(t) for t in _ALL}
# The tables whose swapped halves or extra names engine.lora.family_names_dits adds.
_EXTRAS = {id(MOCHI): "mochi", id(HUNYUAN_DIT): "hunyuan_dit", id(MINIMAX_H3): "minimax_h3"}


def _fill(template: str, m: re.Match) -> str:
    return template.replace("{n}", m.group(1)) if "{n}" in template else template


def to_original(paths: Iterable[str], pairs: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """diffusers path -> original path for every path the table `pairs` (e.g. WAN) renames."""
    compiled = _TABLES[id(pairs)]
    out = {}
    for p in paths:
        for _, _, d_pat, o_tmpl in compiled:
            m = d_pat.match(p)
            if m:
                out[p] = _fill(o_tmpl, m)
                break
    return out


def tables_for(paths: Iterable[str]) -> list[tuple[tuple[str, str], ...]]:
    """The rename tables a base's module paths call for (its own naming decides nothing here: a
    table is read in the direction the base needs)."""
    ps = set(paths)
    out = []
    # Hunyuan-DiT's blocks (`blocks.N.attn1`, its diffusers `pos_embed.proj`) are neither Wan's nor PixArt's.
    hunyuan_dit = "pooler.q_proj" in ps or "time_extra_emb.pooler.q_proj" in ps
    if hunyuan_dit:
        out.append(HUNYUAN_DIT)
    if "t5_y_embedder.to_kv" in ps or "time_embed.pooler.to_kv" in ps:
        out.append(MOCHI)
    if (
        not hunyuan_dit
        and any(p.startswith(("blocks.", "vace_blocks.")) for p in ps)
        and (
            "patch_embedding" in ps
            or any(".self_attn." in p or ".attn1." in p for p in ps if p.startswith("blocks."))
        )
    ):
        out.append(WAN)
    if any(p.startswith("blocks.") and (".block.self_attn." in p or ".self_attn.to_q" in p) for p in ps):
        out.append(WAN_ANIMATE2)  # the release's wrapped blocks or diffusers' names for them
    if any(p.startswith(_NEXTDIT_STACKS) for p in ps) and any(
        ".attention." in p or ".attn." in p for p in ps
    ):
        out.extend((Z_IMAGE, LUMINA2))
    if any(p.startswith("txt_in.individual_token_refiner.") for p in ps):
        out.append(HUNYUAN)
    if any(p in ps for p in ("patchify_proj", "proj_in")) and any(
        p.startswith(("adaln_single.", "time_embed.")) for p in ps
    ):
        out.append(LTX)
    if any(p.startswith(("double_layers.", "single_layers.")) for p in ps) or (
        "time_step_proj.linear_1" in ps and any(p.startswith("joint_transformer_blocks.") for p in ps)
    ):
        out.append(AURAFLOW)
    if any(".adaln_modulation_self_attn." in p for p in ps) or (
        "time_embed.t_embedder.linear_1" in ps and any(p.startswith("transformer_blocks.") for p in ps)
    ):
        out.append(COSMOS)
    if any(p.endswith((".attn.wq", ".attn.to_gate")) for p in ps):
        out.append(KREA2)
    if (not hunyuan_dit and "pos_embed.proj" in ps) or ("t_block.1" in ps and "attention_y_norm" not in ps):
        out.append(PIXART)
    if "attention_y_norm" in ps or (
        "caption_norm" in ps and ("patch_embed.proj" in ps or "patch_embedding" in ps)
    ):
        out.append(SANA)
    if any(p.startswith(("txt_mode_blocks.", "content_mode_blocks.", "mode_blocks.", "early_stream_modulations."))
           for p in ps):  # fmt: skip
        out.append(FLUX3)
    if any(p.endswith(".adaln_proj.linear") for p in ps):  # MiniMax-H3's per-block AdaLN projection
        out.append(MINIMAX_H3)
    if any(p.startswith("blocks.block") and ".block.attn." in p for p in ps):  # Cosmos 1.0's nested blocks
        out.append(COSMOS1)
    return out


def other_names(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, View]]:
    """For a base's module paths (path -> weight shape): every name the other naming gives a module
    -> (the base's path, view). Original paths yield diffusers names and the reverse."""
    out: dict[str, tuple[str, View]] = {}
    for pairs in tables_for(shapes):
        compiled = _TABLES[id(pairs)]
        for path in shapes:
            for o_re, d_tpl, d_re, o_tpl in compiled:
                m = o_re.match(path)
                if m:
                    out.setdefault(_fill(d_tpl, m), (path, None))
                    break
                m = d_re.match(path)
                if m:
                    out.setdefault(_fill(o_tpl, m), (path, None))
                    break
        if id(pairs) in _EXTRAS:
            other_names_of(_EXTRAS[id(pairs)], out, shapes)
        if pairs is WAN:
            _add_animate(out, shapes)
        if pairs is AURAFLOW or pairs is FLUX3:
            final = _AURA_FINAL if pairs is AURAFLOW else _F3_FINAL
            for have, other in (final, final[::-1]):
                if have in shapes:
                    out.setdefault(other, (have, ("swap",)))
    return out


_ANIMATE_APP = "motion_encoder.enc.net_app.convs"


def _add_animate(out: dict, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Wan Animate's motion encoder's last conv: the release's convs.n+1 after its n residual blocks, diffusers'
    conv_out (its fused face-adapter `linear1_kv` is engine.lora.fused_names')."""
    res = {p.split(".")[2] for p in shapes if p.startswith("motion_encoder.res_blocks.")}
    convs = {p.split(".")[4] for p in shapes if p.startswith(_ANIMATE_APP + ".")}
    last = f"{_ANIMATE_APP}.{len(convs) - 1}"
    if res and "motion_encoder.conv_out" in shapes:
        out.setdefault(f"{_ANIMATE_APP}.{len(res) + 1}", ("motion_encoder.conv_out", None))
    elif convs and last in shapes:
        out.setdefault("motion_encoder.conv_out", (last, None))
