"""The DC-AE (Sana's and PRX's VAE, engine.vae.dc_ae) against diffusers' AutoencoderDC on the same random
weights: a reduced config shaped like the f32c32 release (six stages, 32x: ResBlocks in the first three,
EfficientViT blocks with one 5x5 multi-scale kernel in the last three, a stride-2 conv down, an
interpolating up block) at tiny widths."""

from __future__ import annotations

import diffusers
import pytest
import torch
from safetensors.torch import save_file

from engine.errors import FormatError, UnsupportedModel
from engine.vae.loading import load_vae

Z = 8
SMALL = dict(
    latent_channels=Z,
    attention_head_dim=4,
    encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
    decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
    encoder_block_out_channels=(4, 8, 8, 16, 16, 16),
    decoder_block_out_channels=(4, 8, 8, 16, 16, 16),
    encoder_layers_per_block=(1, 1, 1, 1, 1, 1),
    decoder_layers_per_block=(2, 1, 1, 1, 1, 2),
    encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
    decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
    downsample_block_type="conv",
    upsample_block_type="interpolate",
    scaling_factor=0.41407,
)
# dc-ae-f32c32-sana-1.0's config (diffusers `scripts/convert_dcae_to_diffusers.py` get_ae_config)
RELEASE = dict(
    SMALL,
    latent_channels=32,
    attention_head_dim=32,
    encoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
    decoder_block_out_channels=(128, 256, 512, 512, 1024, 1024),
    encoder_layers_per_block=(2, 2, 2, 3, 3, 3),
    decoder_layers_per_block=(3, 3, 3, 3, 3, 3),
)


@pytest.fixture(scope="module")
def dc(tmp_path_factory):
    torch.manual_seed(0)
    ref = diffusers.AutoencoderDC(**SMALL).eval()
    with torch.no_grad():  # RMSNorm's unit weights and zero biases: perturbed, so each one counts
        for p in ref.parameters():
            p.add_(0.2 * torch.randn_like(p))
    path = tmp_path_factory.mktemp("dcae") / "dc-ae.safetensors"
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return ref, str(path), load_vae(path)


def test_the_config_is_read_off_the_shapes(dc):
    _, _, vae = dc
    cfg = vae.cfg
    assert (vae.latent_channels, vae.downscale, vae.image_range) == (Z, 32, (-1.0, 1.0))
    assert cfg.decoder.widths == SMALL["decoder_block_out_channels"]
    assert cfg.decoder.layers == SMALL["decoder_layers_per_block"]
    assert cfg.decoder.kinds == ("res",) * 3 + ("vit",) * 3 and cfg.decoder.scales[3:] == ((5,),) * 3
    assert cfg.encoder.layers == SMALL["encoder_layers_per_block"]
    assert (cfg.head_dim, cfg.up_interpolate, cfg.down_conv, cfg.expand) == (4, True, True, 4)


def test_decode_and_encode_equal_diffusers(dc):
    ref, _, vae = dc
    torch.manual_seed(1)
    z = torch.randn(1, Z, 3, 4)
    x = torch.rand(1, 3, 96, 64) * 2 - 1
    with torch.no_grad():
        want, got = ref.decode(z).sample, vae.decode(z)
        assert got.shape == (1, 3, 96, 128)
        assert (want - got).abs().max() <= 1e-4 * max(1.0, want.abs().max())
        want, got = ref.encode(x).latent, vae.encode(x)
        assert got.shape == (1, Z, 3, 2)
        assert (want - got).abs().max() <= 1e-4 * max(1.0, want.abs().max())
        # a latent of at most head_dim pixels: diffusers' quadratic attention at the deepest stages
        z = torch.randn(2, Z, 1, 2)
        assert (ref.decode(z).sample - vae.decode(z)).abs().max() <= 1e-4


def test_the_tiled_decode_equals_the_whole_one(dc):
    from engine.vae.run import RunInfo, decode

    _, _, vae = dc
    torch.manual_seed(2)
    z = torch.randn(1, Z, 7, 9)
    info = RunInfo()
    whole = decode(vae, z, tiled=False)
    tiled = decode(vae, z, tiled=True, tile=64, overlap=32, budget=1 << 34, info=info)
    assert info.mode == "tiled" and info.tiles > 4
    assert (whole - tiled).abs().max() <= 1e-5
    # the attention stages ran whole: the tiles start at the first conv-only stage, 4x the latent
    assert vae.head_scale == 4


