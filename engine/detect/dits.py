"""Transformer backbones (and Stable Cascade's UNets): MMDiT (SD3 / SD3.5), AuraFlow, HunyuanDiT, PixArt,
Stable Cascade. Facts and sources: see engine/detect/diffusion.py. The FLUX family lives in flux.py."""

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
    patch = ix.shape(p + "pos_embed.proj.weight") or ix.shape(p + "x_embedder.proj.weight")
    if patch and patch[0] != 1152:
        return None  # PixArt-α and Σ (XL/2) are 1152 wide: PixArt's blocks in another model (Allegro: 2304)
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
    elif ix.has(p + "effnet_mapper.0.weight"):  # diffusers' Stage B names clip_mapper clip_txt_pooled_mapper
        b.architecture = "stable_cascade_b"
        b.because(ix, p + "effnet_mapper.0.weight", "an EfficientNet-feature mapper → Stable Cascade stage B")
    else:
        b.because(ix, p + "clf.1.weight", "Stable Cascade layout, stage unknown")
    return b
