"""A layout nobody knows is never guessed: a denoiser of unknown structure is a diffusion_model with
architecture null and the facts its keys show; a new size of a known block structure stays in its family."""

from __future__ import annotations

import pytest
from layouts_2026.common import Rows, detect

from engine.detect import KINDS


def _mystery(blocks=30, hidden=3072, patch=(2, 2), timestep=True) -> Rows:
    r = Rows()
    r.conv("x_embedder.proj", hidden, 16, patch)
    if timestep:
        r.lin("t_embedder.mlp.0", hidden, 256)
    for i in range(blocks):
        r.lin(f"blocks.{i}.attn.qkv", 3 * hidden, hidden)
        r.lin(f"blocks.{i}.attn.proj", hidden, hidden)
        r.lin(f"blocks.{i}.mlp.fc1", 4 * hidden, hidden)
        r.lin(f"blocks.{i}.mlp.fc2", hidden, 4 * hidden)
    return r


def test_an_unknown_denoiser_is_null_with_its_shape_in_the_evidence():
    d = detect(_mystery().under("model.diffusion_model."))
    assert (d.kind, d.architecture, d.variant, d.also) == ("diffusion_model", None, None, ())
    assert [e.reason for e in d.evidence] == [
        "transformer, 30 blocks, hidden 3072, patch 2×2: no known release"
    ]
    assert d.components["transformer"].prefix == "model.diffusion_model."


def test_attention_blocks_without_a_timestep_are_no_denoiser():
    assert detect(_mystery(timestep=False)).kind == "unknown"


def _small_layouts() -> list[dict]:
    from layouts_2026 import image as I
    from layouts_2026 import parts as P
    from layouts_2026 import video as V

    return [
        V.wan_original(V.WAN21_I2V_14B.with_(layers=3, flf=True)),
        V.wan_original(V.WAN21_VACE_1_3B.with_(layers=4, vace_layers=(0, 2))),
        V.hunyuan(V.HUNYUAN_VIDEO.with_(double=2, single=2), "tencent"),
        V.hunyuan(V.HUNYUAN_VIDEO15.with_(double=2)),
        V.mochi_original(3),
        V.cosmos_original(V.ANIMA.with_(layers=2)),
        I.flux_bfl(I.CHROMA.with_(depth=2, single=2)),
        I.flux_bfl(I.FLUX2_KLEIN_4B.with_(depth=2, single=2)),
        I.nextdit_original(I.Z_IMAGE.with_(layers=2)),
        I.sana_original(I.SANA_600M.with_(layers=3)),
        I.krea2_original(I.Krea2Config(layers=2)),
        P.wan_vae_original("2.2"),
        P.mochi_vae_decoder(),
        P.umt5_wan(2),
    ]


