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
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .keys import KeyIndex
from .result import Evidence

# SGM/LDM checkpoints keep the backbone under this prefix; bare files have none.
PREFERRED_PREFIXES = ("model.diffusion_model.", "", "diffusion_model.", "model.", "unet.", "transformer.")


@dataclass
class Backbone:
    """What the rules found: the backbone's prefix, component name, architecture and why."""

    prefix: str
    component: str  # "unet" or "transformer"
    family: str
    architecture: str | None = None
    variant: str | None = "normal"
    prediction: str | None = None
    evidence: list[Evidence] = field(default_factory=list)

    def because(self, ix: KeyIndex, key: str, reason: str) -> None:
        self.evidence.append(Evidence(key, ix.shape(key), reason))


def _pick_prefix(ix: KeyIndex, suffix: str, also: tuple[str, ...] = ()) -> str | None:
    cands = [p for p in ix.prefixes_for(suffix) if all(ix.has(p + a) for a in also)]
    cands = [p for p in cands if not p.startswith(("model_ema.", "control_model.", "first_stage_model."))]
    if not cands:
        return None
    for p in PREFERRED_PREFIXES:
        if p in cands:
            return p
    return min(cands, key=len)


def find_backbone(ix: KeyIndex) -> Backbone | None:
    """The diffusion backbone in these keys (any prefix), or None when there is none."""
    for probe in (_mmdit, _flux, _auraflow, _hunyuan, _pixart, _cascade, _ldm_unet, _diffusers_unet):
        b = probe(ix)
        if b is not None:
            return b
    return None


def _ldm_unet(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "input_blocks.0.0.weight", ("out.2.weight",)) or _pick_prefix(
        ix, "input_blocks.0.0.weight", ("time_embed.0.weight",)
    )
    if p is None:
        return None
    b = Backbone(p, "unet", "ldm_unet")
    conv_in = p + "input_blocks.0.0.weight"
    ctx_key = ix.first_match(
        re.escape(p) + r"input_blocks\.\d+\.1\.transformer_blocks\.0\.attn2\.to_k\.weight"
    )
    ctx_key = ctx_key or ix.first_match(
        re.escape(p) + r"middle_block\.1\.transformer_blocks\.0\.attn2\.to_k\.weight"
    )
    adm_key = p + "label_emb.0.0.weight"
    video = any(".time_stack." in k or ".time_mixer." in k for k in ix.with_prefix(p + "input_blocks."))
    _unet_rules(ix, b, conv_in, ctx_key, adm_key if ix.has(adm_key) else None, video, p + "out.2.weight")
    if any(k.startswith("depth_model.") for k in ix.tensors) and b.architecture == "sd2":
        b.variant = "depth"
        b.because(
            ix,
            next(k for k in ix.tensors if k.startswith("depth_model.")),
            "a MiDaS depth model is included → depth",
        )
    return b


def _diffusers_unet(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "conv_in.weight", ("time_embedding.linear_1.weight",))
    if p is None:
        return None
    b = Backbone(p, "unet", "diffusers_unet")
    ctx_key = ix.first_match(
        re.escape(p) + r"down_blocks\.\d+\.attentions\.0\.transformer_blocks\.0\.attn2\.to_k\.weight"
    ) or ix.first_match(
        re.escape(p) + r"mid_block\.attentions\.0\.transformer_blocks\.0\.attn2\.to_k\.weight"
    )
    adm_key = next(
        (
            p + k
            for k in ("add_embedding.linear_1.weight", "class_embedding.linear_1.weight")
            if ix.has(p + k)
        ),
        None,
    )
    video = any(
        "temporal_transformer_blocks" in k or ".time_stack." in k for k in ix.with_prefix(p + "down_blocks.")
    )
    _unet_rules(ix, b, p + "conv_in.weight", ctx_key, adm_key, video, p + "conv_out.weight")
    return b


