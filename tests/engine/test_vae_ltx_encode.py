"""The LTX-Video VAEs' encoder (engine.vae.ltx_encoder) against diffusers' AutoencoderKLLTXVideo /
AutoencoderKLLTX2Video on the same weights: 0.9.0's layout (strided convolutions, width-changing blocks),
0.9.5's and LTX-2's (space-to-depth downsamplers), causal in chunks of one latent frame and, where the config
says so, not causal; both namings; what it refuses, by name; `loadout encode` and back."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.errors import FormatError
from engine.vae import decode, encode
from engine.vae import estimate as est
from engine.vae.estimate import spec_of
from engine.vae.loading import _made, load_vae, strict_load
from engine.vae.ltx import Pads
from engine.vae.ltx_loading import LTX2_PADS, build
from engine.vae.wan import patchify

diffusers = pytest.importorskip("diffusers")

# Tiny VAEs whose encoders have every kind of block: 0.9.0's (width-changing lone blocks after strided
# convolutions), 0.9.5's (space-to-depth in space, time, both) and LTX-2's (the same, its own class)
DEC095 = dict(decoder_block_out_channels=(8, 16, 32), decoder_layers_per_block=(1, 1, 1, 1),
              decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
              upsample_residual=(True,) * 3, upsample_factor=(2,) * 3, timestep_conditioning=True)  # fmt: skip
V090 = dict(block_out_channels=(8, 16, 32, 32), decoder_block_out_channels=(4, 8, 16, 16), latent_channels=16,
            layers_per_block=(1, 2, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1))  # fmt: skip
V095 = dict(block_out_channels=(8, 16, 16, 32, 32), latent_channels=16, layers_per_block=(1, 2, 1, 1, 1),
            down_block_types=("LTXVideo095DownBlock3D",) * 4, spatio_temporal_scaling=(True,) * 4,
            downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"), **DEC095)  # fmt: skip
LTX2 = dict(block_out_channels=(16, 16, 32, 32), layers_per_block=(1, 2, 1, 1, 1), latent_channels=16,
            decoder_block_out_channels=(8, 16, 32), decoder_layers_per_block=(1, 1, 1, 1), timestep_conditioning=True)  # fmt: skip
RELEASES = {
    "0.9.0": (V090, "AutoencoderKLLTXVideo", Pads()),
    "0.9.5": (V095, "AutoencoderKLLTXVideo", Pads()),
    "ltx2": (LTX2, "AutoencoderKLLTX2Video", LTX2_PADS),
}


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(float(b.abs().max()) ** 2 / mse)


def _reference(release: str, seed: int = 0, **extra):
    kw, cls, _ = RELEASES[release]
    ref = getattr(diffusers, cls)(**{**kw, **extra})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # weights of a trained network's scale: activations stay O(1) through the blocks
        for n, p in ref.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(
                1000 + 100 * r
                if n.endswith("multiplier")
                else r * (0.5 / math.sqrt(p[0].numel() if p.dim() else 1))
            )
    return ref.eval()


def _mine(ref, release: str):
    return build(
        {k: v.clone() for k, v in ref.state_dict().items()}, "ref", strict_load, _made, RELEASES[release][2]
    )


@pytest.fixture(scope="module", params=list(RELEASES))
def pair(request):
    ref = _reference(request.param)
    return request.param, ref, _mine(ref, request.param)


def _clip(frames: int, h: int = 64, w: int = 96, seed: int = 1) -> torch.Tensor:
    return torch.rand(1, 3, frames, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def test_encode_matches_diffusers_for_an_image_and_a_clip(pair):
    """The posterior's mean (diffusers' latent_dist.mode(): conv_out's first z channels), raw VAE space."""
    _, ref, mine = pair
    assert hasattr(mine, "encoder") and mine.enc_cfg.time_factor == 8 and mine.enc_cfg.downscale == 32
    for frames in (1, 17):
        x = _clip(frames)
        with torch.inference_mode():
            want = ref.encode(x).latent_dist.mode()
            got = mine.encode(x)
        assert got.shape == want.shape == (1, 16, 1 + (frames - 1) // 8, 2, 3)
        # measured: max abs error 2e-7 - 2e-6 on latents of magnitude ~1-2.5 (float32), PSNR > 120 dB
        assert float((got - want).abs().max()) < 2e-5 and psnr(got, want) > 90


def test_the_chunked_encode_equals_the_whole_clip(pair):
    """A latent frame at a time (the first 9 frames, then 8) through a Stream is the whole clip's pass: each
    strided output reads the frames it reads in the whole clip."""
    _, _, mine = pair
    x = _clip(25, 32, 64, seed=3)
    with torch.inference_mode():
        chunked = mine.encode(x)
        whole = mine.encoder.step(patchify(x, 4), None)[:, :16]
    assert chunked.shape == whole.shape == (1, 16, 4, 1, 2)
    assert float((chunked - whole).abs().max()) < 1e-5  # measured 0 - 3e-7: the convolutions' rounding
    # the carried frames are what makes it so: frames 9-16 encoded after a fresh start at frame 8 differ
    with torch.inference_mode():
        alone = mine.encode(x[:, :, 8:17])[:, :, 1]
    assert float((alone - whole[:, :, 2]).abs().max()) > 1e-4  # measured 1e-3 (0.9.0) and more


def test_a_non_causal_or_mirrored_encoder_config_is_followed(tmp_path):
    """LTX-2's class takes `encoder_causal` and `encoder_spatial_padding_mode`: read from the config.json
    beside diffusers' weights; a non-causal encoder runs the clip whole."""
    from safetensors.torch import save_file

    for extra in (dict(encoder_causal=False), dict(encoder_spatial_padding_mode="reflect")):
        ref = _reference("ltx2", seed=2, **extra)
        d = tmp_path / next(iter(extra))
        d.mkdir()
        save_file(
            {k: v.contiguous() for k, v in ref.state_dict().items()},
            d / "diffusion_pytorch_model.safetensors",
        )
        ref.save_config(d)
        mine = load_vae(d / "diffusion_pytorch_model.safetensors")
        assert mine.enc_cfg.causal == extra.get("encoder_causal", True)
        assert mine.enc_cfg.reflect == ("encoder_spatial_padding_mode" in extra)
        x = _clip(17, seed=4)
        with torch.inference_mode():
            want = ref.encode(x).latent_dist.mode()
            got = mine.encode(x)
        assert float((got - want).abs().max()) < 2e-5
        plain = _mine(ref, "ltx2")  # the same weights, the default (causal, zero borders) encoder
        with torch.inference_mode():
            assert float((plain.encode(x) - want).abs().max()) > 1e-3


def test_an_unsupported_frame_count_or_size_is_named():
    ref = _reference("0.9.5")
    mine = _mine(ref, "0.9.5")
    with pytest.raises(FormatError, match=r"1 \+ 8k frames .*5 frames"):
        mine.encode(_clip(5))
    with pytest.raises(FormatError, match="multiples of 32"):
        mine.encode(_clip(1, 48, 64))


def _original_named(mine) -> dict[str, torch.Tensor]:
    """Lightricks' single-file naming: our module paths under `vae.`."""
    return {f"vae.{k}": v.contiguous() for k, v in mine.state_dict().items()}


def test_original_naming_is_what_diffusers_converts_from(pair):
    """diffusers' own single-file converters turn our (Lightricks) encoder names into exactly the
    diffusers encoder's."""
    from diffusers.loaders.single_file_utils import (
        convert_ltx2_vae_to_diffusers,
        convert_ltx_vae_checkpoint_to_diffusers,
    )

    release, ref, mine = pair
    sd = _original_named(mine)
    if release == "0.9.5":  # the converter picks 0.9.5's table by the released encoder's last width
        sd["vae.encoder.conv_out.conv.weight"] = torch.zeros(17, 2048, 3, 3, 3)
    convert = convert_ltx2_vae_to_diffusers if release == "ltx2" else convert_ltx_vae_checkpoint_to_diffusers
    got = {k: v for k, v in convert(dict(sd)).items() if k.startswith("encoder.")}
    theirs = {k: v for k, v in ref.state_dict().items() if k.startswith("encoder.")}
    assert set(got) == set(theirs)
    assert all(torch.equal(got[k], theirs[k]) for k in theirs if k != "encoder.conv_out.conv.weight")


def test_both_namings_load_the_encoder_and_encode_alike(pair, tmp_path):
    from safetensors.torch import save_file

    release, ref, mine = pair
    meta = {
        "config": json.dumps(
            {"vae": {"decoder_spatial_padding_mode": "reflect" if release == "ltx2" else "zeros"}}
        )
    }
    save_file(_original_named(mine), tmp_path / "single.safetensors", meta)
    (tmp_path / "vae").mkdir()
    save_file(
        {k: v.contiguous() for k, v in ref.state_dict().items()},
        tmp_path / "vae/diffusion_pytorch_model.safetensors",
    )
    ref.save_config(tmp_path / "vae")
    a, b = (
        load_vae(tmp_path / "single.safetensors"),
        load_vae(tmp_path / "vae/diffusion_pytorch_model.safetensors"),
    )
    assert a.enc_cfg == b.enc_cfg == mine.enc_cfg
    x = _clip(9, seed=6)
    with torch.inference_mode():
        assert torch.allclose(a.encode(x), b.encode(x), atol=1e-6)
        assert torch.allclose(a.encode(x), ref.encode(x).latent_dist.mode(), atol=2e-5)


def test_a_missing_or_misshapen_encoder_key_is_named(tmp_path):
    from safetensors.torch import save_file

    ref = _reference("0.9.5")
    ref.save_config(tmp_path)
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd.pop("encoder.down_blocks.1.resnets.1.conv2.conv.weight")
    save_file(sd, tmp_path / "missing.safetensors")
    with pytest.raises(
        FormatError, match=r"missing .*encoder\.down_blocks\.2\.res_blocks\.1\.conv2\.conv\.weight"
    ):
        load_vae(tmp_path / "missing.safetensors")
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd["encoder.mid_block.resnets.0.conv1.conv.bias"] = torch.zeros(31)
    save_file(sd, tmp_path / "bad.safetensors")
    with pytest.raises(
        FormatError, match=r"wrong shape .*encoder\.down_blocks\.8\.res_blocks\.0\.conv1\.conv\.bias"
    ):
        load_vae(tmp_path / "bad.safetensors")
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd.pop("encoder.down_blocks.1.downsamplers.0.conv.conv.weight")
    save_file(sd, tmp_path / "nodown.safetensors")
    with pytest.raises(FormatError, match=r"encoder block 3 is neither"):
        load_vae(tmp_path / "nodown.safetensors")


def test_a_decoder_only_file_still_decodes_and_refuses_to_encode(tmp_path):
    from safetensors.torch import save_file

    ref = _reference("0.9.5")
    ref.save_config(tmp_path)
    save_file({k: v.contiguous() for k, v in ref.state_dict().items() if not k.startswith("encoder.")},
              tmp_path / "decoder.safetensors")  # fmt: skip
    vae = load_vae(tmp_path / "decoder.safetensors")
    assert not hasattr(vae, "encoder")
    # the estimate's weights are the model's: an encoding one counts its encoder's
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, tmp_path / "both.safetensors")
    both = load_vae(tmp_path / "both.safetensors")
    enc_bytes = sum(v.numel() * 4 for k, v in ref.state_dict().items() if k.startswith("encoder."))
    assert spec_of(both).weight_bytes - spec_of(vae).weight_bytes == enc_bytes > 0
    assert spec_of(both).k_act("encode") > 0  # engine.vae.estimate.K_VIDEO_ENCODE: measured, not 0
    assert decode(vae, torch.randn(1, 16, 1, 2, 2)).shape == (1, 1, 3, 64, 64)
    with pytest.raises(FormatError, match="holds the decoder only: give the VAE file with its encoder"):
        encode(vae, torch.rand(1, 3, 64, 64))


