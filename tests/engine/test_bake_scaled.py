"""Baking a LoRA into a scaled fp8 / int8 base (ComfyUI's layouts): the patch applies to the weight's
value (stored · scale), and the result is stored back in the base's format."""

from __future__ import annotations

import json

import pytest
import torch
from test_bake import BASE

from engine.facade import Engine
from engine.formats.safetensors import SafetensorsFile, save_tensors
from engine.quant.scaled import dequantize_stored, requantize
from engine.requests import Bake, StackItem


@pytest.fixture
def lokr(shared_data):
    return shared_data("weights/smart_falcon_8_lokr.safetensors")


def _scaled_base(layout: str) -> tuple[dict, dict]:
    """(the scaled file's tensors, the dequantized twin's), every matrix/conv weight quantized."""
    g = torch.Generator().manual_seed(1)
    q, twin = {}, {}
    for k, s in BASE.items():
        t = torch.randn(*s, generator=g) * 0.05
        if len(s) == 1:
            q[k] = twin[k] = t
            continue
        layer = k[: -len("weight")]
        if layout == "int8":
            scale = (t.abs().amax() / 127).reshape(())
            w = torch.round(t / scale).clamp(-127, 127).to(torch.int8)
            q[layer + "weight_scale"] = scale
            q[layer + "comfy_quant"] = torch.tensor(list(b'{"format": "int8_tensorwise"}'), dtype=torch.uint8)
        else:  # scaled_fp8, one scale per output row
            scale = t.abs().flatten(1).amax(1) / 448
            w = (t / scale.reshape(-1, *[1] * (t.dim() - 1))).to(torch.float8_e4m3fn)
            q[layer + "scale_weight"] = scale
        q[k] = w
        twin[k] = dequantize_stored(w, q[layer + ("weight_scale" if layout == "int8" else "scale_weight")])
    if layout == "scaled_fp8":
        q["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    return q, twin


@pytest.mark.parametrize("layout", ["scaled_fp8", "int8"])
def test_a_lora_bakes_into_the_value_of_a_scaled_weight(tmp_path, lokr, layout):
    q, twin = _scaled_base(layout)
    save_tensors(tmp_path / "q.safetensors", q)
    save_tensors(tmp_path / "twin.safetensors", twin)
    stack = (StackItem(str(lokr), 4.0, 4.0),)
    e = Engine()
    e.run(Bake(str(tmp_path / "q.safetensors"), stack, str(tmp_path / "q_out.safetensors")))
    e.run(Bake(str(tmp_path / "twin.safetensors"), stack, str(tmp_path / "twin_out.safetensors")))
    got = SafetensorsFile(tmp_path / "q_out.safetensors")
    ref = SafetensorsFile(tmp_path / "twin_out.safetensors")
    assert set(got.keys()) == set(q)  # the same layout: weights, scales, markers
    scale_attr = "weight_scale" if layout == "int8" else "scale_weight"
    for k in BASE:
        if len(BASE[k]) == 1:
            continue
        w = got.tensor(k)
        assert w.dtype == q[k].dtype  # still one byte per element
        value = dequantize_stored(w, got.tensor(k[: -len("weight")] + scale_attr))
        want = ref.tensor(k).float()
        delta = want - twin[k]
        assert delta.abs().max() > 0.01  # the LoRA moves this weight well past the format's rounding
        # the baked value is the patched value within the format's rounding, not the raw bytes patched
        step = got.tensor(k[: -len("weight")] + scale_attr).float().max()
        tol = step * (1 if layout == "int8" else 32)  # e4m3: 3 mantissa bits, values up to 448·scale
        assert (value - want).abs().max() <= tol
        assert ((value - want).norm() / delta.norm()) < 0.25
    meta = json.loads(got.header.metadata["loadout.bake"])
    assert meta["patched_keys"] == 4


def test_requantize_keeps_the_scale_where_values_fit_and_grows_it_where_they_do_not():
    like = torch.zeros(4, 8, dtype=torch.float8_e4m3fn)
    scale = torch.full((4,), 0.01)
    v = torch.randn(4, 8, generator=torch.Generator().manual_seed(2)) * 0.5
    v[0] = v[0].clamp(-4, 4) * 0  # row 0 fits the old scale (all zeros)
    v[2, 3] = 40.0  # row 2 needs a scale of 40 / 448
    raw, s = requantize(v, like, scale)
    assert raw.dtype == torch.float8_e4m3fn and s.shape == scale.shape
    assert s[0] == scale[0] and torch.isclose(s[2], torch.tensor(40.0 / 448))
    back = dequantize_stored(raw, s)
    assert torch.isfinite(back).all() and abs(back[2, 3].item() - 40.0) < 1e-4  # not saturated


def test_a_gguf_base_is_refused_with_what_to_do(tmp_path, lokr):
    from engine.errors import UnsupportedModel
    from tests.support.gguf_files import write_gguf_twin

    weights = {k: torch.randn(*s) for k, s in BASE.items()}
    write_gguf_twin(tmp_path / "base.gguf", weights, "sd1", lambda k, t: t.dim() == 2)
    with pytest.raises(UnsupportedModel, match="on the fly"):
        Engine().run(
            Bake(str(tmp_path / "base.gguf"), (StackItem(str(lokr)),), str(tmp_path / "o.safetensors"))
        )
    assert not (tmp_path / "o.safetensors").exists()
