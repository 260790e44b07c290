"""Qwen-Image 2.1's VAE (diffusers' AutoencoderKLQwenImage21, built on the meta device: its real state dict)
→ kind `vae`, architecture `qwen_image21`, told apart from the Wan 2.1 / 2.2 VAEs whose module tree it
shares by its 2-D convolutions (4-D weights) and its 64 latent channels."""

from __future__ import annotations

import pytest
from layouts_2026 import parts as P
from layouts_2026.common import detect, meta_shapes

diffusers = pytest.importorskip("diffusers")


def _q21(**kw):
    return meta_shapes(diffusers.AutoencoderKLQwenImage21, **kw)


def test_the_release_layout_is_qwen_image21_with_its_deciding_shapes():
    ref = _q21()
    assert ref["decoder.conv_in.weight"] == (1152, 64, 3, 3)  # the class's defaults: the release
    for prefix in ("", "vae."):
        d = detect({prefix + k: s for k, s in ref.items()})
        assert (d.kind, d.architecture, d.also) == ("vae", "qwen_image21", ())
        assert d.components["vae"].prefix == prefix and d.components["vae"].tensors == len(ref)
        reasons = [e.reason for e in d.evidence]
        assert any("2-D convolutions (4-D weights) decoding 64 latent channels → the Qwen-Image 2.1 VAE" in r
                   for r in reasons)  # fmt: skip
        assert any("4 2x upsampling levels in the decoder → 16x spatial" in r for r in reasons)
        assert any("4 image channels (RGBA)" in r for r in reasons)
        assert d.evidence[0].key == prefix + "decoder.conv_in.weight"
        assert d.evidence[0].shape == (1152, 64, 3, 3)


def test_a_reduced_width_file_is_still_qwen_image21_and_other_z_is_no_release():
    small = _q21(base_dim=16, decoder_base_dim=24)
    assert detect(small).architecture == "qwen_image21"
    # a 2-D-convolution Wan layout at Wan 2.2's z 48 is not Wan 2.2's VAE (whose convolutions are 3-D)
    z48 = detect(
        _q21(base_dim=16, decoder_base_dim=24, z_dim=48, latents_mean=[0.0] * 48, latents_std=[1.0] * 48)
    )
    assert (z48.kind, z48.architecture) == ("vae", None)
    assert any("48 latent channels: no known release" in e.reason for e in z48.evidence)


def test_wan_vaes_are_not_taken_for_it():
    assert detect(meta_shapes(diffusers.AutoencoderKLWan)).architecture == "wan21"
    assert (
        detect(meta_shapes(diffusers.AutoencoderKLWan, **P.wan22_vae_diffusers_config())).architecture
        == "wan22"
    )
    assert detect(P.wan_vae_original("2.2")).architecture == "wan22"
