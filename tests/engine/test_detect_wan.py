"""Wan 2.1 / 2.2 detection in both namings, whole files and single shards (layouts: layouts_2026.video)."""

from __future__ import annotations

import pytest
from layouts_2026 import video as V
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes

CASES = [
    # config, architecture, variant, also
    (V.WAN21_T2V_1_3B, "wan21", "t2v-1.3b", ("skyreels_v2",)),
    (V.WAN21_T2V_14B, "wan21", "t2v-14b", ("wan22", "skyreels_v2")),  # = each Wan 2.2 T2V A14B expert
    (V.WAN21_I2V_14B, "wan21", "i2v-14b", ("skyreels_v2", "chronoedit")),
    (V.WAN21_FLF2V_14B, "wan21", "flf2v-14b", ()),
    (V.WAN21_VACE_1_3B, "wan21", "vace-1.3b", ()),
    (V.WAN21_VACE_14B, "wan21", "vace-14b", ("wan22",)),
    (V.WAN21_FUN_INP_1_3B, "wan21", "fun-1.3b", ()),
    (V.WAN21_FUN_CONTROL_14B, "wan21", "fun-14b", ()),
    (V.WAN21_FUN_CAMERA_1_3B, "wan21", "fun-1.3b", ()),
    (V.WAN22_I2V_A14B, "wan22", "i2v-14b", ()),
    (V.WAN22_TI2V_5B, "wan22", "ti2v-5b", ()),
    (V.WAN22_FUN_CAMERA_A14B, "wan22", "fun-14b", ()),
]


def _small(c: V.WanConfig) -> V.WanConfig:
    """The same release with fewer blocks (detection never counts them; meta builds stay quick)."""
    vace = tuple(range(0, 4, 2)) if c.vace_layers else ()
    return c.with_(layers=4, vace_layers=vace)


@pytest.mark.parametrize("cfg, arch, var, also", CASES)
@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_wan_original_naming(cfg, arch, var, also, prefix):
    d = detect(V.wan_original(_small(cfg)).under(prefix))
    assert (d.kind, d.architecture, d.variant, d.also, d.prediction) == (
        "diffusion_model",
        arch,
        var,
        also,
        "flow",
    )
    assert d.components["transformer"].prefix == prefix and set(d.components) == {"transformer"}
    if also:
        assert any("cannot tell them apart" in e.reason for e in d.evidence)


def test_also_survives_the_json_cache_and_worker_processes():
    import pickle

    from engine.detect import Detection

    d = detect(V.wan_original(_small(V.WAN21_T2V_14B)))
    assert d.also == ("wan22", "skyreels_v2")
    assert Detection.from_json(d.to_json()) == d
    assert pickle.loads(pickle.dumps(d)) == d
    assert d.to_json()["also"] == ["wan22", "skyreels_v2"] and list(d.to_json())[4:6] == [
        "architecture",
        "also",
    ]


def test_full_size_releases_detect_with_their_parameter_counts():
    for cfg, params in ((V.WAN21_T2V_1_3B, 1.42e9), (V.WAN21_T2V_14B, 14.29e9), (V.WAN22_TI2V_5B, 5.0e9)):
        rows = V.wan_original(cfg)
        assert abs(rows.params() - params) / params < 0.02, rows.params()
        d = detect(rows)
        assert d.variant.endswith(("1.3b", "14b", "5b")) and d.params == rows.params()


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")
transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("cfg, arch, var, also", CASES[:7] + CASES[9:11])
def test_wan_diffusers_naming_from_the_real_classes(cfg, arch, var, also):
    c = _small(cfg)
    cls = diffusers.WanVACETransformer3DModel if c.vace_layers else diffusers.WanTransformer3DModel
    ref = meta_shapes(cls, **V.wan_diffusers_config(c))
    # our original-naming layout is what diffusers' own converter turns into the real class's keys
    mine = converted(sfu.convert_wan_transformer_to_diffusers, V.wan_original(c))
    if "img_emb.emb_pos" in mine:  # the converter leaves FLF2V's position table under its own name
        mine["condition_embedder.image_embedder.pos_embed"] = mine.pop("img_emb.emb_pos")
    assert_same(mine, ref)
    d = detect(ref)
    assert (d.architecture, d.variant, d.also) == (arch, var, also)


def test_full_size_diffusers_wan_14b_i2v():
    ref = meta_shapes(diffusers.WanTransformer3DModel, **V.wan_diffusers_config(V.WAN21_I2V_14B))
    d = detect(ref)
    assert (d.architecture, d.variant) == ("wan21", "i2v-14b")
    assert any("40 blocks" in e.reason for e in d.evidence)


