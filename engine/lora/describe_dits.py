"""The newer DiT families' LoRA rules (engine.lora.describe's infer_base asks them first): each family told by the module
names its classes give and, where names are shared, by the widths of its release configs. Header-only and torch-free,
as engine.lora.describe is."""

from __future__ import annotations

import re
from collections import Counter

# The 2025-26 families, from the module names their classes give (original and diffusers naming,
# underscored): Wan's `blocks.N.self_attn` / `cross_attn` (diffusers `attn1` / `attn2` and `ffn.net`);
# Qwen-Image's dual-stream `img_mod` / `txt_mlp`; NextDiT's `layers.N.attention` / `feed_forward`
# (Lumina 2 in diffusers: `attn` and `feed_forward.linear_1`); HunyuanVideo's `img_attn_qkv` beside
# `img_mlp.fc1` / `img_mod.linear` (FLUX.1 says `img_mlp.0`, `img_mod.lin`); HiDream's stream blocks.
# The family patterns below are searched in all diffusion module names at once, one name per line.
_WAN = re.compile(r"^(?:vace_)?blocks_\d+_(?:self_attn|cross_attn|attn1|attn2|ffn)_", re.MULTILINE)
# Wan-Animate-2's blocks: the release's wrapped ones (`blocks.N.block.self_attn.q`) or diffusers' (`self_attn.to_q`,
# `cross_attn.add_k_proj`): Wan 2.2's family (engine.detect.wan), checked before plain Wan's names.
_WAN_ANIMATE2 = re.compile(
    r"^blocks_\d+_(?:block_(?:self_attn|cross_attn|ffn|norm3)_?|(?:self|cross)_attn_(?:to_|add_[kv]_proj|norm_added_k))",
    re.MULTILINE,
)
_WAN_Q = re.compile(r"^blocks_\d+_(?:self_attn_q|attn1_to_q)$")
_QWEN = re.compile(r"^transformer_blocks_\d+_(?:img_mod|txt_mod|img_mlp|txt_mlp)_", re.MULTILINE)
# LongCat-Image and Ovis-Image (engine.detect.flux_likes): FLUX.1's diffusers-named blocks without its pooled vector.
# Ovis' gated MLPs are 8 x the stream wide (ff.net.0.proj, a single block's proj_mlp; FLUX.1's 4 x); LongCat's
# context_embedder reads Qwen2.5-VL's 3584-wide states (FLUX.1's T5 4096).
_FLUX_LIKE_MLP = re.compile(
    r"^(?:single_transformer_blocks_\d+_proj_mlp|transformer_blocks_\d+_ff(?:_context)?_net_0_proj)$"
)
_CONTEXT_EMBEDDER = re.compile(r"^context_embedder$")
# Qwen-Image 2.1 (diffusers' QwenImage21Transformer2DModel): a SwiGLU `img_mlp.{gate_layer, proj, out}` (ComfyUI's
# `gate_up`) where Qwen-Image's is `img_mlp.net.N`, and the shared `modulation.1` / `txt_in.{in,out}_layer` around
# the blocks; checked before Qwen-Image's pattern, which its MLP names also match.
_QWEN21 = re.compile(
    r"^(?:transformer_blocks_\d+_img_mlp_(?:gate_layer|proj|out|gate_up)|modulation_1|txt_in_(?:in|out)_layer)$",
    re.MULTILINE,
)
_NEXTDIT = re.compile(
    r"^(?:layers|noise_refiner|context_refiner)_\d+_(?:attention|attn|feed_forward)_", re.MULTILINE
)
_NEXTDIT_OUT = re.compile(r"^layers_\d+_(?:attention_out|attention_to_out_0|attn_to_out_0)$")
_HUNYUAN = ("img_mlp_fc1", "img_mod_linear", "txt_mlp_fc1", "individual_token_refiner")
_HIDREAM = re.compile(r"^(?:double|single)_stream_blocks_\d+_", re.MULTILINE)
# AuraFlow (Pony V7): the release's `double_layers` / `single_layers`; diffusers' `joint_transformer_blocks` and
# single blocks whose MLP is `ff.linear_1` / `out_projection` and modulation `norm1` (FLUX.1's: `proj_mlp`, `norm`)
_AURAFLOW = re.compile(
    r"^(?:(?:double|single)_layers_\d+_|joint_transformer_blocks_\d+_|single_transformer_blocks_\d+_(?:ff_|norm1_))",
    re.MULTILINE,
)
# FLUX.3 (BFL's and diffusers' names: engine.lora.family_names.FLUX3): per-mode blocks, per-mode modulations, and
# single blocks with separate q / k / v and a SwiGLU mlp_in (FLUX.1's / FLUX.2's fuse them into linear1). Read before
# AuraFlow, whose diffusers single blocks also have an `ff_` MLP.
_FLUX3 = re.compile(
    r"^(?:(?:content_)?mode_blocks_image(?:_cond)?_\d+_|txt_mode_blocks_\d+_|(?:early|single)_stream_modulations_"
    r"|single_blocks_\d+_(?:[qkv]_proj|attn_out|mlp_in|mlp_out)$|single_transformer_blocks_\d+_ff_linear_(?:in|out)$)",
    re.MULTILINE,
)
# Mochi 1: the release's two streams of a block (`blocks.N.attn.qkv_x`, `attn.proj_y`, `mlp_x.w1`, `mod_y`: genmoai/mochi's
# AsymmetricJointBlock) or diffusers' text stream inside attn1 (`attn1.add_q_proj`, `attn1.to_add_out`: FLUX.1's and
# SD3's diffusers blocks name it `attn.`). Hunyuan-DiT's release (Tencent's HunYuanDiTBlock: fused `attn1.Wqkv`,
# `attn2.kv_proj`, `q_proj` / `out_proj`, the `default_modulation`, what its own LoRA training targets) or diffusers'
# (HunyuanDiTBlock's `norm1.linear`, `ff.net`, `skip_linear`; Wan's are `ffn.net`); diffusers' attention names are
# Wan's (`blocks.N.attn1.to_q`), told apart by the width: 1408 (DiT-g/2's hidden_size, the release config).
# Stable Cascade's ResBlocks (depthwise, channelwise MLP) and AttnBlocks (kv_mapper, the MultiheadAttention's
# out_proj, diffusers' attention.to_*), in either naming: no other family's modules are named so
_CASCADE = re.compile(
    r"^(?:down|up)_blocks_\d+_\d+_(?:depthwise|channelwise_[04]|kv_mapper_1|attention_(?:attn_out_proj|to_[qkv]|to_out_0))$",
    re.MULTILINE,
)
# The condition width the kv_mappers read (c_cond): Stage C 2048 (lite 1536), Stage B 1280 (stage_*.yaml)
_CASCADE_COND = {2048: "stable_cascade_c", 1536: "stable_cascade_c", 1280: "stable_cascade_b"}


