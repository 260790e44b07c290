"""The Mochi 1 VAE encodes (engine.vae.mochi_encoder): the posterior mean equals diffusers' AutoencoderKLMochi on
the same weights (a reduced config with attention in every stage but the first, as released) for an image and
clips, chunked encodes equal the whole one (the attention's keys and values carried), the encoder loads strictly in
diffusers' and the release's namings, and `loadout encode` writes a latent that `loadout decode` takes."""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

from engine.errors import FormatError  # noqa: E402
from engine.vae import encode  # noqa: E402
from engine.vae.loading import load_vae  # noqa: E402
from tests.engine.test_vae_mochi import _randomise, _release_encoder_names, _release_names, _sd  # noqa: E402

SMALL = dict(encoder_block_out_channels=(32, 64, 64, 64), decoder_block_out_channels=(32, 32, 32, 64),
             layers_per_block=(1, 1, 1, 2, 1), add_attention_block=(False, True, True, True, True))  # fmt: skip


@pytest.fixture(scope="module")
def ref():
    return _randomise(diffusers.AutoencoderKLMochi(**SMALL))


@pytest.fixture(scope="module")
def path(ref, tmp_path_factory):
    from safetensors.torch import save_file

    p = tmp_path_factory.mktemp("mochi") / "mochi_vae.safetensors"
    save_file(_sd(ref), str(p))
    return str(p)


