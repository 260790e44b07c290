"""Qwen-Image 2.1's transformer (diffusers' QwenImage21Transformer2DModel, built on the meta device) in diffusers'
names and ComfyUI's (`model.diffusion_model.`, `img_mlp.gate_up` fused: checked against diffusers' own single-file
converter) → `qwen_image21`; Qwen-Image 1 and its Edit / Layered files stay `qwen_image`."""

from __future__ import annotations

import pytest
from layouts_2026.common import blocks_only, converted, detect, meta_shapes

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

PREFIX = "model.diffusion_model."


def _q21(**kw):
    return meta_shapes(diffusers.QwenImage21Transformer2DModel, **kw)


def comfy(rows: dict, prefix: str = PREFIX) -> dict:
    """diffusers' names -> ComfyUI's: the SwiGLU gate and up rows fused into `img_mlp.gate_up`, gate first."""
    out = {}
    for k, s in rows.items():
        if k.endswith("img_mlp.proj.weight"):
            continue
        if k.endswith("img_mlp.gate_layer.weight"):
            k, s = k.replace("gate_layer", "gate_up"), (2 * s[0], *s[1:])
        out[prefix + k] = s
    return out


def test_the_release_size_in_both_namings():
    ref = _q21()
    assert converted(sfu.convert_qwen_image21_transformer_checkpoint_to_diffusers, comfy(ref)) == ref
    for rows, prefix in ((ref, ""), ({PREFIX + k: s for k, s in ref.items()}, PREFIX), (comfy(ref), PREFIX)):
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant, d.prediction) == (
            "diffusion_model",
            "qwen_image21",
            "normal",
            "flow",
        )
        assert d.components["transformer"].prefix == prefix
        assert abs(d.params - 7.115e9) < 0.01e9
        assert "32 blocks), hidden 4096 → Qwen-Image 2.1" in d.evidence[0].reason
        assert not any("not the released" in e.reason for e in d.evidence)


def test_another_size_and_a_middle_shard_stay_qwen_image21():
    small = _q21(num_layers=6, num_attention_heads=16, context_in_dim=2560)
    for rows in (small, comfy(small)):
        d = detect(rows)
        assert (d.architecture, d.variant) == ("qwen_image21", "normal")
        assert any("hidden size 2048: not the released Qwen-Image 2.1" in e.reason for e in d.evidence)
    for rows, container in (
        (_q21(num_layers=8), "transformer_blocks."),
        (comfy(_q21(num_layers=8)), PREFIX + "transformer_blocks."),
    ):
        d = detect(blocks_only(rows, container, 3, 6))
        assert (d.kind, d.architecture) == ("diffusion_model", "qwen_image21")
        assert any("part of a sharded model" in e.reason for e in d.evidence)


def test_qwen_image_1_edit_and_layered_stay_qwen_image():
    q1 = meta_shapes(diffusers.QwenImageTransformer2DModel, num_layers=3)
    layered = meta_shapes(diffusers.QwenImageTransformer2DModel, num_layers=3, use_additional_t_cond=True)
    for rows, var in (
        (q1, "normal"),
        ({**q1, "__index_timestep_zero__": (0,)}, "edit"),
        (layered, "layered"),
    ):
        for prefix in ("", PREFIX):
            d = detect({prefix + k: s for k, s in rows.items()})
            assert (d.architecture, d.variant) == ("qwen_image", var)
