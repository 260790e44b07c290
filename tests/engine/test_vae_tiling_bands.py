"""The tiled executor's memory savers compute what the plain ops compute: convolutions in row bands
(with an upsample read band by band, a shortcut added band by band), and a tile store that keeps one
copy of a tensor listed twice."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine import ops
from engine.vae import tiling


def _conv(cin, cout, k, seed=0):
    torch.manual_seed(seed)
    m = torch.nn.Conv2d(cin, cout, k, padding=k // 2)
    return m


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("up", [False, True])
@pytest.mark.parametrize("rows_bytes", [1, 700, 1 << 30])  # one row per band, a few rows, all at once
def test_banded_convolution_equals_the_whole_one(monkeypatch, k, up, rows_bytes):
    monkeypatch.setattr(tiling, "BAND_BYTES", rows_bytes)
    conv = _conv(5, 6, k)
    x = torch.randn(2, 5, 13, 11, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = conv(F.interpolate(x, scale_factor=2.0, mode="nearest") if up else x)
        got = tiling._conv_rows(conv, x, up)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_banded_shortcut_add_equals_the_plain_add(monkeypatch):
    monkeypatch.setattr(tiling, "BAND_BYTES", 64)
    conv = _conv(8, 4, 1)
    r = torch.randn(1, 8, 9, 7)
    x = torch.randn(1, 4, 9, 7)
    with torch.inference_mode():
        want = x + conv(r)
        got = x.clone()
        tiling._add_conv_rows(got, conv, r)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_only_stride_one_same_convolutions_are_banded():
    assert tiling._bandable(_conv(3, 3, 3))
    assert tiling._bandable(ops.Conv2d(3, 3, 3, padding=1))
    assert not tiling._bandable(torch.nn.Conv2d(3, 3, 3, stride=2, padding=0))  # a downsample
    assert not tiling._bandable(torch.nn.Conv2d(3, 3, 3, padding=0))
    assert not tiling._bandable(torch.nn.Conv2d(3, 3, 3, padding=1, padding_mode="reflect"))
    assert not tiling._bandable(torch.nn.ReLU())


def test_steps_with_an_upsample_and_shortcut_equal_the_plain_ops(monkeypatch):
    """up2 -> conv is fused (the upsample never whole); push / pop_add with a 1x1 shortcut adds in
    bands; SiLU runs in place only on tensors the executor made, never on the caller's input."""
    monkeypatch.setattr(tiling, "BAND_BYTES", 256)
    c1, c2, sc = _conv(4, 6, 3, 1), _conv(6, 6, 3, 2), _conv(4, 6, 1, 3)
    steps = [("up2",), ("push",), ("module", c1), ("silu",), ("module", c2), ("pop_add", sc), ("silu",)]
    x = torch.randn(1, 4, 10, 9)
    keep = x.clone()
    with torch.inference_mode():
        u = F.interpolate(x, scale_factor=2.0, mode="nearest")
        want = F.silu(c2(F.silu(c1(u))) + sc(u))
        got, scale = tiling._run_steps(steps, [x], [], 1, None)
    assert scale == 2
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert torch.equal(x, keep)  # the input crop is the caller's: never written


def test_disk_store_keeps_one_copy_of_a_tensor_listed_twice(tmp_path):
    store = tiling.DiskStore(torch.device("cpu"), folder=str(tmp_path))
    try:
        a, b = torch.randn(2, 3), torch.arange(4.0)
        store.put(0, [a, b, a])
        x, y, z = store.get(0)
        assert x is z and torch.equal(x, a) and torch.equal(y, b)
        assert x is not a  # read back from the file
    finally:
        store.close()


def test_bands_are_sized_by_the_device():
    """A GPU band keeps the device busy (few launches), a CPU band keeps the cache warm."""
    conv = _conv(128, 128, 3)
    rows = {d: next(tiling._bands(conv, 1, 1024, 1024, 2, torch.device(d)))[1] for d in ("cpu", "cuda")}
    assert rows["cpu"] == tiling.BAND_BYTES // (128 * 1024 * 2) == 8
    assert rows["cuda"] == ops.GPU_BAND_BYTES // (128 * 1024 * 2) == 128
    assert ops.band_bytes(torch.device("cpu")) == ops.BAND_BYTES < ops.band_bytes(torch.device("cuda"))


