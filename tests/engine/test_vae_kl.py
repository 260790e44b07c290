"""AutoencoderKL: strict loading from every naming, agreement with an independent implementation,
shapes for each latent format, tiled == full, fp16 NaN guard, memory decisions, progress and cancel."""

from __future__ import annotations

import gc
import os
import tempfile
import threading

import psutil
import pytest
import torch
from vae_fixtures import psnr, randomize_, small_kl

from engine import ops
from engine.errors import Cancelled, FormatError
from engine.formats.safetensors import save_tensors
from engine.jobs import CancelToken
from engine.vae import LATENT_FORMATS, estimate_decode_bytes, estimate_encode_bytes, load_vae
from engine.vae.autoencoder_kl import AutoencoderKL, KLConfig
from engine.vae.groupstats import Moments
from engine.vae.run import RunInfo, decode, encode


def _z(c=4, h=8, w=8, seed=1):
    return torch.randn(1, c, h, w, generator=torch.Generator().manual_seed(seed))


def _img(h=64, w=64, seed=2):
    return torch.rand(1, 3, h, w, generator=torch.Generator().manual_seed(seed))


# -- loading --------------------------------------------------------------------------------------
def test_checkpoint_prefix_standalone_and_strictness(tmp_path):
    m = small_kl()
    sd = m.state_dict()
    ckpt = tmp_path / "model.safetensors"
    other = {"model.diffusion_model.input_blocks.0.0.weight": torch.zeros(2, 2)}
    save_tensors(ckpt, {**other, **{f"first_stage_model.{k}": v for k, v in sd.items()}})
    standalone = tmp_path / "vae.safetensors"
    save_tensors(standalone, sd)
    z = _z(h=4, w=4)
    ref = decode(m, z, tiled=False)
    for path in (ckpt, standalone):
        loaded = load_vae(path)
        assert loaded.cfg.ch_mult == (1, 2, 4, 4) and loaded.cfg.num_res_blocks == 2
        assert torch.equal(decode(loaded, z, tiled=False), ref)

    missing = dict(sd)
    del missing["decoder.up.0.block.1.conv1.weight"]
    save_tensors(tmp_path / "missing.safetensors", missing)
    with pytest.raises(FormatError, match=r"missing \(e\.g\. decoder\.up\.0\.block\.1\.conv1\.weight"):
        load_vae(tmp_path / "missing.safetensors")
    save_tensors(tmp_path / "extra.safetensors", {**sd, "decoder.extra.weight": torch.zeros(1)})
    with pytest.raises(FormatError, match="unexpected"):
        load_vae(tmp_path / "extra.safetensors")
    bad = dict(sd)
    bad["decoder.mid.attn_1.q.weight"] = torch.zeros(3, 3, 1, 1)
    save_tensors(tmp_path / "bad.safetensors", bad)
    with pytest.raises(FormatError, match="wrong shape"):
        load_vae(tmp_path / "bad.safetensors")


def test_pth_checkpoint_with_state_dict(tmp_path):
    m = small_kl(seed=3)
    path = tmp_path / "vae.ckpt"
    torch.save({"state_dict": {f"first_stage_model.{k}": v for k, v in m.state_dict().items()}}, path)
    loaded = load_vae(path)
    z = _z(h=4, w=4)
    assert torch.equal(decode(loaded, z, tiled=False), decode(m, z, tiled=False))


