"""Kandinsky 6 SR's video VAE (engine.vae.kandinsky6_sr): its decoder equals diffusers' Kandinsky6SRVAE on the same
weights, chunked decodes equal the whole one (the network is causal), tiles are seamless, the load is strict and
the release's layout is read from a header-faithful file."""

from __future__ import annotations

import pytest
import torch

diffusers = pytest.importorskip("diffusers")
from diffusers.models.autoencoders.autoencoder_kandinsky6_sr import (  # noqa: E402
    Kandinsky6SRVAE as Reference,
)

from engine.errors import FormatError  # noqa: E402
from engine.events import Tiling  # noqa: E402
from engine.vae import decode  # noqa: E402
from engine.vae.loading import load_vae  # noqa: E402
from engine.vae.run import RunInfo  # noqa: E402
from engine.vae.video import decode_video  # noqa: E402

Z = 64  # the release's latent channels: detection knows the file by them
SMALL = dict(
    latent_channels=Z,
    encoder_block_out_channels=(4, 8, 8, 16, 16),
    decoder_block_out_channels=(4, 8, 8, 16, 16),
    layers_per_block=1,
)
CPU = torch.device("cpu")


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = ((a.float() - b.float()) ** 2).mean().item()
    return float("inf") if mse == 0 else 10 * torch.log10(torch.tensor(peak**2 / mse)).item()


@pytest.fixture(scope="module")
def k6(tmp_path_factory):
    return reduced_k6(tmp_path_factory)


