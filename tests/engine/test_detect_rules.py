"""Detection rules as pure functions over keys and shapes (no files): one small hand-written layout per
rule, built the way the architectures are built (see the citations in engine/detect/*.py)."""

from __future__ import annotations

import pytest

from engine.detect import KINDS, detect_index, index_from_shapes

MDM = "model.diffusion_model."


def unet(ctx: int, *, adm: int | None = None, in_ch: int = 4, mc: int = 320, prefix: str = MDM, video=False):
    """The keys an LDM UNet's rules look at (plus a few bystanders)."""
    k = {
        f"{prefix}input_blocks.0.0.weight": (mc, in_ch, 3, 3),
        f"{prefix}input_blocks.0.0.bias": (mc,),
        f"{prefix}time_embed.0.weight": (mc * 4, mc),
        f"{prefix}input_blocks.1.0.in_layers.0.weight": (mc,),
        f"{prefix}input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight": (mc * 2, ctx),
        f"{prefix}input_blocks.4.1.proj_in.weight": (mc * 2, mc * 2),
        f"{prefix}middle_block.1.transformer_blocks.0.attn2.to_k.weight": (mc * 4, ctx),
        f"{prefix}output_blocks.11.1.transformer_blocks.0.norm1.bias": (mc,),
        f"{prefix}out.2.weight": (4, mc, 3, 3),
    }
    if adm:
        k[f"{prefix}label_emb.0.0.weight"] = (mc * 4, adm)
    if video:
        k[f"{prefix}input_blocks.4.1.time_stack.0.attn1.to_q.weight"] = (mc * 2, mc * 2)
    return k


def clip_l(prefix: str, width: int = 768, layers: int = 12):
    k = {f"{prefix}text_model.embeddings.token_embedding.weight": (49408, width)}
    for i in range(layers):
        k[f"{prefix}text_model.encoder.layers.{i}.layer_norm1.weight"] = (width,)
        k[f"{prefix}text_model.encoder.layers.{i}.self_attn.q_proj.weight"] = (width, width)
    return k


def open_clip(prefix: str, width: int, layers: int = 2):
    k = {f"{prefix}token_embedding.weight": (49408, width), f"{prefix}positional_embedding": (77, width)}
    for i in range(layers):
        k[f"{prefix}transformer.resblocks.{i}.ln_1.weight"] = (width,)
        k[f"{prefix}transformer.resblocks.{i}.attn.in_proj_weight"] = (3 * width, width)
    return k


def vae(prefix: str, z: int = 4, diffusers=False):
    mid = "decoder.mid_block.resnets.0.conv1.weight" if diffusers else "decoder.mid.block_1.conv1.weight"
    return {
        f"{prefix}decoder.conv_in.weight": (512, z, 3, 3),
        f"{prefix}{mid}": (512, 512, 3, 3),
        f"{prefix}encoder.conv_out.weight": (2 * z, 512, 3, 3),
    }


def det(shapes, metadata=None, **kw):
    d = detect_index(index_from_shapes(shapes, metadata, **kw))
    assert d.to_json()["components"], "every key must land in a component"
    return d


@pytest.mark.parametrize(
    "ctx, adm, arch",
    [(768, None, "sd1"), (1024, None, "sd2"), (2048, 2816, "sdxl"), (1280, 2560, "sdxl_refiner")],
)
@pytest.mark.parametrize("prefix", [MDM, "", "model.", "diffusion_model."])
def test_unet_architecture_from_context_and_adm(ctx, adm, arch, prefix):
    d = det(unet(ctx, adm=adm, prefix=prefix))
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", arch, "normal")
    assert d.components["unet"].prefix == prefix
    assert any(f"context {ctx}" in e.reason and e.shape[1] == ctx for e in d.evidence)


def test_unknown_context_is_null_not_a_guess():
    d = det(unet(4096))
    assert d.architecture is None and d.variant is None and d.prediction is None
    assert any("4096" in e.reason for e in d.evidence)


@pytest.mark.parametrize("in_ch, variant", [(9, "inpaint"), (8, "pix2pix"), (4, "normal")])
def test_unet_variants_from_input_channels(in_ch, variant):
    assert det(unet(768, in_ch=in_ch)).variant == variant


