"""AuraFlow, Stable Cascade, PixArt, HunyuanDiT and SVD layouts against diffusers on the meta device."""

from __future__ import annotations

import pytest

from tests.support import synth
from tests.support.synth import cascade as C

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")

from test_synth_reference import assert_same, meta_tensors, on_meta, shapes, shapes_of  # noqa: E402


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
        switch_level=(False,) * (n - 1) if c.updown_blocks else None,
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


def pixart_native_to_diffusers(rows) -> dict:
    """PixArt's own conversion (tools/convert_pixart_alpha_to_diffusers.py): split qkv / kv, rename, and
    drop the null-caption embedding and pos_embed that diffusers does not keep."""
    simple = {
        "x_embedder.proj": "pos_embed.proj",
        "t_embedder.mlp.0": "adaln_single.emb.timestep_embedder.linear_1",
        "t_embedder.mlp.2": "adaln_single.emb.timestep_embedder.linear_2",
        "t_block.1": "adaln_single.linear",
        "y_embedder.y_proj.fc1": "caption_projection.linear_1",
        "y_embedder.y_proj.fc2": "caption_projection.linear_2",
        "csize_embedder.mlp.0": "adaln_single.emb.resolution_embedder.linear_1",
        "csize_embedder.mlp.2": "adaln_single.emb.resolution_embedder.linear_2",
        "ar_embedder.mlp.0": "adaln_single.emb.aspect_ratio_embedder.linear_1",
        "ar_embedder.mlp.2": "adaln_single.emb.aspect_ratio_embedder.linear_2",
        "final_layer.linear": "proj_out",
        "final_layer.scale_shift_table": "scale_shift_table",
    }
    block = {
        "attn.proj": "attn1.to_out.0",
        "cross_attn.q_linear": "attn2.to_q",
        "cross_attn.proj": "attn2.to_out.0",
        "mlp.fc1": "ff.net.0.proj",
        "mlp.fc2": "ff.net.2",
        "scale_shift_table": "scale_shift_table",
    }
    out = {}
    for key, _, shape in rows:
        if key in ("pos_embed", "y_embedder.y_embedding"):
            continue
        if key.startswith("blocks."):
            _, n, rest = key.split(".", 2)
            mod, _, param = rest.rpartition(".")
            if rest == "scale_shift_table":
                mod, param = rest, ""
            pre = f"transformer_blocks.{n}."
            tail = f".{param}" if param else ""
            if mod == "attn.qkv":
                for q in ("to_q", "to_k", "to_v"):
                    out[f"{pre}attn1.{q}{tail}"] = (shape[0] // 3, *shape[1:])
            elif mod == "cross_attn.kv_linear":
                for q in ("to_k", "to_v"):
                    out[f"{pre}attn2.{q}{tail}"] = (shape[0] // 2, *shape[1:])
            else:
                out[pre + block[mod] + tail] = shape
        else:
            mod, _, param = key.rpartition(".")
            if key in simple:
                out[simple[key]] = shape
            else:
                out[f"{simple[mod]}.{param}"] = shape
    return out


@pytest.mark.parametrize("arch,cfg", [("pixart_alpha", "PIXART_ALPHA"), ("pixart_sigma", "PIXART_SIGMA")])
def test_pixart_layouts_match_diffusers(arch, cfg):
    from tests.support.synth import pixart as PA

    c = getattr(PA, cfg)
    model = on_meta(
        diffusers.PixArtTransformer2DModel,
        num_attention_heads=16,
        attention_head_dim=72,
        in_channels=c.in_channels,
        out_channels=c.out_channels,
        num_layers=c.depth,
        caption_channels=c.caption,
        sample_size=c.sample,
        use_additional_conditions=c.micro_conditions,
    )
    ref = shapes_of(model)
    assert_same(shapes(synth.layout(f"{arch}_transformer_diffusers")), ref)
    native = synth.layout(f"{arch}_transformer", pos_embed=True)
    assert_same(pixart_native_to_diffusers(native), ref)
    assert dict(shapes(native))["y_embedder.y_embedding"] == (c.token_num, 4096)


def hunyuan_native_to_diffusers(rows) -> dict:
    """diffusers' scripts/convert_hunyuandit_to_diffusers.py rules: split Wqkv / kv_proj, rename norms,
    modulation, MLPs and the embedders (norm2 and norm3 swap, which leaves the shapes alone)."""
    top = {
        "pooler.": "time_extra_emb.pooler.",
        "t_embedder.mlp.0": "time_extra_emb.timestep_embedder.linear_1",
        "t_embedder.mlp.2": "time_extra_emb.timestep_embedder.linear_2",
        "x_embedder.proj": "pos_embed.proj",
        "mlp_t5.0": "text_embedder.linear_1",
        "mlp_t5.2": "text_embedder.linear_2",
        "extra_embedder.0": "time_extra_emb.extra_embedder.linear_1",
        "extra_embedder.2": "time_extra_emb.extra_embedder.linear_2",
        "final_layer.adaLN_modulation.1": "norm_out.linear",
        "final_layer.linear": "proj_out",
        "style_embedder": "time_extra_emb.style_embedder",
    }
    inner = {
        "q_norm": "norm_q",
        "k_norm": "norm_k",
        "out_proj": "to_out.0",
        "q_proj": "to_q",
        "default_modulation.1": "norm1.linear",
        "mlp.fc1": "ff.net.0.proj",
        "mlp.fc2": "ff.net.2",
    }
    out = {}
    for key, _, shape in rows:
        if key.startswith("blocks."):
            _, n, rest = key.split(".", 2)
            mod, _, param = rest.rpartition(".")
            pre = f"blocks.{n}."
            if mod == "attn1.Wqkv":
                for q in ("to_q", "to_k", "to_v"):
                    out[f"{pre}attn1.{q}.{param}"] = (shape[0] // 3, *shape[1:])
            elif mod == "attn2.kv_proj":
                for q in ("to_k", "to_v"):
                    out[f"{pre}attn2.{q}.{param}"] = (shape[0] // 2, *shape[1:])
            elif mod == "norm1":
                out[f"{pre}norm1.norm.{param}"] = shape
            else:
                a, _, m = mod.partition(".")
                new = f"{a}.{inner[m]}" if a in ("attn1", "attn2") else inner.get(mod, mod)
                out[f"{pre}{new}.{param}"] = shape
        else:
            for old, new in top.items():
                if key.startswith(old):
                    key = new + key[len(old) :]
                    break
            out[key] = shape
    return out


@pytest.mark.parametrize(
    "name,style", [("hunyuan_dit_v11_transformer", True), ("hunyuan_dit_v12_transformer", False)]
)
def test_hunyuan_dit_native_converts_to_diffusers(name, style):
    model = on_meta(
        diffusers.HunyuanDiT2DModel,
        num_attention_heads=16,
        attention_head_dim=88,
        in_channels=4,
        patch_size=2,
        hidden_size=1408,
        num_layers=40,
        mlp_ratio=4.3637,
        sample_size=128,
        use_style_cond_and_image_meta_size=style,
    )
    assert_same(hunyuan_native_to_diffusers(synth.layout(name)), shapes_of(model))


def _svd_native_to_diffusers(key: str, layers: int) -> str:
    """The renaming of diffusers' scripts/convert_svd_to_diffusers.py (block index arithmetic, resnet and
    temporal renames), written out for keys rather than tensors."""
    simple = {
        "time_embed.0": "time_embedding.linear_1",
        "time_embed.2": "time_embedding.linear_2",
        "label_emb.0.0": "add_embedding.linear_1",
        "label_emb.0.2": "add_embedding.linear_2",
        "input_blocks.0.0": "conv_in",
        "out.0": "conv_norm_out",
        "out.2": "conv_out",
    }
    mod, _, param = key.rpartition(".")
    if mod in simple:
        return f"{simple[mod]}.{param}"
    res = [
        ("in_layers.0", "norm1"),
        ("in_layers.2", "conv1"),
        ("out_layers.0", "norm2"),
        ("out_layers.3", "conv2"),
        ("emb_layers.1", "time_emb_proj"),
        ("skip_connection", "conv_shortcut"),
    ]
    att = [
        ("time_stack", "temporal_transformer_blocks"),
        ("time_pos_embed.0", "time_pos_embed.linear_1"),
        ("time_pos_embed.2", "time_pos_embed.linear_2"),
    ]

    def resnet(prefix: str, rest: str) -> str:
        if rest.startswith("time_mixer."):
            return f"{prefix}.{rest}"
        part = "temporal_res_block" if rest.startswith("time_stack.") else "spatial_res_block"
        rest = rest.removeprefix("time_stack.")
        for a, b in res:
            rest = rest.replace(a, b)
        return f"{prefix}.{part}.{rest}"

    def attention(prefix: str, rest: str) -> str:
        for a, b in att:
            rest = rest.replace(a, b)
        return f"{prefix}.{rest}"

    kind, n, sub, rest = key.split(".", 3)
    n, sub = int(n), int(sub) if kind != "middle_block" else int(n)
    if kind == "middle_block":
        rest = key.split(".", 2)[2]
        return (
            attention("mid_block.attentions.0", rest)
            if n == 1
            else resnet(f"mid_block.resnets.{n // 2}", rest)
        )
    if kind == "input_blocks":
        blk, lay = (n - 1) // (layers + 1), (n - 1) % (layers + 1)
        if rest.startswith("op."):
            return f"down_blocks.{blk}.downsamplers.0.conv.{rest[3:]}"
        return (
            resnet(f"down_blocks.{blk}.resnets.{lay}", rest)
            if sub == 0
            else attention(f"down_blocks.{blk}.attentions.{lay}", rest)
        )
    blk, lay = n // (layers + 1), n % (layers + 1)
    if sub == 0:
        return resnet(f"up_blocks.{blk}.resnets.{lay}", rest)
    if rest.startswith("conv."):
        return f"up_blocks.{blk}.upsamplers.0.{rest}"
    return attention(f"up_blocks.{blk}.attentions.{lay}", rest)


def test_svd_unet_matches_diffusers_in_both_namings():
    ref = shapes_of(on_meta(diffusers.UNetSpatioTemporalConditionModel))
    assert_same(shapes(synth.layout("svd_unet_diffusers")), ref)
    native = synth.layout("svd_unet")
    assert_same({_svd_native_to_diffusers(k, 2): tuple(s) for k, _, s in native}, ref)
    assert len(native) == len(ref)
    # the spatial half is the plain LDM UNet of the same config
    from tests.support.synth import unet as U

    spatial = {
        k for k, _, _ in native if "time_stack" not in k and "time_mixer" not in k and "time_pos" not in k
    }
    assert spatial == {k for k, _, _ in _ldm_rows(U.SVD.with_(video=False))}


def _ldm_rows(cfg):
    from tests.support.synth import unet as U
    from tests.support.synth._build import Builder

    b = Builder()
    U.unet_ldm(b, cfg)
    return b.rows