def reduced_k6(tmp_path_factory):
    """A reduced Kandinsky 6 SR VAE (five levels as released, narrow, one resnet a level) with random gammas and
    biases, in diffusers' naming (the only one known), and diffusers' model on the same weights."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = Reference(**SMALL).eval()
    sd = {}
    for k, v in ref.state_dict().items():
        if k.endswith("gamma"):
            v = 1 + 0.2 * torch.randn_like(v)
        elif k.endswith("bias"):
            v = 0.1 * torch.randn_like(v)
        sd[k] = v.contiguous()
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("k6") / "kandinsky6_sr_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def _want(ref, z: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return ref.decode(z).sample.clamp(-1, 1)


@pytest.mark.parametrize("frames, hw", [(3, (2, 3)), (1, (2, 2)), (6, (1, 2))])
def test_decode_equals_diffusers(k6, frames, hw):
    """Over diffusers' own segments (its first one 5 latent frames, then 4: 6 frames cross one), a single frame.
    `decode` runs one latent frame at a time; the chunk test below decodes whole clips against diffusers too."""
    ref, path, _ = k6
    vae = load_vae(path)
    assert (vae.downscale, vae.time_factor, vae.video) == (16, 4, True)
    z = torch.randn(1, Z, frames, *hw, generator=torch.Generator().manual_seed(frames))
    with torch.inference_mode():
        got = vae.decode(z)
    want = _want(ref, z)
    assert got.shape == want.shape == (1, 3, 1 + 4 * (frames - 1), hw[0] * 16, hw[1] * 16)
    assert (got - want).abs().max() < 1e-5 and psnr(got, want) >= 40


def test_chunks_are_exact_and_tiles_are_seamless(k6):
    ref, path, _ = k6
    vae = load_vae(path)
    z = torch.randn(1, Z, 3, 4, 6, generator=torch.Generator().manual_seed(3))
    want = _want(ref, z).transpose(1, 2)  # (B, F, C, H, W) as decode_video gives it
    with torch.inference_mode():
        one = decode_video(vae, z, Tiling("full", tile_frames=1), device=CPU, dtype=torch.float32)
        whole = decode_video(vae, z, Tiling("full", tile_frames=0), device=CPU, dtype=torch.float32)
    assert (one - whole).abs().max() < 1e-5 and (whole - want).abs().max() < 1e-5
    info = RunInfo()
    tiled = decode(vae, z, tiled=True, tile=64, overlap=32, info=info) * 2 - 1  # [0, 1] images -> [-1, 1]
    assert info.mode == "tiled" and info.tiles > 1
    assert psnr(tiled, want) >= 35 and not torch.allclose(tiled, want, atol=1e-4)


def test_a_missing_or_misshapen_key_is_named_and_the_encoder_is_not_needed(k6, tmp_path):
    """(The encoder's keys: test_vae_kandinsky6_sr_encode.py.)"""
    from safetensors.torch import save_file

    _, path, sd = k6
    decoder = {k: v for k, v in sd.items() if k.startswith("decoder.")}
    save_file(decoder, str(tmp_path / "dec.safetensors"))
    z = torch.randn(1, Z, 2, 2, 2)
    with torch.inference_mode():
        assert torch.equal(load_vae(tmp_path / "dec.safetensors").decode(z), load_vae(path).decode(z))
    broken = dict(decoder)
    del broken["decoder.up.2.block.1.norm2.conv_b.bias"]
    save_file(broken, str(tmp_path / "missing.safetensors"))
    with pytest.raises(FormatError, match=r"missing .*decoder\.up\.2\.block\.1\.norm2\.conv_b\.bias"):
        load_vae(tmp_path / "missing.safetensors")
    broken = dict(decoder, **{"decoder.mid.block_2.norm1.norm_layer.gamma": torch.ones(7, 1, 1, 1)})
    save_file(broken, str(tmp_path / "shape.safetensors"))
    with pytest.raises(FormatError, match=r"wrong shape .*decoder\.mid\.block_2\.norm1\.norm_layer\.gamma"):
        load_vae(tmp_path / "shape.safetensors")
    from engine.errors import UnsupportedModel

    rgba = dict(decoder, **{"decoder.conv_out.conv.weight": torch.zeros(4, 4, 3, 3, 3),
                            "decoder.conv_out.conv.bias": torch.zeros(4)})  # fmt: skip
    save_file(rgba, str(tmp_path / "rgba.safetensors"))
    with pytest.raises(UnsupportedModel, match="4 image channels"):
        load_vae(tmp_path / "rgba.safetensors")


def test_the_released_layout_is_detected_and_read_from_a_header_faithful_file(tmp_path):
    """diffusers' default configuration (the release's) as a sparse file: detected as Kandinsky 6 SR's video VAE
    (the image and video KVAEs stay refused as before), built at its widths with no tensor data read, its
    estimate and plan counting 1 + 4 (T - 1) frames."""
    from diffusers.models.autoencoders.autoencoder_kl_kvae import AutoencoderKLKVAE
    from diffusers.models.autoencoders.autoencoder_kl_kvae_video import AutoencoderKLKVAEVideo

    from engine.detect import detect_file
    from engine.errors import UnsupportedModel
    from engine.formats.safetensors import write_sparse
    from engine.vae import estimate as est
    from tests.engine.layouts_2026.common import meta_shapes

    def sparse(cls, name):
        return write_sparse(tmp_path / name, [(k, "BF16", s) for k, s in meta_shapes(cls).items()])

    path = sparse(Reference, "kandinsky6_sr_vae.safetensors")
    det = detect_file(path)
    assert (det.kind, det.architecture) == ("vae", "kandinsky6_sr")
    for cls in (AutoencoderKLKVAE, AutoencoderKLKVAEVideo):
        other = sparse(cls, f"{cls.__name__}.safetensors")
        assert detect_file(other).architecture is None
        with pytest.raises(UnsupportedModel, match="KVAE"):
            load_vae(other)
    vae = load_vae(path)
    c = vae.cfg
    assert (c.z, c.dims, c.temporal, c.layers_per_block) == (64, (16, 256, 512, 1024, 2048),
                                                             (False, False, True, True, False), 2)  # fmt: skip
    assert (c.enc_dims, c.enc_temporal, c.enc_layers) == ((16, 128, 256, 512, 1024),
                                                          (False, True, True, False, False), 2)  # fmt: skip
    assert (vae.downscale, vae.time_factor) == (16, 4)
    spec = est.spec_of(vae)
    # the bf16 decoder (2.93 GB) and encoder (0.55 GB): the file holds both, so both load
    assert spec.kind == "kandinsky6_sr" and spec.video and 3.4e9 < spec.weight_bytes < 3.5e9
    assert spec.weight_bytes * 2 == est.VIDEO_SPECS["kandinsky6_sr"].weight_bytes  # its float32 default
    assert est.video_widths(str(path), "kandinsky6_sr") == (16, 2048)
    assert [est.video_frames("kandinsky6_sr", t) for t in (1, 2, 21)] == [1, 5, 81]


def test_the_command_line_decodes_a_clip_and_plans_one(k6, tmp_path, capsys):
    import json

    from engine.cli import main
    from engine.formats.latent import write_latent

    z = torch.randn(1, Z, 2, 3, 4, generator=torch.Generator().manual_seed(5))
    write_latent(tmp_path / "clip.latent", z)
    args = ["decode", "--json", "--quiet", "--vae", k6[1], "--latent", str(tmp_path / "clip.latent")]
    assert main([*args, "--out", f"{tmp_path}/frames/"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 5 and res["size"] == [64, 48]
    assert sorted(p.name for p in (tmp_path / "frames").iterdir()) == [f"{i:06d}.png" for i in range(5)]
    assert main(["plan", "--model", k6[1], "--decode", "832x480x81", "--vram", "2", "--json"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["steps"]
    assert (
        step["step"] == "decode" and step["detail"]["frames"] == 81 and step["detail"]["latent_frames"] == 21
    )
