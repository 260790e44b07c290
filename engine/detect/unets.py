"""UNet backbones (LDM and diffusers naming): SD1, SD2 (+ unCLIP, depth, inpaint, x4 upscale), SDXL,
the SDXL refiner and Stable Video Diffusion. Facts and sources: see engine/detect/diffusion.py."""

from __future__ import annotations

import re

from .backbone import Backbone, pick_prefix
from .keys import KeyIndex
from .result import Evidence


def ldm_unet(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "input_blocks.0.0.weight", ("out.2.weight",)) or pick_prefix(
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
    if b.architecture == "sd2" and ix.has_prefix("depth_model."):
        b.variant = "depth"
        b.because(
            ix,
            ix.with_prefix("depth_model.")[0],
            "a MiDaS depth model is included → depth",
        )
    return b


def diffusers_unet(ix: KeyIndex) -> Backbone | None:
    p = pick_prefix(ix, "conv_in.weight", ("time_embedding.linear_1.weight",))
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
    if not video:
        _temporal(ix, b, p)
    return b


# Temporal layers diffusers' video UNets add to an image UNet's blocks (diffusers `unet_motion_model.py`:
# AnimateDiff's `motion_modules`; `unet_3d_condition.py` / `unet_i2vgen_xl.py`: ModelScope's and
# I2VGen-XL's `temp_convs`, `temp_attentions` and `transformer_in`). Their image blocks are SD1's or
# SD2's, so the context width alone would name an image model that ignores every temporal layer.
_TEMPORAL = (
    (".motion_modules.", "AnimateDiff motion modules beside the image blocks → an AnimateDiff UNet"),
    (".temp_attentions.", "temporal attentions beside the image blocks → a text-to-video UNet (ModelScope, "
     "I2VGen-XL)"),
    (".temp_convs.", "temporal convolutions beside the image blocks → a text-to-video UNet (ModelScope, "
     "I2VGen-XL)"),
)  # fmt: skip


def _temporal(ix: KeyIndex, b: Backbone, p: str) -> None:
    blob = "\n" + "\n".join(ix.with_prefix(p + "down_blocks.") + ix.with_prefix(p + "mid_block.")) + "\n"
    for marker, why in _TEMPORAL:  # searched in one joined string: every diffusers UNet passes here
        i = blob.find(marker)
        if i >= 0:
            key = blob[blob.rfind("\n", 0, i) + 1 : blob.find("\n", i)]
            image = f" (its image blocks: {b.architecture})" if b.architecture else ""
            b.evidence.insert(0, Evidence(key, ix.shape(key), f"{why}{image}: no known release Loadout runs"))
            b.architecture, b.variant, b.prediction = None, None, None
            return


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
    # supported_models.SDXL.model_type); without a marker the file is eps, as every official SDXL release
    # and ComfyUI's default (DESIGN.md's contract shows SDXL base as eps). A v finetune that dropped the
    # marker is mislabelled by every tool alike; the evidence line says what the call rests on.
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
        else:
            b.prediction = "eps"
            b.evidence.append(
                Evidence("v_pred (absent)", None, "no v_pred / edm_vpred marker key → eps (SDXL's default)")
            )
    elif arch == "svd":
        b.prediction = "v"  # SVD is trained as v-prediction on an EDM schedule (ComfyUI SVD_img2vid)
    elif arch == "sd2" and b.variant in ("inpaint", "depth", "upscale"):
        b.prediction = "eps"
