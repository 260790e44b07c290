"""Layouts checked against independent references: diffusers / transformers classes built on the
`meta` device (their own namings), and diffusers' single-file converters (native LDM/BFL/MMDiT naming
-> diffusers naming), so the native layouts of architectures without a manifest are checked too.

diffusers and transformers are test-only references, not project dependencies: skipped when absent.
"""

from __future__ import annotations

import pytest

from tests.support import synth
from tests.support.synth import flux as F
from tests.support.synth import mmdit as M
from tests.support.synth import text as T
from tests.support.synth import unet as U
from tests.support.synth import vae as V

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")


def shapes_of(module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in module.state_dict().items()}


def shapes(rows, prefix: str = "") -> dict[str, tuple[int, ...]]:
    return {k[len(prefix) :]: tuple(s) for k, _, s in rows if k.startswith(prefix)}


def meta_tensors(rows) -> dict:
    return {k: torch.empty(s, device="meta") for k, _, s in rows}


def assert_same(mine: dict, ref: dict) -> None:
    missing = sorted(set(ref) - set(mine))
    extra = sorted(set(mine) - set(ref))
    wrong = sorted((k, mine[k], ref[k]) for k in set(mine) & set(ref) if mine[k] != ref[k])
    assert not (missing or extra or wrong), (
        f"missing {missing[:4]} ({len(missing)}) extra {extra[:4]} ({len(extra)}) wrong {wrong[:4]} ({len(wrong)})"
    )


def on_meta(cls, *args, **kw):
    with torch.device("meta"):
        return cls(*args, **kw)


# --- UNets ----------------------------------------------------------------------------------------
def diffusers_unet_config(c: U.UNetConfig) -> dict:
    """UNet2DConditionModel arguments equivalent to an LDM config (the mapping diffusers itself uses in
    create_unet_diffusers_config_from_ldm)."""
    attn = [
        2**i in c.attention_resolutions and c.transformer_depth[i] > 0 for i in range(len(c.channel_mult))
    ]
    cfg = dict(
        in_channels=c.in_channels,
        out_channels=c.out_channels,
        block_out_channels=[c.model_channels * m for m in c.channel_mult],
        down_block_types=["CrossAttnDownBlock2D" if a else "DownBlock2D" for a in attn],
        up_block_types=["CrossAttnUpBlock2D" if a else "UpBlock2D" for a in reversed(attn)],
        layers_per_block=c.num_res_blocks,
        cross_attention_dim=c.context_dim,
        attention_head_dim=8,
        use_linear_projection=c.use_linear_in_transformer,
        transformer_layers_per_block=list(c.transformer_depth),
    )
    if c.adm_in_channels:
        cfg.update(
            addition_embed_type="text_time",
            addition_time_embed_dim=256,
            projection_class_embeddings_input_dim=c.adm_in_channels,
        )
    return cfg


UNETS = {
    "sd1": (U.SD1, "sd1_unet", "sd1_unet_diffusers"),
    "sd1_inpaint": (U.SD1.with_(in_channels=9), "sd1_inpaint_unet", "sd1_inpaint_unet_diffusers"),
    "sd2": (U.SD2, "sd2_unet", "sd2_unet_diffusers"),
    "sdxl": (U.SDXL, "sdxl_unet", "sdxl_unet_diffusers"),
    "sdxl_refiner": (U.SDXL_REFINER, "sdxl_refiner_unet", "sdxl_refiner_unet_diffusers"),
}


@pytest.mark.parametrize("arch", list(UNETS))
def test_unet_layouts_match_diffusers(arch):
    cfg, ldm_name, diff_name = UNETS[arch]
    dcfg = diffusers_unet_config(cfg)
    ref = shapes_of(on_meta(diffusers.UNet2DConditionModel, **dcfg))
    assert_same(shapes(synth.layout(diff_name)), ref)
    # the native LDM layout, converted by diffusers' own single-file converter, gives the same model
    ldm = meta_tensors(synth.layout(ldm_name, prefix="model.diffusion_model."))
    converted = sfu.convert_ldm_unet_checkpoint(ldm, dcfg)
    assert len(converted) == len(ldm)  # nothing of ours was left unconverted
    assert_same({k: tuple(v.shape) for k, v in converted.items()}, ref)


# --- VAEs -----------------------------------------------------------------------------------------
def diffusers_vae(c: V.VAEConfig):
    n = len(c.ch_mult)
    return on_meta(
        diffusers.AutoencoderKL,
        in_channels=c.in_channels,
        out_channels=c.out_ch,
        down_block_types=["DownEncoderBlock2D"] * n,
        up_block_types=["UpDecoderBlock2D"] * n,
        block_out_channels=[c.ch * m for m in c.ch_mult],
        layers_per_block=c.num_res_blocks,
        latent_channels=c.z_channels,
        use_quant_conv=c.quant_conv,
        use_post_quant_conv=c.quant_conv,
    )