@pytest.mark.parametrize(
    "cfg, arch, var, also",
    [
        (V.WAN21_T2V_14B, "wan21", "14b", ("wan22",)),  # t2v 2.1 / t2v or i2v 2.2: the stem would tell
        # CLIP image keys sit in every block
        (V.WAN21_I2V_14B, "wan21", "i2v-14b", ("skyreels_v2", "chronoedit")),
        (V.WAN22_TI2V_5B, "wan22", "5b", ()),
        (V.WAN21_T2V_1_3B, "wan21", "1.3b", ()),
    ],
)
def test_a_middle_shard_is_detected_from_its_own_blocks(cfg, arch, var, also):
    original = blocks_only(V.wan_original(cfg), "blocks.", 10, 20)
    diff = blocks_only(
        meta_shapes(diffusers.WanTransformer3DModel, **V.wan_diffusers_config(cfg)), "blocks.", 10, 20
    )
    for rows in (original, diff):
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant, d.also) == ("diffusion_model", arch, var, also)
        assert any("blocks 10-19 (part of a sharded model)" in e.reason for e in d.evidence)
        assert any("a shard?" in e.reason for e in d.evidence)


def test_an_unknown_wan_size_is_wan_without_a_size():
    d = detect(V.wan_original(V.WanConfig(dim=2048, ffn=8192, layers=4)))
    assert d.architecture == "wan21" and d.variant == "t2v"
    assert any("no known Wan release has this size" in e.reason for e in d.evidence)


def test_a_wan_diffusers_pipeline_folder_names_its_umt5_text_encoder(tmp_path):
    import json

    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse

    root = tmp_path / "Wan2.1-T2V-1.3B-Diffusers"
    index = {
        "_class_name": "WanPipeline",
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    for sub in ("transformer", "text_encoder", "vae"):
        (root / sub).mkdir(parents=True)
    (root / "model_index.json").write_text(json.dumps(index))
    umt5 = transformers.UMT5Config(
        vocab_size=256384,
        d_model=4096,
        d_kv=64,
        d_ff=10240,
        num_layers=2,
        num_heads=64,
        feed_forward_proj="gated-gelu",
    )
    layouts = {
        "transformer/diffusion_pytorch_model.safetensors": meta_shapes(
            diffusers.WanTransformer3DModel, **V.wan_diffusers_config(V.WAN21_T2V_1_3B, layers=3)
        ),
        "text_encoder/model.safetensors": meta_shapes(transformers.UMT5EncoderModel, umt5),
        "vae/diffusion_pytorch_model.safetensors": meta_shapes(diffusers.AutoencoderKLWan),
    }
    for rel, rows in layouts.items():
        write_sparse(root / rel, [(k, "BF16", s) for k, s in rows.items()])
    d = detect_file(root)
    assert (d.kind, d.architecture, d.variant, d.format) == ("checkpoint", "wan21", "t2v-1.3b", "diffusers")
    assert set(d.components) == {"transformer", "umt5_xxl", "vae"}


def test_wan22_animate_and_s2v_markers():
    d = detect(meta_shapes(diffusers.WanAnimateTransformer3DModel, num_layers=2))
    assert (d.architecture, d.variant) == ("wan22", "animate-14b")
    rows = V.wan_original(V.WAN21_T2V_14B.with_(layers=3))
    rows.lin("casual_audio_encoder.encoder.final_linear", 5120, 1024)
    assert (detect(rows).architecture, detect(rows).variant) == ("wan22", "s2v-14b")


def _animate2_rows(prefix: str = "") -> dict:
    return V.wan_animate2_release(V.WAN_ANIMATE2_14B.with_(layers=3)).under(prefix)


@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_wan_animate2_release_naming_through_diffusers_converter(prefix):
    c = V.WAN_ANIMATE2_14B.with_(layers=3)
    rows = _animate2_rows(prefix)
    # diffusers' own converter turns our release layout into the real class's keys
    ref = meta_shapes(diffusers.WanAnimate2Transformer3DModel, **V.wan_animate2_diffusers_config(c))
    assert_same(converted(sfu.convert_wan_animate_2_transformer_to_diffusers, dict(rows)), ref)
    for layout, want_prefix in ((rows, prefix), (ref, "")):
        d = detect(layout)
        assert (d.kind, d.architecture, d.variant, d.also, d.prediction) == (
            "diffusion_model",
            "wan22",
            "animate2-14b",
            (),
            "flow",
        )
        assert d.components["transformer"].prefix == want_prefix and set(d.components) == {"transformer"}
        assert any("Wan-Animate-2" in e.reason for e in d.evidence)


def test_wan_animate2_and_animate1_are_not_read_as_each_other():
    one = detect(meta_shapes(diffusers.WanAnimateTransformer3DModel, num_layers=2))
    assert (one.architecture, one.variant) == ("wan22", "animate-14b")
    assert not any("Wan-Animate-2" in e.reason for e in one.evidence)
    two = detect(_animate2_rows())
    assert two.variant == "animate2-14b" and not any("Wan 2.2 Animate" in e.reason for e in two.evidence)
    # a middle shard (no stem, no head) is still Animate-2, from its wrapped blocks
    shard = blocks_only(V.wan_animate2_release(V.WAN_ANIMATE2_14B), "blocks.", 10, 20)
    assert detect(shard).variant == "animate2-14b"
