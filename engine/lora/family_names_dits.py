"""Original <-> diffusers module paths of the single-stream and asymmetric DiTs (PixArt-α / Σ, Sana, Mochi 1,
Hunyuan-DiT): the tables engine.lora.family_names reads (its `tables_for` lists every table), and what a table of
renames cannot say: a fused module reached as the row blocks the other naming splits it into, and a weight whose two
halves the other naming holds the other way round (a ("swap",) view, read both ways).

Facts (cited, not copied): PixArt's from OneTrainer's diffusers-to-checkpoint converter and diffusers'
`convert_sana_transformer_to_diffusers`; Mochi 1's from diffusers' `convert_mochi_transformer_checkpoint_to_diffusers`
(loaders/single_file_utils.py: qkv_x / qkv_y split into attn1.to_q/k/v and add_q/k/v_proj, mlp_x.w1's SwiGLU halves
and final_layer.mod's (shift, scale) swapped, the last block's mod_y as norm1_context.linear_1); Hunyuan-DiT's from
diffusers' `scripts/convert_hunyuandit_to_diffusers.py` (Wqkv split into attn1.to_q/k/v, kv_proj into attn2.to_k/v,
norm2 and norm3 exchanged, the final adaLN's halves swapped). Trainers name modules after these: genmoai/mochi's LoRA
trainer the release's (`blocks.N.attn.qkv_x`, `proj_x`, `mlp_x.w1`), Tencent's HunyuanDiT trainer PEFT LoRAs on the
release's `Wqkv`, `q_proj`, `kv_proj`, `out_proj`, diffusers' Mochi trainer and ai-toolkit diffusers' names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .naming import underscored

# PixArt-α / Σ and Sana: the release's `blocks.N` (fused self-attention qkv and cross-attention kv_linear) <->
# diffusers' `transformer_blocks.N`; the fused ones are reached as row blocks (_add_fused_blocks).
_PA_BLOCK = (
    ("attn.proj", "attn1.to_out.0"),
    ("cross_attn.q_linear", "attn2.to_q"),
    ("cross_attn.proj", "attn2.to_out.0"),
)
_PA_TOP = (
    ("t_block.1", "linear"),
    ("t_embedder.mlp.0", "emb.timestep_embedder.linear_1"),
    ("t_embedder.mlp.2", "emb.timestep_embedder.linear_2"),
)  # fmt: skip  (below adaln_single / time_embed)
_PA_CAPTION = (("y_embedder.y_proj.fc1", "caption_projection.linear_1"),
               ("y_embedder.y_proj.fc2", "caption_projection.linear_2"), ("final_layer.linear", "proj_out"))  # fmt: skip
PIXART: tuple[tuple[str, str], ...] = (
    ("x_embedder.proj", "pos_embed.proj"),
    *((o, f"adaln_single.{d}") for o, d in _PA_TOP),
    *(
        (f"{o}.mlp.{i}", f"adaln_single.emb.{d}.linear_{j}")
        for o, d in (("csize_embedder", "resolution_embedder"), ("ar_embedder", "aspect_ratio_embedder"))
        for i, j in ((0, 1), (2, 2))
    ),  # fmt: skip
    *_PA_CAPTION,
    *((f"blocks.{{n}}.{o}", f"transformer_blocks.{{n}}.{d}") for o, d in _PA_BLOCK),
    ("blocks.{n}.mlp.fc1", "transformer_blocks.{n}.ff.net.0.proj"),
    ("blocks.{n}.mlp.fc2", "transformer_blocks.{n}.ff.net.2"),
)
SANA: tuple[tuple[str, str], ...] = (
    ("x_embedder.proj", "patch_embed.proj"),
    *((o, f"time_embed.{d}") for o, d in _PA_TOP),
    *_PA_CAPTION,
    *((f"blocks.{{n}}.{o}", f"transformer_blocks.{{n}}.{d}") for o, d in _PA_BLOCK),
    *(
        (f"blocks.{{n}}.mlp.{o}_conv.conv", f"transformer_blocks.{{n}}.ff.conv_{d}")
        for o, d in (("inverted", "inverted"), ("depth", "depth"), ("point", "point"))
    ),  # fmt: skip
    # SANA-Video's (diffusers' convert_sana_video_to_diffusers.py): its 3-D patch embedding, its temporal convolution
    ("x_embedder.proj", "patch_embedding"),
    ("blocks.{n}.mlp.t_conv", "transformer_blocks.{n}.ff.conv_temp"),
)

# Mochi 1: the release's `blocks.N` (fused qkv_x / qkv_y, the streams' mod_x / mod_y) <-> diffusers'
# `transformer_blocks.N`; the fused ones and the swapped halves are other_names_of's.
_MOCHI_BLOCK = (
    ("mod_x", "norm1.linear"),
    ("mod_y", "norm1_context.linear"),
    ("mod_y", "norm1_context.linear_1"),  # the last block's (one scale: diffusers' LuminaLayerNormContinuous)
    ("attn.q_norm_x", "attn1.norm_q"),
    ("attn.k_norm_x", "attn1.norm_k"),
    ("attn.q_norm_y", "attn1.norm_added_q"),
    ("attn.k_norm_y", "attn1.norm_added_k"),
    ("attn.proj_x", "attn1.to_out.0"),
    ("attn.proj_y", "attn1.to_add_out"),
    ("mlp_x.w2", "ff.net.2"),
    ("mlp_y.w2", "ff_context.net.2"),
)
MOCHI: tuple[tuple[str, str], ...] = (
    ("x_embedder.proj", "patch_embed.proj"),
    ("t_embedder.mlp.0", "time_embed.timestep_embedder.linear_1"),
    ("t_embedder.mlp.2", "time_embed.timestep_embedder.linear_2"),
    *((f"t5_y_embedder.{m}", f"time_embed.pooler.{m}") for m in ("to_kv", "to_q", "to_out")),
    ("t5_yproj", "time_embed.caption_proj"),
    ("final_layer.linear", "proj_out"),
    *((f"blocks.{{n}}.{o}", f"transformer_blocks.{{n}}.{d}") for o, d in _MOCHI_BLOCK),
)
# MiniMax-H3 (diffusers' `convert_minimax_h3_transformer_checkpoint_to_diffusers`): the release's `blocks.N` and
# `token_refiner.blocks.N` (fused qkv_proj, [q; k; v]) <-> diffusers' `transformer_blocks.N` and
# `token_refiner.refiner_blocks.N`; the fused qkv_proj and the SwiGLU fc1 ([gate; value], diffusers [value; gate]) are
# other_names_of's.
_MM_BLOCK = (("attn.q_norm", "attn.norm_q"), ("attn.k_norm", "attn.norm_k"), ("attn.out_proj", "attn.to_out.0"),
             ("mlp.fc2", "ff.net.2"), ("norm1", "norm1"), ("norm2", "norm2"))  # fmt: skip
_MM_STACKS = (("blocks", "transformer_blocks"), ("token_refiner.blocks", "token_refiner.refiner_blocks"))
MINIMAX_H3: tuple[tuple[str, str], ...] = (
    ("video_patch_proj", "proj_in"),
    ("audio_patch_proj", "audio_proj_in"),
    ("condition_proj", "context_embedder"),
    ("time_embedder.proj_in", "time_embedder.linear_1"),
    ("time_embedder.proj_out", "time_embedder.linear_2"),
    ("final_layer.norm", "norm_out.norm"),
    ("final_layer.adaln_proj.linear", "norm_out.linear"),
    ("final_layer.video_out", "proj_out"),
    ("final_layer.audio_out", "audio_proj_out"),
    ("blocks.{n}.adaln_proj.linear", "transformer_blocks.{n}.adaln_proj.linear"),
    *((f"{o}.{{n}}.{a}", f"{d}.{{n}}.{b}") for o, d in _MM_STACKS for a, b in _MM_BLOCK),
)
# Hunyuan-DiT: both namings keep `blocks.N`. diffusers names the release's norm3 (before the cross-attention) norm2
# and its norm2 (before the MLP) norm3: one name for two modules of one shape, which a base's own names answer first,
# so those two stay out of the table: prefixed_names gives them where a name's prefix says its naming.
_HDIT_BLOCK = (
    ("norm1", "norm1.norm"),
    ("default_modulation.1", "norm1.linear"),
    ("attn1.q_norm", "attn1.norm_q"),
    ("attn1.k_norm", "attn1.norm_k"),
    ("attn1.out_proj", "attn1.to_out.0"),
    ("attn2.q_proj", "attn2.to_q"),
    ("attn2.q_norm", "attn2.norm_q"),
    ("attn2.k_norm", "attn2.norm_k"),
    ("attn2.out_proj", "attn2.to_out.0"),
    ("mlp.fc1", "ff.net.0.proj"),
    ("mlp.fc2", "ff.net.2"),
)
HUNYUAN_DIT: tuple[tuple[str, str], ...] = (
    ("x_embedder.proj", "pos_embed.proj"),
    ("t_embedder.mlp.0", "time_extra_emb.timestep_embedder.linear_1"),
    ("t_embedder.mlp.2", "time_extra_emb.timestep_embedder.linear_2"),
    ("extra_embedder.0", "time_extra_emb.extra_embedder.linear_1"),
    ("extra_embedder.2", "time_extra_emb.extra_embedder.linear_2"),
    ("style_embedder", "time_extra_emb.style_embedder"),
    *((f"pooler.{p}_proj", f"time_extra_emb.pooler.{p}_proj") for p in "qkvc"),
    ("mlp_t5.0", "text_embedder.linear_1"),
    ("mlp_t5.2", "text_embedder.linear_2"),
    ("final_layer.linear", "proj_out"),
    *((f"blocks.{{n}}.{o}", f"blocks.{{n}}.{d}") for o, d in _HDIT_BLOCK),
)

# (release, diffusers) weights whose two halves diffusers holds the other way round: Mochi's SwiGLU w1 (diffusers'
# `x · SiLU(gate)`: b, a) and final modulation, Hunyuan-DiT's final adaLN (diffusers' norm_out: scale, shift).
_SWAPPED = {
    "mochi": (("blocks.{n}.mlp_x.w1", "transformer_blocks.{n}.ff.net.0.proj"),
              ("blocks.{n}.mlp_y.w1", "transformer_blocks.{n}.ff_context.net.0.proj"),
              ("final_layer.mod", "norm_out.linear")),
    "hunyuan_dit": (("final_layer.adaLN_modulation.1", "norm_out.linear"),),
    "minimax_h3": tuple((f"{o}.{{n}}.mlp.fc1", f"{d}.{{n}}.ff.net.0.proj") for o, d in _MM_STACKS),
}  # fmt: skip
_MOCHI_LAST_Y = re.compile(r"^blocks\.(\d+)\.mod_y$")


def template_pattern(template: str) -> re.Pattern:
    """A path template (`{n}` a block number, the group) as an anchored pattern."""
    return re.compile("^" + re.escape(template).replace(r"\{n\}", r"(\d+)") + "$")


def other_names_of(family: str, out: dict, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Add to `out` (name -> (the base's path, view)) what the table of `family` cannot say: the swapped weights (both
    ways), and Mochi's mod_y under the last block's diffusers name too (fused modules: engine.lora.fused_names)."""
    for pair in _SWAPPED.get(family, ()):
        for have, other in (pair, pair[::-1]):
            pat = template_pattern(have)
            for path in shapes:
                m = pat.match(path)
                if m:
                    out.setdefault(
                        other.replace("{n}", m.group(1)) if m.groups() else other, (path, ("swap",))
                    )
    if family == "mochi":
        for path in shapes:
            m = _MOCHI_LAST_Y.match(path)
            if m:
                out.setdefault(f"transformer_blocks.{m.group(1)}.norm1_context.linear_1", (path, None))


