"""GGUFs as stable-diffusion.cpp writes them (`sd-cli -M convert --type q8_0`, the converter behind
leejet's Z-Image-Turbo GGUFs): every tensor but biases whose rows fill whole blocks is quantized -- the
1-dim norm weights, Z-Image's pad tokens and caption norm, Wan's modulation tables, SD3's position table
-- and ggml's writer stores shapes without their leading axes of 1 ([1, 3840] as [3840]). Each family
steps like its dequantized float32 twin; before, a quantized tensor outside a layer was refused at load
(ComfyUI-GGUF's converter keeps them in float, its loader cannot read them quantized either)."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_steps_alike,
    diffusers_lumina2,
    diffusers_z_image,
    lumina2_original,
    z_image_original,
)
from test_quant_families import FAMILIES

from engine.model import build_components
from tests.support.gguf_files import sdcpp_pick, write_gguf_twin

gguf = pytest.importorskip("gguf")
BLOCK = 32  # Q8_0's


def _z_image() -> dict[str, torch.Tensor]:
    return z_image_original(diffusers_z_image()[1])


def _lumina2() -> dict[str, torch.Tensor]:
    return lumina2_original(diffusers_lumina2()[1])


CASES = {**FAMILIES, "z_image": (_z_image, "z_image", 64), "lumina2": (_lumina2, "lumina2", 64)}
# what the converter quantizes that ComfyUI-GGUF's keeps in float: a tensor outside any layer
OUTSIDE = {"wan21": "blocks.0.modulation", "sd3.5_medium": "pos_embed", "z_image": "x_pad_token"}


@pytest.mark.parametrize("family", sorted(CASES))
def test_a_stable_diffusion_cpp_gguf_steps_like_its_dequantized_twin(tmp_path, family):
    make, architecture, px = CASES[family]
    weights = make()
    # 1e-5: the same float32 values; SD2's and SDXL's convolutions read them in other layouts (1e-6 off)
    quantized = check_gguf_like_its_twin(
        tmp_path, weights, "loadout-test", sdcpp_pick(BLOCK), architecture, (px, px), ggml_dims=True, tol=1e-5
    )
    flat = [k for k, t in weights.items() if t.dim() == 1 and k.endswith(".weight") and len(t) % BLOCK == 0]
    assert set(flat) <= set(quantized)  # the norms' weights (FLUX.1's QK-norms are `.scale`s: kept)
    if family in OUTSIDE:
        assert OUTSIDE[family] in quantized


def test_a_quantized_pad_token_is_held_as_blocks_and_counted_as_such(tmp_path):
    """The pad tokens keep their blocks in every tier (the ledger counts the file's bytes); the forward
    reads them dequantized, flat as the file stores them; a step with most of the model streamed gives
    the full step's bits."""
    weights = _z_image()
    path = tmp_path / "z.gguf"
    _, quantized = write_gguf_twin(path, weights, "lumina2", sdcpp_pick(BLOCK), ggml_dims=True)
    assert {"x_pad_token", "cap_pad_token", "cap_embedder.0.weight"} <= set(quantized)
    (comp,) = build_components(path, {"transformer": ""}).values()
    root = comp.module
    assert root.x_pad_token.dtype == torch.uint8
    assert root.quantized["x_pad_token"].shape == (weights["x_pad_token"].numel(),)
    assert comp.tier_bytes()["disk"] == comp.file_bytes == sum(comp.measured_tiers().values())
    check_steps_alike(path, tmp_path, 0.001, "z_image", (1, 16, 8, 8))


def test_a_scaled_fp8_norm_weight_outside_any_layer_reads_scaled(tmp_path):
    """The same holders in a scaled-fp8 file whose converter scaled the 1-dim weights too (Z-Image's caption
    norm `cap_embedder.0`, a plain holder the forward reads): value = stored · scale, like a layer's."""
    from denoise_files import write

    from engine import denoise
    from engine.model import Component
    from tests.support.scaled_files import scaled_fp8_twin

    weights = _z_image()
    q, twin = scaled_fp8_twin(weights, lambda k, t: k.endswith(".weight"))
    assert "cap_embedder.0.scale_weight" in q
    q["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    dens = [denoise.bind(Component("transformer", write(tmp_path / f"{n}.safetensors", t), ""), "z_image")
            for n, t in (("fp8", q), ("twin", twin))]  # fmt: skip
    inputs = dens[0].random_inputs(64, 64, seed=1)
    with torch.inference_mode():
        out, want = (d(inputs) for d in dens)
    assert (out - want).norm() / want.norm() <= 1e-5