def test_diffusers_naming_matches_diffusers_itself(tmp_path):
    """An independent implementation with the same weights: diffusers' AutoencoderKL."""
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    ref = diffusers.AutoencoderKL(
        block_out_channels=(32, 64, 128, 128),
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        layers_per_block=2,
        latent_channels=4,
        norm_num_groups=32,
    ).eval()
    with torch.no_grad():  # diffusers zero-initialises nothing here, but make norms non-trivial
        for n, p in ref.named_parameters():
            if "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    path = tmp_path / "diffusion_pytorch_model.safetensors"
    save_tensors(path, ref.state_dict())
    ours = load_vae(path)
    z, x = _z(h=4, w=6), _img(32, 48)
    with torch.no_grad():
        want = ((ref.decode(z).sample + 1) / 2).clamp(0, 1)
        want_mean = ref.encode(x * 2 - 1).latent_dist.mean
    torch.testing.assert_close(decode(ours, z, tiled=False), want, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(encode(ours, x, tiled=False), want_mean, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "z,quant,fmt",
    [(4, True, "sd1"), (4, True, "sdxl"), (16, False, "sd3"), (16, False, "flux1"), (32, True, "flux2")],
)
def test_latent_formats_shapes(tmp_path, z, quant, fmt):
    m = small_kl(z=z, quant=quant)
    path = tmp_path / "vae.safetensors"
    save_tensors(path, {f"vae.{k}": v for k, v in m.state_dict().items()})
    vae = load_vae(path)
    assert vae.latent_channels == z and hasattr(vae, "quant_conv") == quant
    assert LATENT_FORMATS[fmt].channels == z
    lat = encode(vae, _img(44, 30))  # cropped to multiples of 8
    assert lat.shape == (1, z, 5, 3)
    assert decode(vae, lat).shape == (1, 3, 40, 24)
    # the model-space round trip of the factors is exact
    torch.testing.assert_close(LATENT_FORMATS[fmt].to_vae(LATENT_FORMATS[fmt].to_model(lat)), lat)


def test_wrong_channels_is_a_clear_error():
    with pytest.raises(FormatError, match="16 channels but this VAE decodes 4-channel"):
        decode(small_kl(), _z(c=16, h=2, w=2))


# -- tiled == full ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sd_layout():
    m = small_kl(seed=5)
    z = _z(h=8, w=16, seed=7)
    return m, z, decode(m, z, tiled=False)


@pytest.mark.slow
def test_tiled_decode_matches_full(sd_layout):
    m, z, full = sd_layout
    info, seen = RunInfo(), []
    tiled = decode(m, z, tiled=True, tile=128, overlap=64, info=info, report=seen.append)
    assert info.mode == "tiled" and info.tiles == 2 and info.store == "ram"
    assert psnr(full, tiled) >= 35
    # progress per tile and pass
    assert all(p.stage == "VAE decode" for p in seen)
    assert [p.done for p in seen] == list(range(1, 2 * 26 + 1))  # 2 tiles x (25 GroupNorms + 1) passes
    assert all(p.total == 2 * 26 for p in seen)
    # The same two tiles decoded independently (own GroupNorm stats, own attention) are far worse:
    # that is what sharing the statistics buys.
    left = decode(m, z[:, :, :, :12], tiled=False)[:, :, :, :64]
    right = decode(m, z[:, :, :, 4:], tiled=False)[:, :, :, 32:]
    assert psnr(full, torch.cat([left, right], dim=3)) < psnr(full, tiled) - 10
    # tile states spilled to disk give the same result, and the folder is removed afterwards
    before = set(os.listdir(tempfile.gettempdir()))
    info = RunInfo()
    assert torch.equal(decode(m, z, tiled=True, tile=128, overlap=64, disk_store=True, info=info), tiled)
    assert info.store == "disk"
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("loadout-tiles-")}


def test_tiled_encode_matches_full():
    m = small_kl(seed=6)
    x = _img(64, 128, seed=8)
    full = encode(m, x, tiled=False)
    tiled = encode(m, x, tiled=True, tile=128, overlap=64)
    assert tiled.shape == full.shape
    snr = 10 * torch.log10(full.var() / ((full - tiled) ** 2).mean()).item()
    assert snr >= 35


