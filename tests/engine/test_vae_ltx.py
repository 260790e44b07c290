"""The LTX-Video VAE's decoder (engine.vae.ltx) against diffusers' AutoencoderKLLTXVideo on the same
weights: 0.9.0's layout and the timestep-conditioned one with residual upsamplers (0.9.5+), in both
namings, whole, in chunks with context frames, and tiled; what it refuses, by name."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import FormatError, UnsupportedModel
from engine.events import Tiling
from engine.vae import decode
from engine.vae import estimate as est
from engine.vae.loading import _made, load_vae, strict_load
from engine.vae.ltx import Pads
from engine.vae.ltx_loading import LTX2_PADS, build
from engine.vae.run import RunInfo
from engine.vae.video import decode_video

diffusers = pytest.importorskip("diffusers")

# Tiny decoders: 0.9.0's layout (a width-changing block before an upsampler, no timestep) and 0.9.5's
# (timestep conditioning, upsamplers with the residual and a factor of 2)
V090 = dict(block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(4, 8, 16, 16), latent_channels=16,
            layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1, 1))  # fmt: skip
V095 = dict(block_out_channels=(8, 8, 8, 8), decoder_block_out_channels=(8, 16, 32), latent_channels=16,
            layers_per_block=(1, 1, 1, 1, 1), decoder_layers_per_block=(1, 1, 1, 1),
            decoder_spatio_temporal_scaling=(True, True, True), decoder_inject_noise=(False,) * 4,
            upsample_residual=(True,) * 3, upsample_factor=(2,) * 3, timestep_conditioning=True)  # fmt: skip


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


def _reference(kw: dict, seed: int = 0, cls=None):
    ref = (cls or diffusers.AutoencoderKLLTXVideo)(**kw)
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


def _mine(ref, ltx2: bool = False):
    """Our decoder on ref's weights; the generation said by the caller (a file says it in its config)."""
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    return build(sd, "ref", strict_load, _made, LTX2_PADS if ltx2 else Pads())


@pytest.fixture(scope="module", params=["0.9.0", "0.9.5"])
def pair(request):
    ref = _reference(V090 if request.param == "0.9.0" else V095)
    return ref, _mine(ref)


def _ref_decode(ref, z, t: float = 0.05):
    temb = torch.tensor([t]) if ref.config.timestep_conditioning else None
    with torch.inference_mode():
        return ref.decode(z, temb, return_dict=False)[0].clamp(-1, 1).transpose(1, 2)


def test_full_decode_matches_diffusers(pair):
    ref, mine = pair
    torch.manual_seed(1)
    z = torch.randn(1, 16, 3, 2, 3)
    want = _ref_decode(ref, z)
    got = decode(mine, z) * 2 - 1
    assert got.shape == want.shape == (1, 17, 3, 64, 96)
    err = float((got - want).abs().max())
    # measured: max abs error ~1e-5 (float32; ~5e-6 for the [0, 1] image), PSNR > 100 dB
    assert err < 1e-4 and psnr(got, want) >= 40
    if mine.cfg.timestep:  # the decode timestep is an input: another one gives another clip, as diffusers'
        mine.decode_timestep = 0.5
        try:
            other = decode(mine, z) * 2 - 1
        finally:
            mine.decode_timestep = 0.05
        assert psnr(other, _ref_decode(ref, z, 0.5)) >= 40 and psnr(other, want) < 40


