"""The FLUX block structure: FLUX.1 (dev, schnell, Fill, Depth/Canny, Kontext), Chroma and FLUX.2 (dev,
klein), in BFL naming (black-forest-labs/flux `modules/layers.py`, black-forest-labs/flux2 `model.py`, which
ComfyUI keeps) and diffusers naming (`FluxTransformer2DModel`, `ChromaTransformer2DModel`,
`Flux2Transformer2DModel`).

Facts (cited, not copied):
* Every block of the three carries QK-normed attention over 128-wide heads. FLUX.1 blocks have their own
  modulation (`double_blocks.N.img_mod.lin`, `single_blocks.N.modulation.lin`; diffusers `norm1.linear`,
  `norm.linear`) and biased qkv; Chroma (lodestones/Chroma, diffusers ChromaTransformer2DModel) drops the
  per-block modulation for one `distilled_guidance_layer` but keeps the biases; FLUX.2 shares one
  modulation across blocks (`double_stream_modulation_img.lin`), has no biases and a SwiGLU MLP
  (`img_mlp.0` twice the MLP width; diffusers `ff.linear_in`, fused `to_qkv_mlp_proj` in single blocks)
  — diffusers `convert_flux2_transformer_checkpoint_to_diffusers`. So a shard's blocks name the family.
* FLUX.1 input channels (flux `util.py` configs): 64 = 16 latent x 2x2; Fill 384 (latent + masked image +
  mask); Depth / Canny 128. ComfyUI's Flux detection: `guidance_in` present = guidance-distilled (dev).
  FLUX.1 Kontext [dev] and Krea [dev] are FLUX.1 dev configs (diffusers FluxKontextPipeline uses the same
  FluxTransformer2DModel): only metadata can tell them.
* FLUX.2 sizes (diffusers Flux2Transformer2DModel defaults; mflux `model_config.py` for klein): dev hidden
  6144, 8 double + 48 single blocks, text 15360 (Mistral Small 3 24B, 3 x 5120); klein 4B hidden 3072,
  5 + 20 blocks, text 7680 (Qwen3 4B); klein 9B hidden 4096, 8 + 24 blocks, text 12288 (Qwen3 8B).
* Chroma Radiance works in pixel space: no `img_in`, `nerf_blocks` instead (ComfyUI model_detection).
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .result import Evidence
from .view import View, find_view, variant

FLUX2_SIZES = {6144: ("dev", "32b", 15360), 3072: ("klein", "4b", 7680), 4096: ("klein", "9b", 12288)}

# (naming, per-block anchor, suffixes that must sit beside it)
_ANCHORS = (
    ("bfl", "double_blocks.#.img_attn.qkv.weight", ("double_blocks.#.txt_attn.qkv.weight",)),
    ("bfl", "single_blocks.#.linear1.weight", ("single_blocks.#.linear2.weight",)),
    (
        "diffusers",
        "transformer_blocks.#.attn.norm_added_k.weight",
        ("transformer_blocks.#.attn.add_q_proj.weight",),
    ),
    ("diffusers", "single_transformer_blocks.#.attn.norm_k.weight", ()),
)
# A shard may hold only stem keys (diffusers shards split the model in key order): these name the family.
_STEMS = (
    ("bfl", "double_stream_modulation_img.lin.weight", ()),
    ("diffusers", "double_stream_modulation_img.linear.weight", ()),
    ("diffusers", "single_stream_modulation.linear.weight", ()),
    (
        "bfl",
        "distilled_guidance_layer.in_proj.weight",
        ("distilled_guidance_layer.layers.0.in_layer.weight",),
    ),
    ("diffusers", "distilled_guidance_layer.in_proj.weight", ()),
    ("bfl", "img_in.weight", ("vector_in.in_layer.weight",)),
    ("diffusers", "x_embedder.weight", ("time_text_embed.text_embedder.linear_1.weight",)),
)


def _find(ix: KeyIndex) -> tuple[View, str, str] | None:
    for naming, anchor, also in _ANCHORS + _STEMS:
        v = find_view(ix, anchor, *also)
        if v is None:
            continue
        if naming == "bfl" and any(
            v.has(s)
            for s in (
                "txt_in.individual_token_refiner.blocks.0.norm1.weight",  # HunyuanVideo / HunyuanImage
                "img_in.proj.weight",  # their patch convolution
                "latent_in.weight",  # Hunyuan3D's shape latents
                "double_blocks.#.img_mlp.gate_proj.weight",  # a gated MLP: another model on FLUX-style blocks
            )
        ):
            return None
        head = _head_dim(v)
        if "#" in anchor and head is not None and head != 128:
            return None  # FLUX's heads are 128 wide; SD3's joint blocks (64) are another family
        if naming == "diffusers":
            if v.has("pos_embed.proj.weight") or v.has("transformer_blocks.#.img_mod.1.weight"):
                return None  # SD3's MMDiT / Qwen-Image: joint blocks of another family
            if v.has("x_embedder.proj.weight") or v.has("context_embedder.linear_1.weight"):
                return None  # a patch convolution, text through an MLP (Motif-Video...): FLUX's are linear
            if "#" in anchor and not any(
                v.has(s)
                for s in (
                    "transformer_blocks.#.ff.net.0.proj.weight",
                    "transformer_blocks.#.ff.linear_in.weight",
                    "single_transformer_blocks.#.proj_mlp.weight",
                    "single_transformer_blocks.#.attn.to_qkv_mlp_proj.weight",
                )
            ):
                return None
        return v, naming, anchor
    return None


def flux(ix: KeyIndex) -> Backbone | None:
    found = _find(ix)
    if found is None:
        return None
    v, naming, anchor = found
    b = Backbone(v.prefix, "transformer", "flux", prediction="flow")
    stem_only = "#" not in anchor
    hidden = _hidden(v)
    if stem_only:
        v.because(b, anchor, f"FLUX stem weights without blocks (one shard of a model), hidden size {hidden}")
    else:
        what = "single-stream" if anchor.startswith("single") else "double-stream"
        v.because(b, anchor, f"FLUX {what} blocks ({v.blocks(anchor)}), hidden size {hidden}")
    shared = "double_stream_modulation_img." + ("lin.weight" if naming == "bfl" else "linear.weight")
    for key in (shared, "single_stream_modulation." + ("lin.weight" if naming == "bfl" else "linear.weight")):
        if v.has(key):
            v.because(b, key, "one modulation shared by all blocks → FLUX.2")
            return _flux2(v, b, naming, hidden)
    if v.has("distilled_guidance_layer.in_proj.weight"):
        v.because(
            b,
            "distilled_guidance_layer.in_proj.weight",
            "a distilled guidance layer feeds every block → Chroma",
        )
        return _chroma(v, b)
    if stem_only:
        return _flux1(v, b, naming, None)
    own, own_key = _own_modulation(v, naming, anchor)
    bias, bias_key = _biased(v, naming, anchor)
    if (own or bias) and not _plain_mlp(v, hidden):
        return None  # FLUX.1-style blocks with a gated MLP (Ovis-Image...): another model, no guess
    if own and v.has("time_embed.timestep_embedder.linear_1.weight"):
        return (
            None  # a timestep-only embedding, no pooled text beside it (Bria 3.x, LongCat-Image): not FLUX.1
        )
    if own:
        text = "txt_in.weight" if naming == "bfl" else "context_embedder.weight"
        width = v.dim(text, 1) if v.has(text) else None
        if width is not None and width != 4096:
            return None  # FLUX.1 reads T5-XXL (4096 wide): FLUX.1 blocks on another encoder (LongCat-Image: 3584)
        return _flux1(v, b, naming, own_key)
    if bias:
        v.because(b, bias_key, "FLUX.1 blocks (biased attention) without their own modulation → Chroma")
        return _chroma(v, b)
    v.because(b, anchor, "blocks without their own modulation or biases (SwiGLU MLP) → FLUX.2")
    return _flux2(v, b, naming, hidden)


def _hidden(v: View) -> int | None:
    for suffix, i in (
        ("double_blocks.#.img_attn.qkv.weight", 1),
        ("single_blocks.#.linear1.weight", 1),
        ("transformer_blocks.#.attn.to_q.weight", 1),
        ("single_transformer_blocks.#.attn.to_q.weight", 1),
        ("single_transformer_blocks.#.attn.to_qkv_mlp_proj.weight", 1),
        ("img_in.weight", 0),
        ("x_embedder.weight", 0),
        ("double_stream_modulation_img.lin.weight", 1),
        ("double_stream_modulation_img.linear.weight", 1),
        ("single_stream_modulation.lin.weight", 1),
        ("single_stream_modulation.linear.weight", 1),
        ("distilled_guidance_layer.out_proj.weight", 0),
    ):
        d = v.dim(suffix, i)
        if d is not None:
            return d
    return None


def _head_dim(v: View) -> int | None:
    """The width of the per-head QK-norm scale, in whichever naming the blocks use."""
    for key in (
        "double_blocks.#.img_attn.norm.key_norm.scale",
        "double_blocks.#.img_attn.norm.key_norm.weight",
        "single_blocks.#.norm.key_norm.scale",
        "single_blocks.#.norm.key_norm.weight",
        "transformer_blocks.#.attn.norm_added_k.weight",
        "single_transformer_blocks.#.attn.norm_k.weight",
    ):
        width = v.dim(key, 0)
        if width is not None:
            return width
    return None


def _plain_mlp(v: View, hidden: int | None) -> bool:
    """FLUX.1 and Chroma blocks have a plain GELU MLP four times the width (flux util.py mlp_ratio 4)."""
    for key in (
        "double_blocks.#.img_mlp.0.weight",
        "transformer_blocks.#.ff.net.0.proj.weight",
        "single_transformer_blocks.#.proj_mlp.weight",
    ):
        width = v.dim(key, 0)
        if width is not None and hidden:
            return width == 4 * hidden
    return True


def _own_modulation(v: View, naming: str, anchor: str) -> tuple[bool, str]:
    single = anchor.startswith("single")
    key = {
        ("bfl", False): "double_blocks.#.img_mod.lin.weight",
        ("bfl", True): "single_blocks.#.modulation.lin.weight",
        ("diffusers", False): "transformer_blocks.#.norm1.linear.weight",
        ("diffusers", True): "single_transformer_blocks.#.norm.linear.weight",
    }[(naming, single)]
    return v.has(key), key


def _biased(v: View, naming: str, anchor: str) -> tuple[bool, str]:
    if naming == "bfl":
        key = anchor.replace(".weight", ".bias")
    else:
        key = ("single_" if anchor.startswith("single") else "") + "transformer_blocks.#.attn.to_q.bias"
    return v.has(key), key


def _flux2(v: View, b: Backbone, naming: str, hidden) -> Backbone:
    b.architecture = "flux2"
    line, size, context = FLUX2_SIZES.get(hidden or 0, (None, None, None))
    txt = "txt_in.weight" if naming == "bfl" else "context_embedder.weight"
    got = v.dim(txt, 1)
    if line is None:
        b.because(v.ix, v.prefix + txt, f"hidden size {hidden}: no known FLUX.2 release has this size")
    elif got is not None and got != context:
        v.because(b, txt, f"hidden {hidden} with text features {got} wide: no known FLUX.2 release")
        line = size = None
    elif got is not None:
        v.because(b, txt, f"hidden {hidden}, text features {got} wide → {_flux2_name(line, size)}")
    else:
        b.because(
            v.ix, v.prefix + txt, f"hidden {hidden} → {_flux2_name(line, size)} (no text input in this file)"
        )
    b.variant = variant(line, size)
    return b


def _flux2_name(line: str, size: str) -> str:
    return "FLUX.2 [dev] 32B" if line == "dev" else f"FLUX.2 [klein] {size.upper()}"


def _chroma(v: View, b: Backbone) -> Backbone:
    b.architecture = "chroma"
    b.variant = "normal"
    if v.has("nerf_blocks.0.norm.scale"):
        b.variant = "radiance"
        v.because(
            b, "nerf_blocks.0.norm.scale", "NeRF-style pixel decoder blocks → Chroma Radiance (pixel space)"
        )
    return b


def _flux1(v: View, b: Backbone, naming: str, own_key: str | None) -> Backbone:
    img_in = "img_in.weight" if naming == "bfl" else "x_embedder.weight"
    guidance = (
        "guidance_in.in_layer.weight"
        if naming == "bfl"
        else "time_text_embed.guidance_embedder.linear_1.weight"
    )
    if own_key is not None:
        v.because(b, own_key, "every block has its own modulation → FLUX.1")
    if not v.has(img_in):
        b.architecture = "flux1_dev"
        b.variant = None
        why = "no input or guidance embedding in this file (a shard?): dev or schnell, and the variant, cannot be told"
        b.because(v.ix, v.prefix + img_in, why)
        b.also = ["flux1_schnell"]
        if _hidden(v) == 3072:
            b.also.append("hunyuan_video")
            why = "HunyuanVideo's double and single blocks have this layout at this width too"
            b.because(v.ix, v.prefix + img_in, why)
        return b
    if v.has(guidance):
        b.architecture = "flux1_dev"
        v.because(b, guidance, "a guidance embedding (guidance-distilled) → FLUX.1 dev")
    else:
        b.architecture = "flux1_schnell"
        v.because(b, img_in, "no guidance embedding (timestep-distilled) → FLUX.1 schnell")
    info = v.ix.tensors.get(v.prefix + img_in)
    shape = v.shape(img_in)
    if not shape or len(shape) != 2 or info is None or info.dtype in ("U8", "I8"):
        b.variant = None  # packed 4-bit weights: the width is not the input width
        return b
    patches = shape[1]
    if patches == 384:
        b.variant = "fill"
        v.because(b, img_in, "384 = (16 latent + 16 masked-image + 64 mask) × 2×2 patches → FLUX.1 Fill")
    elif patches == 128:
        b.variant = "control"
        v.because(b, img_in, "128 = (16 latent + 16 control latent) × 2×2 patches → FLUX.1 Depth/Canny")
    elif patches == 64:
        b.variant = _kontext(v, b)
    else:
        b.variant = None
        v.because(b, img_in, f"{patches} input features: no known FLUX.1 release")
    return b


def _kontext(v: View, b: Backbone) -> str:
    said = next(
        (
            k
            for k in ("modelspec.architecture", "modelspec.title", "modelspec.description")
            if "kontext" in v.ix.metadata.get(k, "").lower()
        ),
        None,
    )
    if said is not None and b.architecture == "flux1_dev":
        b.evidence.append(
            _meta(said, "the metadata names Kontext; FLUX.1 Kontext [dev] has FLUX.1 dev's layout → kontext")
        )
        return "kontext"
    if b.architecture == "flux1_dev":
        b.evidence.append(
            _meta(
                "",
                "FLUX.1 Kontext [dev] and FLUX.1 Krea [dev] share FLUX.1 dev's layout key for key; "
                "without metadata saying so the file is reported as plain dev",
            )
        )
    return "normal"


def _meta(key: str, reason: str) -> Evidence:
    return Evidence(f"__metadata__.{key}" if key else "", None, reason)
