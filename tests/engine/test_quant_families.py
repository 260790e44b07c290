"""Every family `loadout step` runs, stored quantized the two ways people download in 2026 — a GGUF as
ComfyUI-GGUF writes it (no prefix, every layer weight of 2+ dims in Q8_0 or Q4_0 blocks) and a scaled-fp8 file as
ComfyUI writes it (`scaled_fp8` marker, one `scale_weight` per layer) — steps like its dequantized
float32 twin. Each family reads its layers' kinds from shapes somewhere (a linear or a 1x1-conv
projection, head widths, patch sizes); a quantized weight's bytes must never stand in for its shape:
SDXL and SD2 GGUF UNets once failed their first step that way."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    FLUX_DEV_TINY,
    FLUX_SCHNELL_TINY,
    SD1_INPAINT_TINY,
    SD2_TINY,
    SDXL_TINY,
    flux_rows,
    random_weights,
    rel_l2,
    unet_rows,
    write,
)
from layouts_2026.video import WanConfig, wan_original

from engine import denoise
from engine.model import Component
from tests.support.gguf_files import write_gguf_twin
from tests.support.scaled_files import scaled_fp8_twin
from tests.support.synth import mmdit as _mmdit
from tests.support.synth._build import Builder


def _mmdit_rows(cfg):
    b = Builder("F32", "")
    _mmdit.mmdit_native(b, cfg)
    return b.rows


def _qwen_image() -> dict[str, torch.Tensor]:
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers.QwenImageTransformer2DModel(num_layers=2, num_attention_heads=2, joint_attention_dim=96)
    g = torch.Generator().manual_seed(4)
    return {k: torch.randn(p.shape, generator=g) * 0.1 for k, p in ref.state_dict().items()}


# family -> (weights in the original naming without prefix, architecture, step size in pixels)
FAMILIES = {
    "sd1_inpaint": (lambda: random_weights(unet_rows(SD1_INPAINT_TINY, prefix="")), "sd1", 64),
    "sd2": (lambda: random_weights(unet_rows(SD2_TINY, prefix="")), "sd2", 64),
    "sdxl": (lambda: random_weights(unet_rows(SDXL_TINY, prefix="")), "sdxl", 64),
    "flux1_dev": (lambda: random_weights(flux_rows(FLUX_DEV_TINY)), "flux1_dev", 64),
    "chroma": (
        lambda: random_weights(flux_rows(FLUX_SCHNELL_TINY.with_(chroma=True, approximator_hidden=96))),
        "chroma",
        64,
    ),
    "sd3.5_medium": (
        lambda: random_weights(
            _mmdit_rows(
                _mmdit.MMDiTConfig(depth=3, pos_embed_max_size=16, qk_norm=True, dual_attention_layers=(0, 1))
            )
        ),
        "sd3.5_medium",
        64,
    ),
    "wan21": (
        lambda: random_weights(
            [
                (k, "F32", s)
                for k, s in wan_original(WanConfig(dim=256, ffn=512, layers=2, text_dim=64)).items()
            ]
        ),
        "wan21",
        64,
    ),
    "qwen_image": (_qwen_image, "qwen_image", 64),
}


def _short_text(inputs: dict) -> dict:
    for k in ("txt", "txt_ids", "context"):  # a short prompt: the test's cost is the text length
        if k in inputs and inputs[k].dim() == 3 and inputs[k].shape[1] > 16:
            inputs[k] = inputs[k][:, :16]
    return inputs


@pytest.mark.parametrize("store", ["Q8_0", "Q4_0", "IQ4_XS", "MXFP4", "scaled_fp8"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_quantized_file_steps_like_its_dequantized_twin(tmp_path, family, store):
    make, architecture, px = FAMILIES[family]
    weights = make()
    if store != "scaled_fp8":
        path = tmp_path / "model.gguf"
        # layers' weights only: a bare parameter (Wan's `modulation`, SD3's `pos_embed`) stays float, as
        # ComfyUI-GGUF's converter keeps it (test_quant_sdcpp.py: stable-diffusion.cpp's quantizes it)
        pick = lambda k, t: k.endswith(".weight") and t.dim() >= 2  # noqa: E731
        twin, quantized = write_gguf_twin(path, weights, "loadout-test", pick, store)
        assert quantized
    else:
        q, twin = scaled_fp8_twin(weights, lambda k, t: k.endswith(".weight") and t.dim() >= 2)
        path = write(tmp_path / "model.safetensors", q)
    dens = [
        denoise.bind(Component("transformer", str(p), "", compute_dtype="float32"), architecture)
        for p in (path, write(tmp_path / "twin.safetensors", twin))
    ]
    inputs = _short_text(dens[0].random_inputs(px, px, seed=3))
    with torch.inference_mode():
        out, want = (d(inputs) for d in dens)
    assert out.shape == want.shape and torch.isfinite(out).all()
    assert rel_l2(out, want) <= 1e-5  # the same float32 weights; GEMMs of other layouts
