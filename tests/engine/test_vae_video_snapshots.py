"""Where a GPU video decode keeps each chunk's retry snapshot (engine.vae.choice.snapshot_for,
engine.vae.video.Snapshots): on the device beside the running chunk while the budget holds both caches,
else in pinned host RAM -- which leaves the budget to bigger tiles -- and a chunk that runs out of
memory is run again from it, exactly."""

from __future__ import annotations

import pytest
import torch

from engine.events import Tiling
from engine.vae import choice, video
from engine.vae import estimate as est
from engine.vae.choice import Job, choose_video
from engine.vae.video import Counters, decode_video

pytest.importorskip("diffusers")
from tests.engine.test_vae_wan import SMALL_21, _mine, _reference  # noqa: E402

GIB = 1 << 30


def _job(cuda: bool = True) -> Job:
    return Job(est.video_spec("wan21"), "decode", (60, 104), 1, 8, 2, cuda, 21)  # 81 frames at 480x832, fp16


def test_a_roomy_budget_keeps_the_snapshot_on_the_device_and_the_plan_unchanged():
    job = _job()
    t = choose_video(job, 24 * GIB)
    assert not t.tiled and choice.snapshot_for(job, t, 24 * GIB) == "device"
    assert choice.peak_bytes(job, t, 24 * GIB) == job.video_bytes(None, t.tile_frames, None, "device")


def test_a_tight_budget_gets_bigger_tiles_with_the_snapshot_in_host_ram():
    job = _job()
    for gib, host_tile, device_tile in ((1.2, 256, 192), (1.8, 512, 320)):
        budget = int(gib * GIB)
        t = choose_video(job, budget)
        on_device = choice._choose_video(job, budget, "auto", None, None, None, 0, "device")
        assert on_device.tile_frames == 1  # the device-snapshot plan had nothing left to give but tiles
        assert (t.tile_px, on_device.tile_px) == (host_tile, device_tile)
        assert choice.snapshot_for(job, t, budget) == "host"
        # it fits with one cache on the device, not with two
        assert choice.peak_bytes(job, t, budget) <= budget < job.video_bytes(t.tile_px, t.tile_frames, t.overlap_px,
                                                                              "device")  # fmt: skip
    # the snapshot's place changes the estimate by one cache exactly
    one = job.video_bytes(512, 1, 64, "host")
    two = job.video_bytes(512, 1, 64, "device")
    cache = est.K_VIDEO_CACHE["wan21"] * job.spec.ch * job.largest_tile_area(512, 64) * job.esize
    assert two - one == pytest.approx(cache, abs=1)


def test_the_smallest_tile_fits_where_only_one_cache_does():
    job = _job()
    budget = int(0.8 * GIB)
    t = choose_video(job, budget)
    assert t.tile_px == choice.MIN_TILE_PX and t.tile_frames == 1
    assert job.video_bytes(t.tile_px, 1, t.overlap_px, "device") > budget  # before: "not even the smallest"
    assert choice.snapshot_for(job, t, budget) == "host" and choice.peak_bytes(job, t, budget) <= budget


def test_while_the_device_plan_has_frames_per_chunk_to_give_it_stays():
    job = _job()
    for gib in (1.6, 2.5, 4.5):
        budget = int(gib * GIB)
        t = choose_video(job, budget)
        assert t.tile_frames > 1 and choice.snapshot_for(job, t, budget) == "device"
        assert t == choice._choose_video(job, budget, "auto", None, None, None, 0, "device")
    # chunks of 2 asked for where only one cache fits beside them: the snapshot goes to host RAM
    t = choose_video(job, int(1.2 * GIB), tile_frames=2)
    assert t.tile_frames == 2 and choice.snapshot_for(job, t, int(1.2 * GIB)) == "host"


def test_no_snapshot_on_the_cpu_and_none_needed_for_one_chunk():
    assert choice.snapshot_for(_job(cuda=False), Tiling("full", tile_frames=1), 1) is None
    job = _job()
    assert choice.snapshot_for(job, Tiling("full", tile_frames=21), 1) == "device"  # its cache is empty