# -- precision, memory decisions, progress, cancel -------------------------------------------------
def test_fp16_overflow_reruns_in_fp32():
    m = small_kl(seed=9)
    with torch.no_grad():  # activations beyond fp16's 65504 after conv_in; the GroupNorm after it
        m.decoder.conv_in.weight.mul_(3e4)  # renormalises, so fp32 is fine
        m.decoder.conv_in.bias.mul_(3e4)
    z = _z(h=4, w=4)
    want = decode(m, z, tiled=False)
    assert torch.isfinite(want).all()
    info = RunInfo()
    got = decode(m, z, tiled=False, dtype=torch.float16, info=info)
    assert info.fp32_rerun and torch.equal(got, want)
    info = RunInfo()
    got = decode(m, z, tiled=True, tile=64, overlap=32, dtype=torch.float16, info=info)
    assert info.fp32_rerun and info.tiles == 1
    assert torch.equal(got, decode(m, z, tiled=True, tile=64, overlap=32))


def test_bf16_decode_is_close_to_fp32():
    m = small_kl(seed=10)
    z = _z(h=4, w=4)
    info = RunInfo()
    assert psnr(decode(m, z, dtype=torch.bfloat16, info=info), decode(m, z)) > 25
    assert info.dtype == "bfloat16" and not info.fp32_rerun


def test_mode_is_decided_up_front_from_the_estimate():
    m = small_kl(seed=13)
    z = _z(h=4, w=4)
    info = RunInfo()
    decode(m, z, budget=1 << 40, info=info)
    assert info.mode == "full"
    info = RunInfo()
    decode(m, z, budget=64 << 10, info=info)  # 64 KiB: below what a full pass needs
    assert info.mode == "tiled" and info.store == "disk"
    assert estimate_decode_bytes(2048, 2048) > 3 * estimate_decode_bytes(1024, 1024)
    assert estimate_decode_bytes(2048, 2048, tile=512) < estimate_decode_bytes(2048, 2048) / 3


def test_a_tile_larger_than_the_image_is_estimated_as_the_image():
    # A 256x192 image in 512-px tiles is one 256x192 tile: its estimate is the full pass's and the
    # tiled run's own overheads (the head's output, the float32 result), not a 512x512 tile's.
    from engine.vae import estimate

    full = estimate_decode_bytes(256, 192)
    one_tile = estimate_decode_bytes(256, 192, tile=512)
    overhead = estimate.VaeSpec("kl", 4, estimate.SD_VAE_WEIGHTS).k_head() * 32 * 24 * 4 + 16 * 256 * 192
    assert one_tile == full + overhead
    # a tile that covers one side only is clipped on that side
    wide = estimate_decode_bytes(1024, 256, tile=512)
    assert wide < estimate_decode_bytes(1024, 1024, tile=512)
    assert estimate_encode_bytes(256, 192, tile=512) < estimate_encode_bytes(512, 512, tile=512)


def _rss():
    gc.collect()
    return psutil.Process().memory_info().rss


_CANCEL_CHILD = """
import gc, sys, psutil, torch
from vae_fixtures import randomize_
from engine.errors import Cancelled
from engine.jobs import CancelToken
from engine.memory import trim_heap
from engine.vae.autoencoder_kl import AutoencoderKL, KLConfig
from engine.vae.groupstats import Moments
from engine.vae.run import decode

def rss():
    gc.collect()
    return psutil.Process().memory_info().rss

m = randomize_(AutoencoderKL(KLConfig(ch=32, ch_mult=(1, 1, 1, 1))), seed=11)
z = torch.randn(1, 4, 64, 64, generator=torch.Generator().manual_seed(1))
decode(m, torch.randn(1, 4, 2, 2), tiled=False)  # warm-up: allocator and kernels
token, at_cancel = CancelToken(), {}

def stop(*_):
    at_cancel["rss"] = psutil.Process().memory_info().rss
    token.cancel()

before = rss()
hook = m.decoder.up[1].upsample.conv.register_forward_hook(stop)
try:
    decode(m, z, tiled=False, token=token)
    sys.exit("not cancelled")
except Cancelled:
    pass  # leaving the handler drops the traceback and the frames holding the activations
hook.remove()
trim_heap()
print(before, at_cancel["rss"], rss())
"""