def test_loadout_encode_an_image_and_decode_it_back(tmp_path, capsys):
    """`loadout encode` on a tiny Lightricks-named file: one frame, 32x, the latent diffusers gives; `loadout
    decode` takes it back to an image of the encoded size."""
    from PIL import Image
    from safetensors.torch import save_file

    from engine.cli import main
    from engine.formats.latent import read_latent

    ref = _reference("0.9.5")
    save_file(_original_named(_mine(ref, "0.9.5")), tmp_path / "ltxv.safetensors",
              {"config": '{"vae": {"causal_decoder": false}}'})  # fmt: skip
    px = (torch.rand(70, 100, 3, generator=torch.Generator().manual_seed(8)) * 255).to(torch.uint8)
    Image.fromarray(px.numpy()).save(tmp_path / "in.png")
    args = ["encode", "--vae", str(tmp_path / "ltxv.safetensors"), "--image", str(tmp_path / "in.png"),
            "--out", str(tmp_path / "in.latent"), "--json", "--quiet"]  # fmt: skip
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, 16, 2, 3] and res["encoded_size"] == [96, 64]
    lat = read_latent(tmp_path / "in.latent")
    x = px[:64, :96].permute(2, 0, 1)[None, :, None].float() / 255 * 2 - 1
    with torch.inference_mode():
        want = ref.encode(x).latent_dist.mode()[:, :, 0]
    assert float((lat - want).abs().max()) < 1e-4
    args = ["decode", "--vae", str(tmp_path / "ltxv.safetensors"), "--latent", str(tmp_path / "in.latent"),
            "--out", str(tmp_path / "back.png"), "--json", "--quiet"]  # fmt: skip
    assert main(args) == 0
    capsys.readouterr()
    assert Image.open(tmp_path / "back.png").size == (96, 64)


