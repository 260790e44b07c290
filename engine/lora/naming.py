"""Naming conventions of adapter module names: which trainer wrote it and which model part it targets.

Facts (cited, not copied):
* kohya sd-scripts `networks/lora.py`: `lora_unet_` + the module path with dots as underscores; text
  encoders `lora_te_` (SD1/SD2), `lora_te1_` / `lora_te2_` (SDXL: CLIP-L / OpenCLIP-G);
  `networks/lora_flux.py` and `lora_sd3.py`: `lora_unet_` over BFL / SAI module names, `lora_te1_`
  (CLIP-L), `lora_te2_` (CLIP-G, SD3), `lora_te3_` (T5-XXL).
* OneTrainer: kohya-style names with `lora_transformer_` for DiT models.
* LyCORIS `lycoris/wrapper.py`: the generic network prefixes its modules with `lycoris_`.
* diffusers `loaders/lora_pipeline.py`: `unet.`, `transformer.`, `text_encoder.`, `text_encoder_2.`,
  `text_encoder_3.` + the diffusers module path.
* PEFT `save_pretrained`: `base_model.model.` + the module path.
* ComfyUI's saved LoRAs and ai-toolkit's ComfyUI exports: `diffusion_model.` + the checkpoint's own
  module path (LDM/SGM, BFL or SAI names); BFL's own LoRAs: bare BFL names.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

# (prefix, convention, slot). slot: "diffusion" (UNet/transformer), "te" / "te1" / "te2" / "te3", "peft".
_PREFIXES: tuple[tuple[str, str, str], ...] = (
    ("lora_unet_", "kohya", "diffusion"),
    ("lora_transformer_", "onetrainer", "diffusion"),
    ("lora_te1_", "kohya", "te1"),
    ("lora_te2_", "kohya", "te2"),
    ("lora_te3_", "kohya", "te3"),
    ("lora_te_", "kohya", "te"),
    ("lycoris_", "lycoris", "diffusion"),
    ("unet.", "diffusers", "diffusion"),
    ("transformer.", "diffusers", "diffusion"),
    ("text_encoder.", "diffusers", "te1"),
    ("text_encoder_2.", "diffusers", "te2"),
    ("text_encoder_3.", "diffusers", "te3"),
    ("base_model.model.", "peft", "peft"),
    ("model.diffusion_model.", "comfyui", "diffusion"),
    ("diffusion_model.", "comfyui", "diffusion"),
    ("text_encoders.clip_l.", "comfyui", "clip_l"),
    ("text_encoders.clip_g.", "comfyui", "clip_g"),
    ("text_encoders.t5xxl.", "comfyui", "t5xxl"),
)

# Bare module paths (no prefix) and what wrote them.
_BARE: tuple[tuple[str, str], ...] = (
    ("double_blocks.", "bfl"),
    ("single_blocks.", "bfl"),
    ("joint_blocks.", "sai"),
    ("transformer_blocks.", "diffusers"),
    ("single_transformer_blocks.", "diffusers"),
    ("down_blocks.", "diffusers"),
    ("up_blocks.", "diffusers"),
    ("mid_block.", "diffusers"),
    ("blocks.", "original"),
    ("vace_blocks.", "original"),
    ("layers.", "original"),
    ("noise_refiner.", "original"),
    ("context_refiner.", "original"),
    ("double_stream_blocks.", "original"),
    ("single_stream_blocks.", "original"),
    ("input_blocks.", "ldm"),
    ("output_blocks.", "ldm"),
    ("middle_block.", "ldm"),
)


class Named(NamedTuple):
    """An adapter module name taken apart: convention, slot, and the module path after the prefix."""

    convention: str
    slot: str
    inner: str  # kohya conventions: underscores; the others: dots
    underscored: bool


# Memoised: the LoRAs of one trainer and base share their module names (every kohya SD1.5 LoRA names
# the same 264 modules), so a library scan classifies each name once rather than once per file.
@functools.lru_cache(maxsize=1 << 14)
def classify(name: str) -> Named:
    """Which convention wrote `name` and which model part it targets (slot), header-only."""
    for prefix, conv, slot in _PREFIXES:
        if name.startswith(prefix):
            inner = name[len(prefix) :]
            if slot == "peft":
                # PEFT names carry no component; text-encoder paths say so themselves.
                slot = "te" if inner.startswith(("text_model.", "encoder.", "shared.")) else "diffusion"
            return Named(conv, slot, inner, prefix.endswith("_"))
    for prefix, conv in _BARE:
        if name.startswith(prefix):
            return Named(conv, "diffusion", name, False)
    if name.startswith("text_model."):
        return Named("transformers", "te", name, False)
    return Named("unknown", "unknown", name, False)


def underscored(path: str) -> str:
    """The kohya form of a dotted module path."""
    return path.replace(".", "_")
