"""Metadata and storage variants for synthetic files: SAI ModelSpec metadata, and the quantised layouts
ComfyUI writes (legacy `scaled_fp8`, per-layer `comfy_quant`) that detection must name as unsupported.

ModelSpec (Stability-AI/ModelSpec, as written by kohya sd-scripts library/sai_model_spec.py):
modelspec.sai_model_spec "1.0.0", modelspec.architecture (e.g. "stable-diffusion-xl-v1-base", with
"/lora" or "/textual-inversion" appended for adapters), modelspec.implementation (the reference code's
URL or "diffusers"), modelspec.title, modelspec.resolution "WxH", optional prediction_type, trigger
phrase, …
"""

from __future__ import annotations

import json

from ._build import Entry

GENERATIVE_MODELS = "https://github.com/Stability-AI/generative-models"
FLUX_IMPL = "https://github.com/black-forest-labs/flux"
HUNYUAN_IMPL = "https://github.com/Tencent/HunyuanDiT"

# our architecture name -> (modelspec.architecture, implementation, resolution); identifiers as defined
# in sd-scripts' sai_model_spec.py (ARCH_SD_V1, ARCH_SD_V2_512, ARCH_SD_V2_768_V, ARCH_SD_XL_V1_BASE,
# ARCH_SD3_M, ARCH_FLUX_1_DEV / _SCHNELL, ARCH_HYDIT_V1_1 / _2) and the ModelSpec README (refiner).
MODELSPEC_ARCH = {
    "sd1": ("stable-diffusion-v1", GENERATIVE_MODELS, "512x512"),
    "sd2": ("stable-diffusion-v2-768-v", GENERATIVE_MODELS, "768x768"),
    "sd2_512": ("stable-diffusion-v2-512", GENERATIVE_MODELS, "512x512"),
    "sdxl": ("stable-diffusion-xl-v1-base", GENERATIVE_MODELS, "1024x1024"),
    "sdxl_refiner": ("stable-diffusion-xl-v1-refiner", GENERATIVE_MODELS, "1024x1024"),
    "sd3": ("stable-diffusion-3-medium", GENERATIVE_MODELS, "1024x1024"),
    "flux1_dev": ("flux-1-dev", FLUX_IMPL, "1024x1024"),
    "flux1_schnell": ("flux-1-schnell", FLUX_IMPL, "1024x1024"),
    "hunyuan_dit": ("hunyuan-dit-g2-v1_2", HUNYUAN_IMPL, "1024x1024"),
}


def modelspec(
    arch: str,
    *,
    title: str = "synthetic",
    adapter: str | None = None,
    prediction: str | None = None,
    trigger_phrase: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """ModelSpec metadata for a file of architecture `arch` (our vocabulary); adapter "lora" or
    "textual-inversion" suffixes the architecture as the spec does. Extra keys are added as given."""
    spec_arch, impl, reso = MODELSPEC_ARCH[arch]
    md = {
        "modelspec.sai_model_spec": "1.0.0",
        "modelspec.architecture": f"{spec_arch}/{adapter}" if adapter else spec_arch,
        "modelspec.implementation": impl,
        "modelspec.title": title,
        "modelspec.resolution": reso,
    }
    if prediction:
        md["modelspec.prediction_type"] = {"eps": "epsilon"}.get(prediction, prediction)
    if trigger_phrase:
        md["modelspec.trigger_phrase"] = trigger_phrase
    md.update(extra)
    return md


def _quantisable(key: str, shape: tuple[int, ...], prefix: str) -> bool:
    # Linear weights only (2-D), as ComfyUI's fp8 conversions leave norms, biases and embeddings alone.
    name = key[len(prefix) :]
    embedding = "embed" in name or name.endswith("shared.weight")  # T5's token table is `shared`
    return key.startswith(prefix) and key.endswith(".weight") and len(shape) == 2 and not embedding


def scaled_fp8(rows: list[Entry], prefix: str = "", *, marker_shape: tuple[int, ...] = (0,)) -> list[Entry]:
    """ComfyUI's legacy scaled-fp8 layout (e.g. t5xxl_fp8_e4m3fn_scaled, *_fp8_scaled checkpoints): the
    Linear weights under `prefix` become F8_E4M3 with a `<layer>.scale_weight` F32 beside each, and
    `<prefix>scaled_fp8` (an fp8 tensor whose dtype names the format; comfy/model_detection.py reads
    only its dtype and whether it has 2 elements) marks the file."""
    out: list[Entry] = []
    for key, dt, shape in rows:
        if _quantisable(key, shape, prefix):
            out.append((key, "F8_E4M3", shape))
            out.append((key[: -len("weight")] + "scale_weight", "F32", ()))
        else:
            out.append((key, dt, shape))
    out.append((f"{prefix}scaled_fp8", "F8_E4M3", marker_shape))
    return out


def comfy_quant(rows: list[Entry], prefix: str = "", *, fmt: str = "float8_e4m3fn") -> list[Entry]:
    """ComfyUI's per-layer quantisation layout: `<layer>.weight` quantised, `<layer>.weight_scale` F32 and
    `<layer>.comfy_quant`, a U8 tensor holding the JSON config ({"format": ...}) as bytes."""
    conf = json.dumps({"format": fmt}).encode()
    out: list[Entry] = []
    for key, dt, shape in rows:
        if _quantisable(key, shape, prefix):
            layer = key[: -len("weight")]
            out.append((key, "F8_E4M3", shape))
            out.append((layer + "weight_scale", "F32", ()))
            out.append((layer + "comfy_quant", "U8", (len(conf),)))
        else:
            out.append((key, dt, shape))
    return out
