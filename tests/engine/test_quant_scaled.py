"""Scaled fp8 and comfy_quant weights: detected, loaded with their one byte per element, and computed with
the scale applied per op — a FLUX.1 forward on such a file equals the forward on its dequantized twin."""

from __future__ import annotations

import json

import pytest
import torch
from denoise_files import FLUX_DEV_TINY, flux_rows, random_weights, rel_l2, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import UnsupportedModel
from engine.model import Component
from engine.quant.scaled import ScaledSpec


def _quantizable(key: str, t: torch.Tensor) -> bool:
    # ComfyUI's fp8 conversions quantize the blocks' linear weights (2-D), not embeddings or norms.
    return key.endswith(".weight") and t.dim() == 2 and "_blocks." in key


def _quantize(weights: dict, layout: str) -> tuple[dict, dict]:
    """(the quantized file's tensors, its dequantized twin's) for one ComfyUI layout."""
    q, twin = {}, {}
    for k, t in weights.items():
        if not _quantizable(k, t):
            q[k] = twin[k] = t
            continue
        layer = k[: -len("weight")]
        if layout == "int8":
            scale = t.abs().max() / 127
            w = torch.clamp(torch.round(t / scale), -127, 127).to(torch.int8)
        else:
            fp8 = torch.float8_e5m2 if layout == "e5m2" else torch.float8_e4m3fn
            scale = t.abs().max() / torch.finfo(fp8).max
            w = (t / scale).to(fp8)
        scale = scale.float()
        q[k] = w
        twin[k] = w.float() * scale
        if layout == "scaled_fp8":
            q[layer + "scale_weight"] = scale.reshape(())
        else:
            fmt = {"int8": "int8_tensorwise", "e5m2": "float8_e5m2"}.get(layout, "float8_e4m3fn")
            q[layer + "weight_scale"] = scale.reshape(())
            q[layer + "comfy_quant"] = torch.tensor(
                list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8
            )
    if layout == "scaled_fp8":
        q["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    return q, twin


@pytest.fixture(scope="module")
def flux_weights():
    return random_weights(flux_rows(FLUX_DEV_TINY), seed=3)


@pytest.mark.parametrize("layout", ["scaled_fp8", "comfy_quant", "e5m2", "int8"])
def test_a_scaled_flux_steps_exactly_like_its_dequantized_twin(tmp_path, flux_weights, layout):
    q, twin = _quantize(flux_weights, layout)
    qp, tp = write(tmp_path / "q.safetensors", q), write(tmp_path / "twin.safetensors", twin)
    det = detect_file(str(qp))
    assert (det.error, det.architecture) == (None, "flux1_dev")
    fmt = {"scaled_fp8": "scaled_fp8", "int8": "int8_tensorwise", "e5m2": "float8_e5m2"}.get(
        layout, "float8_e4m3fn"
    )
    assert any(e.reason.startswith(f"{fmt} weights (") for e in det.evidence), det.evidence

    comp = Component("transformer", qp, "", compute_dtype="float32")
    # The weights stay one byte per element in the component (and so in the ledger).
    u = next(u for u in comp.units if u.path == "double_blocks.0.img_attn.qkv")
    assert u.module.weight.element_size() == 1 and isinstance(u.module.quantized["weight"], ScaledSpec)
    assert comp.file_bytes == sum(t.numel() * t.element_size() for t in q.values())
    twin_comp = Component("transformer", tp, "", compute_dtype="float32")
    # Every op computes with exactly the twin's weights (the scale applied in float32, where fp8 and
    # int8 values and their products with the scale are exact)...
    x = torch.zeros(1, 1)
    twin_units = {u.path: u for u in twin_comp.units}
    for a in comp.units:
        if a.kind == "linear":
            b = twin_units[a.path]
            assert torch.equal(a.module.cast_params(x)[0], b.module.cast_params(x)[0]), a.path
    # ...so the forward is the twin's, up to the matmul kernels' summation order (the BLAS picks its
    # kernel by the operands' memory alignment: a dequantized weight is a fresh buffer, the twin's a
    # view of its file's map).
    den, ref = denoise.bind(comp, "flux1_dev"), denoise.bind(twin_comp, "flux1_dev")
    inputs = den.random_inputs(64, 64, seed=1)
    inputs["txt"], inputs["txt_ids"] = inputs["txt"][:, :16], inputs["txt_ids"][:, :16]
    with torch.inference_mode():
        out, want = den(inputs), ref(inputs)
    assert rel_l2(out, want) <= 1e-6


def test_the_scale_stays_float32_when_weights_are_stored_in_fp8(tmp_path, flux_weights):
    q, _ = _quantize(flux_weights, "scaled_fp8")
    comp = Component("transformer", write(tmp_path / "q.safetensors", q), "", storage_dtype="float8_e4m3fn")
    u = next(u for u in comp.units if u.path == "double_blocks.0.img_attn.qkv")
    comp.move_unit(u, "device")  # the CPU device: a copy in the storage dtype
    assert u.module.weight.dtype == torch.float8_e4m3fn and u.module.scale_weight.dtype == torch.float32
    assert u.module.scale_weight.item() == q["double_blocks.0.img_attn.qkv.scale_weight"].item()


def test_nvfp4_and_mxfp8_are_named_and_refused(tmp_path, flux_weights):
    key = "double_blocks.0.img_attn.qkv"
    out, inp = flux_weights[key + ".weight"].shape
    nv = dict(flux_weights)
    nv[key + ".weight"] = torch.zeros(out, inp // 2, dtype=torch.uint8)
    nv[key + ".weight_scale"] = torch.zeros(out, inp // 16, dtype=torch.float8_e4m3fn)
    nv[key + ".weight_scale_2"] = torch.ones(())
    nv[key + ".comfy_quant"] = torch.tensor(list(b'{"format": "nvfp4"}'), dtype=torch.uint8)
    p = write(tmp_path / "nv.safetensors", nv)
    d = detect_file(str(p))
    assert d.error.type == "unsupported" and "nvfp4" in d.error.message and "fp8" in d.error.message
    with pytest.raises(UnsupportedModel, match="nvfp4"):
        Component("transformer", p, "")
