"""SD3 / SD3.5 single files and diffusion-transformer-only files (native and diffusers namings).

SD3 single files (as ComfyUI reads them, comfy/supported_models.py SD3 and the official
sd3_medium_incl_clips_t5xxlfp16.safetensors): model.diffusion_model.*, first_stage_model.* (the
16-channel VAE without quant convs), and optionally text_encoders.{clip_l,clip_g}.transformer.* in
transformers CLIPTextModelWithProjection naming (SD3 uses both pooled outputs, so both carry
text_projection.weight) and text_encoders.t5xxl.transformer.*.
"""

from __future__ import annotations

from . import auraflow as AF
from . import cascade as SC
from . import flux as F
from . import hunyuan as HY
from . import mmdit as M
from . import pixart as PA
from . import text as T
from . import vae as V
from .checkpoints import DM
from .registry import Parts, register


def _sd3(cfg: M.MMDiTConfig, te_default: bool):
    def fn(
        p: Parts,
        clip: bool = te_default,
        t5xxl: bool = te_default,
        vae: bool = True,
        clip_l_projection: bool = True,
    ) -> None:
        M.mmdit_native(p("transformer", DM), cfg)
        if vae:
            V.vae_ldm(p("vae", "first_stage_model."), V.SD3)
        if clip:
            # diffusers' SD3 text_encoder is CLIPTextModelWithProjection; files saved from a bare CLIPTextModel
            # (as FLUX.1's clip_l is) lack text_projection.weight: option clip_l_projection=False.
            T.clip_hf(
                p("clip_l", "text_encoders.clip_l.transformer."), T.CLIP_L, projection=clip_l_projection
            )
            T.clip_hf(p("clip_g", "text_encoders.clip_g.transformer."), T.CLIP_G, projection=True)
        if t5xxl:
            T.t5_encoder(p("t5xxl", "text_encoders.t5xxl.transformer."), T.T5_XXL)

    return fn


def _sd3_components(te: bool) -> dict[str, str]:
    comps = {"transformer": DM, "vae": "first_stage_model."}
    if te:
        comps |= {c: f"text_encoders.{c}.transformer." for c in ("clip_l", "clip_g", "t5xxl")}
    return comps


# sd3_medium_incl_clips_t5xxlfp16.safetensors holds all three encoders; sd3.5_large.safetensors and
# sd3.5_medium.safetensors ship the transformer and VAE only (encoders as separate files).
for _name, _arch, _cfg, _te in (
    ("sd3_medium", "sd3", M.SD3_MEDIUM, True),
    ("sd3.5_large", "sd3.5_large", M.SD35_LARGE, False),
    ("sd3.5_medium", "sd3.5_medium", M.SD35_MEDIUM, False),
):
    register(
        _name,
        "checkpoint",
        _arch,
        _sd3_components(_te),
        prediction="flow",
        naming="sgm",
        note="options clip / t5xxl / vae add or drop the bundled parts",
    )(_sd3(_cfg, _te))


# Training objectives of the single-objective DiT families (ComfyUI comfy/model_base.py model types:
# HunyuanDiT V_PREDICTION, PixArt EPS, AuraFlow / SD3 / Flux FLOW).
OBJECTIVE = {"hunyuan_dit": "v", "pixart": "eps"}


def _dm(build, cfg, component: str):
    def fn(p: Parts) -> None:
        build(p(component), cfg)

    return fn


for _name, _arch, _build, _cfg, _naming in (
    ("sd3_medium_transformer", "sd3", M.mmdit_native, M.SD3_MEDIUM, "native"),
    ("sd3.5_large_transformer", "sd3.5_large", M.mmdit_native, M.SD35_LARGE, "native"),
    ("sd3.5_medium_transformer", "sd3.5_medium", M.mmdit_native, M.SD35_MEDIUM, "native"),
    ("sd3_medium_transformer_diffusers", "sd3", M.mmdit_diffusers, M.SD3_MEDIUM, "diffusers"),
    ("sd3.5_large_transformer_diffusers", "sd3.5_large", M.mmdit_diffusers, M.SD35_LARGE, "diffusers"),
    ("sd3.5_medium_transformer_diffusers", "sd3.5_medium", M.mmdit_diffusers, M.SD35_MEDIUM, "diffusers"),
    ("flux1_dev_transformer_diffusers", "flux1_dev", F.flux_diffusers, F.FLUX_DEV, "diffusers"),
    ("flux1_schnell_transformer_diffusers", "flux1_schnell", F.flux_diffusers, F.FLUX_SCHNELL, "diffusers"),
    ("flux2_dev_transformer", "flux2", F.flux2_bfl, F.FLUX2_DEV, "bfl"),
    ("chroma_transformer", "chroma", F.flux_bfl, F.CHROMA, "bfl"),
    ("auraflow_transformer", "auraflow", AF.auraflow_native, AF.AURAFLOW, "native"),
    ("hunyuan_dit_v11_transformer", "hunyuan_dit", HY.hunyuan_dit_native, HY.HUNYUAN_DIT_V11, "native"),
    ("hunyuan_dit_v12_transformer", "hunyuan_dit", HY.hunyuan_dit_native, HY.HUNYUAN_DIT_V12, "native"),
    ("pixart_alpha_transformer_diffusers", "pixart", PA.pixart_diffusers, PA.PIXART_ALPHA, "diffusers"),
    ("pixart_sigma_transformer_diffusers", "pixart", PA.pixart_diffusers, PA.PIXART_SIGMA, "diffusers"),
):
    register(
        _name,
        "diffusion_model",
        _arch,
        {"transformer": ""},
        prediction=OBJECTIVE.get(_arch, "flow"),
        naming=_naming,
    )(_dm(_build, _cfg, "transformer"))


# Stable Cascade stage files (stage_c.safetensors, stage_b.safetensors and the *_lite / bf16 variants)
# hold the UNet alone, in Stability's naming. Stable Cascade predicts noise ("eps"-like), not flow.
for _name, _arch, _cfg in (
    ("stable_cascade_c", "stable_cascade_c", SC.STAGE_C),
    ("stable_cascade_c_lite", "stable_cascade_c", SC.STAGE_C_LITE),
    ("stable_cascade_b", "stable_cascade_b", SC.STAGE_B),
    ("stable_cascade_b_lite", "stable_cascade_b", SC.STAGE_B_LITE),
):
    register(_name, "diffusion_model", _arch, {"unet": ""}, naming="native")(
        _dm(SC.cascade_native, _cfg, "unet")
    )


def _pixart(cfg: PA.PixArtConfig):
    def fn(p: Parts, pos_embed: bool = False) -> None:
        PA.pixart_native(p("transformer"), cfg, pos_embed=pos_embed)

    return fn


# PixArt-XL-2-1024-MS.pth / PixArt-Sigma-XL-2-1024-MS.pth (ComfyUI models/checkpoints or diffusion_models).
# PixArt is trained with eps prediction and learned sigma (8 output channels).
register(
    "pixart_alpha_transformer",
    "diffusion_model",
    "pixart",
    {"transformer": ""},
    prediction="eps",
    naming="native",
)(_pixart(PA.PIXART_ALPHA))
register(
    "pixart_sigma_transformer",
    "diffusion_model",
    "pixart",
    {"transformer": ""},
    prediction="eps",
    naming="native",
)(_pixart(PA.PIXART_SIGMA))
