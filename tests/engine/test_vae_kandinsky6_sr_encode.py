"""Kandinsky 6 SR's video VAE encodes (engine.vae.kandinsky6_sr_encoder): the posterior mean equals diffusers'
Kandinsky6SRVAE.encode on the same weights for an image and for clips across diffusers' own segments, chunked
encodes equal the whole one, the encoder loads strictly and only where the file holds it, and `loadout encode`
writes a latent that `loadout decode` takes. Diffusers' naming is the only one known, so there is one to read."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")

from engine.errors import FormatError  # noqa: E402
from engine.vae import encode  # noqa: E402
from engine.vae.loading import load_vae  # noqa: E402
from tests.engine.test_vae_kandinsky6_sr import Z, reduced_k6  # noqa: E402


@pytest.fixture(scope="module")
def k6(tmp_path_factory):
    """The decoder tests' reduced model (encoder and decoder) and diffusers' on the same weights."""
    return reduced_k6(tmp_path_factory)


def _want(ref, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.encode(x).latent_dist.mode()


@pytest.mark.parametrize("frames, hw", [(1, (32, 48)), (9, (32, 32)), (21, (16, 16))])
def test_encode_equals_diffusers(k6, frames, hw):
    """An image, a clip of three chunks, and one that crosses diffusers' first segment (17 frames, then 16)."""
    ref, path, _ = k6
    vae = load_vae(path)
    x = torch.rand(1, 3, frames, *hw, generator=torch.Generator().manual_seed(frames)) * 2 - 1
    with torch.inference_mode():
        got = vae.encode(x)
    want = _want(ref, x)
    assert got.shape == want.shape == (1, Z, 1 + (frames - 1) // 4, hw[0] // 16, hw[1] // 16)
    err = (got - want).abs().max().item()
    print(f"kandinsky6_sr encode {frames} frames: max abs error {err:.2e}")
    assert err < 1e-5


def test_chunks_equal_the_whole_clip_and_bad_clips_are_refused(k6):
    _, path, _ = k6
    vae = load_vae(path)
    x = torch.rand(1, 3, 13, 16, 16, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.inference_mode():
        whole = vae.encode(x, chunk_frames=12)  # the first frame, then the other 12 at once
        fours, eights = vae.encode(x, chunk_frames=4), vae.encode(x, chunk_frames=8)
        # the first frame's latent is causal: it does not see the frames after it
        assert torch.equal(vae.encode(x[:, :, :1]), whole[:, :, :1])
    assert whole.shape[2] == 4
    assert (fours - whole).abs().max() < 1e-5 and (eights - whole).abs().max() < 1e-5
    with pytest.raises(FormatError, match=r"1 \+ 4k frames"):
        vae.encode(x[:, :, :4])
    with pytest.raises(FormatError, match=r"chunks of 4k"):
        vae.encode(x, chunk_frames=6)
    with pytest.raises(FormatError, match="multiples of 16"):
        vae.encode(x[:, :, :, :8])


def test_the_encoder_loads_strictly_and_only_where_the_file_has_it(k6, tmp_path):
    from safetensors.torch import save_file

    from engine.vae import estimate as est

    _, path, sd = k6
    vae = load_vae(path)
    decoder = {k: v for k, v in sd.items() if k.startswith("decoder.")}
    save_file(decoder, str(tmp_path / "dec.safetensors"))
    dec_only = load_vae(tmp_path / "dec.safetensors")
    assert not hasattr(dec_only, "encoder") and hasattr(vae, "encoder")
    # the encoder's weights count where it is loaded (a decode or encode holds them all)
    enc_bytes = sum(v.numel() * v.element_size() for k, v in sd.items() if k.startswith("encoder."))
    assert est.spec_of(vae).weight_bytes == est.spec_of(dec_only).weight_bytes + enc_bytes
    assert est.K_VIDEO_ENCODE["kandinsky6_sr"] > 0
    image = torch.rand(1, 3, 32, 32)
    with pytest.raises(FormatError, match="holds the decoder only: give the VAE file with its encoder"):
        encode(dec_only, image)
    broken = dict(sd)
    del broken["encoder.down.1.downsample.temporal_conv.1.conv.bias"]
    save_file(broken, str(tmp_path / "missing.safetensors"))
    with pytest.raises(
        FormatError, match=r"missing .*encoder\.down\.1\.downsample\.temporal_conv\.1\.conv\.bias"
    ):
        load_vae(tmp_path / "missing.safetensors")
    broken = dict(sd, **{"encoder.mid.block_2.norm1.gamma": torch.ones(7, 1, 1, 1)})
    save_file(broken, str(tmp_path / "shape.safetensors"))
    with pytest.raises(FormatError, match=r"wrong shape .*encoder\.mid\.block_2\.norm1\.gamma"):
        load_vae(tmp_path / "shape.safetensors")
    broken = {k: v for k, v in sd.items() if not k.startswith("encoder.down.0.block.0.conv2.")}
    save_file(broken, str(tmp_path / "level.safetensors"))
    with pytest.raises(FormatError, match=r"encoder\.down\.0\.block\.0\.conv2\.conv\.weight is missing"):
        load_vae(tmp_path / "level.safetensors")


def test_the_command_line_encodes_an_image_that_decodes_back(k6, tmp_path, capsys):
    import json

    from PIL import Image

    from engine.cli import main
    from engine.formats.latent import read_latent

    ref, path, _ = k6
    Image.new("RGB", (70, 50), (200, 30, 90)).save(tmp_path / "in.png")
    args = ["encode", "--vae", path, "--image", str(tmp_path / "in.png"), "--out", str(tmp_path / "e.latent")]
    assert main([*args, "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, Z, 3, 4] and res["encoded_size"] == [64, 48]
    lat = read_latent(tmp_path / "e.latent")
    x = torch.tensor([200, 30, 90], dtype=torch.float32).div(255).mul(2).sub(1)
    want = _want(ref, x[None, :, None, None, None].expand(1, 3, 1, 48, 64))[:, :, 0]
    assert (lat - want).abs().max() < 1e-5
    args = ["decode", "--vae", path, "--latent", str(tmp_path / "e.latent"), "--out", str(tmp_path / "e.png")]
    assert main([*args, "--json", "--quiet"]) == 0
    capsys.readouterr()
    assert Image.open(tmp_path / "e.png").size == (64, 48)
