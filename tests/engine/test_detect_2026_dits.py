"""2026 transformers told by modules of their own (dits_2026.py), from diffusers' classes on the meta device:
NucleusMoE-Image, PRX, Ideogram 4, GLM-Image and SANA-Video, at their default size and a small one, bare and
under `transformer.`; the block-level ones from one shard of their blocks too. Sana, Lumina 2 and Qwen-Image stay
themselves."""

from __future__ import annotations

import math

import pytest
from layouts_2026.common import blocks_only, detect, meta_shapes

diffusers = pytest.importorskip("diffusers")

CASES = [
    # class, architecture, a small config, the first evidence line at the default size, the blocks container
    (
        "NucleusMoEImageTransformer2DModel",
        "nucleus_image",
        dict(num_layers=5, num_attention_heads=4, attention_head_dim=32, axes_dims_rope=(8, 12, 12), num_experts=4,
             moe_intermediate_dim=64, joint_attention_dim=256),
        "blocks with a mixture-of-experts image MLP (128 experts and a shared one; 8 blocks), hidden 2048"
        " → NucleusMoE-Image",
        "transformer_blocks.",
    ),
    (
        "PRXTransformer2DModel",
        "prx",
        dict(hidden_size=256, num_heads=4, depth=2, context_in_dim=128),
        "blocks with fused image q / k / v and text keys / values only (16 blocks), hidden 1792 → PRX",
        "blocks.",
    ),
    (
        "Ideogram4Transformer2DModel",
        "ideogram4",
        None,
        "layers with sandwich norms and one modulation linear each (34 blocks), hidden 4608 → Ideogram 4",
        "layers.",
    ),
    (
        "GlmImageTransformer2DModel",
        "glm_image",
        dict(num_layers=2, num_attention_heads=4, attention_head_dim=32),
        "transformer blocks (30 blocks), hidden 2560",
        None,  # told by its stem: a shard of its blocks is no GLM-Image of its own
    ),
    (
        "JoyImageEditTransformer3DModel",
        "joyimage",
        dict(num_layers=2, hidden_size=256, num_attention_heads=4, rope_dim_list=[16, 24, 24], text_dim=128),
        "double-stream blocks with one attention module for both streams (20 blocks), hidden 3072 → JoyImage",
        "double_blocks.",
    ),
    (
        "JoyImageEditPlusTransformer3DModel",
        "joyimage",
        None,
        "double-stream blocks with one attention module for both streams (20 blocks), hidden 3072 → JoyImage",
        "double_blocks.",
    ),
    (
        "BriaFibo2Transformer2DModel",
        "bria_fibo2",
        None,
        "NextDiT-style layers (44 blocks), hidden 3584, behind a perceiver over the text → Bria FIBO 2",
        None,  # told by its perceiver: a shard of its layers alone is NextDiT's structure
    ),
    (
        "SanaWMTransformer3DModel",
        "sana_wm",
        None,
        "Sana's blocks with camera conditioning in each (20 blocks), hidden 2240 → SANA-WM",
        "blocks.",
    ),
    (
        "Cosmos3OmniTransformer",
        "cosmos3",
        None,
        "language-model layers with a second, generation pathway in each (36 blocks), hidden 4096 → Cosmos 3",
        "layers.",
    ),
    (
        "SanaVideoTransformer3DModel",
        "sana_video",
        dict(num_layers=2, num_attention_heads=4, attention_head_dim=32, num_cross_attention_heads=4,
             cross_attention_head_dim=32, cross_attention_dim=128),
        "Sana's linear-attention blocks with a temporal convolution in the Mix-FFN (20 blocks), hidden 2240"
        " → SANA-Video",
        "transformer_blocks.",
    ),
]  # fmt: skip


def _params(rows):
    return sum(math.prod(s) for s in rows.values())


@pytest.mark.parametrize("cls, arch, small, why, container", CASES)
def test_each_family(cls, arch, small, why, container):
    # NucleusMoE-Image's release widths and experts, at 8 of its 24 blocks (its 128 experts a block are slow to build)
    rows = meta_shapes(getattr(diffusers, cls), **({"num_layers": 8} if arch == "nucleus_image" else {}))
    for prefix in ("", "transformer."):
        d = detect({prefix + k: s for k, s in rows.items()})
        assert (d.kind, d.architecture, d.variant, d.prediction, d.also) == (
            "diffusion_model",
            arch,
            "normal",
            "flow",
            (),
        )
        assert d.components["transformer"].prefix == prefix
        assert abs(d.params - _params(rows)) <= 0.01 * _params(rows)
        assert d.evidence[0].reason == why
    if small is not None:
        assert detect(meta_shapes(getattr(diffusers, cls), **small)).architecture == arch
    if container is not None:
        d = detect(blocks_only(rows, container, 4, 8))
        assert d.architecture == arch
        assert "blocks 4-7 (part of a sharded model)" in d.evidence[0].reason


def test_the_families_beside_them_stay_themselves():
    assert detect(meta_shapes(diffusers.SanaTransformer2DModel)).architecture == "sana"
    assert detect(meta_shapes(diffusers.Lumina2Transformer2DModel)).architecture == "lumina2"
    assert (
        detect(meta_shapes(diffusers.QwenImageTransformer2DModel, num_layers=2)).architecture == "qwen_image"
    )