def _x(t: int, h: int = 16, w: int = 24, seed: int = 3) -> torch.Tensor:
    return torch.rand(1, 3, t, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _want(ref, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.encode(x).latent_dist.mode()


@pytest.mark.parametrize("frames", [1, 13])
def test_encode_equals_diffusers(ref, path, frames):
    vae = load_vae(path)
    assert vae.cfg.encoder.time == (1, 2, 3) and vae.cfg.encoder.attention == (False, True, True, True, True)
    x = _x(frames)
    with torch.inference_mode():
        got = vae.encode(x)
    want = _want(ref, x)
    assert got.shape == want.shape == (1, 12, 1 + (frames - 1) // 6, 2, 3)
    err = (got - want).abs().max().item()
    print(f"mochi encode {frames} frames: max abs error {err:.2e}")
    assert err < 2e-5


def test_chunks_equal_the_whole_clip_and_bad_clips_are_refused(path, monkeypatch):
    from engine.vae import mochi_encoder

    vae = load_vae(path)
    x = _x(19, 16, 16, seed=4)
    with torch.inference_mode():
        whole = vae.encode(x, chunk_frames=18)
        assert torch.equal(vae.encode(x[:, :, :1]), whole[:, :, :1])  # causal: the first frame sees no others
        monkeypatch.setattr(mochi_encoder, "ROWS", 5)  # the attention a few pixels at a time, as at full size
        sixes, twelves = vae.encode(x, chunk_frames=6), vae.encode(x, chunk_frames=12)
    assert whole.shape[2] == 4
    assert (sixes - whole).abs().max() < 1e-5 and (twelves - whole).abs().max() < 1e-5
    with pytest.raises(FormatError, match=r"1 \+ 6k frames"):
        vae.encode(x[:, :, :5])
    with pytest.raises(FormatError, match="multiples of 8"):
        vae.encode(x[:, :, :, :12])


@pytest.mark.parametrize("naming", ["diffusers", "release"])
def test_both_namings_load_the_encoder_strictly(ref, path, naming, tmp_path):
    from safetensors.torch import save_file

    sd = _sd(ref)
    if naming == "release":  # ComfyUI's repackaged layout: the release's names under decoder. / encoder.
        sd = _release_names(sd) | _release_encoder_names(sd)
    save_file(sd, str(tmp_path / "vae.safetensors"))
    x = _x(7)
    with torch.inference_mode():  # the same sums (memory-mapped and stacked weights: last-bit differences)
        assert (
            load_vae(tmp_path / "vae.safetensors").encode(x) - load_vae(path).encode(x)
        ).abs().max() < 1e-5
    gone = (
        "encoder.down_blocks.1.attentions.0.to_k.weight"
        if naming == "diffusers"
        else "encoder.layers.5.stack.5.bias"
    )
    broken = {k: v for k, v in sd.items() if k != gone}
    save_file(broken, str(tmp_path / "missing.safetensors"))
    named = r"to_k.* is missing" if naming == "diffusers" else r"missing .*encoder\.layers\.5\.stack\.5\.bias"
    with pytest.raises(FormatError, match=named):
        load_vae(tmp_path / "missing.safetensors")
    key = "encoder.proj_out.weight" if naming == "diffusers" else "encoder.output_proj.weight"
    save_file(dict(sd, **{key: torch.zeros(24, 7)}), str(tmp_path / "shape.safetensors"))
    with pytest.raises(FormatError, match=r"wrong shape .*encoder\.output_proj\.weight"):
        load_vae(tmp_path / "shape.safetensors")


def test_genmos_decoder_file_brings_its_encoder_file(ref, path, tmp_path):
    """Genmo's release: decoder.safetensors and encoder.safetensors side by side, neither prefixed."""
    from safetensors.torch import save_file

    sd = _sd(ref)
    save_file(_release_names(sd, prefix=""), str(tmp_path / "decoder.safetensors"))
    enc = {k.removeprefix("encoder."): v for k, v in _release_encoder_names(sd).items()}
    save_file(enc, str(tmp_path / "encoder.safetensors"))
    x = _x(7)
    with torch.inference_mode():
        got = load_vae(tmp_path / "decoder.safetensors").encode(x)
        assert (got - load_vae(path).encode(x)).abs().max() < 1e-5
    assert not hasattr(load_vae(tmp_path / "decoder.safetensors", pair=False), "encoder")


def test_a_decoder_only_file_refuses_to_encode_and_the_weights_count(ref, path, tmp_path):
    from safetensors.torch import save_file

    from engine.vae import estimate as est

    sd = _sd(ref)
    save_file({k: v for k, v in sd.items() if k.startswith("decoder.")}, str(tmp_path / "dec.safetensors"))
    dec = load_vae(tmp_path / "dec.safetensors")
    assert not hasattr(dec, "encoder")
    with pytest.raises(FormatError, match="holds the decoder only: give the VAE file with its encoder"):
        encode(dec, torch.rand(1, 3, 16, 16))
    enc_bytes = sum(v.numel() * v.element_size() for k, v in sd.items() if k.startswith("encoder."))
    assert est.spec_of(load_vae(path)).weight_bytes == est.spec_of(dec).weight_bytes + enc_bytes
    assert est.K_VIDEO_ENCODE["mochi"] > 0


def test_the_command_line_encodes_an_image_that_decodes_back(ref, path, tmp_path, capsys):
    import json

    from PIL import Image

    from engine.cli import main
    from engine.formats.latent import read_latent

    # a noisy image (a flat one is ill-conditioned: its per-frame GroupNorms amplify last-bit differences)
    pixels = torch.randint(0, 256, (20, 30, 3), generator=torch.Generator().manual_seed(6), dtype=torch.uint8)
    Image.fromarray(pixels.numpy()).save(tmp_path / "in.png")
    args = ["encode", "--vae", path, "--image", str(tmp_path / "in.png"), "--out", str(tmp_path / "e.latent")]
    assert main([*args, "--json", "--quiet"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, 12, 2, 3] and res["encoded_size"] == [24, 16]
    x = pixels[:16, :24].permute(2, 0, 1).float().div(255).mul(2).sub(1)  # cropped to whole latent pixels
    want = _want(ref, x[None, :, None].contiguous())[:, :, 0]
    assert (read_latent(tmp_path / "e.latent") - want).abs().max() < 2e-5
    args = ["decode", "--vae", path, "--latent", str(tmp_path / "e.latent"), "--out", str(tmp_path / "e.png")]
    assert main([*args, "--json", "--quiet"]) == 0
    capsys.readouterr()
    assert Image.open(tmp_path / "e.png").size == (24, 16)