def test_chunks_with_context_frames_equal_the_whole_clip_and_tiles_are_seamless(pair):
    """The decoder is not causal: each chunk decodes with time_context latent frames a side, whose
    output is dropped. Covering the decoder's reach, that is the whole pass's result."""
    _, mine = pair
    torch.manual_seed(2)
    t = 2 * mine.time_context + 3  # chunks in the middle see context on both sides
    z = torch.randn(1, 16, t, 2, 2)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        whole = decode_video(mine, z, Tiling("full", tile_frames=0), device=cpu, dtype=torch.float32)
        one = decode_video(mine, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
    assert one.shape == whole.shape == (1, 1 + 8 * (t - 1), 3, 64, 64)
    assert float((one - whole).abs().max()) < 1e-5
    # too little context is not exact: the reach is real
    mine.time_context, reach = 1, mine.time_context
    try:
        with torch.inference_mode():
            short = decode_video(mine, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
    finally:
        mine.time_context = reach
    assert float((short - whole).abs().max()) > 1e-3
    z = torch.randn(1, 16, 2, 8, 8)
    want = decode(mine, z) * 2 - 1
    info = RunInfo()
    # the releases' context (VaeSpec.context_px: 64 px, 2 latent pixels each side of a seam), 6-pixel tiles;
    # measured 61 dB (0.9.0's layout) and 38 dB (0.9.5's); one latent pixel of context gave 57 and 34
    tiled = decode(
        mine, z, tiled=True, tile=192, overlap=2 * est.VIDEO_SPECS["ltxv"].context_px("decode"), info=info
    )
    tiled = tiled * 2 - 1
    assert info.mode == "tiled" and info.tiles > 1
    assert psnr(tiled, want) >= 35


# What Lightricks' single files say of their VAE in the metadata's `config` (the decoder's part of it)
LTXV_META = {"config": '{"vae": {"_class_name": "CausalVideoAutoencoder", "causal_decoder": false}}'}


def _original_named(ref, mine) -> dict[str, torch.Tensor]:
    """Lightricks' single-file naming: our module paths under `vae.`, with the latent statistics."""
    sd = {f"vae.{k}": v.contiguous() for k, v in mine.state_dict().items()}
    g = torch.Generator().manual_seed(5)
    sd["vae.per_channel_statistics.mean-of-means"] = torch.randn(16, generator=g)
    sd["vae.per_channel_statistics.std-of-means"] = torch.rand(16, generator=g) + 0.5
    return sd


def test_original_naming_is_what_diffusers_converts_from(pair):
    """diffusers' own single-file converter turns our (Lightricks) names into exactly the diffusers
    decoder's (it reads the encoder's last conv to pick the release: one is given)."""
    from diffusers.loaders.single_file_utils import convert_ltx_vae_checkpoint_to_diffusers

    ref, mine = pair
    sd = _original_named(ref, mine)
    sd["vae.encoder.conv_out.conv.weight"] = torch.zeros(1, 8, 1, 1, 1)
    converted = convert_ltx_vae_checkpoint_to_diffusers(dict(sd))
    theirs = {k: v for k, v in ref.state_dict().items() if k.startswith("decoder.")}
    got = {k: v for k, v in converted.items() if k.startswith("decoder.")}
    assert set(got) == set(theirs)
    assert all(torch.equal(got[k], theirs[k]) for k in theirs)


def test_both_namings_load_from_files_and_decode_alike(pair, tmp_path):
    from safetensors.torch import save_file

    ref, mine = pair
    save_file(_original_named(ref, mine), tmp_path / "ltx-video-2b-v0.9-tiny.safetensors", LTXV_META)
    (tmp_path / "vae").mkdir()  # diffusers' folder: the weights and config.json
    save_file(
        {k: v.contiguous() for k, v in ref.state_dict().items()},
        tmp_path / "vae/diffusion_pytorch_model.safetensors",
    )
    ref.save_config(tmp_path / "vae")
    a, b = (
        load_vae(tmp_path / "ltx-video-2b-v0.9-tiny.safetensors"),
        load_vae(tmp_path / "vae/diffusion_pytorch_model.safetensors"),
    )
    assert a.cfg == b.cfg == mine.cfg
    assert set(a.latent_stats) == {
        "per_channel_statistics.mean-of-means",
        "per_channel_statistics.std-of-means",
    }
    z = torch.randn(1, 16, 2, 2, 2)
    assert torch.allclose(decode(a, z), decode(b, z), atol=1e-5)  # the same sums, other weight buffers
    spec = est.spec_of(a)
    assert (spec.kind, spec.time_factor, spec.downscale, spec.time_context) == ("ltxv", 8, 32, a.time_context)


def test_a_missing_or_misshapen_key_is_named_and_noise_injection_is_refused(tmp_path):
    from safetensors.torch import save_file

    ref = _reference(V095)
    ref.save_config(tmp_path)  # diffusers' config.json beside the files: an LTX-Video VAE
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd.pop("decoder.up_blocks.1.resnets.0.conv2.conv.weight")
    save_file(sd, tmp_path / "broken.safetensors")
    with pytest.raises(FormatError, match=r"missing .*up_blocks\.4\.res_blocks\.0\.conv2\.conv\.weight"):
        load_vae(tmp_path / "broken.safetensors")
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd["decoder.mid_block.resnets.0.scale_shift_table"] = torch.zeros(4, 31)
    save_file(sd, tmp_path / "bad.safetensors")
    with pytest.raises(FormatError, match=r"wrong shape .*up_blocks\.0\.res_blocks\.0\.scale_shift_table"):
        load_vae(tmp_path / "bad.safetensors")
    noisy = _reference({**V095, "decoder_inject_noise": (False, True, True, True)})  # 0.9.1's decoder
    save_file({k: v.contiguous() for k, v in noisy.state_dict().items()}, tmp_path / "noisy.safetensors")
    with pytest.raises(UnsupportedModel, match=r"random noise .*0\.9\.1"):
        load_vae(tmp_path / "noisy.safetensors")


def test_loadout_decode_writes_the_clip_and_takes_the_decode_timestep(tmp_path, capsys):
    """`loadout decode` on a tiny Lightricks-named file: 1 + 8 (T - 1) frames at 32x and 24 fps; the decode
    timestep and the pipelines' seeded noise mixing are options of the decode, not of the file."""
    import json

    from PIL import Image
    from safetensors.torch import save_file

    from engine.cli import main
    from engine.formats.latent import write_latent

    ref = _reference(V095)
    save_file(_original_named(ref, _mine(ref)), tmp_path / "ltxv.safetensors", LTXV_META)
    z = torch.randn(1, 16, 2, 2, 3, generator=torch.Generator().manual_seed(7))
    write_latent(tmp_path / "clip.latent", z)
    base = ["decode", "--json", "--quiet", "--vae", str(tmp_path / "ltxv.safetensors"),
            "--latent", str(tmp_path / "clip.latent")]  # fmt: skip

    def frame(out: str, *extra: str) -> bytes:
        assert main([*base, "--out", str(tmp_path / out) + "/", *extra]) == 0
        res = json.loads(capsys.readouterr().out)
        assert res["frames"] == 9 and res["size"] == [96, 64] and res["fps"] == 24
        with Image.open(tmp_path / out / "000004.png") as im:
            return im.tobytes()

    want = _ref_decode(ref, z)[0, 4]  # diffusers at the pipelines' 0.05
    got = torch.frombuffer(bytearray(frame("a")), dtype=torch.uint8).reshape(64, 96, 3).permute(2, 0, 1)
    assert float((got.float() / 255 - (want + 1) / 2).abs().max()) <= 1 / 255 + 1e-6
    assert frame("b", "--decode-timestep", "0.05") == frame("a2") != frame("c", "--decode-timestep", "0.5")
    noisy = frame("d", "--decode-noise-scale", "0.5", "--seed", "3")
    assert noisy != frame("a3") and noisy == frame("e", "--decode-noise-scale", "0.5", "--seed", "3")


@pytest.mark.parametrize("release", ["0.9.0", "0.9.5"])
def test_the_released_layouts_config_is_read_from_a_header_faithful_file(release, tmp_path):
    """The releases' layouts at full size in Lightricks' naming (sparse: the header, no data): 0.9.0
    (diffusers' defaults) and a timestep-conditioned one with residual upsamplers (0.9.5's decoder:
    widths 1024 -> 128, 5 blocks a level); the config, the reach and the estimate's spec follow."""
    from engine.formats.safetensors import write_sparse
    from tests.engine.layouts_2026.common import meta_shapes
    from tests.engine.layouts_2026.parts import LTXV090_STAGES, ltx_vae_original

    kw = {} if release == "0.9.0" else dict(
        decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 5, 5, 5),
        decoder_spatio_temporal_scaling=(True,) * 3, decoder_inject_noise=(False,) * 4, upsample_residual=(True,) * 3,
        upsample_factor=(2,) * 3, timestep_conditioning=True,
    )  # fmt: skip
    shapes = meta_shapes(diffusers.AutoencoderKLLTXVideo, **kw)
    stages = LTXV090_STAGES if release == "0.9.0" else {"decoder": []}
    rows = (
        ltx_vae_original(shapes, stages) if release == "0.9.0" else {f"vae.{k}": s for k, s in shapes.items()}
    )
    meta = None if release == "0.9.0" else LTXV_META  # 0.9.5's tensors are LTX-2's too: its config tells
    path = write_sparse(
        tmp_path / "ltx-video-2b.safetensors", [(k, "BF16", tuple(s)) for k, s in rows.items()], meta
    )
    vae = load_vae(path)
    cfg = vae.cfg
    assert (cfg.z, cfg.downscale, cfg.time_factor, cfg.image_channels) == (128, 32, 8, 3)
    if release == "0.9.0":
        assert not cfg.timestep and cfg.width == 512 and cfg.last_width == 128
        # decoder.up_blocks.0-9 (diffusers' 0.9.0 table): the middle, then 512 x3, up, 512 x3, 512 -> 256, up, ...
        assert cfg.blocks == (
            ("res", 512, 4),
            ("res", 512, 3),
            ("up", 512, 1, (2, 2, 2), False),
            ("res", 512, 3),
            ("lone", 512, 256),
            ("up", 256, 1, (2, 2, 2), False),
            ("res", 256, 3),
            ("lone", 256, 128),
            ("up", 128, 1, (2, 2, 2), False),
            ("res", 128, 4),
        )
    else:
        assert cfg.timestep and cfg.width == 1024 and cfg.last_width == 128
        assert [b for b in cfg.blocks if b[0] == "up"] == [
            ("up", w, 2, (2, 2, 2), True) for w in (1024, 512, 256)
        ]
    spec = est.spec_of(vae)
    assert (spec.kind, spec.ch, spec.mid) == ("ltxv", 8, cfg.width)
    assert est.video_widths(str(path), "ltxv", "vae.") == (8, cfg.width)
    # the released decoders' up paths reach far: a chunk decodes with 10 / 12 latent frames a side
    assert vae.time_context == cfg.reach() == (10 if release == "0.9.0" else 12)
    assert vae.time_context == est.VIDEO_SPECS["ltxv"].time_context or release == "0.9.0"


# LTX-2's video VAE: the residual decoder with mirrored borders (and, where its config says so, causal)
LTX2 = dict(block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1), latent_channels=16,
            decoder_block_out_channels=(8, 16, 32), decoder_layers_per_block=(1, 1, 1, 1), timestep_conditioning=True)  # fmt: skip


