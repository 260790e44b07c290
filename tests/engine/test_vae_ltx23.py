"""LTX-2.3's video VAE: a decoder that upsamples once in time only and once in space only, with no residual, and a
wider encoder (diffusers AutoencoderKLLTX2Video with convert_ltx2_to_diffusers' "2.3" config). Decoded, encoded,
detected and planned from its own tensors, in diffusers' naming and Lightricks' (engine.vae.ltx, ltx_loading)."""

from __future__ import annotations

import json

import pytest
import torch
from layouts_2026 import parts as P
from layouts_2026.common import detect, meta_shapes

from engine.events import Tiling
from engine.vae import decode
from engine.vae import estimate as est
from engine.vae.loading import load_vae
from engine.vae.run import RunInfo
from engine.vae.video import decode_video

diffusers = pytest.importorskip("diffusers")
from safetensors.torch import save_file  # noqa: E402

from tests.engine.test_vae_ltx import _ref_decode, _reference, psnr  # noqa: E402

# The release's shape at tiny widths: encoder spatial / temporal / 2x2x2 / 2x2x2 downsamplers; decoder upsamplers
# 2x2x2 (factor 2), 2x2x2 (factor 1), time only, space only (factor 2), none adding its input back
LTX23 = dict(block_out_channels=(8, 16, 32, 32), layers_per_block=(1, 1, 1, 1, 1), latent_channels=16,
             downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
             decoder_block_out_channels=(8, 16, 16, 32), decoder_layers_per_block=(1, 2, 1, 1, 1),
             decoder_spatio_temporal_scaling=(True,) * 4, decoder_inject_noise=(False,) * 5,
             upsample_type=("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
             upsample_residual=(False,) * 4, upsample_factor=(2, 2, 1, 2), timestep_conditioning=False,
             decoder_spatial_padding_mode="zeros", decoder_causal=False)  # fmt: skip
# Lightricks' metadata config for it, as ltx-core writes one: the decoder's blocks listed in the encoder's
# order (the decoder runs them reversed), the audio VAE's config beside the video one
META = {
    "vae": {
        "decoder_blocks": [
            ["res_x", {"num_layers": 1}], ["compress_space", {"multiplier": 2}], ["res_x", {"num_layers": 1}],
            ["compress_time", {"multiplier": 2}], ["res_x", {"num_layers": 2}], ["compress_all", {"multiplier": 1}],
            ["res_x", {"num_layers": 1}], ["compress_all", {"multiplier": 2}], ["res_x", {"num_layers": 1}],
        ],
        "decoder_spatial_padding_mode": "zeros", "causal_decoder": False, "timestep_conditioning": False,
    },
    "audio_vae": {"model": {}},
}  # fmt: skip


@pytest.fixture(scope="module")
def ref():
    return _reference(LTX23, cls=diffusers.AutoencoderKLLTX2Video)


def _lightricks(sd: dict) -> dict:
    """diffusers' names -> the release's (LTX23_STAGES read backwards, as layouts_2026.parts does for shapes)."""
    rows = P.ltx_vae_original({k: tuple(v.shape) for k, v in sd.items()}, P.LTX23_STAGES, ltx2=True)
    back = dict(zip(rows, sd.values(), strict=True))  # Rows keeps the diffusers order
    return {k: v.contiguous() for k, v in back.items()}


def _write(ref, tmp_path, naming: str):
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    if naming == "diffusers":  # the vae/ folder: weights and config.json
        (tmp_path / "vae").mkdir()
        save_file(sd, tmp_path / "vae/diffusion_pytorch_model.safetensors")
        ref.save_config(tmp_path / "vae")
        return tmp_path / "vae/diffusion_pytorch_model.safetensors"
    path = tmp_path / "ltx-2.3-video-vae.safetensors"
    save_file(_lightricks(sd), path, {"config": json.dumps(META)} if naming == "lightricks" else None)
    return path


@pytest.mark.parametrize("naming", ["diffusers", "lightricks", "bare"])
def test_ltx23_decodes_and_encodes_like_diffusers_whole_in_chunks_and_tiles(ref, naming, tmp_path):
    """Each naming with the config its release ships (config.json; the metadata) and a file stripped of both: the
    strides come from the shapes, the residual and the borders from the config, or from the layout's only
    release (zero borders, no residual) -- so the three decode alike, and say nothing about an assumption."""
    mine = load_vae(_write(ref, tmp_path, naming))
    cfg = mine.cfg
    assert cfg.generation == "ltx2" and not cfg.pads.reflect and not cfg.pads.causal
    ups = [b for b in cfg.blocks if b[0] == "up"]
    assert [(b[2], b[3], b[4]) for b in ups] == [
        (2, (2, 2, 2), False),
        (1, (2, 2, 2), False),
        (2, (2, 1, 1), False),
        (2, (1, 2, 2), False),
    ]
    assert (cfg.downscale, cfg.time_factor) == (32, 8) and est.spec_of(mine).kind == "ltx2"
    torch.manual_seed(4)
    z = torch.randn(1, 16, 3, 2, 3)
    want = _ref_decode(ref, z)
    info = RunInfo()
    got = decode(mine, z, info=info) * 2 - 1
    assert got.shape == want.shape == (1, 17, 3, 64, 96)
    assert float((got - want).abs().max()) < 1e-4 and psnr(got, want) >= 40  # measured 4e-7
    assert not info.notes
    # chunks of one latent frame with the up path's reach as context equal the whole clip; tiles are seamless
    z = torch.randn(1, 16, 2 * mine.time_context + 2, 2, 2)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        whole = decode_video(mine, z, Tiling("full", tile_frames=0), device=cpu, dtype=torch.float32)
        one = decode_video(mine, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
    assert float((one - whole).abs().max()) < 1e-5
    z = torch.randn(1, 16, 2, 8, 8)
    assert psnr(decode(mine, z, tiled=True, tile=192, overlap=128) * 2 - 1, decode(mine, z) * 2 - 1) >= 35
    # the encoder: spatial, temporal, then two 2x2x2 downsamplers, 1024 -> 1024 wide in the release
    for frames in (1, 9, 17):
        x = torch.rand(1, 3, frames, 64, 64, generator=torch.Generator().manual_seed(frames)) * 2 - 1
        with torch.inference_mode():
            w = ref.encode(x).latent_dist.mode()
            g = mine.encode(x)
        assert g.shape == w.shape and float((g - w).abs().max()) < 1e-4  # measured 1.7e-6


def test_upsamplers_in_time_or_space_add_their_input_back_where_the_config_says(tmp_path):
    """A residual is not in the weights: diffusers' `upsample_residual` (from the output end) or the metadata's
    `"residual": true` switch it on per upsampler, folded and repeated by the upsampler's own stride."""
    kw = {
        **LTX23,
        "upsample_residual": (True, False, True, True),
    }  # the decoder's order: True, True, False, True
    ref = _reference(kw, seed=1, cls=diffusers.AutoencoderKLLTX2Video)
    mine = load_vae(_write(ref, tmp_path, "diffusers"))
    assert [b[4] for b in mine.cfg.blocks if b[0] == "up"] == [True, True, False, True]
    z = torch.randn(1, 16, 2, 2, 2, generator=torch.Generator().manual_seed(5))
    want = _ref_decode(ref, z)
    assert float((decode(mine, z) * 2 - 1 - want).abs().max()) < 1e-4
    # the same through Lightricks' metadata
    meta = json.loads(json.dumps(META))
    flags = iter((True, False, True, True))  # encoder order: the decoder's reversed
    for b in meta["vae"]["decoder_blocks"]:
        if b[0].startswith("compress"):
            b[1]["residual"] = next(flags)
    path = tmp_path / "ltx23-residual.safetensors"
    save_file(_lightricks(ref.state_dict()), path, {"config": json.dumps(meta)})
    lt = load_vae(path)
    assert [b[4] for b in lt.cfg.blocks if b[0] == "up"] == [True, True, False, True]
    assert float((decode(lt, z) * 2 - 1 - want).abs().max()) < 1e-4


def test_the_released_layout_is_read_detected_and_planned_from_its_header(tmp_path):
    """LTX-2.3's VAE at full size (sparse: the header, no data), in both namings: its nine Lightricks blocks (four
    diffusers up blocks, as LTX-Video 0.9.0's) are told from 0.9.0's by the upsamplers' strides."""
    from engine.formats.safetensors import write_sparse

    shapes = meta_shapes(diffusers.AutoencoderKLLTX2Video, **P.LTX23_RELEASE)
    orig = P.ltx_vae_original(shapes, P.LTX23_STAGES, ltx2=True)
    assert sum(k.startswith("vae.decoder.up_blocks.8.") for k in orig) and not any(
        ".up_blocks.9." in k for k in orig
    )
    for rows in (shapes, orig):
        d = detect(rows)
        assert (d.kind, d.architecture) == ("vae", "ltx2"), d.evidence
        assert any("LTX-2.3" in e.reason for e in d.evidence)
    path = write_sparse(tmp_path / "ltx-2.3-22b-video-vae.safetensors",
                        [(k, "BF16", tuple(s)) for k, s in orig.items()], {"config": json.dumps(META)})  # fmt: skip
    vae = load_vae(path)
    cfg = vae.cfg
    assert (cfg.z, cfg.width, cfg.last_width, cfg.downscale, cfg.time_factor) == (128, 1024, 128, 32, 8)
    assert [b[:4] for b in cfg.blocks if b[0] == "up"] == [
        ("up", 1024, 2, (2, 2, 2)),
        ("up", 512, 1, (2, 2, 2)),
        ("up", 512, 2, (2, 1, 1)),
        ("up", 256, 2, (1, 2, 2)),
    ]
    assert vae.enc_cfg.downscale == 32 and vae.enc_cfg.time_factor == 8
    assert (
        vae.time_context == cfg.reach() == 10
    )  # 12 for 0.9.5 / LTX-2.0: fewer blocks after the time upsamplers
    spec = est.spec_of(vae)
    assert (spec.kind, spec.ch, spec.mid) == ("ltx2", 8, 1024)
    assert est.video_widths(str(path), "ltx2", "vae.") == (8, 1024)


def test_lightricks_metadata_tells_ltx_video_095_from_ltx2_where_the_tensors_are_the_same():
    """0.9.5+ and LTX-2.0 share their tensors: LTX-Video's own config (zero borders) names LTX-Video, LTX-2's
    (mirrored borders, or its audio VAE beside) LTX-2; without metadata LTX-2, as the loader decodes it."""
    kw = dict(decoder_block_out_channels=(256, 512, 1024), decoder_layers_per_block=(5, 5, 5, 5),
              decoder_spatio_temporal_scaling=(True,) * 3, decoder_inject_noise=(False,) * 4,
              upsample_residual=(True,) * 3, upsample_factor=(2,) * 3, timestep_conditioning=True)  # fmt: skip
    orig = P.ltx_vae_original(meta_shapes(diffusers.AutoencoderKLLTX2Video, **kw), P.LTX2_STAGES, ltx2=True)
    ltxv = {"config": json.dumps({"vae": {"_class_name": "CausalVideoAutoencoder", "causal_decoder": False}})}
    ltx2 = {"config": json.dumps({"vae": {"decoder_spatial_padding_mode": "reflect"}})}
    with_audio = {"config": json.dumps({"vae": {}, "audio_vae": {}})}
    for meta, arch in ((ltxv, "ltxv"), (ltx2, "ltx2"), (with_audio, "ltx2"), (None, "ltx2")):
        d = detect(orig, meta)
        assert d.architecture == arch, d.evidence
        assert any("0.9.5+" in e.reason for e in d.evidence) == (arch == "ltxv")