@pytest.mark.parametrize("release", ["0.9.0", "0.9.5", "ltx2"])
def test_the_released_encoders_are_read_from_header_faithful_files(release, tmp_path):
    """The releases' encoders at full size in Lightricks' naming (sparse: the header, no data): 0.9.0's
    (diffusers' defaults), 0.9.5's (Lightricks/LTX-Video-0.9.5's config) and LTX-2's (the class defaults):
    widths from 128, 8x in time, 32x in space, the weights counted by the estimate."""
    from engine.formats.safetensors import write_sparse
    from tests.engine.layouts_2026.common import meta_shapes
    from tests.engine.layouts_2026.parts import LTX2_STAGES, LTXV090_STAGES, ltx_vae_original

    enc095 = dict(block_out_channels=(128, 256, 512, 1024, 2048), layers_per_block=(4, 6, 6, 2, 2),
                  down_block_types=("LTXVideo095DownBlock3D",) * 4, spatio_temporal_scaling=(True,) * 4,
                  downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
                  decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 5, 5, 5),
                  decoder_spatio_temporal_scaling=(True,) * 3, decoder_inject_noise=(False,) * 4,
                  upsample_residual=(True,) * 3, upsample_factor=(2,) * 3, timestep_conditioning=True)  # fmt: skip
    if release == "ltx2":
        rows = ltx_vae_original(meta_shapes(diffusers.AutoencoderKLLTX2Video), LTX2_STAGES, ltx2=True)
    elif release == "0.9.0":
        rows = ltx_vae_original(meta_shapes(diffusers.AutoencoderKLLTXVideo), LTXV090_STAGES)
    else:  # diffusers' names under `vae.` (as the decoder's test of this layout)
        rows = {f"vae.{k}": s for k, s in meta_shapes(diffusers.AutoencoderKLLTXVideo, **enc095).items()}
    meta = {
        "config": json.dumps(
            {"vae": {"decoder_spatial_padding_mode": "reflect" if release == "ltx2" else "zeros"}}
        )
    }
    path = write_sparse(tmp_path / "vae.safetensors", [(k, "BF16", tuple(s)) for k, s in rows.items()], meta)
    vae = load_vae(path)
    e = vae.enc_cfg
    assert (e.width, e.out, e.time_factor, e.downscale, e.causal) == (128, 129, 8, 32, True)
    # 0.9.0: encoder.down_blocks.0-9 (diffusers' 0.9.0 table): res, conv, lone, ..., the middle
    if release == "0.9.0":
        kinds = ["res", "conv", "lone", "res", "conv", "lone", "res", "conv", "res", "res"]
        assert [b[0] for b in e.blocks] == kinds
    else:  # spatial, temporal, both, both
        downs = [
            ("down", 128, 256, 4),
            ("down", 256, 512, 2),
            ("down", 512, 1024, 8),
            ("down", 1024, 2048, 8),
        ]
        assert [b for b in e.blocks if b[0] == "down"] == downs
    enc = sum(math.prod(s) for k, s in rows.items() if k.startswith("vae.encoder."))
    assert spec_of(vae).weight_bytes >= 2 * enc > 0  # bf16 on the meta device: every encoder weight counted
    # and oneDNN's reorder of its widest convolution's weight (a float32 copy, twice): the middle block's
    fixed = 8 * 27 * (512 if release == "0.9.0" else 2048) ** 2
    assert spec_of(vae).encode_fixed == fixed and (release == "0.9.0" or fixed == est.LTX_ENCODE_FIXED)
    spec = est.VIDEO_SPECS["ltxv"]  # the plan's (no model loaded) counts it too
    floor = est.RUNTIME_BYTES + spec.weight_bytes + est.LTX_ENCODE_FIXED
    assert est.estimate_encode_bytes(512, 512, kind="ltxv") > floor


