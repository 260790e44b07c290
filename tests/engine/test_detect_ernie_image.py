"""ERNIE-Image in the release's single-file naming (diffusers' names, bare and under `model.diffusion_model.`) and
diffusers' (ErnieImageTransformer2DModel built on the meta device), the default size and a small one, whole and
sharded; the FLUX.2 VAE its pipeline decodes with names it."""

from __future__ import annotations

import pytest
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes, shard

diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

SMALL = dict(hidden_size=256, num_attention_heads=2, num_layers=3, ffn_hidden_size=512, text_in_dim=96)
PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def layouts():
    cls = diffusers.ErnieImageTransformer2DModel
    return {"default": meta_shapes(cls), "small": meta_shapes(cls, **SMALL)}


def test_the_release_naming_is_diffusers_under_the_prefix(layouts):
    for ref in layouts.values():
        release = {PREFIX + k: s for k, s in ref.items()}
        assert_same(converted(sfu.convert_ernie_image_transformer_checkpoint_to_diffusers, release), ref)


@pytest.mark.parametrize("name", ["default", "small"])
@pytest.mark.parametrize("prefix", ["", PREFIX])
def test_ernie_image_in_both_namings(layouts, name, prefix):
    d = detect({prefix + k: s for k, s in layouts[name].items()})
    assert (d.kind, d.architecture, d.variant, d.prediction) == (
        "diffusion_model",
        "ernie_image",
        None,
        "flow",
    ), d.evidence
    assert d.components["transformer"].prefix == prefix
    assert all(e.key and e.shape for e in d.evidence), d.evidence
    reasons = " | ".join(e.reason for e in d.evidence)
    hidden, heads = (3072, 24) if name == "default" else (256, 2)
    assert "ERNIE-Image blocks" in reasons and f"hidden size {hidden}, {heads} heads of 128" in reasons


def test_the_default_size_is_diffusers_default_config(layouts):
    d = detect(layouts["default"])
    reasons = " | ".join(e.reason for e in d.evidence)
    assert "24 blocks" in reasons and "MLP 8192 wide" in reasons and "text features 2560 wide" in reasons
    assert "128 latent channels, patch 1×1" in reasons
    assert d.params == 2_821_119_104  # 24 layers x 113 M + the stem and head


def test_shards_are_ernie_image_from_their_own_keys(layouts):
    rows = {PREFIX + k: s for k, s in layouts["default"].items()}
    d = detect(blocks_only(rows, PREFIX + "layers.", 10, 20))
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "ernie_image", None), d.evidence
    assert any("part of a sharded model" in e.reason for e in d.evidence)
    assert any("cannot be told" in e.reason for e in d.evidence)
    d = detect(shard(rows, lambda k: ".layers." not in k))
    assert (d.architecture, d.components["transformer"].prefix) == ("ernie_image", PREFIX), d.evidence


def test_the_flux2_vae_is_also_ernie_image():
    d = detect(meta_shapes(diffusers.AutoencoderKLFlux2))
    assert (d.kind, d.architecture) == ("vae", "flux2") and "ernie_image" in d.also
    assert any("ERNIE-Image" in e.reason for e in d.evidence)