def _job(cuda: bool, side: int = 1024):
    from vae_fixtures import small_kl

    from engine.vae.run import job_of

    return job_of(small_kl(ch=32), torch.zeros(1, 4, side // 8, side // 8), "decode",
                  torch.device("cuda" if cuda else "cpu"), torch.float16)  # fmt: skip


def test_tile_states_wait_on_the_gpu_only_when_they_fit_and_never_after_an_oom():
    from engine.vae import choice, estimate

    gpu, cpu = _job(cuda=True), _job(cuda=False)
    t = choice.choose(gpu, 1 << 40, "tiled", 512, 64)
    states = estimate.store_bytes(gpu.spec, "decode", gpu.pixels, gpu.esize)
    assert choice.store_for(gpu, t, 1 << 40) == "device"
    assert choice.store_for(gpu, t, states) == "host"  # the states alone: no room for the tiles
    assert choice.store_for(gpu, t, 1 << 40, disk=True) == "disk"
    after_oom = choice.retry(gpu, choice.choose(gpu, 1 << 40, "full"), 1 << 40)
    assert after_oom.tiled and choice.store_for(gpu, after_oom, 1 << 40) == "host"
    # the CPU: RAM, or files once the image's states would take over half the budget
    tc = choice.choose(cpu, 1 << 40, "tiled", 512, 64)
    assert choice.store_for(cpu, tc, 1 << 40) == "ram"
    assert choice.store_for(cpu, tc, 2 * states - 1) == "disk"


def test_a_tilings_estimate_counts_its_batch_and_where_its_states_wait():
    # The estimate of what runs (the plan's figure, RunInfo.tiling_estimate_bytes): small tiles batched
    # up to the budget's tile count as the boxes of the largest batch the run makes -- counted as one
    # tile, a batched CPU run measured 7 % over its estimate -- and the states count where they share
    # the pass's memory.
    from engine.vae import choice, estimate

    gpu, cpu = _job(cuda=True), _job(cuda=False)
    spec, px, es = gpu.spec, gpu.pixels, gpu.esize
    batched = choice.choose(gpu, 1 << 40, "tiled", 256, 64)
    assert batched.batch_px == 1024**2  # the GPU's budget tile
    tiles = choice.plan_tiles(128, 128, 32, 8)
    biggest = max(sum(choice.box_px(tiles[i], 8) for i in b) for b in choice.batch_tiles(tiles, 8, 1024**2))
    assert choice.computed_px(gpu, batched) == biggest
    assert 256 * 256 < biggest <= 1024**2  # several tiles at once, never more than the budget's tile

    def est(computed, states=False):
        return estimate.tiled_bytes(spec, "decode", px, 256, es, ram_store=states, computed_px=computed)

    on_device = est(biggest, True)
    assert choice.peak_bytes(gpu, batched, 1 << 40) == on_device > est(0, True)
    # a budget that leaves no room for the states beside the batch: they wait in host RAM, not counted
    tight = on_device - estimate.RUNTIME_BYTES - spec.weight_bytes - 1
    assert choice.store_for(gpu, batched, tight) == "host"
    assert choice.peak_bytes(gpu, batched, tight) == est(biggest)
    # after an out-of-memory the tiles run one at a time, each no bigger than its tile
    one = choice.retry(gpu, batched, 1 << 40)
    assert choice.computed_px(gpu, one) <= 128 * 128
    assert choice.peak_bytes(gpu, one, 1 << 40) == estimate.tiled_bytes(spec, "decode", px, 128, es)
    # the CPU: states in RAM count, on disk they do not; a full pass is the full estimate
    tc = choice.choose(cpu, 1 << 40, "tiled", 512, 64)
    ram = choice.peak_bytes(cpu, tc, 1 << 40)
    assert ram - choice.peak_bytes(cpu, tc, 1 << 40, disk=True) == estimate.store_bytes(
        spec, "decode", px, es
    )
    full = choice.choose(cpu, 1 << 40, "full")
    assert choice.peak_bytes(cpu, full, 1 << 40) == estimate.full_bytes(spec, "decode", px, es)
    # every image of the latent runs through each tile
    two = choice.Job(spec, "decode", gpu.lat_hw, 2, 8, es, True)
    assert choice.computed_px(two, batched) == 2 * biggest


def test_a_runs_info_carries_the_estimate_of_the_tiling_that_ran():
    from vae_fixtures import small_kl

    from engine.vae import choice, decode
    from engine.vae.run import RunInfo, job_of

    vae = small_kl(seed=3)
    z = torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(1))
    info = RunInfo()
    decode(vae, z, tiled=True, tile=64, overlap=16, budget=1 << 34, info=info)
    assert any("tiles at a time" in n for n in info.notes)  # 64-px tiles ran in batches
    job = job_of(vae, z, "decode", torch.device("cpu"), torch.float32)
    ran = choice.choose(job, 1 << 34, "tiled", 64, 16)
    assert info.tiling_estimate_bytes == choice.peak_bytes(job, ran, 1 << 34)
    one_at_a_time = choice.peak_bytes(job, choice.tiled(job, 64, 16, 0), 1 << 34)
    assert info.tiling_estimate_bytes > one_at_a_time


def test_the_preflight_tiled_figure_runs_each_tile_through_every_image():
    from engine.vae import estimate, estimate_decode_bytes

    one = estimate_decode_bytes(512, 512, tile=256)
    two = estimate_decode_bytes(512, 512, tile=256, batch=2)
    spec = estimate.VaeSpec("kl", 4, estimate.SD_VAE_WEIGHTS)
    # the second image adds its head, result and its share of the tile, which runs for both at once
    assert two - one == int(
        spec.k_head() * 64 * 64 * 4 + 16 * 512 * 512 + spec.k_act("decode") * 256 * 256 * 4
    )
