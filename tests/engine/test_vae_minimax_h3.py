"""MiniMax-H3's video VAE (engine.vae.minimax_h3): its ViT decoder equals diffusers' AutoencoderKLMiniMaxH3 on the
same weights -- the release's tiled output and the untiled one -- over frame counts that pad and cross-fade, loads
strictly, reads the released widths from a header-faithful file, decodes from the command line, and stops (its
encoder: test_vae_minimax_h3_encode)."""

from __future__ import annotations

import json

import pytest
import torch

diffusers = pytest.importorskip("diffusers")

MEAN = torch.tensor((0.485, 0.456, 0.406))[None, :, None, None, None]
STD = torch.tensor((0.229, 0.224, 0.225))[None, :, None, None, None]
SMALL = dict(
    block_out_channels=(8,) * 6, norm_num_groups=4, decoder_num_layers=2, decoder_num_attention_heads=2
)


@pytest.fixture(scope="module")
def h3(tmp_path_factory):
    """A reduced MiniMax-H3 VAE (its encoder narrow, its decoder 2 blocks of 2 heads) with random weights, written
    in diffusers' naming (the release's only one), and diffusers' model on the same weights."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLMiniMaxH3(**SMALL).eval()
    sd = {
        k: torch.randn_like(v) * (0.5 if k.endswith(("scale1", "scale2")) else 0.05)
        for k, v in ref.state_dict().items()
    }
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("h3") / "minimax_h3_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def _reference(ref, z, tiled: bool = True) -> torch.Tensor:
    (ref.enable_tiling if tiled else ref.disable_tiling)()
    with torch.no_grad():
        out = (ref.decode(z).sample * STD + MEAN) * 2 - 1  # ImageNet-normalised -> [-1, 1]
    ref.enable_tiling()
    return out


@pytest.mark.parametrize("frames, hw", [(7, (20, 36)), (3, (4, 20)), (12, (5, 6))])
def test_decode_equals_diffusers_tiled_and_whole(h3, frames, hw):
    """The release's output (256-px tiles blended over their overlaps; chunks of latent frames cross-faded in
    time, padded with copies of the last) and the untiled decode, against diffusers' model."""
    from engine.vae.estimate import vit_frames
    from engine.vae.loading import load_vae

    ref, path, _ = h3
    vae = load_vae(path)
    z = torch.randn(1, 24, frames, *hw, generator=torch.Generator().manual_seed(frames))
    with torch.inference_mode():
        got, whole = vae.decode(z), vae.decode(z, None)
    want = _reference(ref, z)
    assert got.shape == want.shape and got.shape[2] == vae.frames_out(frames) == vit_frames(frames)
    assert (got - want).abs().max() < 1e-5
    assert (whole - _reference(ref, z, tiled=False)).abs().max() < 1e-5
    if hw[0] * 16 > 256 or hw[1] * 16 > 256:
        assert not torch.equal(got, whole)  # a ViT's tiles are not the whole frame: the release's choice


def test_frame_counts_and_a_latent_too_short_for_a_chunk(h3):
    from engine.errors import UnsupportedModel
    from engine.vae.estimate import latent_frames_for, video_frames
    from engine.vae.loading import load_vae

    assert [video_frames("minimax_h3", t) for t in (1, 2, 3, 7, 12, 17)] == [0, 0, 9, 22, 39, 56]
    assert latent_frames_for("minimax_h3", 22) == 7 and latent_frames_for("wan21", 81) == 21
    vae = load_vae(h3[1])
    with pytest.raises(UnsupportedModel, match="5n \\+ 2 frames"):
        vae.decode(torch.zeros(1, 24, 2, 4, 4))


