"""AuraFlow, Stable Cascade, PixArt, HunyuanDiT and SVD layouts against diffusers on the meta device."""

from __future__ import annotations

import pytest

from engine import synth
from engine.synth import cascade as C

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

from test_synth_reference import assert_same, meta_tensors, on_meta, shapes_of  # noqa: E402


def test_auraflow_native_converts_to_diffusers():
    native = meta_tensors(synth.layout("auraflow_transformer"))
    converted = sfu.convert_auraflow_transformer_checkpoint_to_diffusers(native)
    assert not native, f"unconverted: {list(native)[:4]}"
    assert all(v is not None for v in converted.values()), [k for k, v in converted.items() if v is None][:4]
    assert_same(
        {k: tuple(v.shape) for k, v in converted.items()},
        shapes_of(on_meta(diffusers.AuraFlowTransformer2DModel)),
    )


def cascade_unet_config(c: C.CascadeConfig) -> dict:
    types = {
        "CT": ("SDCascadeResBlock", "SDCascadeTimestepBlock"),
        "CTA": ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock"),
    }
    n = len(c.c_hidden)
    return dict(
        in_channels=c.c_in,
        out_channels=c.c_out,
        timestep_ratio_embedding_dim=c.c_r,
        patch_size=c.patch,
        conditioning_dim=c.c_cond,
        block_out_channels=c.c_hidden,
        num_attention_heads=c.nhead,
        down_num_layers_per_block=c.blocks_down,
        up_num_layers_per_block=c.blocks_up,
        down_blocks_repeat_mappers=c.repeat_down,
        up_blocks_repeat_mappers=c.repeat_up,
        block_types_per_layer=tuple(types[lv] for lv in c.level),
        clip_text_in_channels=c.clip_text,
        clip_text_pooled_in_channels=c.clip_text_pooled,
        clip_image_in_channels=c.clip_img,
        clip_seq=c.clip_seq,
        effnet_in_channels=c.effnet,
        pixel_mapper_in_channels=c.pixels,
        timestep_conditioning_type=c.t_conds,
        dropout=(0.0,) * n,
        switch_level=(False,) * (n - 1) if c.switch_level else None,
    )


@pytest.mark.parametrize(
    "name,cfg",
    [
        ("stable_cascade_c", C.STAGE_C),
        ("stable_cascade_c_lite", C.STAGE_C_LITE),
        ("stable_cascade_b", C.STAGE_B),
        ("stable_cascade_b_lite", C.STAGE_B_LITE),
    ],
)
def test_stable_cascade_native_converts_to_diffusers(name, cfg):
    native = meta_tensors(synth.layout(name))
    converted = sfu.convert_stable_cascade_unet_single_file_to_diffusers(native)
    ref = shapes_of(on_meta(diffusers.StableCascadeUNet, **cascade_unet_config(cfg)))
    assert_same({k: tuple(v.shape) for k, v in converted.items()}, ref)
    # diffusers' own single-file sniffing recognises the stage from our keys
    key = sfu.CHECKPOINT_KEY_NAMES[
        "stable_cascade_stage_c" if name.startswith("stable_cascade_c") else "stable_cascade_stage_b"
    ]
    assert key in native
