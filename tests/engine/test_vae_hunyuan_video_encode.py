"""The HunyuanVideo VAE's encoder (engine.vae.hunyuan_video_encoder) against diffusers'
AutoencoderKLHunyuanVideo on the same weights: an image, a clip, a clip past diffusers' frame tiles; both
namings; strict loading; a decoder-only file's refusal; the command line's round trip."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.errors import FormatError
from engine.vae.loading import load_vae

diffusers = pytest.importorskip("diffusers")

# the decode tests' reduced VAE (test_vae_hunyuan_video): 3 blocks, 4x space, 4x time, 32 channels
SMALL = dict(latent_channels=4, block_out_channels=(32, 32, 64), layers_per_block=1, spatial_compression_ratio=4,
             down_block_types=("HunyuanVideoDownBlock3D",) * 3, up_block_types=("HunyuanVideoUpBlock3D",) * 3)  # fmt: skip


@pytest.fixture(scope="module")
def hv(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLHunyuanVideo(**SMALL).eval()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, v in ref.state_dict().items():
        r = torch.randn(v.shape, generator=g)
        sd[k] = 1 + 0.1 * r if "norm" in k and k.endswith("weight") else r * (0.5 / math.sqrt(v[0].numel()))
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("hv") / "hunyuan_video_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def _clip(frames: int, size: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, 3, frames, size, size, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _reference(ref, x):
    with torch.inference_mode():
        return ref.encode(x).latent_dist.mode()


@pytest.mark.parametrize("frames", [1, 9, 25])
def test_the_encode_equals_diffusers(hv, frames):
    """An image, a clip diffusers encodes whole, and one past its 16 frames that it encodes in tiles of 17
    frames every 12 (use_framewise_encoding, on by default): the same means."""
    ref, path, _ = hv
    vae = load_vae(path)
    x = _clip(frames)
    with torch.inference_mode():
        got = vae.encode(x)
    want = _reference(ref, x)
    assert got.shape == want.shape == (1, 4, 1 + (frames - 1) // 4, 4, 4)
    err = float((got - want).abs().max())
    print(f"{frames} frames: max abs error {err:.2e}")
    assert err < 1e-4  # float32 rounding: ~1e-6


def test_frame_counts_and_sizes_it_cannot_take_are_named(hv):
    vae = load_vae(hv[1])
    with torch.inference_mode(), pytest.raises(FormatError, match=r"6 frames.*1 \+ 4 k"):
        vae.encode(_clip(6))
    with torch.inference_mode(), pytest.raises(FormatError, match="multiples of 4"):
        vae.encode(torch.zeros(1, 3, 1, 18, 16))


def test_comfyuis_ldm_naming_loads_the_encoder_and_encodes_the_same(hv, tmp_path):
    """The encoder's LDM names follow the decoder's scheme (`encoder.down.0.block.0`, `.downsample.conv.conv`,
    `mid.attn_1.q` as 1x1 convolutions, `norm_out`), as the image VAEs' renaming writes them."""
    from safetensors.torch import save_file

    from engine.vae.loading import diffusers_to_ldm

    _, path, sd = hv
    ldm = diffusers_to_ldm(sd)
    assert "encoder.down.1.downsample.conv.conv.weight" in ldm and "encoder.mid.attn_1.q.weight" in ldm
    assert ldm["encoder.mid.attn_1.q.weight"].dim() == 4 and "encoder.norm_out.weight" in ldm
    save_file(ldm, tmp_path / "hunyuan_video_vae_bf16.safetensors")
    x = _clip(5, seed=2)
    with torch.inference_mode():
        assert torch.equal(
            load_vae(tmp_path / "hunyuan_video_vae_bf16.safetensors").encode(x), load_vae(path).encode(x)
        )