def test_sd2_depth_unclip_and_svd():
    assert det(unet(1024, in_ch=5)).variant == "depth"
    depth = det({**unet(1024, in_ch=4), "depth_model.model.pretrained.layer1.0.weight": (96, 3, 16, 16)})
    assert depth.variant == "depth" and depth.components["other"].tensors == 1
    assert det(unet(1024, adm=1536)).variant == "unclip"
    svd = det(unet(1024, adm=768, in_ch=8, video=True))
    assert (svd.architecture, svd.variant, svd.prediction) == ("svd", "normal", "v")


def test_prediction_only_where_the_header_says_it():
    assert det(unet(768)).prediction == "eps"
    assert det(unet(1024)).prediction is None  # SD2 512-base (eps) and 768-v share the layout
    assert det(unet(1024, in_ch=9)).prediction == "eps"
    sdxl = unet(2048, adm=2816)
    assert det(sdxl).prediction == "eps"  # no v_pred / edm_vpred marker: SDXL's default
    assert det({**sdxl, "v_pred": (0,), "ztsnr": (0,)}).prediction == "v"
    assert det({**sdxl, "edm_vpred.sigma_max": (), "edm_vpred.sigma_min": ()}).prediction == "v"
    stated = det(unet(1024), {"modelspec.prediction_type": "v"})
    assert stated.prediction == "v"
    assert any(e.key == "__metadata__.modelspec.prediction_type" for e in stated.evidence)


def test_diffusers_unet_naming():
    k = {
        "conv_in.weight": (320, 4, 3, 3),
        "time_embedding.linear_1.weight": (1280, 320),
        "down_blocks.1.attentions.0.transformer_blocks.0.attn2.to_k.weight": (640, 2048),
        "add_embedding.linear_1.weight": (1280, 2816),
        "conv_out.weight": (4, 320, 3, 3),
    }
    d = det(k)
    assert (d.kind, d.architecture, d.components["unet"].tensors) == ("diffusion_model", "sdxl", 5)
    assert det({**k, "conv_in.weight": (320, 9, 3, 3)}).variant == "inpaint"


def mmdit(depth: int, hidden: int, *, prefix=MDM, x_attn2=(), qk_norm=False):
    k = {f"{prefix}x_embedder.proj.weight": (hidden, 16, 2, 2), f"{prefix}pos_embed": (1, 36864, hidden)}
    for i in range(depth):
        k[f"{prefix}joint_blocks.{i}.context_block.attn.qkv.weight"] = (3 * hidden, hidden)
        k[f"{prefix}joint_blocks.{i}.x_block.attn.qkv.weight"] = (3 * hidden, hidden)
        if qk_norm:
            k[f"{prefix}joint_blocks.{i}.x_block.attn.ln_q.weight"] = (64,)
    for i in x_attn2:
        k[f"{prefix}joint_blocks.{i}.x_block.attn2.qkv.weight"] = (3 * hidden, hidden)
    return k


def test_mmdit_family():
    assert det(mmdit(24, 1536)).architecture == "sd3"
    assert det(mmdit(38, 2432, qk_norm=True)).architecture == "sd3.5_large"
    med = det(mmdit(24, 1536, x_attn2=range(13), qk_norm=True, prefix=""))
    assert (med.architecture, med.prediction, med.kind) == ("sd3.5_medium", "flow", "diffusion_model")
    odd = det(mmdit(30, 1920))
    assert odd.architecture is None and odd.prediction == "flow"


def test_mmdit_checkpoint_with_three_text_encoders():
    k = {
        **mmdit(24, 1536),
        **clip_l("text_encoders.clip_l.transformer."),
        **clip_l("text_encoders.clip_g.transformer.", 1280, 32),
        "text_encoders.t5xxl.transformer.encoder.block.0.layer.0.SelfAttention.q.weight": (4096, 4096),
        "text_encoders.t5xxl.transformer.encoder.final_layer_norm.weight": (4096,),
        **vae("first_stage_model.", 16),
    }
    d = det(k, dtype="BF16")
    assert d.kind == "checkpoint" and d.architecture == "sd3"
    assert set(d.components) == {"transformer", "clip_l", "clip_g", "t5xxl", "vae"}
    assert d.components["t5xxl"].prefix == "text_encoders.t5xxl.transformer."