def test_random_parts_of_2026_layouts_never_crash():
    """Any subset of real keys, under any prefix, with shapes bent: an answer (maybe null), never a crash."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    layouts = _small_layouts()

    @settings(max_examples=150)
    @given(
        st.integers(0, len(layouts) - 1),
        st.randoms(use_true_random=False),
        st.sampled_from(["", "model.diffusion_model.", "net.", "vae.", "text_encoders.x.transformer."]),
    )
    def check(which, rnd, prefix):
        rows = layouts[which]
        keys = rnd.sample(sorted(rows), k=rnd.randint(1, min(len(rows), 60)))
        shapes = {}
        for k in keys:
            shape = list(rows[k])
            if shape and rnd.random() < 0.2:
                shape[rnd.randrange(len(shape))] = rnd.choice([1, 3, 7, 4096])
            shapes[prefix + k] = tuple(shape)
        d = detect(shapes)
        assert d.kind in KINDS and d.to_json()["also"] == list(d.also)
        assert sum(c.tensors for c in d.components.values()) == len(shapes)

    check()


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")


@pytest.mark.parametrize(
    "cls",
    [
        # (Ovis-Image, LongCat-Image, Bria 3.2 and FIBO, once here, have their rule: flux_likes.py)
        # PixArt's blocks at 2304 wide, a video model: once PixArt
        "AllegroTransformer3DModel",
        # (Motif-Video, FLUX-style video blocks once read as HunyuanVideo, has its rule: flux_likes.py)
        # (Sana's blocks under a 3-D patch embedding, once Sana: SANA-Video and SANA-WM are dits_2026.py's, as is
        # Bria FIBO 2, NextDiT blocks with a perceiver once read as Z-Image)
    ],
)
def test_structures_no_rule_knows_are_never_guessed(cls):
    from layouts_2026.common import meta_shapes

    d = detect(meta_shapes(getattr(diffusers, cls)))
    assert (d.kind, d.architecture) == ("diffusion_model", None), d.evidence
    assert "no known release" in d.evidence[0].reason


@pytest.mark.parametrize("cls", ["AutoencoderKLCogVideoX", "AutoencoderKLKVAEVideo"])
def test_video_vaes_no_rule_knows_are_never_guessed(cls):
    """Causal 3-D VAEs of 16 latent channels that are not HunyuanVideo's (CogVideoX's and Kandinsky's KVAE
    decoders, their norms conditioned on the latent): once read as the HunyuanVideo VAE, whose scaling
    they lack."""
    from layouts_2026.common import meta_shapes

    d = detect(meta_shapes(getattr(diffusers, cls)))
    assert (d.kind, d.architecture) == ("vae", None), d.evidence
    assert "not HunyuanVideo's" in " ".join(e.reason for e in d.evidence)


@pytest.mark.parametrize(
    ("cls", "config", "marker"),
    [
        ("UNet3DConditionModel", {}, "text-to-video UNet"),  # ModelScope: SD2's context width
        ("I2VGenXLUNet", {}, "text-to-video UNet"),  # once SD2 pix2pix (8 input channels)
        ("UNetMotionModel", {"cross_attention_dim": 768}, "AnimateDiff"),  # once SD1
    ],
)
def test_video_unets_on_image_blocks_are_not_the_image_model(cls, config, marker):
    """Temporal layers beside an SD1 / SD2 UNet's blocks: the context width alone named the image model,
    whose forward would skip every temporal layer."""
    from layouts_2026.common import meta_shapes

    d = detect(meta_shapes(getattr(diffusers, cls), **config))
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", None, None), d.evidence
    assert marker in d.evidence[0].reason and "no known release" in d.evidence[0].reason


def test_animatediff_files_say_what_they_are():
    from layouts_2026.common import meta_shapes

    d = detect(meta_shapes(diffusers.SparseControlNetModel))  # once an SD1 diffusion model
    assert (d.kind, d.architecture) == ("controlnet", "sd1")
    assert any("SparseCtrl" in e.reason for e in d.evidence)
    sd15 = detect(meta_shapes(diffusers.MotionAdapter))  # motion modules alone: no model of their own
    sdxl = detect(meta_shapes(diffusers.MotionAdapter, block_out_channels=(320, 640, 1280)))
    for d, base in ((sd15, "SD1.5's UNet"), (sdxl, "SDXL's UNet")):
        assert (d.kind, d.architecture) == ("unknown", None)
        assert f"AnimateDiff motion modules for {base}" in d.evidence[0].reason


def test_wan_and_hunyuan_derivatives_are_named_as_what_they_add():
    from layouts_2026.common import meta_shapes

    small = {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 2}  # Wan 2.1 1.3B's width
    anyflow = detect(meta_shapes(diffusers.AnyFlowTransformer3DModel, **small))
    far = detect(meta_shapes(diffusers.AnyFlowFARTransformer3DModel, **small))
    assert (anyflow.architecture, anyflow.variant) == ("wan21", "anyflow-1.3b")
    assert (far.architecture, far.variant) == ("wan21", "anyflow_far-1.3b")
    helios = detect(meta_shapes(diffusers.HeliosTransformer3DModel, **small))
    assert (helios.kind, helios.architecture, helios.variant) == ("diffusion_model", None, None)
    assert "Helios" in helios.evidence[0].reason
    framepack = diffusers.HunyuanVideoFramepackTransformer3DModel
    d = detect(
        meta_shapes(
            framepack, num_layers=1, num_single_layers=1, has_image_proj=True, has_clean_x_embedder=True
        )
    )
    assert (d.architecture, d.variant) == ("hunyuan_video", "framepack")


@pytest.mark.parametrize(
    ("cls", "config", "why"),
    [
        ("AutoencoderKLKVAE", {}, "conditioned on the latent"),  # once the SD3 / FLUX.1 VAE
        ("AutoencoderKLAllegro", {}, "temporal convolutions"),  # once the SD VAE
    ],
)
def test_vaes_that_are_no_autoencoderkl_are_not_named_for_one(cls, config, why):
    from layouts_2026.common import meta_shapes

    d = detect(meta_shapes(getattr(diffusers, cls), **config))
    assert (d.kind, d.architecture) == ("vae", None), d.evidence
    assert why in d.evidence[0].reason and "→ SD" not in d.evidence[0].reason


def test_adapters_and_controlnets_of_other_families_say_what_they_are():
    from layouts_2026.common import meta_shapes

    def adapter(**config):
        return detect(meta_shapes(diffusers.T2IAdapter, **config))

    # diffusers' T2IAdapter (once an unknown file): a ControlNet-kind hint encoder, SDXL's unshuffles by 16
    sd, light, xl = (
        adapter(),
        adapter(adapter_type="light_adapter"),
        adapter(adapter_type="full_adapter_xl", downscale_factor=16),
    )
    assert [(d.kind, d.architecture) for d in (sd, light, xl)] == [
        ("controlnet", None), ("controlnet", None), ("controlnet", "sdxl")
    ]  # fmt: skip
    assert all("T2I-Adapter" in d.evidence[0].reason for d in (sd, light, xl))
    # TencentARC's own naming (ldm/modules/encoders/adapter.py): `conv_in`, `body.N.block1/2`
    original = {"conv_in.weight": (320, 192, 3, 3), "body.0.block1.weight": (320, 320, 3, 3),
                "body.0.block2.weight": (320, 320, 3, 3), "body.2.in_conv.weight": (640, 320, 1, 1)}  # fmt: skip
    assert detect(original).kind == "controlnet"
    redux = detect(meta_shapes(diffusers.ReduxImageEncoder))  # FLUX.1 Redux: a style model
    assert redux.kind == "unknown" and "FLUX.1 Redux" in redux.evidence[0].reason
    qwen = detect(meta_shapes(diffusers.QwenImageControlNetModel, num_layers=2))  # once "over FLUX.1 blocks"
    assert qwen.kind == "controlnet" and "Qwen-Image" in qwen.evidence[0].reason
    cosmos = detect(meta_shapes(diffusers.CosmosControlNetModel))  # once a diffusion model
    assert cosmos.kind == "controlnet" and "Cosmos" in cosmos.evidence[0].reason


def test_svds_temporal_vae_is_named_and_refused_by_decode_for_what_it_is(tmp_path):
    """Stable Video Diffusion's VAE in diffusers' naming (once an unknown file); its temporal decoder is
    no AutoencoderKL's, so decode says so instead of listing unexpected keys."""
    from layouts_2026.common import meta_shapes
    from safetensors.torch import save_file

    from engine.errors import UnsupportedModel
    from engine.vae.loading import load_vae

    d = detect(meta_shapes(diffusers.AutoencoderKLTemporalDecoder))
    assert (d.kind, d.architecture) == ("vae", "svd")
    assert "Stable Video Diffusion's VAE" in d.evidence[0].reason
    small = diffusers.AutoencoderKLTemporalDecoder(block_out_channels=(32,), layers_per_block=1,
                                                   down_block_types=("DownEncoderBlock2D",))  # fmt: skip
    path = tmp_path / "svd_vae.safetensors"
    save_file({k: v.contiguous() for k, v in small.state_dict().items()}, str(path))
    with pytest.raises(UnsupportedModel, match="temporal layers in the decoder"):
        load_vae(path)