def test_a_stop_interrupts_the_encode_between_its_ops():
    """Every convolution of the encoder checks the job's token (engine.ops): a stop takes effect inside the
    encode, not after it."""
    from engine import ops
    from engine.jobs import Cancelled, CancelToken

    mine = _mine(_reference("0.9.5"), "0.9.5")
    token, seen = CancelToken(), []

    class Counting(CancelToken):
        def raise_if_cancelled(self) -> None:
            seen.append(1)
            if len(seen) == 5:  # the 5th op of the first chunk
                token.cancel("stop")
            token.raise_if_cancelled()

    with ops.cancel_scope(Counting()), pytest.raises(Cancelled):
        mine.encode(_clip(9))
    assert len(seen) == 5


def test_a_folder_of_frames_encodes_its_first_1_plus_8k(tmp_path, capsys):
    """`loadout encode --image DIR/` with LTX-Video: 11 frames encode their first 9 (1 + 8k, the note says so),
    and the latent is diffusers' encode of those 9."""
    from PIL import Image
    from safetensors.torch import save_file

    from engine.cli import main
    from engine.formats.latent import read_latent

    ref = _reference("0.9.5")
    save_file(_original_named(_mine(ref, "0.9.5")), tmp_path / "ltxv.safetensors",
              {"config": '{"vae": {"causal_decoder": false}}'})  # fmt: skip
    px = (torch.rand(11, 64, 96, 3, generator=torch.Generator().manual_seed(9)) * 255).to(torch.uint8)
    (tmp_path / "frames").mkdir()
    for i, f in enumerate(px):
        Image.fromarray(f.numpy()).save(tmp_path / "frames" / f"{i}.png")
    args = ["encode", "--vae", str(tmp_path / "ltxv.safetensors"), "--image", str(tmp_path / "frames"),
            "--out", str(tmp_path / "clip.latent"), "--json", "--quiet"]  # fmt: skip
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 9 and res["latent_shape"] == [1, 16, 2, 2, 3]
    assert any("first 9 of 11 frames" in n and "1 + 8k" in n for n in res["notes"])
    x = px[:9].permute(3, 0, 1, 2)[None].float() / 255 * 2 - 1
    with torch.inference_mode():
        want = ref.encode(x).latent_dist.mode()
    assert float((read_latent(tmp_path / "clip.latent") - want).abs().max()) < 1e-4
