"""The CUDA paths: real device memory, pinned RAM copies, async copies, collection. Skipped without CUDA."""

from __future__ import annotations

import gc

import pytest
import torch
from residency_files import write_components

from engine.model import Component
from engine.residency import Policy, Residency

pytestmark = pytest.mark.cuda
ROWS = [256, 512, 1024, 2048]


@pytest.fixture
def ckpt(tmp_path):
    return write_components(tmp_path / "m.safetensors", {n: ROWS for n in "ab"}, width=1024)


def cuda_comp(path, name, **kw):
    return Component(name, path, f"{name}.", device="cuda:0", compute_dtype="float16", **kw)


def manager(**kw) -> Residency:
    kw.setdefault("reserve_bytes", 0)
    kw.setdefault("min_inference_bytes", 0)
    return Residency("cuda:0", policy=Policy(vram_state="NORMAL_VRAM", **kw))


def free_now() -> int:
    torch.cuda.synchronize()
    return torch.cuda.mem_get_info()[0]


def test_free_device_memory_returns_after_unload(ckpt):
    a = cuda_comp(ckpt, "a")
    # One cycle first: the process's first load takes device memory once that no unload gives back
    # (70 MiB on an H200, torch 2.11, CUDA_MODULE_LOADING lazy and eager alike); every later cycle
    # returns all of it (benchmarks/gpu_check.py's run, 2026-11-26).
    warm = manager()
    warm.load([a])
    warm.unload(a)
    torch.cuda.empty_cache()
    before_free, before_alloc = free_now(), torch.cuda.memory_allocated()
    m = manager()
    m.load([a])
    assert m.snapshot().get("a").device_bytes == a.full_bytes() == a.measured_tiers()["device"]
    assert torch.cuda.memory_allocated() - before_alloc >= a.full_bytes()
    m.unload(a)
    assert torch.cuda.memory_allocated() == before_alloc
    assert abs(free_now() - before_free) <= 2 * 1024**2  # empty_cache gave the blocks back


def test_partial_load_streams_the_rest_and_computes_the_same(ckpt):
    a = cuda_comp(ckpt, "a")
    ref = Component("a", ckpt, "a.", compute_dtype="float32")
    x = torch.randn(4, 1024)
    want = ref.module.l3(x)
    m = manager(vram_budget=a.full_bytes() // 2)
    m.load([a])
    snap = m.snapshot().get("a")
    assert 0 < snap.device_bytes <= a.full_bytes() // 2
    assert snap.ram_bytes + snap.device_bytes + snap.disk_bytes == a.full_bytes()
    assert a.module.l3.offload  # the largest module streams
    got = a.module.l3(x.to("cuda:0", torch.float16))
    torch.testing.assert_close(got.float().cpu(), want, rtol=2e-2, atol=2e-2)
    assert (snap.device_bytes, snap.ram_bytes, snap.disk_bytes) == tuple(a.measured_tiers().values())


def test_ram_tier_is_pinned_and_capped(ckpt):
    a = cuda_comp(ckpt, "a")
    m = manager(vram_budget=4096, ram_budget=a.full_bytes() // 2)  # room for position_ids only
    m.load([a])
    snap = m.snapshot().get("a")
    assert snap.device_bytes <= 4096 and 0 < snap.ram_bytes <= a.full_bytes() // 2
    ram_units = [u for u in a.units if u.tier == "ram"]
    assert ram_units and all(u.block.pinned for u in ram_units)
    assert all(getattr(u.module, "weight", torch.empty(0)).is_pinned() for u in ram_units if u.castable)
    assert (snap.device_bytes, snap.ram_bytes, snap.disk_bytes) == tuple(a.measured_tiers().values())
    assert m.pinned.used > 0
    m.unload(a)
    gc.collect()
    assert m.pinned.used == 0


def test_evicting_to_ram_then_reloading(ckpt):
    a, b = cuda_comp(ckpt, "a"), cuda_comp(ckpt, "b")
    m = manager(vram_budget=a.full_bytes())
    m.load([a])
    m.load([b])  # a leaves the device for pinned RAM
    assert m.snapshot().get("a").ram_bytes > 0
    m.load([a])
    assert m.snapshot().get("a").resident == 1.0
    for c in (a, b):
        row = m.snapshot().get(c.name)
        assert (row.device_bytes, row.ram_bytes, row.disk_bytes) == tuple(c.measured_tiers().values())


def test_a_collected_component_frees_its_device_memory(ckpt):
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    m = manager()
    a = cuda_comp(ckpt, "a")
    m.load([a])
    del a
    gc.collect()
    assert m.snapshot().components == ()
    assert torch.cuda.memory_allocated() == before
