"""Video VAEs: Wan 2.1 (and Qwen-Image's), Wan 2.2, HunyuanVideo, LTX-Video, LTX-2, Mochi and FLUX.2, in the
original namings (layouts_2026.parts) and diffusers naming; each names its family and who else uses it."""

from __future__ import annotations

import pytest
from layouts_2026 import parts as P
from layouts_2026.common import assert_same, converted, detect, meta_shapes

WAN21_ALSO = ("wan22", "qwen_image", "cosmos_predict2", "krea2")


def test_wan_vaes_in_the_original_naming():
    d = detect(P.wan_vae_original("2.1"))
    assert (d.kind, d.architecture, d.also) == ("vae", "wan21", WAN21_ALSO)
    assert set(d.components) == {"vae"} and d.components["vae"].tensors == len(P.wan_vae_original("2.1"))
    assert any("cannot tell which file" in e.reason for e in d.evidence)
    d = detect(P.wan_vae_original("2.2"))
    assert (d.kind, d.architecture, d.also) == ("vae", "wan22", ())
    rgba = detect(P.wan_vae_original("2.1", image_channels=4))
    assert (rgba.architecture, rgba.also) == ("wan21", ("qwen_image",))
    assert any("Qwen-Image-Layered" in e.reason for e in rgba.evidence)


def test_mochi_vae_in_genmo_naming():
    for rows in (P.mochi_vae_decoder(), P.mochi_vae_decoder().under("decoder.")):
        d = detect(rows)
        assert (d.kind, d.architecture) == ("vae", "mochi")


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")


def test_wan21_original_converts_to_the_real_classes_and_qwen_image_shares_it():
    ref = meta_shapes(diffusers.AutoencoderKLWan)
    assert_same(converted(sfu.convert_wan_vae_to_diffusers, P.wan_vae_original("2.1")), ref)
    assert ref == meta_shapes(diffusers.AutoencoderKLQwenImage)
    d = detect(ref)
    assert (d.kind, d.architecture, d.also) == ("vae", "wan21", WAN21_ALSO)


def test_wan22_vae_diffusers_naming_and_parameter_count():
    ref = meta_shapes(diffusers.AutoencoderKLWan, **P.wan22_vae_diffusers_config())
    d = detect(ref)
    assert (d.kind, d.architecture) == ("vae", "wan22")
    assert P.wan_vae_original("2.2").params() == d.params


def test_hunyuan_video_vaes():
    ref = meta_shapes(diffusers.AutoencoderKLHunyuanVideo)
    ldm = P.hunyuan_vae_ldm(ref)
    for rows in (ref, ldm):
        d = detect(rows)
        assert (d.kind, d.architecture) == ("vae", "hunyuan_video")
    assert ldm.params() == sum(__import__("math").prod(s) for s in ref.values())
    assert any(k.startswith("decoder.mid.block_1.conv1.conv") for k in ldm)
    d = detect(meta_shapes(diffusers.AutoencoderKLHunyuanVideo15))
    assert (d.kind, d.architecture) == ("vae", "hunyuan_video15")


def test_ltx_vaes_in_both_namings():
    ltxv = meta_shapes(diffusers.AutoencoderKLLTXVideo)
    orig = P.ltx_vae_original(ltxv, P.LTXV090_STAGES)
    assert_same(converted(sfu.convert_ltx_vae_checkpoint_to_diffusers, orig), ltxv)
    ltx2 = meta_shapes(diffusers.AutoencoderKLLTX2Video)
    orig2 = P.ltx_vae_original(ltx2, P.LTX2_STAGES, ltx2=True)
    assert_same(converted(sfu.convert_ltx2_vae_to_diffusers, orig2), ltx2)
    for rows, arch in ((ltxv, "ltxv"), (orig, "ltxv"), (ltx2, "ltx2"), (orig2, "ltx2")):
        d = detect(rows)
        assert (d.kind, d.architecture) == ("vae", arch), d.evidence
        assert "vae" in d.components and "other" not in d.components


def test_mochi_vae_diffusers_and_genmo_parameter_counts():
    ref = meta_shapes(diffusers.AutoencoderKLMochi)
    d = detect(ref)
    assert (d.kind, d.architecture) == ("vae", "mochi")
    import math

    decoder = sum(math.prod(s) for k, s in ref.items() if k.startswith("decoder."))
    assert P.mochi_vae_decoder().params() == decoder


def test_flux2_vae_is_flux2():
    d = detect(meta_shapes(diffusers.AutoencoderKLFlux2))
    # FLUX.3's pipelines decode with it (diffusers' modular_pipelines/flux3/decoders.py)
    assert (d.kind, d.architecture, d.also) == ("vae", "flux2", ("flux3", "ernie_image"))
    assert any("FLUX.3" in e.reason for e in d.evidence)