def flux(prefix="", *, guidance=True, img_in=64, flux2=False):
    """The keys of one double and one single block as BFL's layers.py lays them out (FLUX.1: biased qkv and
    a modulation per block; FLUX.2: neither, one shared modulation), plus the stem the rules read."""
    h = 6144 if flux2 else 3072
    k = {f"{prefix}img_in.weight": (h, 128 if flux2 else img_in)}
    for s in ("img", "txt"):
        k[f"{prefix}double_blocks.0.{s}_attn.qkv.weight"] = (3 * h, h)
        k[f"{prefix}double_blocks.0.{s}_attn.norm.key_norm.scale"] = (128,)
        if not flux2:
            k[f"{prefix}double_blocks.0.{s}_attn.qkv.bias"] = (3 * h,)
            k[f"{prefix}double_blocks.0.{s}_mod.lin.weight"] = (6 * h, h)
    k[f"{prefix}single_blocks.0.linear1.weight"] = (21504, 3072)
    k[f"{prefix}single_blocks.0.linear2.weight"] = (3072, 15360)
    if guidance:
        k[f"{prefix}guidance_in.in_layer.weight"] = (h, 256)
    if flux2:
        k[f"{prefix}double_stream_modulation_img.lin.weight"] = (36864, 6144)
    else:
        k[f"{prefix}single_blocks.0.modulation.lin.weight"] = (9216, 3072)
    return k


def test_flux_family():
    assert det(flux()).architecture == "flux1_dev"
    assert det(flux(guidance=False)).architecture == "flux1_schnell"
    assert det(flux(MDM)).components["transformer"].prefix == MDM
    assert det(flux(img_in=384)).variant == "fill"
    assert det(flux(img_in=128)).variant == "control"  # Depth and Canny share the 128-wide img_in
    assert det(flux(flux2=True, guidance=False)).architecture == "flux2"
    # fp8 weights (plain, without scales) are still a FLUX.1 dev diffusion model, loadable
    fp8 = det({k: ("F8_E4M3", s) for k, s in flux().items()})
    assert fp8.architecture == "flux1_dev" and fp8.error is None
    assert fp8.components["transformer"].dtype == "F8_E4M3"


def test_diffusers_flux_naming():
    k = {
        "x_embedder.weight": (3072, 64),
        "transformer_blocks.0.attn.to_q.weight": (3072, 3072),
        "transformer_blocks.0.attn.add_q_proj.weight": (3072, 3072),
        "transformer_blocks.0.attn.norm_added_k.weight": (128,),
        "transformer_blocks.0.norm1.linear.weight": (18432, 3072),
        "transformer_blocks.0.ff.net.0.proj.weight": (12288, 3072),
        "single_transformer_blocks.0.proj_out.weight": (3072, 15360),
    }
    assert det(k).architecture == "flux1_schnell"
    assert (
        det({**k, "time_text_embed.guidance_embedder.linear_1.weight": (3072, 256)}).architecture
        == "flux1_dev"
    )


def test_other_dits():
    aura = det(
        {"model.double_layers.0.attn.w1q.weight": (3072, 3072), "model.cond_seq_linear.weight": (3072, 2048)}
    )
    assert (aura.architecture, aura.prediction, aura.components["transformer"].prefix) == (
        "auraflow",
        "flow",
        "model.",
    )
    hy = det({"mlp_t5.0.weight": (4096, 2048), "blocks.0.attn1.qkv.weight": (4224, 1408)})
    assert hy.architecture == "hunyuan_dit"
    pix = det(
        {
            "t_block.1.weight": (6912, 1152),
            "y_embedder.y_proj.fc1.weight": (1152, 4096),
            "blocks.0.cross_attn.q_linear.weight": (1152, 1152),
            "blocks.0.mlp.fc1.weight": (4608, 1152),
        }
    )
    assert pix.architecture == "pixart"
    c = det({"clf.1.weight": (16, 2048, 1, 1), "clip_txt_mapper.weight": (8192, 1280)})
    assert c.architecture == "stable_cascade_c"
    b = det({"clf.1.weight": (16, 1280, 1, 1), "clip_mapper.weight": (5120, 1280)})
    assert b.architecture == "stable_cascade_b"


