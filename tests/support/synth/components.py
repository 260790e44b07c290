"""Single-component files: VAEs and text encoders as users keep them in models/vae, models/clip, …"""

from __future__ import annotations

from . import taesd as A
from . import text as T
from . import vae as V
from .registry import Parts, register

# --- VAEs ---------------------------------------------------------------------------------------
for _name, _arch, _cfg, _naming in (
    # SD1/SD2/SDXL share one 4-channel AutoencoderKL layout (sd-vae-ft-mse, sdxl_vae): arch unknowable.
    ("sd_vae", None, V.SD, "ldm"),
    ("sd_vae_diffusers", None, V.SD, "diffusers"),
    # SD3 and FLUX.1 share the 16-channel layout (ae.safetensors / sd3 vae): told apart only by values.
    ("flux1_vae", None, V.FLUX1, "ldm"),
    ("flux1_vae_diffusers", None, V.FLUX1, "diffusers"),
    # FLUX.2's 32-channel VAE, in diffusers naming (vae/diffusion_pytorch_model.safetensors of FLUX.2-dev).
    ("flux2_vae_diffusers", "flux2", V.FLUX2, "diffusers"),
):

    def _vae(p: Parts, _cfg=_cfg, _naming=_naming) -> None:
        (V.vae_ldm if _naming == "ldm" else V.vae_diffusers)(p("vae"), _cfg)

    register(_name, "vae", _arch, {"vae": ""}, naming=_naming, note=f"{_cfg.z_channels}-channel latent")(_vae)


# --- text encoders ------------------------------------------------------------------------------
@register("clip_l", "text_encoder", None, {"clip_l": ""}, naming="transformers")
def _clip_l(p: Parts, position_ids: bool = False, projection: bool = False) -> None:
    """CLIP-L as in comfyanonymous/flux_text_encoders clip_l.safetensors or a diffusers text_encoder/."""
    T.clip_hf(p("clip_l"), T.CLIP_L, position_ids=position_ids, projection=projection)


@register("clip_g", "text_encoder", None, {"clip_g": ""}, naming="transformers")
def _clip_g(p: Parts, position_ids: bool = False) -> None:
    """OpenCLIP-G converted to transformers naming (diffusers text_encoder_2, ComfyUI clip_g.safetensors):
    CLIPTextModelWithProjection, so text_projection.weight is present."""
    T.clip_hf(p("clip_g"), T.CLIP_G, position_ids=position_ids, projection=True)


@register("clip_g_openclip", "text_encoder", None, {"clip_g": ""}, naming="openclip")
def _clip_g_oc(p: Parts) -> None:
    T.clip_openclip(p("clip_g"), T.CLIP_G)


@register("clip_h_openclip", "text_encoder", None, {"clip_h": ""}, naming="openclip")
def _clip_h_oc(p: Parts) -> None:
    T.clip_openclip(p("clip_h"), T.CLIP_H)


@register("t5xxl", "text_encoder", None, {"t5xxl": ""}, naming="transformers")
def _t5(p: Parts, embed_tokens: bool = False) -> None:
    """T5-XXL encoder (t5xxl_fp16.safetensors, diffusers text_encoder_2 of FLUX.1 / text_encoder_3 of SD3)."""
    T.t5_encoder(p("t5xxl"), T.T5_XXL, embed_tokens=embed_tokens)


# --- TAESD family (vae_approx) --------------------------------------------------------------------
def _taesd(fam: str, latent: int, part: str):
    pool = fam == "taef2"

    def fn(p: Parts) -> None:
        b = p("vae")
        if part == "encoder":
            A.taesd_encoder(b, latent, pool=pool)
        elif part == "decoder":
            A.taesd_decoder(b, latent, pool=pool)
        else:  # diffusers AutoencoderTiny: both halves in one file
            A.taesd_encoder(b, latent, pool=pool, key="encoder.layers.")
            A.taesd_decoder(b, latent, pool=pool, key="decoder.layers.", clamp=False)

    return fn


for _fam, _latent in A.FAMILY.items():
    for _part in ("encoder", "decoder", "diffusers"):
        # 4-channel (taesd/taesdxl) and 16-channel (taesd3/taef1) files are identical in layout, so only
        # the 32-channel taef2 names an architecture.
        register(
            f"{_fam}_{_part}",
            "vae_approx",
            "flux2" if _fam == "taef2" else None,
            {"vae": ""},
            naming="diffusers" if _part == "diffusers" else "taesd",
            note=f"{_latent}-channel latent",
        )(_taesd(_fam, _latent, _part))
