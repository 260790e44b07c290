"""MiniMax-H3's video VAE encoder (engine.vae.minimax_h3_encoder): equals diffusers' AutoencoderKLMiniMaxH3.encode on
the same weights -- one frame, clips padded to whole 17-frame clips, the release's tiles and the untiled encode --
runs a clip in chunks exactly as whole, loads strictly in both namings, leaves a decoder-only file refusing, and
encodes from the command line."""

from __future__ import annotations

import json

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

MEAN = torch.tensor((0.485, 0.456, 0.406))[None, :, None, None, None]
STD = torch.tensor((0.229, 0.224, 0.225))[None, :, None, None, None]
# the encoder 32 wide (the release's 32 GroupNorm groups: their count is not in the file), the decoder one head
SMALL = dict(block_out_channels=(32,) * 6, decoder_num_layers=1, decoder_num_attention_heads=1)


@pytest.fixture(scope="module")
def h3(tmp_path_factory):
    """A reduced MiniMax-H3 VAE with random weights (the norms' scales near 1), its file in diffusers' naming and in a
    checkpoint's `vae.` one, and diffusers' model on the same weights."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLMiniMaxH3(**SMALL).eval()
    sd = {}
    for k, v in ref.state_dict().items():
        sd[k] = torch.randn_like(v) * (0.5 if k.endswith(("scale1", "scale2")) else 0.05)
        if k.startswith("encoder.") and ".norm" in k and k.endswith("weight"):
            sd[k] += 1
    ref.load_state_dict(sd)
    d = tmp_path_factory.mktemp("h3enc")
    save_file(sd, str(d / "h3.safetensors"))
    save_file({f"vae.{k}": v for k, v in sd.items()}, str(d / "h3_ckpt.safetensors"))
    return ref, str(d / "h3.safetensors"), sd, d


def _reference(ref, x, tiled: bool = True) -> torch.Tensor:
    (ref.enable_tiling if tiled else ref.disable_tiling)()
    with torch.no_grad():
        out = ref.encode(((x + 1) / 2 - MEAN) / STD).latent_dist.mode()  # [-1, 1] -> ImageNet-normalised
    ref.enable_tiling()
    return out


def _clip(frames, h, w, seed=0):
    return torch.rand(1, 3, frames, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


@pytest.mark.parametrize(
    "frames, hw, latent_frames",
    [(1, (48, 32), 1), (1, (272, 32), 1), (9, (32, 48), 2), (20, (32, 32), 7)],
)
def test_encode_equals_diffusers(h3, frames, hw, latent_frames):
    """One frame alone; 9 frames padded to a clip of 17 (5 latent frames, the last 3 dropped); 20 padded to two
    clips (10, 3 dropped); 272 rows: two 256-px tiles blended over 15 latent rows, the release's output."""
    from engine.vae.loading import load_vae

    ref, path, _, _ = h3
    vae = load_vae(path)
    x = _clip(frames, *hw, seed=frames)
    with torch.inference_mode():
        got = vae.encode(x)
    want = _reference(ref, x)
    assert got.shape == want.shape == (1, 24, latent_frames, hw[0] // 16, hw[1] // 16)
    # float32 rounding: oneDNN convolves conv_in where torch's native path convolves diffusers' (0 to 1.1e-5 here)
    assert (got - want).abs().max() < 2e-5
    if hw[0] > 256:  # the tiles are the release's: not the whole frame's encode
        with torch.inference_mode():
            whole = vae.encode(x, None)
        assert (whole - _reference(ref, x, tiled=False)).abs().max() < 2e-5
        assert (whole - got).abs().max() > 1e-3


def test_a_clip_in_chunks_equals_it_whole(h3):
    """Chunks of 1, 4, 4, 4, 4 frames with the causal state carried: the whole clip's sums (the convolutions over
    fewer frames round differently: 3e-6 here); without the carried frames the chunks differ."""
    from engine.vae.causal_conv import Stream
    from engine.vae.loading import load_vae
    from engine.vae.minimax_h3_encoder import _chunks

    vae = load_vae(h3[1])
    x = _clip(17, 32, 32, seed=3)
    with torch.inference_mode():
        chunked = _chunks(vae, x)
        whole = vae.quant_conv(vae.encoder.step(x, Stream()))[:, :24]
        cold = torch.cat([vae.encoder.step(x[:, :, a:b], Stream()) for a, b in ((0, 1), (1, 5))], dim=2)
    assert chunked.shape == whole.shape == (1, 24, 5, 2, 2)
    assert (chunked - whole).abs().max() < 1e-5
    assert (vae.quant_conv(cold)[:, :24] - whole[:, :, :2]).abs().max() > 1e-3


def test_both_namings_load_the_encoder_and_a_broken_key_is_named(h3, tmp_path):
    from safetensors.torch import save_file

    from engine.errors import FormatError
    from engine.vae.loading import load_vae

    _, path, sd, d = h3
    x = _clip(1, 32, 32, seed=5)
    with torch.inference_mode():
        a, b = load_vae(path).encode(x), load_vae(d / "h3_ckpt.safetensors").encode(x)
    assert torch.equal(a, b)
    for key, value in (
        ("encoder.down_blocks.2.resnets.1.conv2.bias", None),
        ("quant_conv.weight", None),
        ("encoder.down_blocks.1.downsamplers.0.conv.weight", torch.zeros(32, 32, 3, 3, 2)),
        ("encoder.norm_out.weight", torch.ones(7)),
    ):
        broken = {k: v for k, v in sd.items() if k != key}
        if value is not None:
            broken[key] = value
        save_file(broken, str(tmp_path / "broken.safetensors"))
        with pytest.raises(FormatError, match=key.replace(".", r"\.")):
            load_vae(tmp_path / "broken.safetensors")


def test_a_decoder_only_file_decodes_and_refuses_to_encode(h3, tmp_path):
    from safetensors.torch import save_file

    from engine.errors import UnsupportedModel
    from engine.vae import encode
    from engine.vae.estimate import full_bytes, spec_of
    from engine.vae.loading import load_vae

    _, path, sd, _ = h3
    save_file(
        {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}, str(tmp_path / "d.st")
    )
    dec, full = load_vae(tmp_path / "d.st"), load_vae(path)
    assert not hasattr(dec, "encoder") and hasattr(full, "encoder")
    z = torch.randn(1, 24, 7, 2, 2, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert torch.equal(dec.decode(z), full.decode(z))
    with pytest.raises(UnsupportedModel, match="its encoder is not run yet"):
        encode(dec, torch.rand(1, 3, 32, 32))
    # the estimate counts the encoder's weights where it is loaded, and its activations in its own width
    enc_bytes = sum(
        p.numel() * 4 for n, p in full.named_parameters() if n.startswith(("encoder.", "quant_conv."))
    )
    assert spec_of(full).weight_bytes == spec_of(dec).weight_bytes + enc_bytes
    spec = spec_of(full)
    assert spec.enc_ch == 32 and spec.k_act("encode") != spec.k_act("decode")
    # its encode runs the release's 256-px tiles one at a time: a larger frame's activations are one tile's
    assert full_bytes(spec, "encode", 1024 * 1024, 4) == full_bytes(spec, "encode", 256 * 256, 4)
    assert full_bytes(spec, "encode", 128 * 128, 4) < full_bytes(spec, "encode", 256 * 256, 4)


def test_the_command_line_encodes_an_image_and_a_clip_latent_decodes_back(h3, tmp_path, capsys):
    """`loadout encode` writes the image's one-frame latent (the API's, cropped to 16-px multiples); the release's
    decoder makes no frame from one latent frame (its chunks: diffusers' neither), so `loadout decode` says so; a
    34-frame clip's 7 latent frames decode back to 22 frames."""
    import numpy as np
    from PIL import Image

    from engine.cli import main
    from engine.formats.latent import read_latent, write_latent
    from engine.vae.loading import load_vae

    _, path, _, _ = h3
    rgb = (np.random.default_rng(0).random((40, 56, 3)) * 255).astype("uint8")
    Image.fromarray(rgb).save(tmp_path / "in.png")
    args = ["encode", "--json", "--quiet", "--vae", path, "--image", str(tmp_path / "in.png")]
    assert main([*args, "--out", str(tmp_path / "in.latent")]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, 24, 2, 3] and res["encoded_size"] == [48, 32]
    lat = read_latent(tmp_path / "in.latent")
    vae = load_vae(path)
    x = torch.from_numpy(rgb[:32, :48].astype("float32") / 255).permute(2, 0, 1)[None, :, None] * 2 - 1
    with torch.inference_mode():
        assert (lat - vae.encode(x)[:, :, 0]).abs().max() < 1e-6
    dec = ["decode", "--json", "--quiet", "--vae", path]
    assert main([*dec, "--latent", str(tmp_path / "in.latent"), "--out", str(tmp_path / "o.png")]) != 0
    assert "5n + 2 frames" in capsys.readouterr().err
    with torch.inference_mode():
        clip = vae.encode(_clip(34, 32, 32, seed=7))
    assert clip.shape[2] == 7
    write_latent(tmp_path / "clip.latent", clip)
    assert main([*dec, "--latent", str(tmp_path / "clip.latent"), "--out", f"{tmp_path}/frames/"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 22


def test_the_encode_panel_shows_the_image_where_one_latent_frame_decodes_to_none(h3, tmp_path):
    """The window's Encode (round trip on): the latent is written, and the image is shown, not a failed decode."""
    from PIL import Image

    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.requests import DetectDevices, Encode

    Image.new("RGB", (48, 32), (200, 30, 90)).save(tmp_path / "in.png")
    e = Engine(on_event=lambda ev: None)
    try:
        e.run(DetectDevices(DeviceOptions(cpu=True)))
        res = e.run(Encode(h3[1], str(tmp_path / "in.png"), str(tmp_path / "o.latent")))
    finally:
        e.close()
    assert res.info["shown"] == "image" and tuple(res.info["latent_shape"]) == (1, 24, 2, 3)


def test_a_cancelled_encode_stops_at_the_next_op(h3):
    from engine import ops
    from engine.errors import Cancelled
    from engine.jobs import CancelToken
    from engine.vae.loading import load_vae

    vae, token, seen = load_vae(h3[1]), CancelToken(), []
    conv = vae.encoder.down_blocks[1].resnets[0].conv1
    conv.register_forward_hook(lambda *a: (seen.append(1), token.cancel()))
    with pytest.raises(Cancelled), ops.cancel_scope(token), torch.inference_mode():
        vae.encode(_clip(17, 32, 32))
    assert len(seen) == 1  # the first chunk's next op did not run
