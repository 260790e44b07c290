"""Transformer backbones (and Stable Cascade's UNets): MMDiT (SD3 / SD3.5), FLUX.1 / FLUX.2 / Chroma,
AuraFlow, HunyuanDiT, PixArt, Stable Cascade. Facts and sources: see engine/detect/diffusion.py."""

from __future__ import annotations

import re

from .backbone import Backbone, pick_prefix
from .keys import KeyIndex


def mmdit(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "joint_blocks.0.context_block.attn.qkv.weight")
    diffusers = False
    if p is None:
        p = pick_prefix(ix, "transformer_blocks.0.attn.add_q_proj.weight", ("pos_embed.proj.weight",))
        diffusers = p is not None
    if p is None:
        return None
    b = Backbone(p, "transformer", "mmdit", prediction="flow")
    blocks_prefix = p + ("transformer_blocks." if diffusers else "joint_blocks.")
    embed = p + ("pos_embed.proj.weight" if diffusers else "x_embedder.proj.weight")
    depth = ix.count_blocks(blocks_prefix)
    hidden = (ix.shape(embed) or (None,))[0]
    attn2 = ix.first_match(
        re.escape(blocks_prefix)
        + (r"\d+\.attn2\.to_q\.weight" if diffusers else r"\d+\.x_block\.attn2\.qkv\.weight")
    )
    first = blocks_prefix + ("0.attn.add_q_proj.weight" if diffusers else "0.context_block.attn.qkv.weight")
    b.because(ix, first, "joint (MMDiT) blocks → the Stable Diffusion 3 family (rectified flow)")
    if attn2 is not None:
        b.architecture = "sd3.5_medium"
        b.because(ix, attn2, "extra self-attention in the image stream (MMDiT-X) → SD3.5 Medium")
    elif hidden == 2432 and depth == 38:
        b.architecture = "sd3.5_large"
        b.because(ix, embed, f"hidden size {hidden} (64 × 38) with {depth} joint blocks → SD3.5 Large")
    elif hidden == 1536 and depth == 24:
        b.architecture = "sd3"
        b.because(ix, embed, f"hidden size {hidden} (64 × 24) with {depth} joint blocks → SD3 Medium")
    else:
        b.because(ix, embed, f"hidden size {hidden} with {depth} joint blocks: no known SD3 release")
    return b


def flux(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "double_blocks.0.img_attn.norm.key_norm.scale")
    diffusers = False
    if p is None:
        p = pick_prefix(ix, "x_embedder.weight", ("single_transformer_blocks.0.proj_out.weight",))
        p = (
            p
            if p is not None
            else pick_prefix(ix, "x_embedder.weight", ("double_stream_modulation_img.linear.weight",))
        )
        diffusers = p is not None
    if p is None:
        return None
    b = Backbone(p, "transformer", "flux", prediction="flow")
    mod = p + (
        "double_stream_modulation_img.linear.weight"
        if diffusers
        else "double_stream_modulation_img.lin.weight"
    )
    if ix.has(mod):
        b.architecture = "flux2"
        b.because(ix, mod, "modulation shared by all double blocks → FLUX.2")
        return b
    if ix.has(p + "distilled_guidance_layer.in_proj.weight"):
        b.architecture = "chroma"
        b.because(
            ix,
            p + "distilled_guidance_layer.in_proj.weight",
            "distilled guidance layer → Chroma (a FLUX.1 derivative)",
        )
        return b
    img_in = p + ("x_embedder.weight" if diffusers else "img_in.weight")
    guidance = p + (
        "time_text_embed.guidance_embedder.linear_1.weight" if diffusers else "guidance_in.in_layer.weight"
    )
    first = p + (
        "transformer_blocks.0.attn.add_q_proj.weight"
        if diffusers
        else "double_blocks.0.img_attn.norm.key_norm.scale"
    )
    b.because(ix, first if ix.has(first) else img_in, "double-stream blocks with QK-norm → FLUX.1")
    if ix.has(guidance):
        b.architecture = "flux1_dev"
        b.because(ix, guidance, "a guidance embedding (guidance-distilled) → FLUX.1 dev")
    else:
        b.architecture = "flux1_schnell"
        b.because(ix, img_in, "no guidance embedding (timestep-distilled) → FLUX.1 schnell")
    shape = ix.shape(img_in)
    info = ix.tensors.get(img_in)
    if shape and len(shape) == 2 and info is not None and info.dtype not in ("U8", "I8"):
        patches = shape[1]
        if patches == 384:
            b.variant = "inpaint"
            b.because(
                ix,
                img_in,
                "384 = (16 latent + 16 masked-image + 64 mask) × 2×2 patches → FLUX.1 Fill (inpaint)",
            )
        elif patches == 128:
            b.variant = "control"
            b.because(ix, img_in, "128 = (16 latent + 16 control latent) × 2×2 patches → FLUX.1 Depth/Canny")
        elif patches != 64:
            b.variant = None
    return b


