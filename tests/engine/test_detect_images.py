"""Qwen-Image, Krea 2, HiDream-I1, Sana, Lumina 2 and Z-Image in original and diffusers naming."""

from __future__ import annotations

import pytest
from layouts_2026 import image as I
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes

ORIGINAL = [
    (lambda: I.krea2_original(I.KREA2), "krea2", "normal"),
    (lambda: I.sana_original(I.SANA_1600M), "sana", "normal-1.6b"),
    (lambda: I.sana_original(I.SANA_600M), "sana", "normal-0.6b"),
    (lambda: I.sana_original(I.SANA15_4800M), "sana", "normal-4.8b"),
    (lambda: I.nextdit_original(I.LUMINA2), "lumina2", "normal"),
    (lambda: I.nextdit_original(I.Z_IMAGE), "z_image", "normal"),
]


@pytest.mark.parametrize("build, arch, var", ORIGINAL)
@pytest.mark.parametrize("prefix", ["", "model.diffusion_model."])
def test_original_naming(build, arch, var, prefix):
    d = detect(build().under(prefix))
    assert (d.kind, d.architecture, d.variant, d.prediction) == ("diffusion_model", arch, var, "flow")
    assert set(d.components) == {"transformer"} and d.components["transformer"].prefix == prefix


@pytest.mark.parametrize("build, arch, var", ORIGINAL)
def test_original_naming_middle_shards(build, arch, var):
    rows = build()
    container = "blocks." if arch in ("krea2", "sana") else "layers."
    d = detect(blocks_only(rows, container, 4, 8))
    assert (d.kind, d.architecture) == ("diffusion_model", arch)
    assert any("part of a sharded model" in e.reason for e in d.evidence)


def test_sana_4_8b_is_told_by_a_block_past_the_1_6b_depth():
    deep = detect(blocks_only(I.sana_original(I.SANA15_4800M), "blocks.", 40, 50))
    assert deep.variant == "normal-4.8b"
    shallow = detect(blocks_only(I.sana_original(I.SANA15_4800M), "blocks.", 4, 8))
    assert shallow.variant == "normal" and any(
        "Sana 1.6B (20 blocks) or" in e.reason for e in shallow.evidence
    )


def test_unknown_nextdit_size_is_the_family_without_a_variant():
    d = detect(I.nextdit_original(I.Z_IMAGE.with_(dim=2560, heads=20, kv_heads=20, layers=4)))
    assert (d.architecture, d.variant) == ("z_image", None)


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")


def _qwen(layers=3, **kw):
    return meta_shapes(diffusers.QwenImageTransformer2DModel, num_layers=layers, **kw)


def test_qwen_image_and_its_edit_markers():
    # Qwen-Image's original release is in diffusers naming; ComfyUI's repackaged files keep it.
    for prefix in ("", "model.diffusion_model."):
        d = detect({prefix + k: s for k, s in _qwen().items()})
        assert (d.kind, d.architecture, d.variant, d.prediction) == (
            "diffusion_model",
            "qwen_image",
            "normal",
            "flow",
        )
        assert any("Edit-2509 share Qwen-Image's layout" in e.reason for e in d.evidence)
    assert detect({**_qwen(), "__index_timestep_zero__": (0,)}).variant == "edit"
    assert detect(_qwen(), {"modelspec.title": "Qwen-Image-Edit-2509"}).variant == "edit"
    assert detect(_qwen(use_additional_t_cond=True)).variant == "layered"
    shard = detect(blocks_only(_qwen(layers=8), "transformer_blocks.", 3, 6))
    assert shard.architecture == "qwen_image"


def test_qwen_image_full_size_is_20b():
    d = detect(meta_shapes(diffusers.QwenImageTransformer2DModel))
    assert d.architecture == "qwen_image" and abs(d.params - 20.43e9) < 0.1e9


def test_krea2_both_namings():
    ref = meta_shapes(diffusers.Krea2Transformer2DModel, num_layers=3)
    small = I.Krea2Config(layers=3)
    assert_same(
        converted(sfu.convert_krea2_transformer_checkpoint_to_diffusers, I.krea2_original(small)), ref
    )
    assert (detect(ref).architecture, detect(ref).variant) == ("krea2", "normal")
    full = detect(meta_shapes(diffusers.Krea2Transformer2DModel))
    assert full.architecture == "krea2" and abs(full.params - 12.82e9) < 0.05e9
    assert detect(blocks_only(ref, "transformer_blocks.", 1, 3)).architecture == "krea2"


HIDREAM = dict(
    patch_size=2,
    in_channels=16,
    out_channels=16,
    num_layers=2,
    num_single_layers=3,
    attention_head_dim=128,
    num_attention_heads=20,
    caption_channels=[4096, 4096],
    text_emb_dim=2048,
    num_routed_experts=4,
    num_activated_experts=2,
    axes_dims_rope=(64, 32, 32),
    max_resolution=(128, 128),
    llama_layers=list(range(32)) + [31] * 16,
)


def test_hidream_one_naming_and_its_shards():
    # HiDream-ai's release uses these names; diffusers' converter only strips ComfyUI's prefix.
    ref = meta_shapes(diffusers.HiDreamImageTransformer2DModel, **HIDREAM)
    comfy = {"model.diffusion_model." + k: s for k, s in ref.items()}
    assert_same(converted(sfu.convert_hidream_transformer_to_diffusers, comfy), ref)
    for rows in (ref, comfy, blocks_only(ref, "single_stream_blocks.", 1, 3)):
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "hidream", "normal")
    full = detect(
        meta_shapes(
            diffusers.HiDreamImageTransformer2DModel, **{**HIDREAM, "num_layers": 16, "num_single_layers": 32}
        )
    )
    assert abs(full.params - 17.1e9) < 0.1e9


@pytest.mark.parametrize("cfg, var", [(I.SANA_1600M, "normal-1.6b"), (I.SANA_600M, "normal-0.6b")])
def test_sana_diffusers_naming(cfg, var):
    ref = meta_shapes(diffusers.SanaTransformer2DModel, **I.sana_diffusers_config(cfg))
    assert_same(converted(sfu.convert_sana_transformer_to_diffusers, I.sana_original(cfg)), ref)
    d = detect(ref)
    assert (d.architecture, d.variant) == ("sana", var)
    sprint = meta_shapes(
        diffusers.SanaTransformer2DModel, **I.sana_diffusers_config(cfg), guidance_embeds=True
    )
    assert detect(sprint).variant == var.replace("normal", "sprint")


def test_lumina2_and_z_image_diffusers_naming():
    lumina = meta_shapes(
        diffusers.Lumina2Transformer2DModel, num_layers=3, cap_feat_dim=2304
    )  # the release: Gemma 2 2B
    assert_same(
        converted(sfu.convert_lumina2_to_diffusers, I.nextdit_original(I.LUMINA2.with_(layers=3))), lumina
    )
    z = meta_shapes(diffusers.ZImageTransformer2DModel, n_layers=3)
    assert_same(
        converted(
            sfu.convert_z_image_transformer_checkpoint_to_diffusers,
            I.nextdit_original(I.Z_IMAGE.with_(layers=3)),
        ),
        z,
    )
    for rows, arch in ((lumina, "lumina2"), (z, "z_image")):
        d = detect(rows)
        assert (d.kind, d.architecture, d.variant) == ("diffusion_model", arch, "normal")
        assert detect(blocks_only(rows, "layers.", 1, 3)).architecture == arch
    full = detect(meta_shapes(diffusers.ZImageTransformer2DModel))
    assert abs(full.params - 6.15e9) < 0.05e9
