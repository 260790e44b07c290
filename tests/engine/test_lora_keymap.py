"""Key mapping and coverage: adapter names in every convention reach the right base weights."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from lora_fixtures import manifest_entries

from engine.formats.safetensors import read_header
from engine.lora.coverage import coverage
from engine.lora.keymap import KeyMap
from engine.lora.naming import underscored
from tests.support import synth


def _shapes(rows):
    return {k: tuple(s) for k, _, s in rows}


def _index(entries):
    return SimpleNamespace(tensors={k: SimpleNamespace(shape=tuple(s)) for k, _, s in entries}, metadata={})


def test_real_lokr_maps_fully_onto_sd15_manifest(shared_data):
    base = _shapes(manifest_entries("manifests/sd15_ldm_single_file.json"))
    cov = coverage(read_header(shared_data("weights/smart_falcon_8_lokr.safetensors")), base)
    j = cov.to_json()
    assert (j["modules"], j["mapped"]) == (350, 350)
    assert j["targets"]["unet"] == {"modules": 278, "mapped": 278, "unmatched": [], "shape_mismatch": []}
    assert j["targets"]["clip_l"] == {"modules": 72, "mapped": 72, "unmatched": [], "shape_mismatch": []}
    # Spot checks against the LDM names (diffusers down_blocks.1.attentions.0 is input_blocks.4.1).
    km = KeyMap(base)
    t = km.resolve("lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k")
    assert t.key == "model.diffusion_model.input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight"
    assert km.resolve("lora_unet_up_blocks_1_resnets_2_conv_shortcut").key == (
        "model.diffusion_model.output_blocks.5.0.skip_connection.weight"
    )
    assert (
        km.resolve("lora_unet_up_blocks_0_upsamplers_0_conv").key
        == "model.diffusion_model.output_blocks.2.1.conv.weight"
    )
    assert (
        km.resolve("lora_unet_up_blocks_1_upsamplers_0_conv").key
        == "model.diffusion_model.output_blocks.5.2.conv.weight"
    )
    assert (
        km.resolve("lora_unet_down_blocks_2_downsamplers_0_conv").key
        == "model.diffusion_model.input_blocks.9.0.op.weight"
    )


def test_sdxl_kohya_dump_maps_fully_onto_sdxl_manifest():
    base = _shapes(manifest_entries("manifests/sdxl_base_sgm_single_file.json"))
    cov = coverage(
        _index(manifest_entries("manifests/sdxl_kohya_lora_alien_style.keys.json")), base
    ).to_json()
    assert (cov["modules"], cov["mapped"]) == (986, 986)
    assert {k: (v["modules"], v["mapped"]) for k, v in cov["targets"].items()} == {
        "unet": (722, 722),
        "clip_l": (72, 72),
        "clip_g": (192, 192),
    }
    km = KeyMap(base)
    t = km.resolve("lora_te2_text_model_encoder_layers_5_self_attn_v_proj")
    assert t.key == "conditioner.embedders.1.model.transformer.resblocks.5.attn.in_proj_weight"
    assert t.view == ("rows", 2560, 1280) and t.shape == (1280, 1280)


@pytest.mark.parametrize(
    ("ldm", "diffusers"),
    [
        ("sd1_checkpoint", "sd1_unet_diffusers"),
        ("sd2_checkpoint", "sd2_unet_diffusers"),
        ("sdxl_checkpoint", "sdxl_unet_diffusers"),
    ],
)
def test_every_diffusers_unet_weight_reaches_the_ldm_weight_of_the_same_shape(ldm, diffusers):
    # The diffusers layouts were converted by diffusers' own single-file code (tests.support.synth): an
    # independent check of our structural LDM <-> diffusers map, for kohya and diffusers names alike.
    base = _shapes(synth.layout(ldm))
    km = KeyMap(base)
    for key, _, shape in synth.layout(diffusers):
        if not key.endswith(".weight"):
            continue
        path = key[: -len(".weight")]
        for name in (f"lora_unet_{underscored(path)}", f"unet.{path}"):
            t = km.resolve(name)
            assert t is not None, name
            assert t.shape == tuple(shape), (name, t.key)


@pytest.mark.parametrize(
    ("ckpt", "comp", "kohya"),
    [("sdxl_checkpoint", "clip_g", "lora_te2_"), ("sd2_checkpoint", "clip_h", "lora_te_")],
)
def test_openclip_encoders_take_hugging_face_names_with_qkv_offsets(ckpt, comp, kohya):
    base = _shapes(synth.layout(ckpt))
    km = KeyMap(base)
    hf = "clip_g" if comp == "clip_g" else None
    n_layers = 32 if comp == "clip_g" else 24
    width = 1280 if comp == "clip_g" else 1024
    for i in range(n_layers):
        for j, p in enumerate(("q_proj", "k_proj", "v_proj")):
            t = km.resolve(f"{kohya}text_model_encoder_layers_{i}_self_attn_{p}")
            assert t.component == comp and t.key.endswith(f"resblocks.{i}.attn.in_proj_weight")
            assert t.view == ("rows", j * width, width)
        for p in ("self_attn_out_proj", "mlp_fc1", "mlp_fc2"):
            t = km.resolve(f"{kohya}text_model_encoder_layers_{i}_{p}")
            assert t is not None and t.component == comp
    if hf:
        # Every Linear of transformers' CLIP-G layout (synth, checked against transformers) is reachable.
        for key, _, shape in synth.layout("clip_g"):
            if key.endswith(".weight") and len(shape) == 2 and "embeddings" not in key:
                t = km.resolve("text_encoder_2." + key[: -len(".weight")])
                assert t is not None and t.shape == tuple(shape), key


def _flux_base():
    return _shapes(manifest_entries("manifests/flux1_dev_bfl_all_in_one.json"))


@pytest.mark.parametrize(
    ("name", "key", "view"),
    [
        (
            "transformer.transformer_blocks.3.attn.to_k",
            "double_blocks.3.img_attn.qkv.weight",
            ("rows", 3072, 3072),
        ),
        (
            "transformer.transformer_blocks.3.attn.add_v_proj",
            "double_blocks.3.txt_attn.qkv.weight",
            ("rows", 6144, 3072),
        ),
        ("transformer.transformer_blocks.0.attn.to_add_out", "double_blocks.0.txt_attn.proj.weight", None),
        ("transformer.transformer_blocks.0.ff_context.net.0.proj", "double_blocks.0.txt_mlp.0.weight", None),
        (
            "transformer.single_transformer_blocks.7.attn.to_q",
            "single_blocks.7.linear1.weight",
            ("rows", 0, 3072),
        ),
        (
            "transformer.single_transformer_blocks.7.proj_mlp",
            "single_blocks.7.linear1.weight",
            ("rows", 9216, 12288),
        ),
        ("transformer.single_transformer_blocks.7.proj_out", "single_blocks.7.linear2.weight", None),
        (
            "transformer.single_transformer_blocks.7.norm.linear",
            "single_blocks.7.modulation.lin.weight",
            None,
        ),
        ("transformer.norm_out.linear", "final_layer.adaLN_modulation.1.weight", ("swap",)),
        ("transformer.x_embedder", "img_in.weight", None),
        ("lora_unet_double_blocks_0_img_attn_qkv", "double_blocks.0.img_attn.qkv.weight", None),  # kohya
        ("lora_unet_single_blocks_37_linear1", "single_blocks.37.linear1.weight", None),
        (
            "lora_transformer_single_transformer_blocks_0_attn_to_v",
            "single_blocks.0.linear1.weight",
            ("rows", 6144, 3072),
        ),
        ("double_blocks.1.img_mod.lin", "double_blocks.1.img_mod.lin.weight", None),  # BFL
        (
            "diffusion_model.double_blocks.1.img_attn.proj",
            "double_blocks.1.img_attn.proj.weight",
            None,
        ),  # ComfyUI
        (
            "base_model.model.transformer_blocks.2.attn.to_out.0",
            "double_blocks.2.img_attn.proj.weight",
            None,
        ),  # PEFT
        (
            "transformer.transformer_blocks.2.attn.norm_added_k",
            "double_blocks.2.txt_attn.norm.key_norm.scale",
            None,
        ),
    ],
)
def test_flux_conventions(name, key, view):
    t = KeyMap(_flux_base()).resolve(name)
    assert t is not None, name
    assert (t.component, t.key, t.view) == ("transformer", "model.diffusion_model." + key, view)


def test_flux_text_encoders():
    km = KeyMap(_flux_base())
    assert km.resolve("lora_te1_text_model_encoder_layers_0_mlp_fc1").component == "clip_l"
    t5 = km.resolve("lora_te3_encoder_block_3_layer_1_DenseReluDense_wo")
    assert t5.key == "text_encoders.t5xxl.transformer.encoder.block.3.layer.1.DenseReluDense.wo.weight"
    assert km.resolve("text_encoder_2.encoder.block.3.layer.0.SelfAttention.q").component == "t5xxl"


def _sd3_layout(blocks=3, h=1536):
    """The MMDiT keys of SD3 (SAI naming, as in sd3_medium.safetensors): joint blocks with fused qkv,
    the last context block "pre-only" (qkv and a 2h modulation, no proj/mlp)."""
    rows = {
        "x_embedder.proj.weight": (h, 16, 2, 2),
        "context_embedder.weight": (h, 4096),
        "t_embedder.mlp.0.weight": (h, 256),
        "t_embedder.mlp.2.weight": (h, h),
        "y_embedder.mlp.0.weight": (h, 2048),
        "y_embedder.mlp.2.weight": (h, h),
        "final_layer.linear.weight": (64, h),
        "final_layer.adaLN_modulation.1.weight": (2 * h, h),
    }
    for i in range(blocks):
        for blk in ("x_block", "context_block"):
            last_ctx = blk == "context_block" and i == blocks - 1
            b = f"joint_blocks.{i}.{blk}"
            rows[f"{b}.attn.qkv.weight"] = (3 * h, h)
            rows[f"{b}.adaLN_modulation.1.weight"] = ((2 if last_ctx else 6) * h, h)
            if not last_ctx:
                rows[f"{b}.attn.proj.weight"] = (h, h)
                rows[f"{b}.mlp.fc1.weight"] = (4 * h, h)
                rows[f"{b}.mlp.fc2.weight"] = (h, 4 * h)
    rows = {"model.diffusion_model." + k: v for k, v in rows.items()}
    rows["text_encoders.clip_l.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight"] = (768, 768)
    rows["text_encoders.clip_g.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight"] = (
        1280,
        1280,
    )
    rows["text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight"] = (4096, 4096)
    return rows


def test_sd3_conventions():
    km = KeyMap(_sd3_layout())
    P = "model.diffusion_model."
    t = km.resolve("transformer.transformer_blocks.1.attn.add_k_proj")
    assert (t.key, t.view) == (P + "joint_blocks.1.context_block.attn.qkv.weight", ("rows", 1536, 1536))
    assert (
        km.resolve("lora_unet_joint_blocks_0_x_block_mlp_fc2").key
        == P + "joint_blocks.0.x_block.mlp.fc2.weight"
    )
    assert km.resolve("transformer.transformer_blocks.2.norm1_context.linear").view == ("swap",)
    assert km.resolve("transformer.transformer_blocks.1.norm1_context.linear").view is None
    assert km.resolve("lora_te1_text_model_encoder_layers_0_self_attn_q_proj").component == "clip_l"
    assert km.resolve("lora_te2_text_model_encoder_layers_0_self_attn_q_proj").component == "clip_g"
    assert km.resolve("text_encoder_3.encoder.block.0.layer.0.SelfAttention.q").component == "t5xxl"
    assert km.resolve("lora_te3_encoder_block_0_layer_0_SelfAttention_q").component == "t5xxl"


def test_coverage_reports_unmatched_and_shape_mismatches():
    base = _shapes(manifest_entries("manifests/sd15_ldm_single_file.json"))
    entries = [
        # an SDXL-width LoRA on SD1: cross-attention context 2048 vs 768
        (
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k.lora_down.weight",
            "F16",
            (4, 2048),
        ),
        (
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k.lora_up.weight",
            "F16",
            (320, 4),
        ),
        (
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_down.weight",
            "F16",
            (4, 320),
        ),
        (
            "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn1_to_q.lora_up.weight",
            "F16",
            (320, 4),
        ),
        ("lora_unet_no_such_block.lora_down.weight", "F16", (4, 320)),
        ("lora_unet_no_such_block.lora_up.weight", "F16", (320, 4)),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1.hada_w1_a", "F16", (3072, 2)),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1.hada_w1_b", "F16", (2, 768)),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1.hada_w2_a", "F16", (3072, 2)),
        ("lora_te_text_model_encoder_layers_0_mlp_fc1.hada_w2_b", "F16", (2, 768)),
    ]
    j = coverage(_index(entries), base).to_json()
    assert (j["modules"], j["mapped"]) == (4, 2)
    unet = j["targets"]["unet"]
    assert unet["unmatched"] == ["lora_unet_no_such_block"]
    assert [m["module"] for m in unet["shape_mismatch"]] == [
        "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k"
    ]
    assert unet["shape_mismatch"][0]["lora_shape"] == [320, 2048]
    assert unet["shape_mismatch"][0]["base_shape"] == [320, 768]
    assert j["targets"]["clip_l"]["mapped"] == 1
    assert json.loads(json.dumps(j)) == j
    assert math.isclose(j["mapped"] / j["modules"], 0.5)


@pytest.mark.parametrize(
    ("ckpt", "diffusers"),
    [
        ("flux1_dev", "flux1_dev_transformer_diffusers"),
        ("sd3_medium", "sd3_medium_transformer_diffusers"),
        ("sd3.5_large", "sd3.5_large_transformer_diffusers"),
        ("sd3.5_medium", "sd3.5_medium_transformer_diffusers"),
    ],
)
def test_every_diffusers_transformer_weight_reaches_a_bfl_or_sai_weight_of_its_shape(ckpt, diffusers):
    # tests.support.synth builds the diffusers layouts with diffusers' own converters: every diffusers-named
    # weight (as diffusers, PEFT, ai-toolkit and OneTrainer name LoRA modules) must land on a view of
    # the native checkpoint weight with exactly its shape — fused q/k/v and Flux linear1 included.
    km = KeyMap(_shapes(synth.layout(ckpt)))
    assert km.diffusion_name == "transformer"
    views = set()
    for key, _, shape in synth.layout(diffusers):
        if not key.endswith(".weight"):
            continue
        path = key[: -len(".weight")]
        for name in (
            f"transformer.{path}",
            f"lora_transformer_{underscored(path)}",
            f"base_model.model.{path}",
        ):
            t = km.resolve(name)
            assert t is not None, name
            assert t.shape == tuple(shape), (name, t.key, t.shape)
            views.add(t.view[0] if t.view else None)
    assert "rows" in views and "swap" in views


@pytest.mark.parametrize(
    ("ldm", "diffusers"),
    [
        ("sd1_unet", "sd1_unet_diffusers"),
        ("sdxl_unet", "sdxl_unet_diffusers"),
        ("sdxl_refiner_unet", "sdxl_refiner_unet_diffusers"),
    ],
)
def test_ldm_and_diffusers_unet_maps_are_inverse(ldm, diffusers):
    from engine.lora.unet_names import diffusers_to_ldm, ldm_to_diffusers

    fwd = ldm_to_diffusers({k.rsplit(".", 1)[0] for k, _, _ in synth.layout(ldm)})
    inv = diffusers_to_ldm({k.rsplit(".", 1)[0] for k, _, _ in synth.layout(diffusers)})
    assert set(fwd.values()) == set(inv)
    assert all(inv[d] == native for native, d in fwd.items())


def test_ldm_named_lora_reaches_a_diffusers_named_unet_file(shared_data):
    # The SDXL kohya dump (LDM names) on a bare diffusers UNet file, and the LoKr (diffusers names) on SD1's.
    cov = coverage(
        _index(manifest_entries("manifests/sdxl_kohya_lora_alien_style.keys.json")),
        _shapes(synth.layout("sdxl_unet_diffusers")),
    ).to_json()
    assert (cov["targets"]["unet"]["modules"], cov["targets"]["unet"]["mapped"]) == (722, 722)
    assert len(cov["targets"]["clip_g"]["unmatched"]) == 192  # a UNet file has no text encoder
    cov = coverage(
        read_header(shared_data("weights/smart_falcon_8_lokr.safetensors")),
        _shapes(synth.layout("sd1_unet_diffusers")),
    ).to_json()
    assert cov["targets"]["unet"]["mapped"] == 278


def test_xlabs_flux_lora_lands_on_bfl_attention(tmp_path):
    from engine.formats.safetensors import write_sparse
    from engine.lora import describe_lora

    entries = []
    for i in range(2):
        for which, (o, n) in {
            "qkv_lora1": (9216, 3072),
            "proj_lora1": (3072, 3072),
            "qkv_lora2": (9216, 3072),
            "proj_lora2": (3072, 3072),
        }.items():
            entries += [
                (f"double_blocks.{i}.processor.{which}.down.weight", "BF16", (16, n)),
                (f"double_blocks.{i}.processor.{which}.up.weight", "BF16", (o, 16)),
            ]
    header = read_header(write_sparse(tmp_path / "xlabs.safetensors", entries))
    info = describe_lora(header)
    assert (info.format, info.base, info.targets, info.rank, info.modules) == (
        "xlabs",
        "flux1",
        ("transformer",),
        16,
        8,
    )
    cov = coverage(header, _flux_base())
    assert (cov.modules, cov.mapped) == (8, 8)
    assert (
        cov.placements["double_blocks.1.txt_attn.qkv"].key
        == "model.diffusion_model.double_blocks.1.txt_attn.qkv.weight"
    )


def test_bfl_control_lora_norm_scales_are_replacements(tmp_path):
    from engine.formats.safetensors import write_sparse
    from engine.lora import describe_lora

    entries = [
        ("double_blocks.0.img_attn.qkv.lora_A.weight", "BF16", (128, 3072)),
        ("double_blocks.0.img_attn.qkv.lora_B.weight", "BF16", (9216, 128)),
        ("double_blocks.0.img_attn.qkv.lora_B.bias", "BF16", (9216,)),
        ("double_blocks.0.img_attn.norm.key_norm.scale", "BF16", (128,)),
        ("single_blocks.3.norm.query_norm.scale", "BF16", (128,)),
    ]
    header = read_header(write_sparse(tmp_path / "control.safetensors", entries))
    info = describe_lora(header)
    assert info.format == "bfl" and "set" in info.algos and "lora" in info.algos
    cov = coverage(header, _flux_base())
    assert (cov.modules, cov.mapped) == (3, 3)
    t = cov.placements["single_blocks.3.norm.query_norm"]
    assert t.key == "model.diffusion_model.single_blocks.3.norm.query_norm.scale"


def test_sdxl_refiner_open_clip_g_and_unet():
    km = KeyMap(_shapes(synth.layout("sdxl_refiner")))
    assert km.resolve("text_encoder_2.text_model.encoder.layers.0.self_attn.q_proj").component == "clip_g"
    t = km.resolve("lora_unet_down_blocks_1_attentions_0_transformer_blocks_0_attn2_to_k")
    assert t is not None and t.shape[1] == 1280  # the refiner's cross-attention context
    for key, _, shape in synth.layout("sdxl_refiner_unet_diffusers"):
        if key.endswith(".weight"):
            assert km.resolve("unet." + key[: -len(".weight")]).shape == tuple(shape), key


def test_old_sd1_clip_without_text_model_prefix(shared_data):
    # Early SD1 checkpoints store cond_stage_model.transformer.encoder.layers… (no "text_model.").
    base = {
        k.replace("cond_stage_model.transformer.text_model.", "cond_stage_model.transformer."): s
        for k, s in _shapes(manifest_entries("manifests/sd15_ldm_single_file.json")).items()
    }
    cov = coverage(read_header(shared_data("weights/smart_falcon_8_lokr.safetensors")), base).to_json()
    assert (cov["modules"], cov["mapped"]) == (350, 350)
