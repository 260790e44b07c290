"""HunyuanVideo 1.0 / 1.5, HunyuanImage 2.1, LTX-Video, LTX-2, Mochi and Cosmos Predict2 (Anima) detection
in the original namings (layouts_2026.video) and diffusers naming (the real classes on the meta device)."""

from __future__ import annotations

import pytest
from layouts_2026 import parts as P
from layouts_2026 import video as V
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes, shard

HUNYUAN = [
    (V.HUNYUAN_VIDEO, "hunyuan_video", "t2v"),
    (V.HUNYUAN_VIDEO_I2V, "hunyuan_video", "i2v"),
    (V.HUNYUAN_VIDEO15, "hunyuan_video15", "normal"),
    (V.HUNYUAN_IMAGE21, "hunyuan_image21", "normal"),
]


@pytest.mark.parametrize("cfg, arch, var", HUNYUAN)
@pytest.mark.parametrize("naming", ["comfy", "tencent"])
def test_hunyuan_original_namings(cfg, arch, var, naming):
    for prefix in ("", "model.diffusion_model."):
        d = detect(V.hunyuan(cfg, naming).under(prefix))
        assert (d.kind, d.architecture, d.variant, d.prediction) == ("diffusion_model", arch, var, "flow")
        assert set(d.components) == {"transformer"}


@pytest.mark.parametrize("cfg, arch, var", HUNYUAN)
@pytest.mark.parametrize("naming", ["comfy", "tencent"])
def test_hunyuan_shards_without_the_stem(cfg, arch, var, naming):
    rows = V.hunyuan(cfg, naming)
    late = (
        blocks_only(rows, "double_blocks.", 19, 21)
        if cfg.double > 19
        else blocks_only(rows, "double_blocks.", 2, 5)
    )
    d = detect(late)
    assert (d.kind, d.architecture) == ("diffusion_model", arch)
    early = detect(blocks_only(rows, "double_blocks.", 2, 5))
    if arch == "hunyuan_video" and naming == "comfy":
        # FLUX.1's blocks have this very layout at 3072: an early shard names both, never a guess
        assert (early.architecture, early.also) == ("flux1_dev", ("flux1_schnell", "hunyuan_video"))
    else:
        assert early.architecture == arch


def test_the_token_replace_i2v_release_is_reported_as_the_t2v_layout_it_is():
    d = detect(V.hunyuan(V.HUNYUAN_VIDEO))
    assert any("token-replace HunyuanVideo-I2V shares this layout" in e.reason for e in d.evidence)


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")


def test_hunyuan_video_tencent_naming_converts_to_the_real_class():
    small = V.HUNYUAN_VIDEO.with_(double=2, single=3)
    ref = meta_shapes(diffusers.HunyuanVideoTransformer3DModel, num_layers=2, num_single_layers=3)
    assert_same(
        converted(sfu.convert_hunyuan_video_transformer_to_diffusers, V.hunyuan(small, "tencent")), ref
    )


@pytest.mark.parametrize(
    "cfg, cls, kw, arch, var",
    [
        (V.HUNYUAN_VIDEO, "HunyuanVideoTransformer3DModel", {}, "hunyuan_video", "t2v"),
        (
            V.HUNYUAN_VIDEO_I2V,
            "HunyuanVideoTransformer3DModel",
            {"in_channels": 33, "image_condition_type": "latent_concat"},
            "hunyuan_video",
            "i2v",
        ),
        (V.HUNYUAN_VIDEO15, "HunyuanVideo15Transformer3DModel", {}, "hunyuan_video15", "normal"),
        (
            V.HUNYUAN_IMAGE21,
            "HunyuanImageTransformer2DModel",
            {"text_embed_2_dim": 1472},
            "hunyuan_image21",
            "normal",
        ),
    ],
)
def test_hunyuan_diffusers_naming_and_parameter_counts(cfg, cls, kw, arch, var):
    ref = meta_shapes(getattr(diffusers, cls), **kw)
    d = detect(ref)
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", arch, var)
    # ComfyUI's naming holds exactly the parameters of the real model, block for block
    assert V.hunyuan(cfg).params() == d.params
    container = "single_transformer_blocks." if cfg.single else "transformer_blocks."
    assert (
        detect(
            blocks_only(ref, container, 1, 3)
            if arch != "hunyuan_video"
            else blocks_only(ref, container, 38, 40)
        ).architecture
        == arch
    )
    assert (
        detect(
            shard(ref, lambda k: not k.startswith(("transformer_blocks.", "single_transformer_blocks.")))
        ).architecture
        == arch
    )