def _cascade_stage(diff, facts, lines: str) -> str | None:
    """Stage C or B from the kv_mappers' input width, else from a stage's own modules (C: its text mapper and crp time
    condition; B: its effnet / pixels mappers and clip_mapper); None when nothing says."""
    width = _width(diff, facts, re.compile(r"kv_mapper_1$"), "in_features")
    if width in _CASCADE_COND:
        return _CASCADE_COND[width]
    if re.search(r"^(?:clip_txt_mapper|clip_img_mapper|.*_mapper_crp)$", lines, re.MULTILINE):
        return "stable_cascade_c"
    if re.search(r"^(?:effnet_mapper_\d|pixels_mapper_\d|clip_mapper)$", lines, re.MULTILINE):
        return "stable_cascade_b"
    return None


_MOCHI = re.compile(
    r"^(?:blocks_\d+_(?:attn_(?:qkv|proj)_[xy]|mlp_[xy]_w[12]|mod_[xy])|transformer_blocks_\d+_attn1_(?:add_[qkv]_proj|to_add_out))$",
    re.MULTILINE,
)
_HUNYUAN_DIT = re.compile(
    r"^blocks_\d+_(?:attn1_Wqkv|attn2_kv_proj|attn[12]_out_proj|attn2_q_proj|default_modulation_1"
    r"|norm1_linear|ff_net_0_proj|skip_linear)$",
    re.MULTILINE,
)
_HUNYUAN_DIT_WIDTH = 1408
# ERNIE-Image (the release's names are diffusers' ErnieImageTransformer2DModel's): Megatron-style block names,
# `layers.N.self_attention.to_q` (NextDiT's are `attention.` / `attn.`) and `mlp.linear_fc2` (its `gate_proj` /
# `up_proj` alone are a decoder LLM's too, so they decide nothing)
_ERNIE_IMAGE = re.compile(
    r"^layers_\d+_(?:self_attention_(?:to_[qkv]|to_out_0)|mlp_linear_fc2)$", re.MULTILINE
)
# MiniMax-H3 (the release's and diffusers' names: engine.lora.family_names_dits.MINIMAX_H3): a block's own AdaLN
# projection, the release's fused `attn.qkv_proj` / `attn.out_proj` (in its refiner too), diffusers' token refiner and
# audio heads; diffusers' attention alone by its width, 5376 (the release config's hidden_size).
_MINIMAX_H3 = re.compile(
    r"^(?:(?:token_refiner_)?blocks_\d+_attn_(?:qkv|out)_proj|(?:transformer_)?blocks_\d+_adaln_proj_linear"
    r"|token_refiner_refiner_blocks_\d+_|final_layer_(?:video|audio)_out$|audio_proj_(?:in|out)$)",
    re.MULTILINE,
)
# PRX (diffusers' names are its files'): the image's fused q / k / v beside the text's keys and values
_PRX = re.compile(r"^blocks_\d+_attention_(?:img_qkv_proj|txt_kv_proj)$", re.MULTILINE)
# JoyImage Edit / Edit Plus (diffusers' names): both streams' attention inside one `attn` and diffusers' FeedForward
# MLPs; FLUX.1's and HunyuanVideo's double blocks name them `img_attn_qkv` / `img_mlp_0` / `img_mlp_fc1`
_JOYIMAGE = re.compile(
    r"^double_blocks_\d+_(?:attn_(?:img|txt)_attn_(?:qkv|proj)|(?:img|txt)_mlp_net_(?:0_proj|2))$",
    re.MULTILINE,
)
# Kandinsky 5 (diffusers' names are its files'): its text blocks, or its visual blocks' cross-attention. Kandinsky 6
# nests its blocks (`video_dec_block`, `video_text_transformer_blocks`) and its SR model has no cross-attention or text
# blocks, so a LoRA of the visual self-attention and MLP alone names no base.
_KANDINSKY5 = re.compile(
    r"^(?:text_transformer_blocks_\d+_|visual_transformer_blocks_\d+_cross_attention_)", re.MULTILINE
)
# SANA-Video (diffusers' names): the temporal convolution of its Mix-FFN; its attention is Sana image's, and the
# release's `blocks.N.mlp.t_conv` is SANA-WM's too, so a LoRA of neither names no base
_SANA_VIDEO = re.compile(r"^transformer_blocks_\d+_ff_conv_temp$", re.MULTILINE)
# NucleusMoE-Image (diffusers' names are its release's): Qwen-Image's img_mod blocks, with a text projection per block
# and a mixture of experts (its router `img_mlp.gate`, its shared expert) in the image MLP, which no Qwen-Image has
# (Qwen-Image 2.1's SwiGLU is `img_mlp.gate_layer`: the router's name ends there).
_NUCLEUS = re.compile(
    r"^transformer_blocks_\d+_(?:encoder_proj|img_mlp_gate$|img_mlp_shared_expert_)", re.MULTILINE
)
# Motif-Video (diffusers' names are its files'): a text cross-attention in its FLUX-style blocks (Stable Audio 3's
# `transformer_blocks.N.cross_attn` fuses `to_kv`, so a double block's names it by its own `to_k` / `to_v`), or its text
# MLP (`context_embedder.linear_1/2`; FLUX.1's and LongCat's context_embedder is one Linear). Its blocks' attention and
# MLPs alone carry FLUX.1's names and (diffusers' default config) widths, and name FLUX.1.
_MOTIF_VIDEO = re.compile(
    r"^(?:single_transformer_blocks_\d+_cross_attn_|transformer_blocks_\d+_cross_attn_to_[kv]$"
    r"|context_embedder_linear_[12]$)",
    re.MULTILINE,
)
# Cosmos 1.0 in NVIDIA's naming: each block's parts nested (`blocks.blockN.blocks.M.`), no other family's. Its
# diffusers-named LoRAs share Cosmos Predict2's names (and the 7B's width LTX-Video 13B's), so they name no base.
_COSMOS1 = re.compile(r"^blocks_block\d+_blocks_[012]_", re.MULTILINE)
# Bria FIBO 2: its Perceiver or an injection block's cross-attention (its NextDiT layers alone: _NEXTDIT_WIDTH).
# GLM-Image: its projectors / time-and-size embedder, or `attn1` 2560 wide with no `attn2` (PixArt / Sana 1152,
# LTX-Video 2048, Mochi 3072). FLUX.1's blocks in diffusers' names (engine.detect.flux_likes): Bria FIBO by its caption
# projections or its 48-channel latent (x_embedder / proj_out; FLUX.1, Bria 3.2, LongCat 64); a time embedding without
# FLUX.1's pooled text (`time_embed`) is LongCat-Image's (3584-wide text) or Bria 3.2's (T5's 4096, 64 channels).
_BRIA_FIBO2 = re.compile(r"^(?:perceiver_layers_\d+_|(?:layers|noise_refiner)_\d+_cross_attention_)", re.M)
_BRIA_FIBO = re.compile(r"^caption_projection_\d+_linear$", re.MULTILINE)
_GLM_IMAGE = re.compile(r"^(?:(?:glyph|prior)_projector_|image_projector_proj$|time_condition_embed_)", re.M)
_GLM_Q, _GLM_WIDTH = re.compile(r"^transformer_blocks_\d+_attn1_to_[qkv]$"), 2560
_TIME_EMBED = re.compile(r"^time_embed_timestep_embedder_linear_[12]$", re.MULTILINE)
_IMG_IN, _IMG_OUT = re.compile(r"^x_embedder$"), re.compile(r"^proj_out$")
# Kandinsky 6 (diffusers' names are its files'): its per-modality text blocks, or its fused blocks' halves and the
# attention between them — names no other family holds (Kandinsky 5's blocks are not nested; its SR model's are not)
_KANDINSKY6 = re.compile(
    r"^(?:(?:video|audio)_text_transformer_blocks_\d+_|visual_transformer_blocks_\d+_(?:video_dec_block|audio_dec_block"
    r"|va_cross_attention|av_cross_attention|va_modulation|av_modulation)_)",
    re.MULTILINE,
)
# Kandinsky 6 SR: its visual blocks' MLP is diffusers' FeedForward (`net.0.proj`, `net.2`), where Kandinsky 5's is
# `in_layer` / `out_layer` and Kandinsky 6's sits inside a `*_dec_block`; its self-attention alone is Kandinsky 5's too
_KANDINSKY6_SR = re.compile(r"^visual_transformer_blocks_\d+_feed_forward_net_(?:0_proj|2)$", re.MULTILINE)
_MINIMAX_H3_Q = re.compile(r"^transformer_blocks_\d+_attn_to_q$")
_MINIMAX_H3_WIDTH = 5376
_FLUX_MLP_IN = re.compile(r"^double_blocks_\d+_img_mlp_0$")
# Hidden widths: Wan 1536 (2.1 1.3B), 5120 (2.1 14B; the 2.2 A14B experts share it), 3072 (2.2 TI2V 5B);
# NextDiT 2304 (Lumina 2), 3840 (Z-Image), 3584 (Bria FIBO 2). Facts of each release's config.
_WAN_WIDTH = {1536: "wan21", 5120: "wan21", 3072: "wan22"}
_NEXTDIT_WIDTH = {2304: "lumina2", 3840: "z_image", 3584: "bria_fibo2"}