def auraflow(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "double_layers.0.attn.w1q.weight")
    key = "double_layers.0.attn.w1q.weight"
    if p is None:
        p = pick_prefix(ix, "joint_transformer_blocks.0.attn.add_k_proj.weight", ("register_tokens",))
        key = "joint_transformer_blocks.0.attn.add_k_proj.weight"
    if p is None:
        return None
    b = Backbone(p, "transformer", "auraflow", architecture="auraflow", prediction="flow")
    b.because(ix, p + key, "AuraFlow's double layers (separate q/k/v per stream) → AuraFlow")
    return b


def hunyuan(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "mlp_t5.0.weight")
    key = "mlp_t5.0.weight"
    if p is None:
        p = pick_prefix(
            ix,
            "text_embedder.linear_1.weight",
            ("blocks.0.attn2.to_k.weight", "time_extra_emb.pooler.q_proj.weight"),
        )
        key = "text_embedder.linear_1.weight"
    if p is None:
        return None
    # HunyuanDiT is trained with v-prediction (its diffusers scheduler config: prediction_type v_prediction).
    b = Backbone(p, "transformer", "hunyuan_dit", architecture="hunyuan_dit", prediction="v")
    b.because(
        ix, p + key, "an MLP that projects mT5 features (bilingual CLIP + mT5 conditioning) → HunyuanDiT"
    )
    return b


def pixart(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(
        ix,
        "t_block.1.weight",
        ("y_embedder.y_proj.fc1.weight", "blocks.0.cross_attn.q_linear.weight", "blocks.0.mlp.fc1.weight"),
    )
    key = "y_embedder.y_proj.fc1.weight"
    if p is None:
        p = pick_prefix(
            ix,
            "adaln_single.emb.timestep_embedder.linear_1.weight",
            (
                "caption_projection.linear_1.weight",
                "pos_embed.proj.weight",
                "transformer_blocks.0.attn2.to_k.weight",
            ),
        )
        key = "caption_projection.linear_1.weight"
    if p is None:
        return None
    # PixArt-α/Σ predict eps (with a learned variance: 8 output channels).
    b = Backbone(p, "transformer", "pixart", architecture="pixart", prediction="eps")
    b.because(ix, p + key, "single adaLN table + T5 caption projection into cross-attention → PixArt")
    return b


def cascade(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "clf.1.weight")
    if p is None:
        return None
    b = Backbone(p, "unet", "stable_cascade")
    if ix.has(p + "clip_txt_mapper.weight"):
        b.architecture = "stable_cascade_c"
        b.because(
            ix, p + "clip_txt_mapper.weight", "a text-embedding mapper in the prior → Stable Cascade stage C"
        )
    elif ix.has(p + "clip_mapper.weight"):
        b.architecture = "stable_cascade_b"
        b.because(
            ix, p + "clip_mapper.weight", "a pooled-CLIP mapper in the decoder → Stable Cascade stage B"
        )
    else:
        b.because(ix, p + "clf.1.weight", "Stable Cascade layout, stage unknown")
    return b