@pytest.mark.parametrize("causal", [False, True])
def test_ltx2_decodes_like_diffusers_in_chunks_and_tiles(causal, tmp_path):
    """LTX-Video 0.9.5's tensors: told apart by the config the release ships -- diffusers' config.json
    beside its weights, or the metadata of Lightricks' single file."""
    from safetensors.torch import save_file

    ref = _reference({**LTX2, "decoder_causal": causal}, cls=diffusers.AutoencoderKLLTX2Video)
    if causal:  # Lightricks' naming and metadata
        meta = '{"vae": {"decoder_spatial_padding_mode": "reflect", "causal_decoder": true}}'
        sd = {f"vae.{k}": v.contiguous() for k, v in _mine(ref, ltx2=True).state_dict().items()}
        save_file(sd, tmp_path / "ltx-2.safetensors", {"config": meta})
    else:  # diffusers' naming and config.json
        sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
        save_file(sd, tmp_path / "ltx-2.safetensors")
        ref.save_config(tmp_path)
    mine = load_vae(tmp_path / "ltx-2.safetensors")
    assert mine.cfg.generation == "ltx2" and mine.cfg.pads.reflect and mine.cfg.pads.causal == causal
    assert est.spec_of(mine).kind == "ltx2"
    torch.manual_seed(4)
    z = torch.randn(1, 16, 3, 2, 3)
    want = _ref_decode(ref, z)
    got = decode(mine, z) * 2 - 1
    assert float((got - want).abs().max()) < 1e-4 and psnr(got, want) >= 40  # measured ~1e-6, 140 dB
    z = torch.randn(1, 16, 2 * mine.time_context + 2, 2, 2)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        whole = decode_video(mine, z, Tiling("full", tile_frames=0), device=cpu, dtype=torch.float32)
        one = decode_video(mine, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
    assert float((one - whole).abs().max()) < 1e-5
    z = torch.randn(1, 16, 2, 8, 8)
    tiled = decode(mine, z, tiled=True, tile=192, overlap=128) * 2 - 1
    assert psnr(tiled, decode(mine, z) * 2 - 1) >= 35
    # the same tensors without a config could be LTX-Video 0.9.5's: decoded as LTX-2's (what detection
    # names it), and the decode says so
    (tmp_path / "bare").mkdir()
    save_file(sd, tmp_path / "bare/ltx.safetensors")
    bare = load_vae(tmp_path / "bare/ltx.safetensors")
    assert bare.cfg.generation == "ltx2" and bare.cfg.pads.reflect and not bare.cfg.pads.causal
    info = RunInfo()
    decode(bare, torch.randn(1, 16, 2, 2, 2), info=info)
    assert any("without its config" in n for n in info.notes)


def test_the_decode_panels_estimate_counts_ltx_frames_and_pixels(tmp_path):
    """The preflight estimate (the Decode panel's) of an LTX latent: 32x, 1 + 8 (T - 1) frames."""
    from safetensors.torch import save_file

    from engine.formats.latent import write_latent
    from engine.preflight import estimate as preflight
    from engine.requests import EstimateDecode

    ref = _reference(V090)
    save_file(_original_named(ref, _mine(ref)), tmp_path / "ltxv.safetensors", LTXV_META)
    write_latent(tmp_path / "clip.latent", torch.zeros(1, 16, 4, 3, 5))
    got = preflight(EstimateDecode(str(tmp_path / "ltxv.safetensors"), str(tmp_path / "clip.latent")))
    assert (got.width, got.height, got.frames) == (160, 96, 25)
    assert 0 < got.tiled_bytes <= got.full_bytes


def test_plan_an_ltx_video_decode(tmp_path, capsys):
    """`loadout plan --decode WxHxF` on an LTX-Video VAE: 121 frames are 16 latent frames at 32x."""
    import json

    from safetensors.torch import save_file

    from engine.cli import main

    ref = _reference(V090)
    save_file(_original_named(ref, _mine(ref)), tmp_path / "ltxv.safetensors", LTXV_META)
    args = ["plan", "--model", str(tmp_path / "ltxv.safetensors"), "--decode", "768x512x121", "--json"]
    assert main([*args, "--vram", "80"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["steps"]
    assert (
        step["step"] == "decode" and step["detail"]["frames"] == 121 and step["detail"]["latent_frames"] == 16
    )
