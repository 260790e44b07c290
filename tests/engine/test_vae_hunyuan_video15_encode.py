"""The HunyuanVideo 1.5 VAE's encoder (engine.vae.hunyuan_video15_encoder) against diffusers'
AutoencoderKLHunyuanVideo15 on the same weights: an image and clips, chunked exactly; strict loading; a
decoder-only file's refusal; the command line's round trip."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.errors import FormatError
from engine.vae.loading import load_vae

diffusers = pytest.importorskip("diffusers")

# the decode tests' reduced VAE (test_vae_hunyuan_video15): 4 blocks, 8x space, 4x time
SMALL = dict(
    latent_channels=4, block_out_channels=(8, 8, 16, 16), layers_per_block=1, spatial_compression_ratio=8
)


@pytest.fixture(scope="module")
def hv15(tmp_path_factory):
    from safetensors.torch import save_file

    ref = diffusers.AutoencoderKLHunyuanVideo15(**SMALL).eval()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, v in ref.state_dict().items():
        r = torch.randn(v.shape, generator=g)
        sd[k] = 1 + 0.1 * r if k.endswith("gamma") else r * (0.5 / math.sqrt(v[0].numel()))
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("hv15") / "hunyuanvideo15_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def _clip(frames: int, h: int = 16, w: int = 24, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, 3, frames, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _reference(ref, x):
    with torch.inference_mode():
        return ref.encode(x).latent_dist.mode()


@pytest.mark.parametrize("frames", [1, 9])
def test_the_encode_equals_diffusers(hv15, frames):
    """diffusers encodes the clip in one pass; this one chunk by chunk (1, then 4 frames)."""
    ref, path, _ = hv15
    vae = load_vae(path)
    x = _clip(frames)
    with torch.inference_mode():
        got = vae.encode(x)
    want = _reference(ref, x)
    assert got.shape == want.shape == (1, 4, 1 + (frames - 1) // 4, 2, 3)
    err = float((got - want).abs().max())
    print(f"{frames} frames: max abs error {err:.2e}")
    assert err < 1e-4  # float32 rounding: ~1e-6


def test_chunks_are_exact(hv15):
    """The whole clip through the encoder at once (one chunk) equals the chunked encode to float32 rounding
    (3e-7: the convolutions' sums in another order): the state the stream carries is the whole of what a chunk
    needs from the frames before it."""
    from engine.vae.causal_conv import Stream

    vae = load_vae(hv15[1])
    x = _clip(13, seed=3)
    with torch.inference_mode():
        chunked = vae.encode(x)
        whole = vae.encoder.step(x, Stream())[:, :4]
    print(f"chunked vs whole: {float((chunked - whole).abs().max()):.2e}")
    assert (chunked - whole).abs().max() < 1e-5


def test_frame_counts_it_cannot_take_are_named(hv15):
    vae = load_vae(hv15[1])
    with torch.inference_mode(), pytest.raises(FormatError, match=r"3 frames.*1 \+ 4 k"):
        vae.encode(_clip(3))


def test_a_missing_or_misshapen_encoder_key_is_named(hv15, tmp_path):
    from safetensors.torch import save_file

    _, _, sd = hv15
    for key, value, match in [
        (
            "encoder.down_blocks.1.resnets.0.norm2.gamma",
            None,
            r"missing .*encoder\.down_blocks\.1\.resnets\.0\.norm2",
        ),
        (
            "encoder.mid_block.attentions.0.to_q.weight",
            torch.zeros(3, 3, 1, 1, 1),
            r"wrong shape .*encoder\.mid_block",
        ),
        (
            "encoder.down_blocks.0.downsamplers.0.conv.conv.weight",
            torch.zeros(3, 8, 3, 3, 3),
            r"not 8 / 4 or / 8",
        ),
    ]:
        broken = dict(sd)
        if value is None:
            broken.pop(key)
        else:
            broken[key] = value
        save_file(broken, tmp_path / "broken.safetensors")
        with pytest.raises(FormatError, match=match):
            load_vae(tmp_path / "broken.safetensors")


def test_a_decoder_only_file_decodes_and_refuses_to_encode(hv15, tmp_path):
    from safetensors.torch import save_file

    from engine.vae import encode
    from engine.vae.estimate import spec_of

    _, path, sd = hv15
    save_file({k: v for k, v in sd.items() if k.startswith("decoder.")}, tmp_path / "d.safetensors")
    vae = load_vae(tmp_path / "d.safetensors")
    assert not hasattr(vae, "encoder")
    with pytest.raises(FormatError, match="holds the decoder only"):
        encode(vae, torch.rand(1, 3, 16, 16))
    enc = sum(v.numel() * 4 for k, v in sd.items() if k.startswith("encoder."))
    assert spec_of(load_vae(path)).weight_bytes - spec_of(vae).weight_bytes == enc


def test_the_command_line_encodes_an_image_that_decodes_back(hv15, tmp_path, capsys):
    import numpy as np
    from PIL import Image

    from engine.cli import main
    from engine.formats.latent import read_latent

    rgb = (np.random.default_rng(0).random((20, 26, 3)) * 255).astype(np.uint8)
    Image.fromarray(rgb).save(tmp_path / "in.png")
    lat = tmp_path / "in.latent"
    assert (
        main(
            [
                "encode",
                "--json",
                "--quiet",
                "--vae",
                hv15[1],
                "--image",
                str(tmp_path / "in.png"),
                "--out",
                str(lat),
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, 4, 2, 3] and res["encoded_size"] == [24, 16]
    x = torch.from_numpy(rgb[:16, :24].astype(np.float32) / 255).permute(2, 0, 1)[None, :, None] * 2 - 1
    assert (read_latent(lat)[0] - _reference(hv15[0], x)[:, :, 0]).abs().max() < 1e-4
    assert (
        main(
            [
                "decode",
                "--json",
                "--quiet",
                "--vae",
                hv15[1],
                "--latent",
                str(lat),
                "--out",
                str(tmp_path / "back.png"),
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["size"] == [24, 16]