def test_cancel_mid_decode_frees_memory():
    # A cheap layout (ch_mult 1,1,1,1) whose full-resolution tensors are still large: 32 channels at
    # 512x512 = 32 MiB each; the decode is stopped right after the upsample into full resolution.
    # Measured in a fresh process: after a long suite, the allocator of this one keeps freed chunks
    # behind live objects allocated meanwhile (RSS said 59 MB held of 115 MB freed, in CI only), which
    # measures the suite's fragmentation, not what the cancelled decode kept.
    import subprocess
    import sys

    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, root, os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(
        [sys.executable, "-c", _CANCEL_CHILD], capture_output=True, text=True, env=env, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    before, at_cancel, after = (int(x) for x in r.stdout.split())
    grew = at_cancel - before
    assert grew > 50 << 20, grew  # the decode really held memory when it was stopped
    assert after - before < max(16 << 20, grew // 5), (before, at_cancel, after)
    m = randomize_(AutoencoderKL(KLConfig(ch=32, ch_mult=(1, 1, 1, 1))), seed=11)
    z = _z(h=64, w=64)
    # a tiled decode stops at the next tile and removes its spilled states
    token = CancelToken()
    before_dirs = set(os.listdir(tempfile.gettempdir()))

    def report(p):
        if p.done == 3:
            token.cancel()

    with pytest.raises(Cancelled):
        decode(
            m, z[:, :, :8, :8], tiled=True, tile=32, overlap=16, disk_store=True, token=token, report=report
        )
    assert not {
        n for n in set(os.listdir(tempfile.gettempdir())) - before_dirs if n.startswith("loadout-tiles-")
    }


def test_ops_cancel_scope_is_per_thread():
    token = CancelToken()
    token.cancel()
    results = []

    def other():
        results.append(decode(small_kl(), _z(h=2, w=2)).shape)  # no token in this thread

    with ops.cancel_scope(token):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert results == [(1, 3, 16, 16)]


@pytest.mark.cuda
def test_gpu_oom_retries_with_smaller_tiles():
    dev = torch.device("cuda", torch.cuda.current_device())  # the fraction needs an index
    m = small_kl(ch=64, seed=12).to(dev)
    z = _z(h=256, w=256)  # 2048^2 output: a full decode needs several GB
    torch.cuda.empty_cache()
    # 768 MiB above what is allocated, whatever the card's size (2 % of an H200 would be 2.9 GB)
    cap = torch.cuda.memory_allocated(dev) + (768 << 20)
    torch.cuda.set_per_process_memory_fraction(cap / torch.cuda.get_device_properties(dev).total_memory, dev)
    try:
        info = RunInfo()
        out = decode(m, z, tiled=False, device=dev, budget=1 << 40, info=info)  # told it fits: it does not
        assert out.shape == (1, 3, 2048, 2048) and info.oom_retries >= 1 and info.mode == "tiled"
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, dev)


def test_group_norm_with_combined_tile_statistics_equals_whole():
    """ops.GroupNorm with statistics combined over pieces of unequal sizes (Chan's formula, a piece
    holding two tiles' cores stacked on the batch among them) is the whole-image norm."""
    g = torch.Generator().manual_seed(3)
    gn = ops.GroupNorm(4, 8)
    with torch.no_grad():
        gn.weight.copy_(torch.randn(8, generator=g))
        gn.bias.copy_(torch.randn(8, generator=g))
    x = torch.randn(2, 8, 10, 14, generator=g) * 3 + torch.randn(1, 8, 1, 1, generator=g) * 20
    moments = Moments(2)
    moments.add(torch.cat([x[:, :, :4, :5], x[:, :, :4, 5:10]]))  # two tiles of one shape, one part
    for part in (x[:, :, :4, 10:], x[:, :, 4:, :]):
        moments.add(part)
    stats = moments.stats(4)
    want_var, want_mean = torch.var_mean(x.double().reshape(2, 4, -1), dim=2, correction=0)
    torch.testing.assert_close(stats.mean, want_mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(stats.var, want_var, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(gn(x, stats), gn(x), atol=1e-5, rtol=1e-5)
    # a batch of two tiles, each normalised with the image's statistics: the same as one by one
    two = torch.cat([x[:, :, :5], x[:, :, 5:]])
    torch.testing.assert_close(gn(two, stats), torch.cat([gn(x[:, :, :5], stats), gn(x[:, :, 5:], stats)]))


@pytest.mark.cuda
def test_gpu_tile_states_stay_on_the_device_or_wait_in_pinned_host_ram():
    dev = torch.device("cuda", torch.cuda.current_device())
    m = small_kl(ch=32, seed=3).to(dev)
    z = _z(h=64, w=64, seed=4)  # 512^2
    full = decode(m, z, tiled=False, device=dev)
    roomy, tight = RunInfo(), RunInfo()
    a = decode(m, z, tiled=True, tile=256, overlap=64, device=dev, info=roomy)
    b = decode(m, z, tiled=True, tile=256, overlap=64, device=dev, budget=64 << 20, info=tight)
    assert (roomy.store, tight.store) == ("device", "host")
    assert psnr(a, full) >= 40 and psnr(b, full) >= 40 and psnr(a, b) >= 60


@pytest.mark.cuda
def test_a_gpu_run_given_cuda_without_an_index_computes_where_its_weights_and_states_are(monkeypatch):
    """torch.device("cuda") != a tensor's cuda:0: told "cuda", a decode treated its resident weights as
    offloaded (cast in every op) and its device-kept tile states as copies (strips given and taken)."""
    from engine.vae import tiling

    m = small_kl(ch=32, seed=3).to("cuda", torch.float16)
    z = _z(h=64, w=64, seed=4)
    monkeypatch.setattr(tiling, "Exchange", lambda *a: pytest.fail("strips given and taken on the device"))
    info = RunInfo()
    out = decode(m, z, tiled=True, tile=256, overlap=64, device="cuda", dtype=torch.float16, info=info)
    assert info.store == "device" and out.shape == (1, 3, 512, 512)
    # every op's weights are where it computes: none is marked offloaded during the run
    marked = []
    for _, mod in ops.castable_modules(m):
        mod.register_forward_pre_hook(lambda mod, args: marked.append(mod.offload))
    decode(m, z, tiled=False, device="cuda", dtype=torch.float16)
    assert marked and not any(marked)


def test_the_run_estimate_of_a_tile_larger_than_the_image_is_the_images():
    # `decode --tile 4096` on a 2048x768 latent runs one 2048x768 tile: its estimate (the run's and the
    # CLI's "as tiled") read 10x the full decode's, counting a 4096^2 tile.
    from engine.formatting import tiles_text
    from engine.vae import choice, estimate

    spec = estimate.VaeSpec("kl", 4, estimate.SD_VAE_WEIGHTS)
    job = choice.Job(spec, "decode", (96, 256), 1, 8, 4, False)
    one = choice.choose(job, 1 << 40, "tiled", 4096, 64)
    assert len(one.rects) == 1
    full = estimate.full_bytes(spec, "decode", job.pixels, 4)
    tiled = choice.peak_bytes(job, one, 1 << 40, disk=True)  # the tile states on disk: not counted
    assert full < tiled < 1.1 * full  # the head's output and the float32 result beside the one tile
    # where the image is bigger than the tile, a tile still counts whole
    small = choice.choose(job, 1 << 40, "tiled", 256, 64)
    assert choice.peak_bytes(job, small, 1 << 40, disk=True) >= estimate.tiled_bytes(
        spec, "decode", job.pixels, 256, 4
    )
    assert tiles_text(1, 4096) == "one tile (the whole image)" and tiles_text(12, 512) == "12 tiles of 512 px"
