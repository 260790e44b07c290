"""FLUX.3 in BFL naming (bare and under `model.diffusion_model.`) and diffusers' (Flux3Transformer2DModel built on the
meta device), base and step-distilled (flow map), the default size and another, whole and sharded; FLUX.1 / FLUX.2 /
Chroma files stay theirs."""

from __future__ import annotations

import pytest
from flux3_files import to_bfl
from layouts_2026 import image as I
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes, shard

diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

SMALL = dict(num_layers=2, num_single_layers=4, num_attention_heads=4, joint_attention_dim=512)


def _diffusers(**cfg):
    return meta_shapes(diffusers.Flux3Transformer2DModel, **cfg)


@pytest.fixture(scope="module")
def layouts():
    return {
        "default": _diffusers(),
        "distilled": _diffusers(flow_map=True),
        "small": _diffusers(**SMALL),
        "small_distilled": _diffusers(flow_map=True, **SMALL),
    }


def test_the_inverse_converter_is_diffusers_converter_backwards(layouts):
    for ref in layouts.values():
        assert_same(converted(sfu.convert_flux3_transformer_checkpoint_to_diffusers, to_bfl(ref)), ref)


@pytest.mark.parametrize("name", ["default", "distilled", "small", "small_distilled"])
@pytest.mark.parametrize("naming", ["bfl", "bfl_prefixed", "diffusers"])
def test_flux3_in_both_namings(layouts, name, naming):
    ref = layouts[name]
    rows = ref if naming == "diffusers" else to_bfl(ref)
    prefix = "model.diffusion_model." if naming == "bfl_prefixed" else ""
    d = detect({prefix + k: s for k, s in rows.items()})
    want = "distilled" if "distilled" in name else None
    assert (d.kind, d.architecture, d.variant, d.prediction) == ("diffusion_model", "flux3", want, "flow"), (
        d.evidence
    )
    assert d.components["transformer"].prefix == prefix
    reasons = " | ".join(e.reason for e in d.evidence)
    assert "FLUX.3" in reasons and ("step-distilled" in reasons) == (want == "distilled")
    hidden = 3072 if name in ("default", "distilled") else 512
    assert f"hidden size {hidden}" in reasons


def test_the_default_size_is_the_release_size(layouts):
    d = detect(to_bfl(layouts["default"]))
    reasons = " | ".join(e.reason for e in d.evidence)
    assert "24 heads of 128" in reasons and "28 blocks" in reasons and "20480 wide" in reasons
    assert abs(d.params - 5.54e9) / 5.54e9 < 0.01, d.params  # 5 x 3 per-mode + 28 single blocks


@pytest.mark.parametrize("naming", ["bfl", "diffusers"])
def test_shards_are_flux3_from_their_own_keys(layouts, naming):
    ref = layouts["distilled"]
    rows = ref if naming == "diffusers" else to_bfl(ref)
    single = "single_transformer_blocks." if naming == "diffusers" else "single_blocks."
    txt = "txt_mode_blocks."
    for part in (blocks_only(rows, single, 10, 20), blocks_only(rows, txt, 1, 4)):
        d = detect(part)
        assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "flux3", None), d.evidence
        assert any("part of a sharded model" in e.reason for e in d.evidence)
        assert any("cannot be told" in e.reason for e in d.evidence)
    stem = shard(rows, lambda k: not k.startswith((single, txt, "mode_blocks.", "content_mode_blocks.")))
    d = detect(stem)
    assert (d.architecture, d.variant) == ("flux3", "distilled")


@pytest.mark.parametrize(
    "cfg, arch",
    [(I.FLUX1_DEV, "flux1_dev"), (I.CHROMA, "chroma"), (I.FLUX2_DEV, "flux2"), (I.FLUX2_KLEIN_4B, "flux2")],
)
def test_other_flux_families_stay_theirs(cfg, arch):
    assert detect(I.flux_bfl(cfg)).architecture == arch
    cls = {
        "flux1": "FluxTransformer2DModel",
        "chroma": "ChromaTransformer2DModel",
        "flux2": "Flux2Transformer2DModel",
    }
    ref = meta_shapes(getattr(diffusers, cls[cfg.kind]), **I.flux_diffusers_config(cfg, 2, 3))
    assert detect(ref).architecture == arch