def test_a_missing_key_is_named_and_a_variant_refused(dc, tmp_path):
    ref, _, _ = dc
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    cut = dict(sd)
    del cut["decoder.up_blocks.4.1.attn.to_out.weight"]
    save_file(cut, str(tmp_path / "cut.safetensors"))
    with pytest.raises(FormatError, match=r"decoder\.up_blocks\.4\.1\.attn\.to_out\.weight"):
        load_vae(tmp_path / "cut.safetensors")
    # the ImageNet in / mix releases: BatchNorm ResBlocks, no first-stage blocks (get_ae_config)
    mix = diffusers.AutoencoderDC(
        latent_channels=Z, attention_head_dim=4, encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 16),
        decoder_block_out_channels=(8, 16), encoder_layers_per_block=(0, 1), decoder_layers_per_block=(0, 1),
        encoder_qkv_multiscales=((), ()), decoder_qkv_multiscales=((), ()),
        decoder_norm_types=("batch_norm", "rms_norm"), decoder_act_fns=("relu", "silu"),
    )  # fmt: skip
    save_file({k: v.contiguous() for k, v in mix.state_dict().items()}, str(tmp_path / "mix.safetensors"))
    with pytest.raises(UnsupportedModel, match="'in' / 'mix'"):
        load_vae(tmp_path / "mix.safetensors")


def test_the_release_layout_is_detected_from_its_header(tmp_path, monkeypatch):
    from layouts_2026.common import meta_shapes

    from engine.detect.file import detect_file
    from engine.formats.safetensors import SafetensorsFile, write_sparse

    rows = meta_shapes(diffusers.AutoencoderDC, **RELEASE)
    path = write_sparse(
        tmp_path / "dc-ae-f32c32-sana-1.1.safetensors", [(k, "F32", s) for k, s in rows.items()]
    )

    def no_data(*a, **k):
        raise AssertionError("detection read tensor data")

    monkeypatch.setattr(SafetensorsFile, "tensor", no_data)
    d = detect_file(path)
    assert (d.kind, d.architecture, tuple(d.also)) == ("vae", "sana", ("prx",))
    assert "32 latent channels at 32x" in d.evidence[0].reason


def test_the_command_line_decodes_to_a_png(dc, tmp_path, capsys):
    import json

    from PIL import Image

    from engine.cli import main
    from engine.formats.latent import read_latent

    _, path, _ = dc
    Image.new("RGB", (64, 96), (200, 30, 90)).save(tmp_path / "in.png")
    args = ["encode", "--vae", path, "--image", str(tmp_path / "in.png"), "--out", str(tmp_path / "e.latent")]
    assert main([*args, "--json", "--quiet"]) == 0
    assert json.loads(capsys.readouterr().out)["latent_shape"] == [1, Z, 3, 2]
    assert read_latent(tmp_path / "e.latent").shape == (1, Z, 3, 2)
    args = ["decode", "--vae", path, "--latent", str(tmp_path / "e.latent"), "--out", str(tmp_path / "e.png")]
    assert main([*args, "--json", "--quiet"]) == 0
    capsys.readouterr()
    assert Image.open(tmp_path / "e.png").size == (64, 96)


def test_diffusers_default_layout_decodes_whole(tmp_path):
    """AutoencoderDC's defaults (ResBlocks only, pixel-shuffle up blocks, pixel-unshuffle down blocks): the
    executor cannot step a pixel shuffle, so the head runs every stage and the tiles only the output conv."""
    from engine.vae.run import decode

    torch.manual_seed(3)
    cfg = dict(encoder_block_out_channels=(8, 16), decoder_block_out_channels=(8, 16), latent_channels=4,
               encoder_layers_per_block=(1, 1), decoder_layers_per_block=(1, 2), attention_head_dim=4,
               encoder_qkv_multiscales=((), ()), decoder_qkv_multiscales=((), ()))  # fmt: skip
    ref = diffusers.AutoencoderDC(**cfg).eval()
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(tmp_path / "d.safetensors"))
    vae = load_vae(tmp_path / "d.safetensors")
    assert (vae.cfg.up_interpolate, vae.cfg.down_conv, vae.downscale, vae.head_scale) == (False, False, 2, 2)
    z, x = torch.randn(1, 4, 9, 7), torch.rand(1, 3, 16, 12) * 2 - 1
    with torch.no_grad():
        assert (ref.decode(z).sample - vae.decode(z)).abs().max() <= 1e-4
        assert (ref.encode(x).latent - vae.encode(x)).abs().max() <= 1e-4
    whole = decode(vae, z, tiled=False)
    assert (decode(vae, z, tiled=True, tile=8, overlap=4, budget=1 << 34) - whole).abs().max() <= 1e-5