def test_ema_copies_do_not_confuse_and_go_to_other():
    k = {**unet(768), **clip_l("cond_stage_model.transformer."), **vae("first_stage_model.")}
    k["model_ema.diffusion_modelinput_blocks00weight"] = (320, 4, 3, 3)
    k["model_ema.decay"] = ()
    d = det(k)
    assert (d.kind, d.architecture) == ("checkpoint", "sd1")
    assert d.components["other"].tensors == 2


def test_components_cover_every_key_and_sum_to_the_data_region():
    k = {**unet(2048, adm=2816), **clip_l("conditioner.embedders.0.transformer.")}
    k.update(open_clip("conditioner.embedders.1.model.", 1280))
    k.update(vae("first_stage_model."))
    k["alphas_cumprod"] = (1000,)
    ix = index_from_shapes(k)
    d = detect_index(ix)
    assert set(d.components) == {"unet", "clip_l", "clip_g", "vae", "other"}
    assert sum(c.tensors for c in d.components.values()) == len(k)
    assert sum(c.bytes for c in d.components.values()) == ix.data_size
    assert d.components["clip_g"].prefix == "conditioner.embedders.1.model."


@pytest.mark.parametrize(
    "shapes, comp",
    [
        (clip_l(""), "clip_l"),
        (clip_l("transformer.", 1280, 32), "clip_g"),
        (open_clip("", 1024), "clip_h"),
        (open_clip("", 1280), "clip_g"),
        (
            {"encoder.block.0.layer.0.SelfAttention.q.weight": (4096, 4096), "shared.weight": (32128, 4096)},
            "t5xxl",
        ),
    ],
)
def test_standalone_text_encoders(shapes, comp):
    d = det(shapes)
    assert (d.kind, d.architecture, list(d.components)) == ("text_encoder", None, [comp])


def test_other_t5_sizes_are_not_called_t5xxl():
    d = det({"encoder.block.0.layer.0.SelfAttention.q.weight": (2048, 2048), "shared.weight": (32128, 2048)})
    assert d.kind == "text_encoder" and list(d.components) == ["other"]


@pytest.mark.parametrize("z, arch", [(4, None), (16, None), (32, "flux2")])
@pytest.mark.parametrize("diffusers", [False, True])
def test_vae_channels(z, arch, diffusers):
    d = det(vae("", z, diffusers))
    assert (d.kind, d.architecture, list(d.components)) == ("vae", arch, ["vae"])
    assert any(f"{z} latent channels" in e.reason for e in d.evidence)


def taesd(prefix: str, z: int, decoder: bool):
    k = {}
    if decoder:
        k[f"{prefix}1.weight"] = (64, z, 3, 3)
        k[f"{prefix}19.weight"] = (3, 64, 3, 3)
    else:
        k[f"{prefix}0.weight"] = (64, 3, 3, 3)
        k[f"{prefix}14.weight"] = (z, 64, 3, 3)
    for c in (0, 2, 4):
        k[f"{prefix}3.conv.{c}.weight"] = (64, 64, 3, 3)
    return k


@pytest.mark.parametrize("prefix", ["", "decoder.layers.", "taesd_decoder."])
def test_taesd_family(prefix):
    d = det(taesd(prefix, 4, True))
    assert (d.kind, d.architecture) == ("vae_approx", None)
    assert det(taesd(prefix, 32, False)).architecture == "flux2"


def test_embeddings():
    assert det({"emb_params": (4, 768)}).architecture == "sd1"
    assert det({"string_to_param.*": (2, 1024)}).architecture == "sd2"
    xl = det({"clip_l": (8, 768), "clip_g": (8, 1280)})
    assert (xl.kind, xl.architecture) == ("embedding", "sdxl")


