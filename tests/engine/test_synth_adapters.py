"""ControlNet, IP-Adapter, CLIP vision and embedding layouts against diffusers / transformers."""

from __future__ import annotations

import pytest

from tests.support import synth
from tests.support.synth import adapters as AD
from tests.support.synth import unet as U

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

from test_synth_reference import (  # noqa: E402
    assert_same,
    diffusers_unet_config,
    meta_tensors,
    on_meta,
    shapes,
    shapes_of,
)


@pytest.mark.parametrize(
    "cfg,ldm_name,diff_name",
    [
        (U.SD1, "sd1_controlnet", "sd1_controlnet_diffusers"),
        (U.SD2, "sd2_controlnet", None),
        (U.SDXL, None, "sdxl_controlnet_diffusers"),
    ],
)
def test_controlnets_match_diffusers(cfg, ldm_name, diff_name):
    dcfg = diffusers_unet_config(cfg)
    dcfg.pop("out_channels")
    dcfg.pop("up_block_types")
    dcfg.pop("in_channels")
    model = on_meta(diffusers.ControlNetModel, **dcfg)
    ref = shapes_of(model)
    if diff_name:
        assert_same(shapes(synth.layout(diff_name)), ref)
    if ldm_name:
        ldm = meta_tensors(synth.layout(ldm_name))
        converted = sfu.convert_controlnet_checkpoint(ldm, dcfg)
        assert len(converted) == len(ldm)
        assert_same({k: tuple(v.shape) for k, v in converted.items()}, ref)


@pytest.mark.parametrize("name,cfg", [("ip_adapter_sd15", U.SD1), ("ip_adapter_sdxl", U.SDXL)])
def test_ip_adapter_layers_follow_diffusers_attention_processor_order(name, cfg):
    """diffusers numbers IP-Adapter layers 1, 3, 5… over unet.attn_processors, skipping self-attention;
    each has the hidden size of its block (loaders/unet.py _convert_ip_adapter_attn_to_diffusers)."""
    unet = on_meta(diffusers.UNet2DConditionModel, **diffusers_unet_config(cfg))
    bo = unet.config.block_out_channels
    expected = {}
    key_id = 1
    for pname in unet.attn_processors:
        if pname.endswith("attn1.processor"):
            continue
        if pname.startswith("mid_block"):
            hidden = bo[-1]
        elif pname.startswith("up_blocks"):
            hidden = list(reversed(bo))[int(pname[len("up_blocks.")])]
        else:
            hidden = bo[int(pname[len("down_blocks.")])]
        for kv in ("k", "v"):
            expected[f"ip_adapter.{key_id}.to_{kv}_ip.weight"] = (hidden, cfg.context_dim)
        key_id += 2
    mine = {k: s for k, s in shapes(synth.layout(name)).items() if k.startswith("ip_adapter.")}
    assert mine == expected
    assert len(expected) == {"ip_adapter_sd15": 32, "ip_adapter_sdxl": 140}[name]


def test_ip_adapter_plus_resampler_loads_into_diffusers_projection():
    """diffusers converts and strictly loads our Resampler keys into IPAdapterPlusImageProjection."""
    unet = on_meta(diffusers.UNet2DConditionModel, **diffusers_unet_config(U.SD1))
    rows = synth.layout("ip_adapter_plus_sd15", dtype="F16")
    ip = {
        k[len("image_proj.") :]: torch.zeros(s, dtype=torch.float16)
        for k, _, s in rows
        if k.startswith("image_proj.")
    }
    proj = unet._convert_ip_adapter_image_proj_to_diffusers(ip, low_cpu_mem_usage=False)
    assert type(proj).__name__ == "IPAdapterPlusImageProjection"
    assert tuple(proj.latents.shape) == (1, 16, 768)


@pytest.mark.parametrize(
    "name,cfg",
    [("clip_vision_vit_l", AD.VIT_L), ("clip_vision_vit_h", AD.VIT_H), ("clip_vision_vit_bigg", AD.VIT_BIGG)],
)
def test_clip_vision_matches_transformers(name, cfg):
    conf = transformers.CLIPVisionConfig(
        hidden_size=cfg.width,
        intermediate_size=cfg.mlp,
        num_hidden_layers=cfg.layers,
        num_attention_heads=16,
        projection_dim=cfg.projection,
        patch_size=cfg.patch,
        image_size=cfg.image,
    )
    ref = shapes_of(on_meta(transformers.CLIPVisionModelWithProjection, conf))
    ref.pop("vision_model.embeddings.position_ids", None)
    assert_same(shapes(synth.layout(name)), ref)


def test_embeddings(tmp_path):
    assert shapes(synth.layout("embedding_sd1", vectors=2)) == {"emb_params": (2, 768)}
    assert shapes(synth.layout("embedding_sdxl")) == {"clip_g": (4, 1280), "clip_l": (4, 768)}
    p = synth.write_a1111_pt(tmp_path / "emb.pt", vectors=3)
    data = torch.load(p, weights_only=True)
    assert tuple(data["string_to_param"]["*"].shape) == (3, 768)
    assert data["string_to_token"] == {"*": 265}