LTX_13B = dict(num_attention_heads=32, attention_head_dim=128, cross_attention_dim=4096, num_layers=4)


@pytest.mark.parametrize(
    "cls, kw, arch, var",
    [
        ("LTXVideoTransformer3DModel", {"num_layers": 4}, "ltxv", "normal-2b"),
        ("LTXVideoTransformer3DModel", LTX_13B, "ltxv", "normal-13b"),
        ("LTX2VideoTransformer3DModel", {"num_layers": 3}, "ltx2", "normal"),
    ],
)
def test_ltx_both_namings_and_shards(cls, kw, arch, var):
    ref = meta_shapes(getattr(diffusers, cls), **kw)
    original = V.ltx_original(ref, ltx2=arch == "ltx2")
    convert = (
        sfu.convert_ltx2_transformer_to_diffusers
        if arch == "ltx2"
        else sfu.convert_ltx_transformer_checkpoint_to_diffusers
    )
    assert_same(converted(convert, dict(original)), ref)
    for rows in (ref, original):
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant, d.prediction) == ("diffusion_model", arch, var, "flow")
    assert detect(blocks_only(ref, "transformer_blocks.", 1, 3)).architecture == arch
    # Lightricks' all-in-one files keep their VAE under `vae.` beside the transformer: a checkpoint
    vae = meta_shapes(diffusers.AutoencoderKLLTX2Video if arch == "ltx2" else diffusers.AutoencoderKLLTXVideo)
    stages = P.LTX2_STAGES if arch == "ltx2" else P.LTXV090_STAGES
    d = detect({**original, **P.ltx_vae_original(vae, stages, ltx2=arch == "ltx2")})
    assert (d.kind, d.architecture, set(d.components)) == ("checkpoint", arch, {"transformer", "vae"})
    assert (d.components["transformer"].prefix, d.components["vae"].prefix) == (
        "model.diffusion_model.",
        "vae.",
    )


def test_full_size_ltx2_is_19b():
    d = detect(meta_shapes(diffusers.LTX2VideoTransformer3DModel))
    assert d.architecture == "ltx2" and abs(d.params - 18.9e9) < 0.1e9


def test_mochi_both_namings():
    ref = meta_shapes(diffusers.MochiTransformer3DModel)
    assert_same(converted(sfu.convert_mochi_transformer_checkpoint_to_diffusers, V.mochi_original()), ref)
    for rows in (
        ref,
        V.mochi_original().under("model.diffusion_model."),
        blocks_only(ref, "transformer_blocks.", 20, 30),
        blocks_only(V.mochi_original(), "blocks.", 40, 48),
    ):
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "mochi", "normal"), d.evidence


@pytest.mark.parametrize(
    "cfg, var",
    [(V.COSMOS2_2B_T2I, "t2i-2b"), (V.COSMOS2_14B_V2W, "i2v-14b"), (V.ANIMA, "anima-2b")],
)
def test_cosmos_predict2_and_anima(cfg, var):
    small = cfg.with_(layers=3)
    ref = meta_shapes(diffusers.CosmosTransformer3DModel, **V.cosmos_diffusers_config(small))
    original = V.cosmos_original(small)
    net = {k: s for k, s in original.items() if ".llm_adapter." not in k}
    assert_same(converted(sfu.convert_cosmos_transformer_checkpoint_to_diffusers, net), ref)
    for prefix_swap in ("net.", "model.diffusion_model.", ""):
        rows = {prefix_swap + k.removeprefix("net."): s for k, s in original.items()}
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant, d.prediction) == (
            "diffusion_model",
            "cosmos_predict2",
            var,
            "flow",
        )
        assert set(d.components) == {"transformer"}
    if cfg.anima:
        # diffusers keeps Anima's adapter in its own folder: the transformer alone is Predict2 2B's layout
        assert detect(ref).variant == "t2i-2b"
        assert any("Anima's transformer alone" in e.reason for e in detect(ref).evidence)
    else:
        assert detect(ref).variant == var
    assert detect(blocks_only(ref, "transformer_blocks.", 1, 3)).variant == var.split("-")[1]


def test_cosmos_1_0_is_cosmos_predict1():
    d = detect(meta_shapes(diffusers.CosmosTransformer3DModel, num_layers=2))  # the defaults: Cosmos 1.0 7B
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "cosmos_predict1", "t2v-7b")
    assert any("Cosmos 1.0" in e.reason for e in d.evidence)