def test_controlnets_ip_adapters_clip_vision_upscalers():
    cn = {
        "control_model.input_hint_block.0.weight": (16, 3, 3, 3),
        "control_model.zero_convs.0.0.weight": (320, 320, 1, 1),
        "control_model.input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (320, 768),
        "control_model.input_blocks.0.0.weight": (320, 4, 3, 3),
        "control_model.time_embed.0.weight": (1280, 320),
    }
    d = det(cn)
    assert (d.kind, d.architecture) == ("controlnet", "sd1")
    dcn = det(
        {
            "controlnet_cond_embedding.conv_in.weight": (16, 3, 3, 3),
            "controlnet_down_blocks.0.weight": (320, 320, 1, 1),
            "add_embedding.linear_1.weight": (1280, 2816),
            "conv_in.weight": (320, 4, 3, 3),
            "time_embedding.linear_1.weight": (1280, 320),
        }
    )
    assert (dcn.kind, dcn.architecture) == ("controlnet", "sdxl")
    ip = det({"image_proj.proj.weight": (3072, 1024), "ip_adapter.1.to_k_ip.weight": (320, 2048)})
    assert (ip.kind, ip.architecture) == ("ip_adapter", "sdxl")
    cv = det(
        {
            "vision_model.post_layernorm.weight": (1280,),
            "vision_model.encoder.layers.0.layer_norm1.weight": (1280,),
            "visual_projection.weight": (1024, 1280),
        }
    )
    assert cv.kind == "clip_vision" and "ViT-H/14" in cv.evidence[0].reason
    up = det(
        {
            "conv_first.weight": (64, 3, 3, 3),
            "body.0.rdb1.conv1.weight": (32, 64, 3, 3),
            "conv_body.weight": (64, 64, 3, 3),
            "conv_last.weight": (3, 64, 3, 3),
        }
    )
    assert up.kind == "upscaler" and up.architecture is None


def test_lora_by_adapter_keys_and_its_facts():
    k = {
        "lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight": (4, 320),
        "lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": (320, 4),
        "lora_unet_down_blocks_0_attentions_0_proj_in.alpha": (),
    }
    d = det(k)
    assert d.kind == "lora" and d.lora is not None and d.lora.rank == 4


def test_a_model_with_a_few_adapter_names_is_still_a_model():
    k = {**unet(768), "lora_unet_x.lora_down.weight": (4, 320)}
    assert det(k).kind == "diffusion_model"


