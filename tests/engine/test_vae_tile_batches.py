"""Small tiles run in batches of equal-size tiles (fewer, larger ops) and fp16 weights are cast once
per run: the result must be the one-tile-at-a-time result, GroupNorm lock-step statistics included,
and a batch must never hold more pixels than the budget's own tile."""

from __future__ import annotations

import torch
from vae_fixtures import psnr, small_kl, small_taesd

from engine.vae import decode, encode
from engine.vae.run import RunInfo
from engine.vae.tiling import batch_tiles, plan_tiles


def test_batches_group_equal_tiles_within_the_pixel_cap():
    tiles = plan_tiles(64, 64, 16, 8)  # 128-px tiles, 64-px overlap: 8 x 8 tiles of 4 sizes
    batches = batch_tiles(tiles, 8, 512 * 512)
    assert sorted(i for b in batches for i in b) == list(range(len(tiles)))
    for b in batches:
        sizes = {(tiles[i].pad[1] - tiles[i].pad[0], tiles[i].pad[3] - tiles[i].pad[2]) for i in b}
        assert len(sizes) == 1
        (h, w) = sizes.pop()
        assert len(b) == 1 or len(b) * h * w * 64 <= 512 * 512
    assert len(batches) < len(tiles) / 4
    assert batches[-1][-1] == len(tiles) - 1  # the last report of a pass names the last tile
    assert batch_tiles(tiles, 8, 0) == [[i] for i in range(len(tiles))]  # no cap given: one at a time


def _one_at_a_time(monkeypatch):
    import engine.vae.tiling as tiling

    real = tiling.batch_tiles
    monkeypatch.setattr(tiling, "batch_tiles", lambda tiles, s, px, reach=1: real(tiles, s, 0, reach))


def test_batched_kl_tiles_equal_single_tiles_through_groupnorm(monkeypatch):
    vae = small_kl(seed=3)
    z = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1))  # a batch of 2 latents
    info = RunInfo()
    batched = decode(vae, z, tiled=True, tile=48, overlap=16, info=info)
    assert info.tiles == 4
    _one_at_a_time(monkeypatch)
    single = decode(vae, z, tiled=True, tile=48, overlap=16)
    assert psnr(batched, single) > 80
    x = torch.rand(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    monkeypatch.undo()
    enc_b = encode(vae, x, tiled=True, tile=32, overlap=16)
    _one_at_a_time(monkeypatch)
    enc_s = encode(vae, x, tiled=True, tile=32, overlap=16)
    assert torch.allclose(enc_b, enc_s, atol=1e-4)


def test_fp16_weights_are_cast_once_per_run_and_restored():
    vae = small_taesd("taesd", 4, seed=5).half()
    before = {k: v for k, v in vae.state_dict().items()}
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    seen = []
    conv = vae.decoder[-1]  # the last conv: runs once per tile batch
    hook = conv.register_forward_pre_hook(lambda m, a: seen.append((m.weight.dtype, m.needs_cast)))
    try:
        out = decode(vae, z, tiled=True, tile=32, overlap=16)
    finally:
        hook.remove()
    assert seen and all(s == (torch.float32, False) for s in seen)  # no per-forward cast
    after = vae.state_dict()
    assert all(after[k] is before[k] or after[k].data_ptr() == before[k].data_ptr() for k in before)
    assert all(v.dtype == torch.float16 for v in after.values())
    ref = decode(vae, z, tiled=True, tile=32, overlap=16, budget=1)  # budget too small to pre-cast
    assert psnr(out, ref) > 80


def test_the_heap_slack_is_the_batchs_not_one_tiles(monkeypatch):
    # What runs at once is a batch: free heap up to a quarter of its activations' estimate is kept for
    # the next batch. Sized for one small tile, every batch of every pass trimmed the heap (and the
    # next batch faulted its pages in again): 1.46x the full decode's time for the window's 128-px
    # tiles, 1.2x with the batch's slack.
    import engine.vae.run as run

    slacks = []
    real, real_batches = run.run_tiled, run.batch_tiles
    monkeypatch.setattr(run, "run_tiled", lambda *a, **kw: slacks.append(kw["trim_slack"]) or real(*a, **kw))
    vae = small_taesd("taesd", 4, seed=5)
    z = torch.randn(1, 4, 32, 32, generator=torch.Generator().manual_seed(4))  # 256 px: 8 x 8 tiles
    info = RunInfo()
    batched = decode(vae, z, tiled=True, tile=64, overlap=32, info=info)
    assert info.tiles == 64 and info.notes  # ran in batches
    _one_at_a_time(monkeypatch)
    monkeypatch.setattr(run, "batch_tiles", lambda tiles, s, px, reach=1: real_batches(tiles, s, 0, reach))
    single = decode(vae, z, tiled=True, tile=64, overlap=32)
    assert psnr(batched, single) > 80
    one_tile = run.estimate.tile_bytes(run._spec(vae), 64, 4) // 4
    assert slacks[1] == one_tile  # one tile at a time: one tile's slack, as before
    assert slacks[0] >= 4 * one_tile  # batches of several tiles: the batch's
