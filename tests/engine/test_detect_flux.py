"""FLUX.1 (Kontext, Fill), Chroma and FLUX.2 (dev, klein) in BFL and diffusers naming, whole and sharded."""

from __future__ import annotations

import pytest
from layouts_2026 import image as I
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes, shard

CASES = [
    (I.FLUX1_DEV, "flux1_dev", "normal"),
    (I.FLUX1_SCHNELL, "flux1_schnell", "normal"),
    (I.FLUX1_FILL, "flux1_dev", "fill"),
    (I.FLUX1_DEPTH, "flux1_dev", "control"),
    (I.CHROMA, "chroma", "normal"),
    (I.FLUX2_DEV, "flux2", "dev-32b"),
    (I.FLUX2_KLEIN_4B, "flux2", "klein-4b"),
    (I.FLUX2_KLEIN_9B, "flux2", "klein-9b"),
]


@pytest.mark.parametrize("cfg, arch, var", CASES)
@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_bfl_naming(cfg, arch, var, prefix):
    d = detect(I.flux_bfl(cfg).under(prefix))
    assert (d.kind, d.architecture, d.variant, d.prediction) == ("diffusion_model", arch, var, "flow")
    assert d.components["transformer"].prefix == prefix


def test_kontext_is_told_only_by_metadata():
    rows = I.flux_bfl(I.FLUX1_DEV)
    plain = detect(rows)
    assert plain.variant == "normal"
    assert any("Kontext" in e.reason and "key for key" in e.reason for e in plain.evidence)
    said = detect(rows, {"modelspec.architecture": "flux-1-dev/kontext"})
    assert (said.architecture, said.variant) == ("flux1_dev", "kontext")


def test_newer_exports_with_key_norm_weight_and_fp8():
    rows = {k.replace("norm.scale", "norm.weight"): s for k, s in I.flux_bfl(I.FLUX1_DEV).items()}
    assert detect(rows).architecture == "flux1_dev"
    d = detect(I.flux_bfl(I.FLUX2_KLEIN_4B), dtype="F8_E4M3")
    assert (d.architecture, d.variant, d.error) == ("flux2", "klein-4b", None)


@pytest.mark.parametrize("cfg, arch, var", [CASES[0], CASES[4], CASES[5], CASES[6]])
def test_bfl_shards(cfg, arch, var):
    rows = I.flux_bfl(cfg)
    middle = blocks_only(rows, "double_blocks.", 2, 4)
    singles = blocks_only(rows, "single_blocks.", 5, 9)
    stem = shard(rows, lambda k: not k.startswith(("double_blocks.", "single_blocks.")))
    for part in (middle, singles):
        d = detect(part)
        assert d.kind == "diffusion_model" and d.architecture == arch
        assert any("part of a sharded model" in e.reason for e in d.evidence)
    assert detect(stem).architecture == arch
    if arch == "flux2":  # the hidden size alone names the FLUX.2 release
        assert detect(middle).variant == var
    if arch == "flux1_dev":  # dev and schnell differ only in the stem: a block shard says both
        assert (detect(middle).variant, detect(middle).also) == (None, ("flux1_schnell", "hunyuan_video"))


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

_CLASS = {
    "flux1": "FluxTransformer2DModel",
    "chroma": "ChromaTransformer2DModel",
    "flux2": "Flux2Transformer2DModel",
}
_CONVERT = {
    "flux1": "convert_flux_transformer_checkpoint_to_diffusers",
    "chroma": "convert_chroma_transformer_checkpoint_to_diffusers",
    "flux2": "convert_flux2_transformer_checkpoint_to_diffusers",
}


def _diffusers(cfg, depth=2, single=3):
    cls = getattr(diffusers, _CLASS[cfg.kind])
    return meta_shapes(cls, **I.flux_diffusers_config(cfg, depth, single))


@pytest.mark.parametrize("cfg, arch, var", CASES)
def test_diffusers_naming_from_the_real_classes(cfg, arch, var):
    small = cfg.with_(depth=2, single=3)
    ref = _diffusers(cfg)
    assert_same(converted(getattr(sfu, _CONVERT[cfg.kind]), I.flux_bfl(small)), ref)
    d = detect(ref)
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", arch, var)


@pytest.mark.parametrize("cfg, arch, var", [CASES[0], CASES[4], CASES[5], CASES[7]])
def test_diffusers_shards(cfg, arch, var):
    ref = _diffusers(cfg, depth=4, single=6)
    for part in (
        blocks_only(ref, "transformer_blocks.", 1, 3),
        blocks_only(ref, "single_transformer_blocks.", 2, 5),
    ):
        d = detect(part)
        assert (d.kind, d.architecture) == ("diffusion_model", arch), d.evidence
        if arch == "flux2":
            assert d.variant == var


def test_full_size_flux2_dev_and_klein():
    for cfg, var, params in ((I.FLUX2_DEV, "dev-32b", 32.2e9), (I.FLUX2_KLEIN_9B, "klein-9b", 9.1e9)):
        ref = meta_shapes(diffusers.Flux2Transformer2DModel, **I.flux_diffusers_config(cfg))
        d = detect(ref)
        assert (d.architecture, d.variant) == ("flux2", var)
        assert abs(d.params - params) / params < 0.1, d.params


def test_a_shard_of_sd3_joint_blocks_is_not_taken_for_flux():
    # SD3.5's diffusers blocks carry the same names as FLUX.1's, with 64-wide heads
    ref = meta_shapes(diffusers.SD3Transformer2DModel, num_layers=6, qk_norm="rms_norm")
    d = detect(blocks_only(ref, "transformer_blocks.", 2, 5))
    assert d.architecture is None and not (d.architecture or "").startswith("flux")
