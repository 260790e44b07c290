"""HunyuanVideo 1.0, HunyuanVideo 1.5 and HunyuanImage 2.1: one block structure (FLUX-style double- and
single-stream blocks behind a token refiner) in three namings — ComfyUI's (comfy/ldm/hunyuan_video/model.py,
FLUX's `img_attn.qkv` / `img_mod.lin`), Tencent's (`img_attn_qkv`, `img_mod.linear`, as diffusers'
`convert_hunyuan_video_transformer_to_diffusers` reads it) and diffusers' (`HunyuanVideoTransformer3DModel`,
`HunyuanVideo15Transformer3DModel`, `HunyuanImageTransformer2DModel`).

Facts (cited, not copied):
* The stem tells the family from FLUX: a patch convolution `img_in.proj` (Conv3d (1,2,2) for video,
  Conv2d for image) and `txt_in.individual_token_refiner` (diffusers `x_embedder.proj`,
  `context_embedder.token_refiner`) — ComfyUI model_detection.py, "Hunyuan Video".
* Sizes (diffusers defaults, ComfyUI model_detection.py): HunyuanVideo hidden 3072, 20 double + 40 single
  blocks, 16 latent channels, text 4096 (llava-llama-3-8b) + pooled CLIP-L (`vector_in`); HunyuanVideo 1.5
  hidden 2048, 54 double blocks only, 65 input channels (32 latent + 32 condition + 1 mask), Qwen2.5-VL
  text (3584), byT5 glyph mapper (`byt5_in`), SigLIP image input (`vision_in`) and `cond_type_embedding`;
  HunyuanImage 2.1 hidden 3584, 20 + 40 blocks, a 2-D 1x1 patch over 64 latent channels.
* HunyuanVideo image-to-video: 33 input channels (latent + image latent + mask, diffusers
  image_condition_type latent_concat), SkyReels 32; the token-replace I2V release keeps 16 and adds no
  weights (diffusers HunyuanVideoConditionEmbedding), so it shares the t2v layout.
* FLUX.1 has 19 double and 38 single blocks at the same 3072 width, so in a shard without a stem only a
  block number past those tells HunyuanVideo's blocks from FLUX.1's.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .result import Evidence
from .view import View, find_view

HIDDEN = {
    3072: ("hunyuan_video", "HunyuanVideo (13B)"),
    2048: ("hunyuan_video15", "HunyuanVideo 1.5 (8.3B)"),
    3584: ("hunyuan_image21", "HunyuanImage 2.1 (17B)"),
}
_STEMS = (
    ("txt_in.individual_token_refiner.blocks.#.norm1.weight", "img_in.proj.weight", "double_blocks.#."),
    (
        "context_embedder.token_refiner.refiner_blocks.#.norm1.weight",
        "x_embedder.proj.weight",
        "transformer_blocks.#.",
    ),
)
# (double-block key giving the hidden size at dim 1, the naming's single-block key)
_BLOCKS = (
    ("double_blocks.#.img_attn_qkv.weight", "single_blocks.#.modulation.linear.weight", ()),  # Tencent
    ("double_blocks.#.img_mod.lin.weight", "single_blocks.#.modulation.lin.weight", ()),  # ComfyUI
    (
        "transformer_blocks.#.norm1_context.linear.weight",
        "single_transformer_blocks.#.norm.linear.weight",
        ("transformer_blocks.#.attn.add_q_proj.weight",),  # (Mochi's joint blocks say attn1)
    ),
)


_FRAMEPACK = ("clean_x_embedder.proj.weight", "image_projection.up.weight")


def hunyuan(ix: KeyIndex) -> Backbone | None:
    for refiner, patch, _ in _STEMS:
        v = find_view(ix, refiner)
        if v is not None:
            return _with_stem(v, refiner, patch)
    return _blocks_only(ix)


def _with_stem(v: View, refiner: str, patch: str) -> Backbone:
    shape = v.shape(patch)
    hidden = shape[0] if shape else v.dim(refiner, 0)
    family, release = HIDDEN.get(hidden or 0, (None, None))
    if shape is not None and len(shape) == 4:
        family = "hunyuan_image21"  # a 2-D patch: an image model
    elif family is None:
        family = (
            "hunyuan_video15"
            if v.has("cond_type_embedding.weight") or v.has("cond_type_embed.weight")
            else "hunyuan_video"
        )
    b = Backbone(v.prefix, "transformer", family, architecture=family, prediction="flow")
    v.because(b, refiner, "a text token refiner before FLUX-style blocks → the HunyuanVideo family")
    kind = "video (3-D)" if shape is not None and len(shape) == 5 else "image (2-D)"
    if shape is not None:
        v.because(b, patch, f"a {kind} patch embedding, hidden {hidden}, {shape[1]} input channels")
    if release is None or HIDDEN[hidden][0] != family:
        v.because(b, refiner, f"hidden {hidden}: no known release of this family has this size")
        b.variant = None
        return b
    v.because(b, patch if shape else refiner, f"hidden {hidden} → {release}")
    b.variant = "normal"
    framepack = next((k for k in _FRAMEPACK if v.has(k)), None)
    if family == "hunyuan_video" and framepack is not None:
        # lllyasviel/FramePack (diffusers `transformer_hunyuan_video_framepack.py`): HunyuanVideo's blocks
        # with embedders for the packed history frames (1x / 2x / 4x) and a SigLIP image projection
        v.because(b, framepack, "history-frame embedders / an image projection → FramePack (next-frame I2V)")
        b.variant = "framepack"
    elif family == "hunyuan_video" and shape is not None:
        b.variant = _hv1_task(v, b, patch, shape[1])
    elif family == "hunyuan_video15":
        b.evidence.append(Evidence("", None, "HunyuanVideo 1.5's task (t2v / i2v) is not told by its layout"))
    return b


def _hv1_task(v: View, b: Backbone, patch: str, channels: int) -> str | None:
    if channels == 16:
        why = "16 input channels → t2v (the token-replace HunyuanVideo-I2V shares this layout key for key)"
        v.because(b, patch, why)
        return "t2v"
    if channels in (32, 33):
        extra = "latent + image latent + mask" if channels == 33 else "latent + image latent (SkyReels)"
        v.because(b, patch, f"{channels} input channels = {extra} → i2v")
        return "i2v"
    v.because(b, patch, f"{channels} input channels: no known HunyuanVideo release")
    return None


def _blocks_only(ix: KeyIndex) -> Backbone | None:
    """A shard without the stem: Tencent's naming is Hunyuan's own; in the FLUX-like namings the width
    tells (2048, 3584), or at 3072 a block number FLUX.1 does not have."""
    for double, single, beside in _BLOCKS:
        v = find_view(ix, double, *beside) or find_view(ix, single)
        if v is None:
            continue
        if v.has("img_in.weight") or v.has("x_embedder.weight") or v.has("vector_in.in_layer.weight"):
            return None  # FLUX's linear patch embedding: not this family
        if v.has("context_embedder.linear_1.weight"):
            return None  # text through an MLP, not HunyuanVideo's token refiner (Motif-Video): another model
        key = double if v.has(double) else single
        hidden = v.dim(key, 1)  # every one of these keys is [n x hidden, hidden]
        family, release = HIDDEN.get(hidden or 0, (None, None))
        tencent = "img_attn_qkv" in double
        past_flux = (v.numbers(double) or [0])[-1] >= 19 or (v.numbers(single) or [0])[-1] >= 38
        if family is None or (family == "hunyuan_video" and not (tencent or past_flux)):
            return None
        b = Backbone(v.prefix, "transformer", family, architecture=family, prediction="flow")
        what = "Tencent's HunyuanVideo block names" if tencent else f"FLUX-style blocks {hidden} wide"
        v.because(b, key, f"{what} ({v.blocks(key)}), no stem in this file (a shard?) → {release}")
        if family == "hunyuan_video" and past_flux and not tencent:
            v.because(b, key, "a block number past FLUX.1's 19 double / 38 single blocks → HunyuanVideo")
        b.variant = None if family == "hunyuan_video" else "normal"
        return b
    return None