@pytest.mark.parametrize(
    "ldm_name,diff_name,cfg",
    [("sd_vae", "sd_vae_diffusers", V.SD), ("flux1_vae", "flux1_vae_diffusers", V.FLUX1)],
)
def test_vae_layouts_match_diffusers(ldm_name, diff_name, cfg):
    model = diffusers_vae(cfg)
    ref = shapes_of(model)
    assert_same(shapes(synth.layout(diff_name)), ref)
    ldm = meta_tensors(synth.layout(ldm_name, prefix="first_stage_model."))
    converted = sfu.convert_ldm_vae_checkpoint(ldm, dict(model.config))
    assert len(converted) == len(ldm)
    assert_same({k: tuple(v.shape) for k, v in converted.items()}, ref)


# --- text encoders --------------------------------------------------------------------------------
def clip_text(c: T.ClipConfig, projection: bool):
    cfg = transformers.CLIPTextConfig(
        vocab_size=c.vocab,
        hidden_size=c.width,
        intermediate_size=c.mlp,
        num_hidden_layers=c.layers,
        num_attention_heads=c.width // 64,
        max_position_embeddings=c.positions,
        projection_dim=c.projection,
    )
    cls = transformers.CLIPTextModelWithProjection if projection else transformers.CLIPTextModel
    return on_meta(cls, cfg)


def test_clip_l_matches_transformers():
    ref = shapes_of(clip_text(T.CLIP_L, True))
    assert_same(shapes(synth.layout("clip_l", projection=True)), ref)
    # Files of a bare CLIPTextModel carry the same text_model.* keys without the projection (transformers
    # 5 builds CLIPTextModel flat and maps its "text_model" base_model_prefix on load, so its own
    # state_dict is no reference for the on-disk naming).
    del ref["text_projection.weight"]
    assert_same(shapes(synth.layout("clip_l")), ref)


def test_clip_g_matches_transformers_with_projection():
    assert_same(shapes(synth.layout("clip_g")), shapes_of(clip_text(T.CLIP_G, True)))


@pytest.mark.parametrize(
    "name,prefix,cfg",
    [
        ("sd2_checkpoint", "cond_stage_model.model.", T.CLIP_H),
        ("sdxl_checkpoint", "conditioner.embedders.1.model.", T.CLIP_G),
        ("sdxl_refiner", "conditioner.embedders.0.model.", T.CLIP_G),
    ],
)
def test_openclip_towers_convert_to_transformers_clip(name, prefix, cfg):
    """diffusers' OpenCLIP converter turns our OpenCLIP-naming tower into CLIPTextModelWithProjection."""
    rows = [r for r in synth.layout(name) if r[0].startswith(prefix)]
    if name == "sd2_checkpoint":
        # diffusers runs SD2's encoder as 23 layers without projection (the penultimate layer's output) and
        # lists the real file's last resblock and text_projection as keys to ignore: we must hold them.
        assert set(sfu.SD_2_TEXT_ENCODER_KEYS_TO_IGNORE) <= {k for k, _, _ in rows}
        model = on_meta(
            transformers.CLIPTextModelWithProjection,
            transformers.CLIPTextConfig(
                hidden_size=cfg.width,
                intermediate_size=cfg.mlp,
                num_hidden_layers=cfg.layers - 1,
                num_attention_heads=16,
                projection_dim=cfg.width,
            ),
        )
    else:
        model = clip_text(cfg, True)
    converted = sfu.convert_open_clip_checkpoint(model, meta_tensors(rows), prefix=prefix)
    ref = shapes_of(model)
    ref.pop("text_model.embeddings.position_ids", None)
    if name == "sd2_checkpoint":
        del ref["text_projection.weight"]
    assert_same({k: tuple(v.shape) for k, v in converted.items()}, ref)


def test_t5xxl_matches_transformers_encoder():
    cfg = transformers.T5Config(
        vocab_size=32128,
        d_model=4096,
        d_kv=64,
        d_ff=10240,
        num_layers=24,
        num_heads=64,
        feed_forward_proj="gated-gelu",
        is_encoder_decoder=False,
    )
    ref = shapes_of(on_meta(transformers.T5EncoderModel, cfg))
    mine = shapes(synth.layout("t5xxl", embed_tokens="encoder.embed_tokens.weight" in ref))
    assert_same(mine, ref)


# --- FLUX.1 ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,cfg",
    [
        ("flux1_schnell_transformer", F.FLUX_SCHNELL),
        ("flux1_fill_transformer", F.FLUX_FILL),
        ("flux1_depth_transformer", F.FLUX_DEPTH),
    ],
)
def test_flux_bfl_layouts_convert_to_diffusers(name, cfg):
    model = on_meta(
        diffusers.FluxTransformer2DModel,
        in_channels=cfg.in_channels,
        out_channels=cfg.out_channels,
        guidance_embeds=cfg.guidance_embed,
    )
    converted = sfu.convert_flux_transformer_checkpoint_to_diffusers(meta_tensors(synth.layout(name)))
    assert_same({k: tuple(v.shape) for k, v in converted.items()}, shapes_of(model))


