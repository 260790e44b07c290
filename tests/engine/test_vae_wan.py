"""The Wan-family video VAEs (Wan 2.1, Wan 2.2, Qwen-Image) against diffusers' own classes on the same
weights, in both namings, chunked and tiled; the video tiling choice and its out-of-memory retries."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import FormatError
from engine.events import Tiling
from engine.vae import choice, decode, encode
from engine.vae import estimate as est
from engine.vae.choice import Job, choose_video
from engine.vae.loading import _build_wan, load_vae
from engine.vae.run import RunInfo
from engine.vae.video import decode_video
from engine.vae.wan_loading import wan_config
from tests.engine.layouts_2026.parts import wan22_vae_diffusers_config, wan_vae_original

diffusers = pytest.importorskip("diffusers")

SMALL_21 = dict(base_dim=16, z_dim=4)
SMALL_22 = dict(base_dim=16, decoder_base_dim=24, z_dim=8, is_residual=True, in_channels=12, out_channels=12,
                patch_size=2, scale_factor_spatial=16)  # fmt: skip


def _randomise(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * r if n.endswith("gamma") else r * (0.5 / math.sqrt(p[0].numel())))
    return m.eval()


def _reference(cls_name: str = "AutoencoderKLWan", **kw):
    return _randomise(getattr(diffusers, cls_name)(**kw))


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


def _mine(ref) -> torch.nn.Module:
    return _build_wan({k: v.clone() for k, v in ref.state_dict().items()}, "ref")


@pytest.fixture(scope="module")
def wan21():
    ref = _reference(**SMALL_21)
    return ref, _mine(ref)


@pytest.fixture(scope="module")
def wan22():
    ref = _reference(**SMALL_22)
    return ref, _mine(ref)


def _ref_decode(ref, z):
    with torch.inference_mode():
        return ref.decode(z).sample.transpose(1, 2)  # frame-major, as Loadout returns clips


@pytest.mark.parametrize("which", ["wan21", "wan22"])
def test_full_decode_matches_diffusers(which, request):
    ref, mine = request.getfixturevalue(which)
    torch.manual_seed(1)
    z = torch.randn(1, mine.latent_channels, 3, 4, 6)
    want = _ref_decode(ref, z)
    got = decode(mine, z) * 2 - 1
    assert got.shape == want.shape == (1, 9, 3, 4 * mine.downscale, 6 * mine.downscale)
    assert psnr(got, want) >= 40


@pytest.mark.parametrize("which", ["wan21", "wan22"])
def test_chunking_is_exact_and_tiles_are_seamless(which, request):
    ref, mine = request.getfixturevalue(which)
    torch.manual_seed(2)
    f = mine.downscale
    z = torch.randn(1, mine.latent_channels, 3, 96 // f, 128 // f)
    want = _ref_decode(ref, z)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        one = decode_video(mine, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
        two = decode_video(mine, z, Tiling("full", tile_frames=2), device=cpu, dtype=torch.float32)
    assert torch.allclose(one, two, atol=1e-5)  # chunk boundaries carry the causal cache: exact
    from engine.vae.wan import Stream

    with torch.inference_mode():  # the full-resolution levels one frame at a time: exact too
        h = mine.decode_head(z, Stream())
        assert torch.allclose(mine.decode_up(h, Stream()), mine.decode_up(h, Stream(), 1), atol=1e-5)
    info = RunInfo()
    tiled = decode(mine, z, tiled=True, tile=64, overlap=32, info=info) * 2 - 1
    assert info.mode == "tiled" and info.tiles > 1
    assert psnr(tiled, want) >= 35
    # tiles of two latent units with one of overlap have no context: they abut, unblended (the blend band
    # reached past the tiles' output and the decode failed on a size mismatch)
    small = decode(mine, z, tiled=True, tile=2 * f, overlap=f, info=info) * 2 - 1
    assert small.shape == tiled.shape and info.tiles > 4


@pytest.mark.parametrize("which", ["wan21", "wan22"])
def test_the_last_chunk_keeps_no_frames_and_gives_the_same_result(which, request):
    """Nothing runs after a clip's (or a tile's) last chunk: its convolutions keep no frames, and the
    frames-at-once path still carries them between its own groups of frames."""
    from engine.vae.wan import Stream

    _, mine = request.getfixturevalue(which)
    torch.manual_seed(3)
    z = torch.randn(1, mine.latent_channels, 2, 32 // mine.downscale, 48 // mine.downscale)
    with torch.inference_mode():
        h = mine.decode_head(z, Stream())
        want = mine.decode_up(h, Stream())
        for at_once in (None, 1):
            last = Stream()
            last.keep = False
            got = mine.decode_up(h, last, at_once)
            assert torch.allclose(got, want, atol=1e-5)
            assert not last.frames and last.keep is False
        kept = Stream()
        mine.decode_up(h, kept)
        assert kept.frames  # a chunk with more to come keeps them


@pytest.mark.parametrize("frames", [1, 2])
def test_a_convolution_in_slices_of_frames_equals_the_whole(frames):
    """CausalConv3d.sliced (a rolling buffer of history + `frames` frames; the residual blocks' second
    convolution over its own input) gives the whole convolution's bits, with and without carried
    history, and leaves the stream holding the same last frames."""
    from engine import ops
    from engine.vae.causal_conv import CausalConv3d, Stream

    torch.manual_seed(5)
    conv, norm = CausalConv3d(8, 8, 3, padding=1), ops.ChannelRMSNorm(8)
    with torch.no_grad():  # the castable ops' parameters start empty
        norm.gamma.copy_(1 + 0.1 * torch.randn_like(norm.gamma))
        conv.weight.copy_(0.1 * torch.randn_like(conv.weight))
        conv.bias.copy_(torch.randn_like(conv.bias))
    x = torch.randn(1, 8, 5, 12, 10).contiguous(memory_format=torch.channels_last_3d)
    earlier = torch.randn(1, 8, 3, 12, 10)
    with torch.inference_mode():
        for carry in (False, True):
            whole, parts = Stream(), Stream()
            if carry:  # a later chunk: history from the frames before
                conv.pad(earlier, whole, norm)
                conv.pad(earlier, parts, norm)
            want = conv(conv.pad(x, whole, norm))
            got = conv.sliced(x.clone(), parts, norm, frames)
            assert torch.equal(got, want)
            assert torch.equal(parts.frames[id(conv)], whole.frames[id(conv)])
            inplace = x.clone()
            again = conv.sliced(inplace, Stream() if not carry else _carried(conv, earlier, norm), norm, frames,
                                inplace=True)  # fmt: skip
            assert again.data_ptr() == inplace.data_ptr() and torch.equal(again, want)
        last = Stream()
        last.keep = False
        conv.sliced(x, last, norm, frames)
        assert not last.frames


def _carried(conv, earlier, norm):
    from engine.vae.causal_conv import Stream

    s = Stream()
    conv.pad(earlier, s, norm)
    return s


@pytest.mark.parametrize("ft,fs,first", [(2, 2, True), (2, 2, False), (1, 2, True), (2, 1, True)])
def test_the_up_shortcut_added_in_place_equals_adding_its_tensor(ft, fs, first):
    """Wan 2.2's DupUp3D shortcut, added into the level's output patch position by patch position,
    gives the bits of adding dup_up's tensor."""
    from engine.vae.wan import add_dup_up

    torch.manual_seed(6)
    x = torch.randn(1, 8, 3, 5, 4)
    cout = 8 * ft * fs * fs // 4
    # the shortcut built as a tensor, as Wan2.2's vae2_2.py DupUp3D writes it: channels repeated, then
    # (cout, ft, fs, fs) unfolded into frames, rows and columns; the first ft - 1 frames dropped at the start
    b, c, t, h, w = x.shape
    y = x.repeat_interleave(cout * ft * fs * fs // c, dim=1)
    y = (
        y.reshape(b, cout, ft, fs, fs, t, h, w)
        .permute(0, 1, 5, 2, 6, 3, 7, 4)
        .reshape(b, cout, t * ft, h * fs, w * fs)
    )
    y = y[:, :, ft - 1 :] if first else y
    out = torch.randn(y.shape)
    want = out + y
    got = add_dup_up(out.clone(), x, ft, fs, first)
    assert torch.equal(got, want)


def test_qwen_image_vae_is_the_wan21_network():
    ref = _reference("AutoencoderKLQwenImage", base_dim=16, z_dim=4)
    mine = _mine(ref)
    torch.manual_seed(3)
    z = torch.randn(1, 4, 1, 5, 7)  # Qwen-Image: one frame
    with torch.inference_mode():
        want = ref.decode(z).sample[:, :, 0]
    got = decode(mine, z[:, :, 0]) * 2 - 1  # a 4-D latent decodes as one frame, to an image
    assert got.shape == want.shape
    assert psnr(got, want) >= 40


@pytest.mark.parametrize("which", ["wan21", "wan22"])
def test_encode_matches_diffusers(which, request):
    ref, mine = request.getfixturevalue(which)
    torch.manual_seed(4)
    x = torch.rand(1, 3, 5, 32, 48) * 2 - 1
    with torch.inference_mode():
        want = ref.encode(x).latent_dist.mean
        got = mine.encode(x)
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    img = torch.rand(1, 3, 32, 48)
    lat = encode(mine, img)
    with torch.inference_mode():
        want1 = ref.encode(img[:, :, None] * 2 - 1).latent_dist.mean[:, :, 0]
    assert torch.allclose(lat, want1, atol=1e-5, rtol=1e-4)


def test_original_naming_is_what_diffusers_converts_from(wan21):
    """Our module paths are the original codebase's: diffusers' own single-file converter turns our state
    dict into exactly the diffusers model's."""
    from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers

    ref, mine = wan21
    ours = {k: v for k, v in mine.state_dict().items()}
    converted = convert_wan_vae_to_diffusers(ours)
    theirs = ref.state_dict()
    assert set(converted) == set(theirs)
    assert all(torch.equal(converted[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_full_size_original_layouts_load(version):
    """The released VAEs' original layouts (written from Wan2.1 vae.py / Wan2.2 vae2_2.py) build and load
    strictly at full size, on the meta device."""
    rows = wan_vae_original(version)
    sd = {k: torch.empty(s, device="meta") for k, s in rows.items()}
    cfg = wan_config(sd, "layout")
    if version == "2.1":
        assert (cfg.z, cfg.dec_dims, cfg.patch, cfg.downscale) == (16, (384, 384, 384, 192, 96), 1, 8)
    else:
        assert (cfg.z, cfg.dec_dims, cfg.patch, cfg.downscale) == (48, (1024, 1024, 1024, 512, 256), 2, 16)
    assert cfg.time_factor == 4
    model = _build_wan(sd, "layout")
    assert sum(p.numel() for p in model.parameters()) == rows.params()


def test_wan22_diffusers_layout_renames_onto_the_original():
    with torch.device("meta"):
        ref = diffusers.AutoencoderKLWan(**wan22_vae_diffusers_config())
    model = _build_wan(dict(ref.state_dict()), "diffusers")
    assert set(model.state_dict()) == set(wan_vae_original("2.2"))


@pytest.mark.parametrize("version,naming", [("2.1", "original"), ("2.2", "original"), ("2.2", "diffusers")])
def test_the_estimate_reads_a_video_vaes_widths_from_its_header(version, naming, tmp_path):
    """The published layouts (sparse, header only) give the published widths; a reduced VAE's header gives
    its own, and the Decode panel's estimate follows them."""
    from engine.formats.safetensors import write_sparse
    from engine.preflight import estimate as preflight
    from engine.requests import EstimateDecode
    from tests.support.wan_vae import write_wan_vae

    kind = "wan22" if version == "2.2" else "wan21"
    if naming == "diffusers":
        with torch.device("meta"):
            ref = diffusers.AutoencoderKLWan(**wan22_vae_diffusers_config())
        rows = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    else:
        rows = wan_vae_original(version)
    path = tmp_path / "vae.safetensors"
    write_sparse(path, [(k, "BF16", tuple(s)) for k, s in rows.items()])
    want = (64, 1024) if kind == "wan22" else (96, 384)
    assert est.video_widths(str(path), kind) == want == (est.VIDEO_SPECS[kind].ch, est.VIDEO_SPECS[kind].mid)
    assert est.video_widths(str(tmp_path / "missing.safetensors"), kind) is None
    if kind == "wan21":  # the test suite's reduced VAE: a quarter of the width or less
        small = write_wan_vae(tmp_path / "small.safetensors")
        ch, mid = est.video_widths(small, "wan21")
        assert ch < 96 and mid < 384
        from engine.formats.latent import write_latent

        write_latent(tmp_path / "clip.latent", torch.zeros(1, 16, 5, 60, 104))
        full, reduced = (preflight(EstimateDecode(v, str(tmp_path / "clip.latent"))).full_bytes
                         for v in (str(path), small))  # fmt: skip
        assert reduced < full / 2
        # the tiled figure counts the box a 512-px tile computes at 832x480 (272x448), not 512x512
        from engine.preflight import _vae_facts

        got = preflight(EstimateDecode(str(path), str(tmp_path / "clip.latent"))).tiled_bytes
        kw = dict(kind="wan21", latent_frames=5, tile=512, weight_bytes=_vae_facts(str(path))[1])
        boxed = est.estimate_decode_bytes(832, 480, tile_area=272 * 448, **kw)
        assert got == boxed < est.estimate_decode_bytes(832, 480, **kw)


def test_a_missing_or_misshapen_key_is_named(wan21, tmp_path):
    from safetensors.torch import save_file

    ref, _ = wan21
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd.pop("decoder.up_blocks.1.resnets.2.conv2.weight")
    save_file(sd, tmp_path / "broken.safetensors")
    with pytest.raises(FormatError, match=r"missing .*upsamples\.6\.residual\.6\.weight"):
        load_vae(tmp_path / "broken.safetensors")
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    sd["decoder.mid_block.attentions.0.proj.weight"] = torch.zeros(3, 3, 1, 1)
    save_file(sd, tmp_path / "bad.safetensors")
    with pytest.raises(FormatError, match=r"wrong shape .*middle\.1\.proj\.weight"):
        load_vae(tmp_path / "bad.safetensors")


def test_a_video_latent_needs_a_video_vae():
    from engine.vae.autoencoder_kl import AutoencoderKL, KLConfig

    kl = AutoencoderKL(KLConfig(ch=32, ch_mult=(1, 1), num_res_blocks=1))
    with pytest.raises(FormatError, match="needs a video VAE"):
        decode(kl, torch.zeros(1, 4, 2, 4, 4))


def test_out_of_memory_halves_chunks_then_splits_tiles_without_losing_work(wan21, monkeypatch):
    """Fault injection: the up path raises torch's out-of-memory for inputs above a size. The decode
    finishes with the same frames (exact where the cache survives, warm-up otherwise)."""
    _, mine = wan21
    torch.manual_seed(5)
    z = torch.randn(1, 4, 4, 16, 20)
    cpu = torch.device("cpu")
    with torch.inference_mode():
        want = decode_video(mine, z, Tiling("full", tile_frames=4), device=cpu, dtype=torch.float32)
    real = type(mine).decode_up
    calls = {"oom": 0}

    def tight(self, h, stream, frames_at_once=None):
        if h.shape[2] * h.shape[3] * h.shape[4] > 2 * 12 * 16 or (h.shape[3] * h.shape[4] > 12 * 14):
            calls["oom"] += 1
            raise torch.OutOfMemoryError("injected")
        return real(self, h, stream, frames_at_once)

    monkeypatch.setattr(type(mine), "decode_up", tight)
    from engine.vae import video

    monkeypatch.setattr(video, "_can_retry", lambda device: True)  # as on a GPU, where OOM is raised
    notes: list[str] = []
    from engine.vae.video import Counters

    c = Counters(notes=notes)
    with torch.inference_mode():
        got = decode_video(mine, z, Tiling("full", tile_frames=4, overlap_frames=4), device=cpu,
                           dtype=torch.float32, counters=c)  # fmt: skip
    assert calls["oom"] >= 2 and c.oom_retries >= 2
    assert any("per chunk" in n for n in notes) and any("split" in n for n in notes)
    assert any("one frame at a time" in n for n in notes)
    assert psnr(got, want) >= 35  # the split tiles restart with a full warm-up: exact up to the seams


def test_choice_picks_full_frames_then_tiles_and_chunks_by_budget():
    spec = est.video_spec("wan21")
    job = Job(spec, "decode", (60, 104), 1, 8, 2, True, 21)  # 81 frames at 480x832, fp16, on a GPU
    roomy = choose_video(job, 24 << 30)
    assert roomy.mode == "full" and roomy.tile_frames >= 1
    tight = choose_video(job, 2 << 30)
    assert tight.tiled and tight.tile_frames >= 1
    assert choice.peak_bytes(job, tight, 2 << 30) <= 2 << 30  # its retry snapshot where the run keeps it
    # the estimate grows with frames per chunk and shrinks with the tile
    assert job.video_bytes(None, 2) > job.video_bytes(None, 1) > job.video_bytes(256, 1)
    # a tile is estimated at the box the run computes: 512-px tiles over 832x480 are 272x448 with context
    assert job.largest_tile_area(512) == 272 * 448 and job.largest_tile_area(512, 0) == 480 * 416
    assert job.video_bytes(512, 1) < est.video_bytes(
        spec, job.pixels, 21, 2, tile_px=512, result_in_ram=False
    )


def test_stop_mid_decode_raises_cancelled_and_the_next_decode_runs(wan21):
    from engine.errors import Cancelled
    from engine.jobs import CancelToken

    _, mine = wan21
    z = torch.randn(1, 4, 3, 12, 16)
    token = CancelToken()
    seen = []

    def report(p):
        seen.append(p)
        if p.tile is not None:  # the first finished chunk: Stop
            token.cancel("user")

    with pytest.raises(Cancelled):
        decode(mine, z, tiled=True, tile=64, overlap=32, token=token, report=report)
    done = [p for p in seen if p.tile is not None]
    assert len(done) == 1 and done[0].total > 1  # stopped within the next op, not at the end
    assert decode(mine, z).shape == (1, 9, 3, 96, 128)


def test_a_latent_from_memory_is_saved_before_the_decode(wan21, tmp_path):
    from engine.formats.latent import read_latent

    _, mine = wan21
    z = torch.randn(1, 4, 2, 4, 6)
    decode(mine, z, save_latent=str(tmp_path / "kept.latent"))
    assert torch.equal(read_latent(tmp_path / "kept.latent"), z)


def test_video_latent_formats_normalise_per_channel():
    from engine.vae.latent_formats import LATENT_FORMATS

    for name, c in (("wan21", 16), ("qwen_image", 16), ("wan22", 48)):
        fmt = LATENT_FORMATS[name]
        assert fmt.channels == c == len(fmt.mean) == len(fmt.std) and fmt.time_factor == 4
        z = torch.randn(1, c, 3, 4, 5)
        m = fmt.to_model(z)
        mean = torch.tensor(fmt.mean).view(1, c, 1, 1, 1)
        std = torch.tensor(fmt.std).view(1, c, 1, 1, 1)
        assert torch.allclose(m, (z - mean) / std) and torch.allclose(fmt.to_vae(m), z, atol=1e-6)
    # diffusers' own defaults for the Wan 2.1 and Qwen-Image VAEs are these statistics
    for cls in (diffusers.AutoencoderKLWan, diffusers.AutoencoderKLQwenImage):
        import inspect

        p = inspect.signature(cls.__init__).parameters
        assert tuple(p["latents_mean"].default) == LATENT_FORMATS["wan21"].mean
        assert tuple(p["latents_std"].default) == LATENT_FORMATS["wan21"].std


def test_the_rgba_qwen_image_layered_vae_decodes_to_rgb():
    ref = _reference("AutoencoderKLQwenImage", base_dim=16, z_dim=4, input_channels=4)
    mine = _mine(ref)
    assert mine.cfg.image_channels == 4
    z = torch.randn(1, 4, 1, 4, 5)
    with torch.inference_mode():
        want = ref.decode(z).sample[:, :3, 0]
    info = RunInfo()
    got = decode(mine, z[:, :, 0], info=info) * 2 - 1
    assert got.shape == want.shape and psnr(got, want) >= 40
    assert any("RGB" in n for n in info.notes)
