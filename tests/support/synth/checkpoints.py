"""Whole single-file checkpoints (LDM, SGM and BFL/ComfyUI namings) and their diffusion models alone.

Optional parts a real file may or may not hold are options, so one layout function covers every
variant met in the wild; the defaults follow the widely shared official files:
* `position_ids` (CLIP's int64 buffer): saved by the transformers of 2022-23, so present in the SD1.5
  and SDXL 1.0 releases (default True).
* `schedule`: the 12 DDPM buffers (betas, alphas_cumprod, ...) the LDM LatentDiffusion class registers
  (CompVis ldm/models/diffusion/ddpm.py register_schedule, 1000 timesteps); present in SD1/SD2 files,
  absent from SGM (SDXL) files (default True for LDM, False for SGM).
* `ema`: LitEma shadow copies `model_ema.<key without dots>` plus model_ema.decay / num_updates
  (ldm/modules/ema.py), only in non-pruned training checkpoints (default False).
* SDXL `clip_l_full` / `clip_g_full`: CLIP-L layer 11 + final_layer_norm and OpenCLIP-G resblock 31 +
  ln_final + text_projection + logit_scale; SDXL only uses the penultimate layers so some tools prune
  them (default True, as in sd_xl_base_1.0).
* SDXL `v_pred` / `ztsnr` / `edm_vpred`: empty marker tensors ComfyUI writes for v-prediction, zero
  terminal SNR and EDM models (default False).
"""

from __future__ import annotations

from . import flux as F
from . import text as T
from . import unet as U
from . import vae as V
from .registry import Parts, register

SCHEDULE = (
    "alphas_cumprod",
    "alphas_cumprod_prev",
    "betas",
    "log_one_minus_alphas_cumprod",
    "posterior_log_variance_clipped",
    "posterior_mean_coef1",
    "posterior_mean_coef2",
    "posterior_variance",
    "sqrt_alphas_cumprod",
    "sqrt_one_minus_alphas_cumprod",
    "sqrt_recip_alphas_cumprod",
    "sqrt_recipm1_alphas_cumprod",
)

DM = "model.diffusion_model."


def _schedule(p: Parts) -> None:
    b = p("other")
    for k in SCHEDULE:
        b.t(k, (1000,))


def _ema(p: Parts, start: int) -> None:
    """LitEma shadows of the diffusion model rows added since `start` (names with dots removed)."""
    b = p("other")
    for k, _, shape in list(p.rows[start:]):
        if k.startswith(p.prefix + DM):
            b.t("model_ema." + k[len(p.prefix) + len("model.") :].replace(".", ""), shape)
    b.t("model_ema.decay", (), dtype="F32")
    b.t("model_ema.num_updates", (), dtype="I32")


def _ldm(p: Parts, unet: U.UNetConfig, te, *, position_ids: bool, schedule: bool, ema: bool) -> None:
    start = len(p.rows)
    U.unet_ldm(p("unet", DM), unet)
    te()
    V.vae_ldm(p("vae", "first_stage_model."), V.SD)
    if schedule:
        _schedule(p)
    if ema:
        _ema(p, start)


def _sd1(unet: U.UNetConfig):
    def fn(p: Parts, position_ids: bool = True, schedule: bool = True, ema: bool = False) -> None:
        def te():
            T.clip_hf(p("clip_l", "cond_stage_model.transformer."), T.CLIP_L, position_ids=position_ids)

        _ldm(p, unet, te, position_ids=position_ids, schedule=schedule, ema=ema)

    return fn


def _sd2(unet: U.UNetConfig):
    def fn(p: Parts, schedule: bool = True, ema: bool = False) -> None:
        # Stability-AI/stablediffusion ldm/modules/encoders/modules.py FrozenOpenCLIPEmbedder keeps the
        # whole text tower (the visual tower is deleted) under cond_stage_model.model.
        def te():
            T.clip_openclip(p("clip_h", "cond_stage_model.model."), T.CLIP_H)

        _ldm(p, unet, te, position_ids=False, schedule=schedule, ema=ema)

    return fn


