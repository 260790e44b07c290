"""The 2026 families diffusers knows and Loadout detects without a forward pass, from diffusers' own classes
built on the meta device: Kandinsky 5 (its release widths), Kandinsky 6 and Kandinsky 6's super-resolution
transformer — each told apart from the others by its block structure, in the release's size and a small one,
bare and under `transformer.`, and from one shard of its blocks."""

from __future__ import annotations

import math

import pytest
from layouts_2026.common import blocks_only, detect, meta_shapes

diffusers = pytest.importorskip("diffusers")

# Kandinsky-5 `configs/config_5s_sft.yaml` (T2V Lite) and `k5_pro_t2v_5s_sft_hd_parallel.yaml` (Pro)
K5_LITE = dict(in_visual_dim=16, out_visual_dim=16, model_dim=1792, ff_dim=7168, visual_cond=True)
K5_PRO = dict(
    K5_LITE,
    time_dim=1024,
    model_dim=4096,
    ff_dim=16384,
    num_text_blocks=4,
    num_visual_blocks=60,
    axes_dims=(32, 48, 48),
)
K5_SMALL = dict(K5_LITE, model_dim=512, ff_dim=1024, num_visual_blocks=3, axes_dims=(8, 12, 12))


@pytest.fixture(scope="module")
def k5_lite():
    return meta_shapes(diffusers.Kandinsky5Transformer3DModel, **K5_LITE)


def _params(rows):
    return sum(math.prod(s) for s in rows.values())


def _check(rows, arch, var, params_of=None):
    for prefix in ("", "transformer."):
        d = detect({prefix + k: s for k, s in rows.items()})
        assert (d.kind, d.architecture, d.variant, d.prediction) == ("diffusion_model", arch, var, "flow")
        assert d.components["transformer"].prefix == prefix
        want = _params(params_of or rows)
        assert abs(d.params - want) <= 0.01 * want
    return d


def test_kandinsky5_release_widths(k5_lite):
    d = _check(k5_lite, "kandinsky5", "normal-2b")
    assert [e.reason for e in d.evidence] == [
        "visual blocks with self- and cross-attention and a 9-fold modulation (32 blocks), hidden 1792 → Kandinsky 5",
        "hidden 1792 → Kandinsky 5 T2V Lite (2B)",
    ]
    d = _check(meta_shapes(diffusers.Kandinsky5Transformer3DModel, **K5_PRO), "kandinsky5", "normal-19b")
    assert "hidden 4096 → Kandinsky 5 Pro (19B)" in [e.reason for e in d.evidence]


def test_kandinsky5_other_width_and_a_shard(k5_lite):
    d = _check(meta_shapes(diffusers.Kandinsky5Transformer3DModel, **K5_SMALL), "kandinsky5", None)
    assert "hidden 512: no known Kandinsky 5 release has this size" in [e.reason for e in d.evidence]
    d = detect(blocks_only(k5_lite, "visual_transformer_blocks.", 10, 20))
    assert (d.architecture, d.variant) == ("kandinsky5", "normal-2b")
    assert "blocks 10-19 (part of a sharded model)" in d.evidence[0].reason


def test_kandinsky6_and_its_super_resolution_model():
    small = dict(model_dim=256, ff_dim=512, num_text_blocks=1, num_visual_blocks=2, axes_dims=(8, 12, 12))
    for kw in (small, dict(small, model_dim_a=128, axes_dims_a=(8, 12, 12))):
        rows = meta_shapes(diffusers.Kandinsky6Transformer3DModel, **kw)
        d = _check(rows, "kandinsky6", "normal")
        audio = kw.get("model_dim_a", 256)
        assert d.evidence[0].reason == (
            f"fused video / audio blocks (2 blocks), video hidden 256, audio hidden {audio} → Kandinsky 6"
        )
        shard = blocks_only(rows, "visual_transformer_blocks.", 1, 2)
        assert detect(shard).architecture == "kandinsky6"
    sr = meta_shapes(diffusers.Kandinsky6SRTransformer3DModel)
    d = _check(sr, "kandinsky6_sr", "normal")
    assert d.evidence[0].reason == (
        "Kandinsky visual blocks without cross-attention, a 6-fold modulation (32 blocks), hidden 1792"
        " → Kandinsky 6 super-resolution"
    )
    assert detect(blocks_only(sr, "visual_transformer_blocks.", 5, 9)).architecture == "kandinsky6_sr"


# --- SkyReels-V2 and ChronoEdit: Wan 2.1's modules ----------------------------------------------------------


@pytest.mark.parametrize(
    "cls, cfg, var, also",
    [
        ("SkyReelsV2Transformer3DModel", "WAN21_T2V_1_3B", "t2v-1.3b", ("skyreels_v2",)),
        ("SkyReelsV2Transformer3DModel", "WAN21_T2V_14B", "t2v-14b", ("wan22", "skyreels_v2")),
        ("SkyReelsV2Transformer3DModel", "WAN21_I2V_14B", "i2v-14b", ("skyreels_v2", "chronoedit")),
        ("ChronoEditTransformer3DModel", "WAN21_I2V_14B", "i2v-14b", ("skyreels_v2", "chronoedit")),
    ],
)
def test_wan_based_releases_are_wan21_naming_the_others(cls, cfg, var, also):
    from layouts_2026 import video as V
    from layouts_2026.common import assert_same

    kw = V.wan_diffusers_config(getattr(V, cfg), layers=2)
    rows = meta_shapes(getattr(diffusers, cls), **kw)
    assert_same(rows, meta_shapes(diffusers.WanTransformer3DModel, **kw))  # Wan's modules, key for key
    d = detect(rows)
    assert (d.architecture, d.variant, d.also, d.prediction) == ("wan21", var, also, "flow")
    assert any("hold Wan 2.1's modules key for key" in e.reason for e in d.evidence)


def test_skyreels_v2_with_its_fps_embedding_is_told_by_it():
    from layouts_2026 import video as V

    kw = V.wan_diffusers_config(V.WAN21_T2V_14B, layers=2)
    rows = meta_shapes(diffusers.SkyReelsV2Transformer3DModel, inject_sample_info=True, **kw)
    d = detect(rows)
    assert (d.architecture, d.variant, d.also) == ("wan21", "skyreels_v2-14b", ())
    assert "an fps embedding beside the timestep's → SkyReels-V2" in [e.reason for e in d.evidence]
    assert abs(d.params - _params(rows)) <= 0.01 * _params(rows)


@pytest.mark.parametrize(
    "cls, name",
    [("AutoencoderKLKVAEVideo", "→ Kandinsky's KVAE"), ("AutoencoderKLCogVideoX", "→ CogVideoX's")],
)
def test_the_latent_conditioned_video_vaes_say_whose_they_are(cls, name):
    d = detect(meta_shapes(getattr(diffusers, cls)))
    assert (d.kind, d.architecture) == ("vae", None)  # no pipeline Loadout knows decodes with them
    assert any(name in e.reason and "not HunyuanVideo's" in e.reason for e in d.evidence), d.evidence