def test_a_missing_or_misshapen_decoder_key_is_named_and_the_encoder_is_not_needed(h3, tmp_path):
    from safetensors.torch import save_file

    from engine.errors import FormatError
    from engine.vae.loading import load_vae

    _, _, sd = h3
    decoder_only = {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}
    save_file(decoder_only, str(tmp_path / "dec.safetensors"))
    z = torch.randn(1, 24, 3, 4, 4)
    with torch.inference_mode():
        a, b = load_vae(tmp_path / "dec.safetensors").decode(z), load_vae(h3[1]).decode(z)
    assert torch.equal(a, b)
    broken = dict(decoder_only)
    del broken["decoder.transformer_blocks.1.attn.to_k.bias"]
    save_file(broken, str(tmp_path / "missing.safetensors"))
    with pytest.raises(FormatError, match="transformer_blocks.1.attn.to_k.bias"):
        load_vae(tmp_path / "missing.safetensors")
    broken = dict(decoder_only, **{"decoder.norm_out.weight": torch.ones(7)})
    save_file(broken, str(tmp_path / "shape.safetensors"))
    with pytest.raises(FormatError, match="decoder.norm_out.weight"):
        load_vae(tmp_path / "shape.safetensors")


def test_the_released_layout_reads_its_widths_from_a_header_faithful_file(tmp_path):
    """diffusers' default configuration (the release's: a 36-block, 2048-wide decoder) as a sparse file: detected as
    MiniMax-H3's VAE, built with 32 heads, 4 registers and the SwiGLU's 8192, no tensor data read."""
    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse
    from engine.vae.loading import load_vae
    from tests.engine.layouts_2026.common import meta_shapes

    rows = [(k, "F32", s) for k, s in meta_shapes(diffusers.AutoencoderKLMiniMaxH3).items()]
    path = write_sparse(tmp_path / "minimax_h3_vae.safetensors", rows)
    det = detect_file(path)
    assert (det.kind, det.architecture) == ("vae", "minimax_h3")
    vae = load_vae(path)
    cfg = vae.cfg
    assert (cfg.z, cfg.dim, cfg.heads, cfg.layers, cfg.registers, cfg.ffn) == (24, 2048, 32, 36, 4, 8192)
    assert (
        vae.encoder.conv_in.out_channels == 128 and len(vae.encoder.down_blocks) == 6
    )  # the encoder, built too
    spec = vae.vae_spec()
    assert (
        spec.kind == "minimax_h3" and spec.weight_bytes == 10_415_475_936 and spec.enc_ch == 128
    )  # 2.6 B float32


def test_the_command_line_decodes_frames_and_stops_cleanly(h3, tmp_path, capsys):
    from engine.cli import main
    from engine.errors import Cancelled
    from engine.formats.latent import write_latent
    from engine.jobs import CancelToken
    from engine.vae import decode
    from engine.vae.loading import load_vae

    z = torch.randn(1, 24, 7, 20, 24, generator=torch.Generator().manual_seed(1))
    write_latent(tmp_path / "clip.latent", z)
    args = ["decode", "--json", "--quiet", "--vae", h3[1], "--latent", str(tmp_path / "clip.latent")]
    assert main([*args, "--out", f"{tmp_path}/frames/"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 22 and res["size"] == [384, 320] and res["mode"] == "tiled" and res["tiles"] == 4
    assert sorted(p.name for p in (tmp_path / "frames").iterdir()) == [f"{i:06d}.png" for i in range(22)]
    assert main([*args, "--out", f"{tmp_path}/whole/", "--no-tile"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "full"
    token, seen = CancelToken(), []

    def report(p):
        seen.append(p)
        if len(seen) == 2:
            token.cancel()

    with pytest.raises(Cancelled):
        decode(load_vae(h3[1]), z, token=token, report=report)
    assert len(seen) == 2  # stopped at the next op after the second tile


def test_an_encode_with_an_encoder_of_unknown_groups_says_so(h3):
    """The fixture's encoder is 8 wide (4 GroupNorm groups): the count is not in the file, and 8 channels cannot take
    the release's 32, so the encoder is left unread and the VAE decodes only."""
    from engine.errors import UnsupportedModel
    from engine.vae import encode
    from engine.vae.loading import load_vae

    with pytest.raises(UnsupportedModel, match="its encoder is not run yet"):
        encode(load_vae(h3[1]), torch.rand(1, 3, 64, 64))