_LDM_COMPONENTS = {"unet": DM, "vae": "first_stage_model."}
for _name, _cfg, _variant in (
    ("sd1_checkpoint", U.SD1, "normal"),
    # Inpainting: 4 latent + 4 masked-image latent + 1 mask = 9 input channels (runwayml
    # stable-diffusion-inpainting, configs/stable-diffusion/v1-inpainting-inference.yaml in_channels 9).
    ("sd1_inpaint", U.SD1.with_(in_channels=9), "inpaint"),
    # InstructPix2Pix: 4 latent + 4 input-image latent = 8 (timothybrooks/instruct-pix2pix
    # configs/generate.yaml in_channels 8).
    ("sd1_pix2pix", U.SD1.with_(in_channels=8), "pix2pix"),
):
    register(
        _name,
        "checkpoint",
        "sd1",
        {**_LDM_COMPONENTS, "clip_l": "cond_stage_model.transformer."},
        variant=_variant,
        prediction="eps",
        naming="ldm",
    )(_sd1(_cfg))

for _name, _cfg, _variant, _pred in (
    ("sd2_checkpoint", U.SD2, "normal", None),
    # stablediffusion configs/stable-diffusion/v2-inpainting-inference.yaml: in_channels 9.
    ("sd2_inpaint", U.SD2.with_(in_channels=9), "inpaint", "eps"),
    # v2-midas-inference.yaml: in_channels 5 (4 latent + 1 depth map). The released file also holds the
    # MiDaS DPT-Hybrid weights under depth_model.*, which this layout does not generate.
    ("sd2_depth", U.SD2.with_(in_channels=5), "depth", "eps"),
):
    register(
        _name,
        "checkpoint",
        "sd2",
        {**_LDM_COMPONENTS, "clip_h": "cond_stage_model.model."},
        variant=_variant,
        prediction=_pred,
        naming="ldm",
        note="SD2 base (eps) and 768-v (v) share one layout" if _pred is None else "",
    )(_sd2(_cfg))


def _sdxl(unet: U.UNetConfig):
    def fn(
        p: Parts,
        position_ids: bool = True,
        clip_l_full: bool = True,
        clip_g_full: bool = True,
        schedule: bool = False,
        v_pred: bool = False,
        ztsnr: bool = False,
        edm_vpred: bool = False,
    ) -> None:
        e = "conditioner.embedders."
        T.clip_hf(
            p("clip_l", e + "0.transformer."),
            T.CLIP_L,
            position_ids=position_ids,
            layers=None if clip_l_full else 11,
            final_norm=clip_l_full,
        )
        T.clip_openclip(
            p("clip_g", e + "1.model."), T.CLIP_G, layers=None if clip_g_full else 31, head=clip_g_full
        )
        U.unet_ldm(p("unet", DM), unet)
        V.vae_ldm(p("vae", "first_stage_model."), V.SD)
        _markers(p, schedule=schedule, v_pred=v_pred, ztsnr=ztsnr, edm_vpred=edm_vpred)

    return fn


def _markers(p: Parts, *, schedule: bool, v_pred: bool, ztsnr: bool, edm_vpred: bool) -> None:
    b = p("other")
    if edm_vpred:
        b.t("edm_vpred.sigma_max", (), dtype="F32")
        b.t("edm_vpred.sigma_min", (), dtype="F32")
    if v_pred:
        b.t("v_pred", (0,), dtype="I64")
    if ztsnr:
        b.t("ztsnr", (0,), dtype="I64")
    if schedule:
        _schedule(p)


_SGM = {
    "unet": DM,
    "vae": "first_stage_model.",
    "clip_l": "conditioner.embedders.0.transformer.",
    "clip_g": "conditioner.embedders.1.model.",
}
# Without a v_pred / edm_vpred marker an SDXL file is eps (ComfyUI supported_models.SDXL.model_type).
register("sdxl_checkpoint", "checkpoint", "sdxl", _SGM, prediction="eps", naming="sgm")(_sdxl(U.SDXL))
# diffusers/stable-diffusion-xl-1.0-inpainting-0.1 unet/config.json: in_channels 9.
register("sdxl_inpaint", "checkpoint", "sdxl", _SGM, variant="inpaint", prediction="eps", naming="sgm")(
    _sdxl(U.SDXL.with_(in_channels=9))
)


@register(
    "sdxl_refiner",
    "checkpoint",
    "sdxl_refiner",
    {"unet": DM, "vae": "first_stage_model.", "clip_g": "conditioner.embedders.0.model."},
    prediction="eps",
    naming="sgm",
)
def _refiner(p: Parts, clip_g_full: bool = True) -> None:
    # sd_xl_refiner.yaml: the only embedder is OpenCLIP-G (FrozenOpenCLIPEmbedder2) at index 0.
    T.clip_openclip(
        p("clip_g", "conditioner.embedders.0.model."),
        T.CLIP_G,
        layers=None if clip_g_full else 31,
        head=clip_g_full,
    )
    U.unet_ldm(p("unet", DM), U.SDXL_REFINER)
    V.vae_ldm(p("vae", "first_stage_model."), V.SD)