def test_a_missing_or_misshapen_encoder_key_is_named(hv, tmp_path):
    from safetensors.torch import save_file

    _, _, sd = hv
    for key, value, match in [
        (
            "encoder.down_blocks.1.downsamplers.0.conv.conv.weight",
            None,
            r"missing .*down_blocks\.1\.downsamplers",
        ),
        ("quant_conv.weight", None, r"missing .*quant_conv\.weight"),
        (
            "encoder.mid_block.attentions.0.to_q.weight",
            torch.zeros(3, 3),
            r"wrong shape .*encoder\.mid_block",
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


def test_a_decoder_only_file_decodes_and_refuses_to_encode(hv, tmp_path, capsys):
    import numpy as np
    from PIL import Image
    from safetensors.torch import save_file

    from engine.cli import main
    from engine.vae import encode

    _, _, sd = hv
    save_file(
        {k: v for k, v in sd.items() if k.startswith(("decoder.", "post_quant_conv."))},
        tmp_path / "d.safetensors",
    )
    vae = load_vae(tmp_path / "d.safetensors")
    assert not hasattr(vae, "encoder") and not hasattr(vae, "quant_conv")
    with pytest.raises(FormatError, match="holds the decoder only"):
        encode(vae, torch.rand(1, 3, 16, 16))
    Image.fromarray(np.zeros((16, 16, 3), np.uint8)).save(tmp_path / "in.png")
    args = ["encode", "--vae", str(tmp_path / "d.safetensors"), "--image", str(tmp_path / "in.png")]
    assert main([*args, "--out", str(tmp_path / "o.latent")]) != 0
    assert "d.safetensors holds the decoder only" in "".join(capsys.readouterr())


def test_the_encoders_weights_count_in_the_spec(hv, tmp_path):
    from safetensors.torch import save_file

    from engine.vae.estimate import spec_of

    _, path, sd = hv
    save_file(
        {k: v for k, v in sd.items() if k.startswith(("decoder.", "post_quant_conv."))},
        tmp_path / "d.safetensors",
    )
    enc = sum(v.numel() * 4 for k, v in sd.items() if k.startswith(("encoder.", "quant_conv.")))
    assert (
        spec_of(load_vae(path)).weight_bytes - spec_of(load_vae(tmp_path / "d.safetensors")).weight_bytes
        == enc
    )


def test_the_command_line_encodes_an_image_that_decodes_back(hv, tmp_path, capsys):
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
                hv[1],
                "--image",
                str(tmp_path / "in.png"),
                "--out",
                str(lat),
            ]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, 4, 5, 6] and res["encoded_size"] == [24, 20]
    x = torch.from_numpy(rgb[:20, :24].astype(np.float32) / 255).permute(2, 0, 1)[None, :, None] * 2 - 1
    assert (read_latent(lat)[0] - _reference(hv[0], x)[:, :, 0]).abs().max() < 1e-4
    assert (
        main(
            [
                "decode",
                "--json",
                "--quiet",
                "--vae",
                hv[1],
                "--latent",
                str(lat),
                "--out",
                str(tmp_path / "back.png"),
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["size"] == [24, 20]
    assert Image.open(tmp_path / "back.png").size == (24, 20)


def test_a_clip_file_encodes_on_the_command_line_as_diffusers_does(hv, tmp_path, capsys):
    """`loadout encode --image clip.webp` (a lossless animated WebP of 7 frames): the first 5 (1 + 4k) are
    encoded, and the latent is diffusers' encode of those frames."""
    import numpy as np

    from engine.cli import main
    from engine.formats.latent import read_latent
    from engine.formats.video_out import write_webp

    ref, path, _ = hv
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (7, 16, 24, 3), dtype=np.uint8)
    write_webp(str(tmp_path / "clip.webp"), [f.tobytes() for f in frames], 24, 16, 24)
    out = tmp_path / "clip.latent"
    assert main(["encode", "--json", "--quiet", "--vae", path, "--image", str(tmp_path / "clip.webp"),
                 "--out", str(out)]) == 0  # fmt: skip
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 5 and res["latent_shape"] == [1, 4, 2, 4, 6]
    x = torch.from_numpy(frames[:5]).permute(3, 0, 1, 2)[None].float() / 255 * 2 - 1
    want = _reference(ref, x)
    assert float((read_latent(str(out)) - want).abs().max()) < 1e-4
