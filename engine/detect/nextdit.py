"""Lumina 2 and Z-Image: the NextDiT block structure (Alpha-VLLM Lumina-Image-2.0, Tongyi-MAI Z-Image), in
the original / ComfyUI naming (comfy/ldm/lumina/model.py: fused `attention.qkv`, `attention.out`,
`feed_forward.w1/w2/w3`, `adaLN_modulation`) and diffusers naming (`Lumina2Transformer2DModel`:
`attn.to_q`, `feed_forward.linear_1`, `norm1.linear`; `ZImageTransformer2DModel`: `attention.to_q`,
`feed_forward.w1`, `all_x_embedder.2-1`).

Facts (cited, not copied): the two share the block (attention with per-head RMS QK-norm, SwiGLU
feed-forward, four RMSNorms, noise and context refiners) and differ in how time enters each block:
Lumina 2's `adaLN_modulation` is SiLU then Linear from a 1024-wide time embedding (index 1, diffusers
`norm1.linear`), Z-Image's is a bare Linear from 256 (index 0) — ComfyUI `JointTransformerBlock`
(`z_image_modulation`). Sizes: Lumina 2 dim 2304, 26 layers, 24 heads with 8 K/V heads, Gemma 2 2B
captions (2304); Z-Image dim 3840, 30 layers, 30 heads, Qwen3 4B captions (2560) — ComfyUI
model_detection.py and the diffusers defaults. Z-Image Turbo and Base share the layout.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .result import Evidence
from .view import View, find_view

# (per-block attention weight whose input width is the hidden size, the feed-forward key beside it)
_NAMINGS = (
    ("layers.#.attention.qkv.weight", "layers.#.feed_forward.w1.weight"),
    ("layers.#.attention.to_q.weight", "layers.#.feed_forward.w1.weight"),
    ("layers.#.attn.to_q.weight", "layers.#.feed_forward.linear_1.weight"),
)
KNOWN = {"lumina2": (2304, "Lumina-Image 2.0 (2.6B)"), "z_image": (3840, "Z-Image (6B)")}


def nextdit(ix: KeyIndex) -> Backbone | None:
    for attn, ffn in _NAMINGS:
        v = find_view(ix, attn, ffn)
        if v is not None:
            break
    else:
        return None
    if v.has("perceiver.latent_queries"):
        return None  # captions resampled by a perceiver (Bria FIBO 2): NextDiT blocks in another model
    hidden = v.dim(attn, 1)
    family, mod_key, t_width = _modulation(v, attn)
    if family is None:
        return None
    b = Backbone(v.prefix, "transformer", family, architecture=family, prediction="flow")
    v.because(b, attn, f"NextDiT blocks ({v.blocks(attn)}), hidden {hidden}")
    name = "Z-Image" if family == "z_image" else "Lumina 2"
    v.because(b, mod_key, f"each block modulated from a {t_width}-wide time embedding → {name}")
    width, release = KNOWN[family]
    if hidden == width:
        v.because(b, attn, f"hidden {hidden} → {release}")
        b.variant = "normal"
    else:
        v.because(b, attn, f"hidden {hidden}: a {name} block structure at a size no release has")
        b.variant = None
    if family == "z_image" and v.has("siglip_embedder.1.weight"):
        v.because(
            b, "siglip_embedder.1.weight", "a SigLIP2 image embedder and refiner → Z-Image Omni (edits)"
        )
        b.variant = "omni" if b.variant else None
    elif family == "z_image":
        b.evidence.append(
            Evidence("", None, "Z-Image Turbo and Base share this layout: the header cannot tell them apart")
        )
    return b


def _modulation(v: View, attn: str) -> tuple[str | None, str, int | None]:
    for key, family in (
        ("layers.#.adaLN_modulation.0.weight", "z_image"),
        ("layers.#.adaLN_modulation.1.weight", "lumina2"),
        ("layers.#.norm1.linear.weight", "lumina2"),
    ):
        if v.has(key):
            return family, key, v.dim(key, 1)
    return None, attn, None