# Hunyuan-DiT's blocks.N.norm2 / norm3, the one name two modules have. Only a prefix tells a LoRA's naming: diffusers'
# and ai-toolkit's `transformer.` and OneTrainer's `lora_transformer_` write diffusers' names, kohya's / musubi's
# `lora_unet_` and diffusion-pipe's / ComfyUI's `diffusion_model.` the release's; a bare, `base_model.model.` (PEFT:
# Tencent's trainer writes the release's names, diffusers' its own) or `lycoris_` name is read in the base's naming.
_HDIT_NORM = re.compile(r"^blocks\.(\d+)\.norm([23])$")
_OTHER_PREFIXES = {
    "release": ("transformer.", "lora_transformer_"),
    "diffusers": ("diffusion_model.", "model.diffusion_model.", "lora_unet_"),
}


def prefixed_names(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
    """Full adapter module names (prefix and all) -> the base path they reach, over what the base's own names say:
    Hunyuan-DiT's norm2 / norm3 named in the other naming (the release's norm2 is diffusers' norm3, and the reverse)."""
    naming = (
        "release"
        if "pooler.q_proj" in shapes
        else "diffusers"
        if "time_extra_emb.pooler.q_proj" in shapes
        else ""
    )
    out = {}
    for path in shapes if naming else ():
        m = _HDIT_NORM.match(path)
        if m:
            other = f"blocks.{m.group(1)}.norm{5 - int(m.group(2))}"
            for p in _OTHER_PREFIXES[naming]:
                out[p + (underscored(other) if p.endswith("_") else other)] = path
    return out