@pytest.fixture(scope="module")
def wan21():
    return _mine(_reference(**SMALL_21))


@pytest.mark.parametrize("where", ["device", "host"])
def test_a_chunk_that_runs_out_of_memory_runs_again_from_its_snapshot_exactly(wan21, monkeypatch, where):
    """Chunks of 4 latent frames fail (injected), are halved twice and run again from the snapshot of
    the cache they started with: the frames are those of a decode in chunks of one, bit for bit."""
    mine, cpu = wan21, torch.device("cpu")
    z = torch.randn(1, 4, 5, 8, 10, generator=torch.Generator().manual_seed(7))
    with torch.inference_mode():
        want = decode_video(mine, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
    real = type(mine).decode_up
    seen: list[video.Stream] = []

    def tight(self, h, stream, frames_at_once=None):
        seen.append(stream)
        if h.shape[2] > 1:
            raise torch.OutOfMemoryError("injected")
        return real(self, h, stream, frames_at_once)

    taken: list[list[bool]] = []  # per snapshot: whether each entry shares the running cache's memory
    real_take = video.Snapshots.take

    def take(self, stream):
        snap = real_take(self, stream)
        ptr = {k: t.untyped_storage().data_ptr() for k, t in stream.frames.items()}
        taken.append([t.untyped_storage().data_ptr() == ptr[k] for k, t in snap.frames.items()])
        assert snap.frames.keys() == stream.frames.keys()
        return snap

    monkeypatch.setattr(type(mine), "decode_up", tight)
    monkeypatch.setattr(video.Snapshots, "take", take)
    monkeypatch.setattr(video, "_can_retry", lambda device: True)  # as on a GPU, where OOM is raised
    c = Counters(notes=[])
    with torch.inference_mode():
        got = decode_video(mine, z, Tiling("full", tile_frames=4), device=cpu, dtype=torch.float32, counters=c,
                           snapshot=where)  # fmt: skip
    assert torch.equal(got, want)
    assert c.snapshot == where and c.oom_retries == 3  # 4 -> 2 -> 1, then the second chunk's 1 + 2 -> 1
    assert sum("per chunk" in n for n in c.notes) == 3
    # one snapshot per chunk that ran, none again for a chunk run again from it: 5 chunks of one frame
    assert len(taken) == 5 and sum(map(len, taken)) > 0
    assert all(shared == (where == "device") for flags in taken for shared in flags)  # host: copies


@pytest.mark.cuda
def test_gpu_snapshots_in_pinned_host_ram_rerun_a_failed_chunk_exactly(wan21, monkeypatch):
    dev = torch.device("cuda", torch.cuda.current_device())
    mine = _mine(_reference(**SMALL_21)).to(dev)
    z = torch.randn(1, 4, 5, 16, 20, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        want = decode_video(mine, z, Tiling("full", tile_frames=1), device=dev, dtype=torch.float32)
    real = type(mine).decode_up
    pinned: list[bool] = []
    real_take = video.Snapshots.take

    def take(self, stream):
        snap = real_take(self, stream)
        pinned.extend(t.is_pinned() and t.device.type == "cpu" for t in snap.frames.values())
        return snap

    def tight(self, h, stream, frames_at_once=None):
        if h.shape[2] > 1:
            raise torch.OutOfMemoryError("injected")
        return real(self, h, stream, frames_at_once)

    monkeypatch.setattr(type(mine), "decode_up", tight)
    monkeypatch.setattr(video.Snapshots, "take", take)
    c = Counters(notes=[])
    with torch.inference_mode():
        got = decode_video(mine, z, Tiling("full", tile_frames=2), device=dev, dtype=torch.float32, counters=c,
                           snapshot="host")  # fmt: skip
    assert c.snapshot == "host" and c.oom_retries >= 2 and pinned and all(pinned)
    assert torch.allclose(got, want, atol=1e-5)
