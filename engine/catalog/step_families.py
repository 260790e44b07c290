"""The families Loadout steps (engine.denoise.SUPPORTED): each architecture's step kind (the key of the catalog's
per-family figures, engine.catalog.measured) and the size it is made for. Data only, one entry per line: a new family
appends its lines (engine.plan reads them)."""

STEP_KINDS = {
    "sd1": "unet",
    "sd2": "unet",
    "sdxl": "unet",
    "sdxl_refiner": "unet",
    "flux1_dev": "flux",
    "flux1_schnell": "flux",
    "flux2": "flux",
    "flux3": "flux3",
    "chroma": "flux",
    "sd3": "mmdit",
    "sd3.5_medium": "mmdit",
    "sd3.5_large": "mmdit",
    "mmdit": "mmdit",
    "qwen_image": "qwen_image",
    "z_image": "nextdit",
    "qwen_image21": "qwen_image21",
    "lumina2": "nextdit",
    "auraflow": "auraflow",
    "wan21": "wan",
    "wan22": "wan",
    "hunyuan_video": "hunyuan_video",
    "hunyuan_video15": "hunyuan_video15",
    "ltxv": "ltxv",
    "ltx2": "ltx2",
    "cosmos_predict2": "cosmos",
    "krea2": "krea2",
    "hunyuan_image21": "hunyuan_image21",
    "sana": "sana",
    "pixart": "pixart",
    "hunyuan_dit": "hunyuan_dit",
    "mochi": "mochi",
    "stable_cascade_c": "stable_cascade_c",
    "stable_cascade_b": "stable_cascade_b",
    "hidream": "hidream",
    "ernie_image": "ernie_image",
    "minimax_h3": "minimax_h3",
    "bria": "bria",
    "bria_fibo": "bria_fibo",
    "glm_image": "glm_image",
    "ideogram4": "ideogram4",
    "prx": "prx",
    "joyimage": "joyimage",
    "longcat_image": "longcat_image",
    "ovis_image": "ovis_image",
    "kandinsky5": "kandinsky5",
    "sana_video": "sana_video",
    "nucleus_image": "nucleus_image",
    "motif_video": "motif_video",
    "cosmos_predict1": "cosmos_predict1",
    "bria_fibo2": "bria_fibo2",
    "kandinsky6": "kandinsky6",
    "kandinsky6_sr": "kandinsky6_sr",
}
# (width, height) each family is made for (Wan: 480p, HunyuanVideo: 720p, one latent frame per step unit)
NATIVE_PX = {
    "sd1": (512, 512),
    "sd2": (768, 768),
    "sdxl": (1024, 1024),
    "sdxl_refiner": (1024, 1024),
    "flux1_dev": (1024, 1024),
    "flux1_schnell": (1024, 1024),
    "flux2": (1024, 1024),
    "flux3": (1024, 1024),  # its pipeline's default size
    "chroma": (1024, 1024),
    "sd3": (1024, 1024),
    "sd3.5_medium": (1024, 1024),
    "sd3.5_large": (1024, 1024),
    "mmdit": (1024, 1024),
    "qwen_image": (1328, 1328),
    "qwen_image21": (1024, 1024),  # its pipeline's output_resolution
    "z_image": (1024, 1024),
    "lumina2": (1024, 1024),
    "auraflow": (1024, 1024),
    "wan21": (832, 480),
    "wan22": (832, 480),
    "hunyuan_video": (1280, 720),  # its 720p (one latent frame per step unit, as Wan's)
    "hunyuan_video15": (1280, 720),
    "ltxv": (768, 512),  # LTX-Video's base resolution (its pipeline's default)
    "ltx2": (768, 512),  # its pipelines' first stage (121 frames at 24 fps; a step here is 17 of them)
    "cosmos_predict2": (1360, 768),  # its Text2Image pipeline's default
    "krea2": (1024, 1024),
    "hunyuan_image21": (2048, 2048),  # its 2K
    "sana": (1024, 1024),
    "pixart": (1024, 1024),
    "mochi": (848, 480),  # its pipeline's default (163 frames; one latent frame per step unit, as Wan's)
    "hunyuan_dit": (1024, 1024),
    "hidream": (1024, 1024),
    "ernie_image": (1024, 1024),  # its pipeline's default size
    "minimax_h3": (1344, 768),  # its pipeline's canvas (short edge 768, 768 x 1344 px at most)
    "stable_cascade_c": (1024, 1024),
    "stable_cascade_b": (1024, 1024),
    "bria": (1024, 1024),  # its pipeline's default size
    "bria_fibo": (1024, 1024),  # its pipeline's default size
    "glm_image": (1024, 1024),  # its pipeline's default size
    "ideogram4": (2048, 2048),  # its pipeline's default size
    "prx": (512, 512),  # its pipeline's default size (DEFAULT_RESOLUTION)
    "joyimage": (1024, 1024),  # its pipeline edits at the input image's size: 1024 px as others
    "longcat_image": (1024, 1024),  # its pipeline's default size
    "ovis_image": (1024, 1024),  # its pipeline's default size
    "kandinsky5": (768, 512),  # its T2V pipeline's default (one latent frame per step unit, as Wan's)
    "sana_video": (832, 480),  # its pipelines' default (81 frames; one latent frame per step unit, as Wan's)
    "nucleus_image": (1024, 1024),  # its pipeline's default size
    "motif_video": (1280, 736),  # its pipelines' default (121 frames; one latent frame per step unit)
    "cosmos_predict1": (1280, 704),  # its Text2World pipeline's default (one latent frame per step unit)
    "bria_fibo2": (1024, 1024),  # its pipeline's default size
    "kandinsky6": (768, 512),  # its TI2VA pipeline's default (one latent frame per step unit)
    "kandinsky6_sr": (512, 768),  # one of its trained tiles (tile_sizes), one latent frame per step unit
}

# What a file with nothing to step is told, before it loads (step_refusal) and when a step is asked (engine.stepping)
NO_DENOISER = "this file holds no denoiser (UNet or diffusion transformer) or text encoder to step"


def step_refusal(detection) -> str | None:
    """Why a step of this file cannot run, from its detection alone (None: Loadout can try it). The window
    greys out "Try a step" with this reason rather than loading a file only to be told so."""
    from ..model.dtypes import role_of

    if detection.error is not None:
        return detection.error.message
    names = tuple(detection.components)
    if any(role_of(n) == "diffusion" for n in names):
        arch = detection.architecture
        # an unnamed denoiser still gets its chance: an MMDiT of no release's size is read from its shapes
        if arch is None or arch in STEP_KINDS:
            return None
        return f"Loadout has no forward pass for {arch} yet: it detects, loads and patches it, but cannot step it"
    if any(role_of(n) == "text_encoder" for n in names):
        return None  # a text encoder's own file steps its encoder (CLIP and T5)
    return NO_DENOISER
