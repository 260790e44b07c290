"""FLUX-style image transformers without FLUX.1's pooled text vector, from diffusers' own classes on the meta
device: LongCat-Image and Bria 3.2 (the same modules, told by the width of the text they read), Bria FIBO (its
caption projections) and Ovis-Image (gated feed-forwards, in every block: a shard of them too). FLUX.1 stays
FLUX.1."""

from __future__ import annotations

import math

import pytest
from layouts_2026.common import blocks_only, detect, meta_shapes

diffusers = pytest.importorskip("diffusers")

SMALL = dict(num_layers=2, num_single_layers=3, attention_head_dim=32, num_attention_heads=4)


def _params(rows):
    return sum(math.prod(s) for s in rows.values())


@pytest.mark.parametrize(
    "cls, arch, why",
    [
        (
            "LongCatImageTransformer2DModel",
            "longcat_image",
            "text states 3584 wide → LongCat-Image (Qwen2.5-VL 7B text)",
        ),
        ("BriaTransformer2DModel", "bria", "text states 4096 wide → Bria 3.2 (T5-XXL text)"),
        ("BriaFiboTransformer2DModel", "bria_fibo", "a caption projection into every block → Bria FIBO"),
        (
            "MotifVideoTransformer3DModel",
            "motif_video",
            "a video (3-D) patch embedding and the text through an MLP, no token refiner → Motif-Video",
        ),
        (
            "OvisImageTransformer2DModel",
            "ovis_image",
            "gated feed-forwards (24576 = 8 × hidden, FLUX's are 4 ×) → Ovis-Image",
        ),
    ],
)
def test_each_family_at_its_default_size(cls, arch, why):
    rows = meta_shapes(getattr(diffusers, cls))
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
        assert why in [e.reason for e in d.evidence]
        assert d.evidence[0].reason.startswith("FLUX-style double-stream (")


def test_small_configs_and_an_ovis_shard():
    for cls, arch in (
        ("LongCatImageTransformer2DModel", "longcat_image"),
        ("BriaTransformer2DModel", "bria"),
        ("BriaFiboTransformer2DModel", "bria_fibo"),
        ("MotifVideoTransformer3DModel", "motif_video"),
    ):
        assert detect(meta_shapes(getattr(diffusers, cls), **SMALL)).architecture == arch
    ovis = meta_shapes(diffusers.OvisImageTransformer2DModel, **SMALL)
    d = detect(ovis)
    assert d.architecture == "ovis_image"
    assert (
        d.evidence[0].reason
        == "FLUX-style double-stream (2 blocks) and single-stream (3 blocks) blocks, hidden 128"
    )
    shard = blocks_only(meta_shapes(diffusers.OvisImageTransformer2DModel), "transformer_blocks.", 2, 4)
    d = detect(shard)
    assert d.architecture == "ovis_image"
    assert "blocks 2-3 (part of a sharded model)" in d.evidence[0].reason


def test_flux1_and_hunyuan_video_stay_themselves():
    d = detect(meta_shapes(diffusers.FluxTransformer2DModel))
    assert d.architecture in ("flux1_dev", "flux1_schnell")
    hv = meta_shapes(diffusers.HunyuanVideoTransformer3DModel, num_layers=1, num_single_layers=1)
    assert detect(hv).architecture == "hunyuan_video"