def test_quantized_models_are_named_and_loaded_or_refused_by_format():
    q = "double_blocks.0.img_attn.qkv"
    w = flux()[q + ".weight"]
    scaled = {
        **flux(),
        q + ".weight": ("F8_E4M3", w),
        q + ".scale_weight": ("F32", ()),
        "scaled_fp8": ("F8_E4M3", (0,)),
    }
    d = det(scaled)
    assert (d.kind, d.architecture, d.error) == ("diffusion_model", "flux1_dev", None)
    assert any("scaled_fp8 weights (1 layers)" in e.reason for e in d.evidence)
    cq = {
        **flux(),
        q + ".weight": ("F8_E4M3", w),
        q + ".weight_scale": ("F32", ()),
        q + ".comfy_quant": ("U8", (28,)),
    }
    assert det(cq).error is None
    int8 = {**cq, q + ".weight": ("I8", w)}
    assert det(int8).error is None and any("int8_tensorwise" in e.reason for e in det(int8).evidence)
    nvfp4 = {
        **flux(),
        q + ".weight": ("U8", (w[0], w[1] // 2)),
        q + ".weight_scale": ("F8_E4M3", (w[0], w[1] // 16)),
        q + ".weight_scale_2": ("F32", ()),
        q + ".comfy_quant": ("U8", (18,)),
    }
    d = det(nvfp4)
    assert d.architecture == "flux1_dev" and d.error.type == "unsupported" and "nvfp4" in d.error.message
    mx = {**cq, q + ".weight_scale": ("U8", (w[0], w[1] // 32))}
    assert "mxfp8" in det(mx).error.message
    nf4 = {**flux(MDM), f"{MDM}double_blocks.0.img_attn.qkv.weight.absmax": ("F32", (1024,))}
    d = det(nf4)
    assert d.architecture == "flux1_dev" and d.error.type == "unsupported" and "4-bit" in d.error.message
    g = det(flux(), format="gguf")
    # a GGUF of types engine.quant reads loads (one it cannot read: tests/e2e/test_scan_cli.py)
    assert g.architecture == "flux1_dev" and g.error is None


def test_no_tensors_is_a_format_error():
    d = detect_index(index_from_shapes({}))
    assert d.error.type == "format" and d.kind == "unknown"


def test_json_has_exactly_the_design_fields():
    j = det(unet(768)).to_json()
    assert list(j) == [
        "path", "file_bytes", "format", "kind", "architecture", "also", "variant", "prediction",
        "components", "lora", "metadata", "summary", "evidence", "error",
    ]  # fmt: skip
    assert set(j["components"]["unet"]) == {"prefix", "tensors", "params", "bytes", "dtype"}
    assert set(j["evidence"][0]) == {"key", "shape", "reason"}


# Fragments of real key names: random mixes hit the rules with missing keys, odd ranks and shapes.
_FRAGMENTS = [
    "model.diffusion_model.", "", "first_stage_model.", "conditioner.embedders.1.model.",
    "text_encoders.t5xxl.transformer.", "control_model.", "model_ema.",
]  # fmt: skip
_SUFFIXES = [
    "input_blocks.0.0.weight", "input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight", "out.2.weight",
    "label_emb.0.0.weight", "time_embed.0.weight", "joint_blocks.0.context_block.attn.qkv.weight",
    "x_embedder.proj.weight", "joint_blocks.3.x_block.attn2.qkv.weight", "img_in.weight",
    "double_blocks.0.img_attn.norm.key_norm.scale", "guidance_in.in_layer.weight",
    "double_stream_modulation_img.lin.weight", "decoder.conv_in.weight", "decoder.mid.block_1.conv1.weight",
    "text_model.encoder.layers.0.layer_norm1.weight", "transformer.resblocks.0.ln_1.weight", "ln_final.weight",
    "token_embedding.weight", "encoder.block.0.layer.0.SelfAttention.q.weight", "shared.weight",
    "input_hint_block.0.weight", "zero_convs.0.0.weight", "image_proj.proj.weight", "ip_adapter.1.to_k_ip.weight",
    "emb_params", "clip_l", "clip_g", "string_to_param.*", "0.weight", "1.weight", "3.conv.0.weight",
    "3.conv.2.weight", "3.conv.4.weight", "vision_model.post_layernorm.weight", "clf.1.weight",
    "clip_txt_mapper.weight", "mlp_t5.0.weight", "double_layers.0.attn.w1q.weight", "scaled_fp8",
    "x.lora_down.weight", "x.alpha", "conv_first.weight", "body.0.rdb1.conv1.weight", "v_pred",
]  # fmt: skip


def test_random_key_soups_never_crash():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    shapes = st.lists(st.integers(0, 5000), min_size=0, max_size=4).map(tuple)
    keys = st.tuples(st.sampled_from(_FRAGMENTS), st.sampled_from(_SUFFIXES)).map("".join)

    @settings(deadline=None, max_examples=300)
    @given(st.dictionaries(keys, shapes, min_size=1, max_size=25))
    def check(layout):
        ix = index_from_shapes(layout)
        d = detect_index(ix)
        assert d.kind in KINDS
        assert sum(c.tensors for c in d.components.values()) == len(layout)
        assert sum(c.bytes for c in d.components.values()) == ix.data_size
        d.to_json()

    check()


def test_detection_never_imports_torch():
    import subprocess
    import sys

    code = (
        "import sys; from engine.detect import detect_file, detect_index, index_from_shapes; "
        "import engine.cli.inspect; "
        "detect_index(index_from_shapes({'model.diffusion_model.input_blocks.0.0.weight': (320, 4, 3, 3)})); "
        "d = detect_file(sys.argv[1]); assert d.kind == 'lora', d; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    from loadout_test_support import data_file

    lokr = str(data_file("weights/smart_falcon_8_lokr.safetensors"))
    root = str(__import__("pathlib").Path(__file__).resolve().parents[2])
    r = subprocess.run([sys.executable, "-c", code, lokr], capture_output=True, text=True, cwd=root)
    assert r.returncode == 0, r.stderr


def test_more_namings():
    flux2 = {"x_embedder.weight": (6144, 128), "double_stream_modulation_img.linear.weight": (36864, 6144)}
    assert det(flux2).architecture == "flux2"
    chroma = {**flux(guidance=False), "distilled_guidance_layer.in_proj.weight": (5120, 64)}
    assert det(chroma).architecture == "chroma"
    sd35m = {
        "pos_embed.proj.weight": (1536, 16, 2, 2),
        **{f"transformer_blocks.{i}.attn.add_q_proj.weight": (1536, 1536) for i in range(24)},
        "transformer_blocks.0.attn2.to_q.weight": (1536, 1536),
    }
    assert det(sd35m).architecture == "sd3.5_medium"
    del sd35m["transformer_blocks.0.attn2.to_q.weight"]
    assert det(sd35m).architecture == "sd3"


def test_metadata_summary():
    md = {
        "modelspec.title": "My Model",
        "modelspec.architecture": "stable-diffusion-xl-v1-base",
        "modelspec.trigger_phrase": "mystyle",
        "ss_network_module": "networks.lora",
        "ss_network_dim": "16",
        "ss_network_alpha": "8.0",
        "ss_tag_frequency": '{"a": {"cat": 3, "dog": 1}, "b": {"cat": 2, " tree": 5}}',
        "ss_steps": "1200",
        "notes": "hello",
    }
    s = det(unet(768), md).summary
    assert s.modelspec == {
        "title": "My Model",
        "architecture": "stable-diffusion-xl-v1-base",
        "trigger_phrase": "mystyle",
    }
    t = s.training
    assert (t["network_dim"], t["network_alpha"], t["steps"]) == (16, 8.0, 1200)
    assert t["top_tags"] == (("cat", 5), ("tree", 5), ("dog", 1))
    assert s.other == {"notes": "hello"}
    assert not det(unet(768)).summary and det(unet(768)).to_json()["summary"] is None


def test_comfyui_clip_save_with_two_encoders():
    k = {**clip_l("clip_l.transformer."), **clip_l("clip_g.transformer.", 1280, 32)}
    k["clip_g.transformer.text_projection.weight"] = (1280, 1280)
    k["clip_l.logit_scale"] = ()
    d = det(k)
    assert d.kind == "text_encoder" and set(d.components) == {"clip_l", "clip_g"}
    assert d.components["clip_l"].tensors == 26  # the logit_scale beside the transformer included
    assert d.components["clip_g"].prefix == "clip_g.transformer."


def test_text_encoder_cut_from_a_checkpoint_keeps_its_ldm_prefix():
    d = det(open_clip("cond_stage_model.model.", 1024, 24))
    assert (d.kind, list(d.components)) == ("text_encoder", ["clip_h"])
    assert d.components["clip_h"].prefix == "cond_stage_model.model."


def test_wrapped_upscaler_old_clip_naming_and_flux_ip_adapter():
    up = {
        f"params_ema.{k}": (64, 64, 3, 3)
        for k in ("conv_first.weight", "body.0.rdb1.conv1.weight", "conv_body.weight", "conv_last.weight")
    }
    assert det(up).kind == "upscaler"
    old = {
        "cond_stage_model.transformer.embeddings.token_embedding.weight": (49408, 768),
        "cond_stage_model.transformer.encoder.layers.0.layer_norm1.weight": (768,),
    }
    d = det({**unet(768), **old})
    assert d.kind == "checkpoint" and d.components["clip_l"].tensors == 2
    ip = det(
        {
            "double_blocks.0.processor.ip_adapter_double_stream_k_proj.weight": (3072, 4096),
            "ip_adapter_proj_model.proj.weight": (16384, 768),
        }
    )
    assert ip.kind == "ip_adapter" and "FLUX.1" in ip.evidence[0].reason


def test_diffusers_token_embedding_and_vae_training_leftovers():
    d = det({"<cat-toy>": (768,)})
    assert (d.kind, d.architecture) == ("embedding", "sd1")
    v = det({**vae(""), "loss.logvar": (), "loss.discriminator.main.0.weight": (64, 3, 4, 4)})
    assert v.kind == "vae" and v.components["vae"].tensors == 3 and v.components["other"].tensors == 2


def test_metadata_architecture_is_a_claim_shown_beside_the_weights_verdict():
    d = det(unet(768), {"modelspec.architecture": "stable-diffusion-xl-v1-base"})
    assert d.architecture == "sd1"
    assert any("claims sdxl" in e.reason and "weights say sd1" in e.reason for e in d.evidence)
    d = det(unet(4096), {"modelspec.architecture": "flux-1-dev"})
    assert d.architecture is None and any("not confirmed" in e.reason for e in d.evidence)
    assert not any(
        "claims" in e.reason
        for e in det(unet(768), {"modelspec.architecture": "stable-diffusion-v1"}).evidence
    )


def _heads_one_by_one(keys):
    out = {}
    for k in keys:
        out.setdefault(k.partition(".")[0], []).append(k)
    return out


@pytest.mark.parametrize("order", ["sorted", "writer", "shuffled"])
def test_key_heads_group_every_key_in_the_files_order(order):
    """KeyIndex.heads groups a sorted run by bisection: the same groups, in the same order, as grouping key by
    key — for a sorted file, one in the order safetensors' writer leaves (by dtype, then name: sorted runs) and a
    shuffled one, with the awkward neighbours of `a.` (`a`, `a-x`, `a/`, `a_`, `.x`, a trailing dot)."""
    import random

    rng = random.Random(order)
    for _ in range(300):
        keys = sorted(
            {
                "".join(rng.choice("ab.-/_0") for _ in range(rng.randint(0, 7)))
                for _ in range(rng.randint(0, 40))
            }
        )
        if order == "writer":  # two dtypes, each sorted by name
            cut = rng.randint(0, len(keys))
            keys = sorted(keys[cut:]) + sorted(keys[:cut])
        elif order == "shuffled":
            rng.shuffle(keys)
        ix = index_from_shapes({k: (1,) for k in keys})
        want = _heads_one_by_one(keys)
        assert ix.heads == want and list(ix.heads) == list(want)


def test_suffix_questions_answer_as_a_test_of_every_key():
    """prefixes_for (in the file's order), count_ending and matches look only at a slice of the suffix index (the
    keys reversed and sorted); they answer exactly as testing every key would — with segments that sort around
    the dot, non-ASCII names and the last code point, where a prefix range's upper bound is built differently."""
    import random

    rng = random.Random(7)
    segs = ["a", "b", "w", "0", "1", "", "a-", "/", "é", "\U0010ffff"]
    for _ in range(400):
        keys = list(
            {".".join(rng.choice(segs) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 30))}
        )
        ix = index_from_shapes({k: (1,) for k in keys})
        for _ in range(6):
            suffix = ".".join(rng.choice(segs) for _ in range(rng.randint(1, 4)))
            n = len(suffix)
            want = [k[: len(k) - n] for k in keys if k.endswith(suffix) and (len(k) == n or k[-n - 1] == ".")]
            assert ix.prefixes_for(suffix) == want, (keys, suffix)
            assert ix.count_ending((f".{suffix}",)) == sum(k.endswith(f".{suffix}") for k in keys), (
                keys,
                suffix,
            )
            pattern = ".".join(
                "#" if s in ("0", "1") and rng.random() < 0.5 else s for s in suffix.split(".")
            )
            want_m = []
            for k in keys:
                got, w = k.split("."), pattern.split(".")
                if len(got) >= len(w) and all(
                    a == b or (a == "#" and b.isdigit()) for a, b in zip(w, got[-len(w) :], strict=True)
                ):
                    want_m.append((".".join(got[: -len(w)]) + "." if len(got) > len(w) else "", k))
            assert ix.matches(pattern) == want_m, (keys, pattern)