def _unet_rules(ix, b: Backbone, conv_in, ctx_key, adm_key, video, conv_out) -> None:
    """UNet architecture from context width, ADM (pooled/size conditioning) width and input channels."""
    shape = ix.shape(conv_in)
    in_ch = shape[1] if shape and len(shape) == 4 else None
    out_shape = ix.shape(conv_out)
    out_ch = out_shape[0] if out_shape and len(out_shape) == 4 else 4
    ctx = ix.shape(ctx_key)[1] if ctx_key and len(ix.shape(ctx_key) or ()) == 2 else None
    adm = ix.shape(adm_key)[1] if adm_key and len(ix.shape(adm_key) or ()) == 2 else None
    arch = None
    if video and ctx == 1024:
        arch = "svd"
        b.because(ix, ctx_key, "temporal (time_stack) blocks with context 1024 → Stable Video Diffusion")
    elif ctx == 768:
        arch = "sd1"
        b.because(ix, ctx_key, "cross-attention context 768 (CLIP-L) → SD1")
    elif ctx == 1024:
        arch = "sd2"
        b.because(ix, ctx_key, "cross-attention context 1024 (OpenCLIP-H) → SD2")
        if adm in (1536, 2048):
            b.variant = "unclip"
            b.because(ix, adm_key, f"image-embedding input {adm} → SD2 unCLIP")
    elif ctx == 2048 and adm == 2816:
        arch = "sdxl"
        b.because(ix, ctx_key, "cross-attention context 2048 (CLIP-L + OpenCLIP-G) → SDXL")
        b.because(ix, adm_key, "pooled + size conditioning 2816 → SDXL base")
    elif ctx == 1280 and adm == 2560:
        arch = "sdxl_refiner"
        b.because(ix, ctx_key, "cross-attention context 1280 (OpenCLIP-G only) → SDXL refiner")
        b.because(ix, adm_key, "pooled + size/aesthetic conditioning 2560 → SDXL refiner")
    elif ctx is not None:
        b.because(ix, ctx_key, f"cross-attention context {ctx}: no known UNet family uses it")
    else:
        b.because(ix, conv_in, "a UNet without cross-attention: no known family")
    b.architecture = arch
    if in_ch is not None and arch is not None:
        if arch == "svd":
            pass  # 8 = noisy latent + conditioning-frame latent: SVD's normal input
        elif in_ch == 9:
            b.variant = "inpaint"
            b.because(ix, conv_in, "9 input channels (latent + mask + masked image) → inpainting")
        elif in_ch == 8:
            b.variant = "pix2pix"
            b.because(ix, conv_in, "8 input channels (latent + source image latent) → instruct-pix2pix")
        elif in_ch == 5 and arch == "sd2":
            b.variant = "depth"
            b.because(ix, conv_in, "5 input channels (latent + depth map) → depth-conditioned")
        elif in_ch == 7 and arch == "sd2":
            b.variant = "upscale"
            b.because(ix, conv_in, "7 input channels (latent + low-res image) → x4 upscaler")
        elif in_ch != out_ch:
            b.variant = None
    # Prediction, only where the file says it. Every SD1 release is eps (CompVis v1 configs:
    # parameterization eps). SDXL files mark v-prediction / EDM with marker keys (ComfyUI
    # supported_models.SDXL.model_type); unmarked v-prediction finetunes exist, so no marker → unknown.
    # SD2's plain 4-channel models are eps (512-base) or v (768-v): only weight values tell (values.py);
    # its inpaint / depth / upscale releases are eps (ComfyUI supported_models.SD20 only tests 4-channel).
    if arch == "sd1":
        b.prediction = "eps"
    elif arch in ("sdxl", "sdxl_refiner"):
        if ix.has("edm_vpred.sigma_max"):
            b.prediction = "v"
            b.because(ix, "edm_vpred.sigma_max", "edm_vpred marker → v-prediction (EDM schedule)")
        elif ix.has("v_pred"):
            b.prediction = "v"
            b.because(ix, "v_pred", "v_pred marker key → v-prediction")
        elif ix.has("edm_mean"):
            b.because(ix, "edm_mean", "edm_mean marker → EDM latents (Playground v2.5 style)")
    elif arch == "svd":
        b.prediction = "v"  # SVD is trained as v-prediction on an EDM schedule (ComfyUI SVD_img2vid)
    elif arch == "sd2" and b.variant in ("inpaint", "depth", "upscale"):
        b.prediction = "eps"


def _mmdit(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "joint_blocks.0.context_block.attn.qkv.weight")
    diffusers = False
    if p is None:
        p = _pick_prefix(ix, "transformer_blocks.0.attn.add_q_proj.weight", ("pos_embed.proj.weight",))
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


def _flux(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "double_blocks.0.img_attn.norm.key_norm.scale")
    diffusers = False
    if p is None:
        p = _pick_prefix(ix, "x_embedder.weight", ("single_transformer_blocks.0.proj_out.weight",))
        p = (
            p
            if p is not None
            else _pick_prefix(ix, "x_embedder.weight", ("double_stream_modulation_img.linear.weight",))
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


def _auraflow(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "double_layers.0.attn.w1q.weight")
    key = "double_layers.0.attn.w1q.weight"
    if p is None:
        p = _pick_prefix(ix, "joint_transformer_blocks.0.attn.add_k_proj.weight", ("register_tokens",))
        key = "joint_transformer_blocks.0.attn.add_k_proj.weight"
    if p is None:
        return None
    b = Backbone(p, "transformer", "auraflow", architecture="auraflow", prediction="flow")
    b.because(ix, p + key, "AuraFlow's double layers (separate q/k/v per stream) → AuraFlow")
    return b


def _hunyuan(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "mlp_t5.0.weight")
    key = "mlp_t5.0.weight"
    if p is None:
        p = _pick_prefix(
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


def _pixart(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(
        ix,
        "t_block.1.weight",
        ("y_embedder.y_proj.fc1.weight", "blocks.0.cross_attn.q_linear.weight", "blocks.0.mlp.fc1.weight"),
    )
    key = "y_embedder.y_proj.fc1.weight"
    if p is None:
        p = _pick_prefix(
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


def _cascade(ix: KeyIndex) -> Backbone | None:
    p = _pick_prefix(ix, "clf.1.weight")
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