def test_flux_diffusers_naming_matches_diffusers():
    for name, cfg in (
        ("flux1_dev_transformer_diffusers", F.FLUX_DEV),
        ("flux1_schnell_transformer_diffusers", F.FLUX_SCHNELL),
    ):
        model = on_meta(diffusers.FluxTransformer2DModel, guidance_embeds=cfg.guidance_embed)
        assert_same(shapes(synth.layout(name)), shapes_of(model))


# --- SD3 / SD3.5 ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arch,cfg", [("sd3_medium", M.SD3_MEDIUM), ("sd3.5_large", M.SD35_LARGE), ("sd3.5_medium", M.SD35_MEDIUM)]
)
def test_mmdit_layouts_match_diffusers(arch, cfg):
    model = on_meta(
        diffusers.SD3Transformer2DModel,
        sample_size=128,
        num_layers=cfg.depth,
        num_attention_heads=cfg.depth,
        attention_head_dim=cfg.head_dim,
        caption_projection_dim=cfg.hidden,
        pos_embed_max_size=cfg.pos_embed_max_size,
        dual_attention_layers=cfg.dual_attention_layers,
        qk_norm="rms_norm" if cfg.qk_norm else None,
    )
    ref = shapes_of(model)
    assert_same(shapes(synth.layout(f"{arch}_transformer_diffusers")), ref)
    native = meta_tensors(synth.layout(arch, clip=False, t5xxl=False, vae=False))
    n = len(native)
    converted = sfu.convert_sd3_transformer_checkpoint_to_diffusers(native)
    assert not native, f"{len(native)} of our {n} keys were not converted: {list(native)[:4]}"
    assert_same({k: tuple(v.shape) for k, v in converted.items()}, ref)


def test_sd3_single_file_text_encoders_are_clip_with_projection_and_t5():
    rows = synth.layout("sd3_medium")
    for comp, cfg in (("clip_l", T.CLIP_L), ("clip_g", T.CLIP_G)):
        assert_same(shapes(rows, f"text_encoders.{comp}.transformer."), shapes_of(clip_text(cfg, True)))
    assert shapes(rows, "text_encoders.t5xxl.transformer.") == shapes(synth.layout("t5xxl"))


@pytest.mark.parametrize("fam", ["taesd", "taesd3", "taef2"])
def test_taesd_family_diffusers_naming_matches_autoencoder_tiny(fam):
    from tests.support.synth.taesd import FAMILY

    rows = synth.layout(f"{fam}_diffusers")
    if fam == "taef2":  # AutoencoderTiny has no pool branch; the rest of the layout must still agree
        rows = [r for r in rows if ".pool." not in r[0]]
    model = on_meta(diffusers.AutoencoderTiny, latent_channels=FAMILY[fam])
    assert_same(shapes(rows), shapes_of(model))
    # the separate taesd.py files are the same stacks: encoder indices equal, decoder indices one higher
    both = shapes(synth.layout(f"{fam}_diffusers"))
    enc = shapes(synth.layout(f"{fam}_encoder"))
    assert {k: s for k, s in both.items() if k.startswith("encoder.")} == {
        f"encoder.layers.{k}": s for k, s in enc.items()
    }
    dec = shapes(synth.layout(f"{fam}_decoder"))
    shifted = {
        "decoder.layers.{}.{}".format(int(k.split(".", 1)[0]) - 1, k.split(".", 1)[1]): s
        for k, s in dec.items()
    }
    assert {k: s for k, s in both.items() if k.startswith("decoder.")} == shifted


def test_flux2_bfl_layout_converts_to_diffusers():
    converted = sfu.convert_flux2_transformer_checkpoint_to_diffusers(
        meta_tensors(synth.layout("flux2_dev_transformer"))
    )
    assert_same(
        {k: tuple(v.shape) for k, v in converted.items()},
        shapes_of(on_meta(diffusers.Flux2Transformer2DModel)),
    )


def test_flux2_vae_matches_diffusers():
    model = on_meta(diffusers.AutoencoderKLFlux2)
    assert_same(shapes(synth.layout("flux2_vae_diffusers")), shapes_of(model))
    assert {d for k, d, _ in synth.layout("flux2_vae_diffusers") if k.startswith("bn.num_")} == {"I64"}


def test_chroma_bfl_layout_converts_to_diffusers():
    native = meta_tensors(synth.layout("chroma_transformer"))
    converted = sfu.convert_chroma_transformer_checkpoint_to_diffusers(native)
    assert not native, list(native)[:4]
    assert_same(
        {k: tuple(v.shape) for k, v in converted.items()},
        shapes_of(on_meta(diffusers.ChromaTransformer2DModel)),
    )
    assert "distilled_guidance_layer.in_proj.bias" in shapes(synth.layout("chroma_transformer"))
