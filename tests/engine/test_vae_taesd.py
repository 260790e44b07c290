"""The TAESD family: the real TAEF2 round-trips a real photo; every variant's layout loads strictly from
each naming, and tiled runs match full ones."""

from __future__ import annotations

import pytest
import torch
from vae_fixtures import psnr, small_taesd

from engine.errors import FormatError
from engine.formats.safetensors import save_tensors
from engine.vae import load_vae
from engine.vae.images import load_image
from engine.vae.run import RunInfo, decode, encode


@pytest.fixture(scope="module")
def taef2_crop(request):
    from loadout_test_support import data_file

    vae = load_vae(data_file("weights/taef2_encoder.pth"))  # the decoder beside it is paired in
    image = load_image(data_file("images/reconstruction_example.jpg"))
    # The top-left 256x256 of the 2048x768 photo (the whole image is in benchmarks/bench_vae.py).
    return vae, image[:, :, :256, :256].contiguous()


def test_taef2_real_weights_layout(taef2_crop):
    vae, _ = taef2_crop
    assert vae.name == "taef2" and vae.latent_channels == 32 and vae.mid_gn
    assert vae.fmt.name == "flux2"
    gns = [n for n, m in vae.named_modules() if type(m).__name__ == "GroupNorm"]
    assert len(gns) == 6  # three decoder and three encoder Blocks at latent resolution


@pytest.mark.slow
def test_taef2_round_trip_full_and_tiled(taef2_crop):
    vae, x = taef2_crop
    z = encode(vae, x, tiled=False)
    assert z.shape == (1, 32, 32, 32)
    y = decode(vae, z, tiled=False)
    assert psnr(x, y) >= 30
    info = RunInfo()
    zt = encode(vae, x, tiled=True, tile=256, overlap=128, info=info)
    assert info.tiles == 4
    yt = decode(vae, zt, tiled=True, tile=128, overlap=64)
    assert psnr(x, yt) >= 30
    assert psnr(y, decode(vae, z, tiled=True, tile=128, overlap=64)) >= 45  # tiled vs full decode


@pytest.mark.parametrize(
    "name,channels,mid_gn,fmt",
    [
        ("taesd", 4, False, "sd1"),
        ("taesdxl", 4, False, "sdxl"),
        ("taesd3", 16, False, "sd3"),
        ("taef1", 16, False, "flux1"),
        ("taef2", 32, True, "flux2"),
    ],
)
def test_variants_load_from_upstream_pth_pairs(tmp_path, name, channels, mid_gn, fmt):
    m = small_taesd(name, channels, mid_gn)
    torch.save(
        {k.removeprefix("encoder."): v for k, v in m.state_dict().items() if k.startswith("encoder.")},
        tmp_path / f"{name}_encoder.pth",
    )
    torch.save(
        {k.removeprefix("decoder."): v for k, v in m.state_dict().items() if k.startswith("decoder.")},
        tmp_path / f"{name}_decoder.pth",
    )
    vae = load_vae(tmp_path / f"{name}_decoder.pth")
    assert (vae.name, vae.latent_channels, vae.mid_gn, vae.fmt.name) == (name, channels, mid_gn, fmt)
    x = torch.rand(1, 3, 64, 48, generator=torch.Generator().manual_seed(0))
    z = encode(vae, x)
    assert z.shape == (1, channels, 8, 6)
    torch.testing.assert_close(z, m.encode(x))
    y = decode(vae, z)
    assert y.shape == (1, 3, 64, 48)
    assert psnr(y, decode(vae, z, tiled=True, tile=64, overlap=64)) > 30  # 16 px of context only


def test_diffusers_autoencoder_tiny_and_comfy_prefixes(tmp_path):
    m = small_taesd("taesd", 4)
    sd = m.state_dict()
    diff = {}
    for k, v in sd.items():
        part, idx, rest = k.split(".", 2)
        idx = int(idx) - (1 if part == "decoder" else 0)  # diffusers' decoder has no clamp layer
        diff[f"{part}.layers.{idx}.{rest}"] = v
    save_tensors(tmp_path / "taesd_diffusers.safetensors", diff)
    save_tensors(tmp_path / "taesd_comfy.safetensors", {f"taesd_{k}": v for k, v in sd.items()})
    z = torch.randn(1, 4, 4, 4, generator=torch.Generator().manual_seed(1))
    want = decode(m, z)
    for f in ("taesd_diffusers.safetensors", "taesd_comfy.safetensors"):
        assert torch.equal(decode(load_vae(tmp_path / f), z), want)


def test_decoder_only_file_refuses_encode(tmp_path):
    m = small_taesd("taef1", 16)
    torch.save(
        {k.removeprefix("decoder."): v for k, v in m.state_dict().items() if k.startswith("decoder.")},
        tmp_path / "taef1_decoder.pth",
    )
    vae = load_vae(tmp_path / "taef1_decoder.pth")
    with pytest.raises(FormatError, match="no encoder"):
        encode(vae, torch.rand(1, 3, 16, 16))