def _width(diff, facts, pattern: re.Pattern, attr: str = "in_features") -> int | None:
    c = Counter(getattr(facts[n], attr) for n, d in diff if pattern.search(d) and getattr(facts[n], attr))
    return c.most_common(1)[0][0] if c else None


def _any_line(pattern: re.Pattern, lines: str, *needles: str) -> bool:
    """Whether `pattern` matches in `lines` (the names joined, one per line, after a leading "\\n").
    `needles` are texts any match contains (a name's start written "\\nname"), so the common case, none
    of them present, costs substring tests only. No pattern can match across a newline, so one search
    gives the same answer as searching each name."""
    return any(n in lines for n in needles) and pattern.search(lines) is not None


_DOUBLE_BLOCK = re.compile(r"^double_blocks_(\d+)_", re.MULTILINE)


def _family_2026(diff, facts) -> tuple[bool, str | None]:
    """(decided, base) for the newer DiT families; decided False when none of their names occur."""
    lines = "\n" + "\n".join(d for _, d in diff)
    if _any_line(
        _CASCADE, lines, "_depthwise", "_channelwise_", "_kv_mapper_", "_attention_attn_", "_attention_to_"
    ):
        return True, _cascade_stage(diff, facts, lines)
    if _any_line(
        _FLUX3,
        lines,
        "mode_blocks_",
        "_stream_modulations_",
        "\nsingle_blocks_",
        "\nsingle_transformer_blocks_",
    ):
        return True, "flux3"
    if _any_line(_ERNIE_IMAGE, lines, "\nlayers_"):
        return True, "ernie_image"
    if _any_line(_PRX, lines, "_attention_img_qkv_proj", "_attention_txt_kv_proj"):
        return True, "prx"
    if _any_line(_JOYIMAGE, lines, "_attn_img_attn_", "_attn_txt_attn_", "_mlp_net_"):
        return True, "joyimage"
    if _any_line(_KANDINSKY5, lines, "\ntext_transformer_blocks_", "_cross_attention_"):
        return True, "kandinsky5"
    if _any_line(_SANA_VIDEO, lines, "_ff_conv_temp"):
        return True, "sana_video"
    if _any_line(_MOTIF_VIDEO, lines, "_cross_attn_", "\ncontext_embedder_linear_"):
        return True, "motif_video"
    if _any_line(_COSMOS1, lines, "\nblocks_block"):
        return True, "cosmos_predict1"
    if _any_line(
        _KANDINSKY6, lines, "_text_transformer_blocks_", "_dec_block_", "_cross_attention_", "_modulation_"
    ):
        return True, "kandinsky6"
    if _any_line(_KANDINSKY6_SR, lines, "_feed_forward_net_"):
        return True, "kandinsky6_sr"
    if _any_line(_HIDREAM, lines, "_stream_blocks_"):
        return True, "hidream"
    if _any_line(_BRIA_FIBO2, lines, "\nperceiver_layers_", "_cross_attention_"):
        return True, "bria_fibo2"
    if _any_line(_GLM_IMAGE, lines, "_projector_", "\ntime_condition_embed_") or (
        "_attn1_to_" in lines and "_attn2_" not in lines and _width(diff, facts, _GLM_Q) == _GLM_WIDTH
    ):
        return True, "glm_image"
    if _any_line(
        _MINIMAX_H3,
        lines,
        "\nblocks_",
        "\ntransformer_blocks_",
        "\ntoken_refiner_",
        "\nfinal_layer_",
        "\naudio_proj_",
    ) or ("\ntransformer_blocks_" in lines and _width(diff, facts, _MINIMAX_H3_Q) == _MINIMAX_H3_WIDTH):
        return True, "minimax_h3"
    if _any_line(_MOCHI, lines, "\nblocks_", "\ntransformer_blocks_"):
        return True, "mochi"
    if _any_line(_HUNYUAN_DIT, lines, "\nblocks_"):
        return True, "hunyuan_dit"
    if _any_line(_AURAFLOW, lines, "_layers_", "\njoint_transformer_blocks_", "\nsingle_transformer_blocks_"):
        return True, "auraflow"
    if _any_line(_NUCLEUS, lines, "_encoder_proj", "_img_mlp_gate", "_img_mlp_shared_expert_"):
        return True, "nucleus_image"
    if _any_line(_QWEN21, lines, "\ntransformer_blocks_", "\nmodulation_1", "\ntxt_in_"):
        return True, "qwen_image21"
    if _any_line(_QWEN, lines, "\ntransformer_blocks_"):
        return True, "qwen_image"
    if _any_line(_WAN_ANIMATE2, lines, "\nblocks_"):  # every name it matches starts so
        return True, "wan22"
    if _any_line(_WAN, lines, "\nblocks_", "\nvace_blocks_"):
        width = _width(diff, facts, _WAN_Q)
        return True, "hunyuan_dit" if width == _HUNYUAN_DIT_WIDTH else _WAN_WIDTH.get(width)
    if _any_line(_NEXTDIT, lines, "\nlayers_", "\nnoise_refiner_", "\ncontext_refiner_"):
        return True, _NEXTDIT_WIDTH.get(_width(diff, facts, _NEXTDIT_OUT, "out_features"))
    # FLUX.1 has 19 double blocks; a 20th (HunyuanVideo has 20, HunyuanVideo 1.5 54) is not FLUX.1.
    doubles = [int(n) for n in _DOUBLE_BLOCK.findall(lines)] if "\ndouble_blocks_" in lines else []
    if any(n in lines for n in _HUNYUAN) or (doubles and max(doubles) >= 19):
        return True, "hunyuan_video"
    if "\ndistilled_guidance_layer" in lines:
        return True, "chroma"

    def latent() -> int | None:  # asked only of FLUX-like names: a UNet's LoRA skips two searches per module
        return _width(diff, facts, _IMG_IN) or _width(diff, facts, _IMG_OUT, "out_features")

    flux_like = any(
        n in lines for n in ("\ntime_embed_", "\ntransformer_blocks_", "\nsingle_transformer_blocks_")
    )
    if _any_line(_BRIA_FIBO, lines, "\ncaption_projection_") or (flux_like and latent() == 48):
        return True, "bria_fibo"
    if _any_line(_TIME_EMBED, lines, "\ntime_embed_"):  # without the latent's width, Bria 3.2 or FIBO: None
        text = _width(diff, facts, _CONTEXT_EMBEDDER)
        return True, "longcat_image" if text == 3584 else "bria" if text == 4096 and latent() == 64 else None
    if "\nsingle_transformer_blocks_" in lines:
        inner = _width(diff, facts, _FLUX_LIKE_MLP, "in_features")
        if inner and _width(diff, facts, _FLUX_LIKE_MLP, "out_features") == 8 * inner:
            return True, "ovis_image"
        if _width(diff, facts, _CONTEXT_EMBEDDER) == 3584:
            return True, "longcat_image"
    # FLUX.2 keeps FLUX.1's block names; its SwiGLU MLP makes img_mlp.0 six times as wide as the
    # stream (FLUX.1: four times).
    if "\ndouble_blocks_" not in lines:
        return False, None
    inner = _width(diff, facts, _FLUX_MLP_IN, "in_features")
    outer = _width(diff, facts, _FLUX_MLP_IN, "out_features")
    if inner and outer and outer == 6 * inner:
        return True, "flux2"
    return False, None