def _flux(cfg: F.FluxConfig):
    def fn(p: Parts, text_encoders: bool = True, vae: bool = True) -> None:
        F.flux_bfl(p("transformer", DM), cfg)
        if text_encoders:
            T.clip_hf(p("clip_l", "text_encoders.clip_l.transformer."), T.CLIP_L)
            T.t5_encoder(p("t5xxl", "text_encoders.t5xxl.transformer."), T.T5_XXL)
        if vae:
            V.vae_ldm(p("vae", "vae."), V.FLUX1)

    return fn


_FLUX = {
    "transformer": DM,
    "clip_l": "text_encoders.clip_l.transformer.",
    "t5xxl": "text_encoders.t5xxl.transformer.",
    "vae": "vae.",
}
register("flux1_dev", "checkpoint", "flux1_dev", _FLUX, prediction="flow", naming="comfyui")(
    _flux(F.FLUX_DEV)
)
register("flux1_schnell", "checkpoint", "flux1_schnell", _FLUX, prediction="flow", naming="comfyui")(
    _flux(F.FLUX_SCHNELL)
)


def _naming(build) -> str:
    return {U.unet_ldm: "ldm", U.unet_diffusers: "diffusers", F.flux_bfl: "bfl"}.get(build, "")


# The diffusion model alone (ComfyUI models/unet, models/diffusion_models): no prefix by default,
# `prefix="model.diffusion_model."` for files cut out of a checkpoint.
def _dm(build, cfg, component: str):
    def fn(p: Parts) -> None:
        build(p(component), cfg)

    return fn


for _name, _arch, _build, _cfg, _comp, _variant in (
    ("sd1_unet", "sd1", U.unet_ldm, U.SD1, "unet", "normal"),
    ("sd1_inpaint_unet", "sd1", U.unet_ldm, U.SD1.with_(in_channels=9), "unet", "inpaint"),
    ("sd2_unet", "sd2", U.unet_ldm, U.SD2, "unet", "normal"),
    ("sdxl_unet", "sdxl", U.unet_ldm, U.SDXL, "unet", "normal"),
    ("sdxl_refiner_unet", "sdxl_refiner", U.unet_ldm, U.SDXL_REFINER, "unet", "normal"),
    ("sd1_unet_diffusers", "sd1", U.unet_diffusers, U.SD1, "unet", "normal"),
    ("sd1_inpaint_unet_diffusers", "sd1", U.unet_diffusers, U.SD1.with_(in_channels=9), "unet", "inpaint"),
    ("sd2_unet_diffusers", "sd2", U.unet_diffusers, U.SD2, "unet", "normal"),
    ("sdxl_unet_diffusers", "sdxl", U.unet_diffusers, U.SDXL, "unet", "normal"),
    ("sdxl_refiner_unet_diffusers", "sdxl_refiner", U.unet_diffusers, U.SDXL_REFINER, "unet", "normal"),
    # Stable Video Diffusion's VideoUNet (v-prediction with EDM sigmas: ComfyUI model_base SVD_img2vid);
    # svd.safetensors hold it under model.diffusion_model. beside the conditioner and a temporal VAE
    # decoder, which are not generated here.
    ("svd_unet", "svd", U.unet_ldm, U.SVD, "unet", "normal"),
    ("svd_unet_diffusers", "svd", U.unet_diffusers, U.SVD, "unet", "normal"),
    ("flux1_dev_transformer", "flux1_dev", F.flux_bfl, F.FLUX_DEV, "transformer", "normal"),
    ("flux1_schnell_transformer", "flux1_schnell", F.flux_bfl, F.FLUX_SCHNELL, "transformer", "normal"),
    ("flux1_fill_transformer", "flux1_dev", F.flux_bfl, F.FLUX_FILL, "transformer", "inpaint"),
    ("flux1_depth_transformer", "flux1_dev", F.flux_bfl, F.FLUX_DEPTH, "transformer", "depth"),
):
    register(
        _name,
        "diffusion_model",
        _arch,
        {_comp: ""},
        variant=_variant,
        prediction="flow" if _comp == "transformer" else {"svd": "v", "sd2": None}.get(_arch, "eps"),
        naming="ldm" if _comp == "unet" else "bfl",
    )(_dm(_build, _cfg, _comp))
