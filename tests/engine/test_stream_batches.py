"""The streamer hands offloaded modules over in batches: each op still gets exactly its own bytes, in the
plan's order or not, with a ring far smaller than a step, and a batch never holds more than the largest
module (or BATCH_MIN) nor mixes ways of streaming."""

from __future__ import annotations

import threading

import pytest
import torch
from denoise_files import SD1_TINY, random_weights, unet_rows, write

from engine import denoise
from engine.denoise import stream
from engine.denoise.stream import BATCH_MIN, WINDOW, Streamer
from engine.devices import DeviceOptions
from engine.facade import Engine
from engine.model import transfer
from engine.requests import Step


class Staging(Streamer):
    """Streams every module by reading it into the ring (what CUDA does with unpinned ones), here on the
    CPU, where a disk-tier module would be mapped instead."""

    def _mode(self, u) -> str:
        return "stage"


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """The tiny SD1 UNet after a step with no room at all: every castable module in the disk tier."""
    path = write(
        tmp_path_factory.mktemp("batches") / "sd1.safetensors", random_weights(unet_rows(SD1_TINY), 5)
    )
    e = Engine()
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=0.0))
    assert e.run(Step(str(path), size=(64, 64))).mode == "partial"
    (comp,) = [c for (_, name), c in e.loaded.items() if name == "unet"]
    yield comp, denoise.bind(comp, "sd1").op_order()
    e.close()


def _own(op) -> dict:
    return {a: getattr(op, a) for a in (op.weight_attr, "bias") if getattr(op, a, None) is not None}


def _check(st: Streamer, op) -> None:
    got = st._fetch(op)
    for attr, want in _own(op).items():
        assert torch.equal(got[attr], want), attr


@pytest.mark.parametrize("kind", [Streamer, Staging])
def test_batches_gather_small_modules_of_one_kind_up_to_the_largest(placed, kind):
    comp, order = placed
    st = kind(comp, order, "cpu", steps=2)
    n = len(st.units)
    assert n > 20 and all(u.tier == "disk" for u in st.units.values())
    assert len(st.plan) == 2 * st._nb and st._nb < n / 4  # the tiny model's modules go dozens at a time
    cap = max(max(st.unit_bytes.values()), BATCH_MIN)
    for b in st.plan:
        assert {st._mode(u) for u in b.units} == {b.mode} == {"map" if kind is Streamer else "stage"}
        assert sum(st.unit_bytes[id(u)] for u in b.units) <= cap
    assert [u for b in st.plan[: st._nb] for u in b.units] == [
        st.units[id(op)] for op in order if id(op) in st.units
    ]


@pytest.mark.parametrize("kind", [Streamer, Staging])
@pytest.mark.parametrize("ring", [None, 1])
def test_every_op_gets_its_own_bytes_in_order_skipped_or_out_of_order(placed, monkeypatch, ring, kind):
    """Steps in the plan's order, then one that skips modules (within the window) and asks for one far
    ahead (read on demand): every op gets its own bytes. ring=1: the smallest ring (two of the largest
    batches), so the reader waits for a batch's ops to be done before it reads over its bytes (Staging:
    copies into the ring) -- no deadlock, no reuse too early."""
    comp, order = placed
    monkeypatch.setattr(stream, "BATCH_MIN", 1 << 16)  # several batches even in this tiny model
    unmapped = [0]
    real_unmap = transfer.FileBlock.unmap_pages

    def unmap_pages(block):
        assert threading.current_thread().name == "loadout-stream"
        unmapped[0] += 1
        real_unmap(block)

    monkeypatch.setattr(transfer.FileBlock, "unmap_pages", unmap_pages)
    ops = [op for op in order if id(op) in {id(u.module) for u in comp.units if stream.streamable(u)}]
    st = kind(comp, order, "cpu", steps=3, ring_bytes=ring)
    assert st._nb > 3
    with st:
        for op in ops:
            _check(st, op)
        assert st.sync_reads == 0 and st.prefetched > 0
        for op in ops:  # the second step: nothing read on demand
            _check(st, op)
        assert st.sync_reads == 0
        _check(st, ops[0])
        _check(st, ops[WINDOW - 1])  # skips WINDOW - 2 modules
        _check(st, ops[WINDOW + 40])  # out of the window: read on demand
        assert st.sync_reads == 1
        for op in ops[WINDOW:]:
            _check(st, op)
        assert st.sync_reads == 1
    assert st.fetched == 3 * len(ops) - (WINDOW - 2) + 1
    assert all(b.host is None and b.mapped is None for b in st.plan)  # nothing held after the run
    # mapped batches are unmapped by the reader thread, beside the compute (not on the compute thread)
    assert (unmapped[0] > 0) == (kind is Streamer)


def test_a_staged_batch_goes_to_the_device_as_one_copy_its_tensors_views_of_it(placed, monkeypatch):
    """What CUDA does with a staged batch (_device_copies), run on the CPU: one buffer holding the batch's
    ring region, each tensor a view of it at its offset there -- its own bytes, its dtype and shape, and
    its address modulo ALIGN as staged (what keeps a partial step's numbers those of the full step)."""
    comp, order = placed
    monkeypatch.setattr(stream, "BATCH_MIN", 1 << 16)
    st = Staging(comp, order, "cpu", steps=1)
    with st:
        b = st.plan[1]
        st._wait(b)
        (buf,), device = st._device_copies(b)
        assert buf.numel() == b.slot.end - b.slot.start
        region = (buf.data_ptr(), buf.data_ptr() + buf.numel())
        ring_at = st._block.base.data_ptr() + b.slot.start
        assert buf.data_ptr() % stream.ALIGN == 0 == ring_at % stream.ALIGN
        assert len(device) == len(b.units) > 1
        for h, d in zip(b.host, device, strict=True):
            assert h.keys() == d.keys()
            for a, t in h.items():
                got = d[a]
                assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), a
                assert region[0] <= got.data_ptr() < region[1]  # a view of the one buffer, not the ring
                assert got.data_ptr() - buf.data_ptr() == t.data_ptr() - ring_at  # where it was staged
                assert got.data_ptr() % stream.ALIGN == t.data_ptr() % stream.ALIGN


class Direct(Streamer):
    """Streams every module as CUDA streams a pinned RAM-tier one (copied from where it is), on the CPU."""

    def _mode(self, u) -> str:
        return "direct"


def test_a_ram_tier_unit_goes_to_the_device_as_one_copy_of_its_block(placed, monkeypatch):
    """What CUDA does with a batch of pinned RAM-tier units, run on the CPU: one copy per unit of the span
    of its block holding its tensors (not one per tensor), each tensor a view of that copy at its offset
    in the block -- its own bytes, dtype, shape and alignment modulo ALIGN."""
    comp, order = placed
    monkeypatch.setattr(stream, "BATCH_MIN", 1 << 16)
    units = [u for u in comp.units if stream.streamable(u)]
    for u in units:
        comp.move_unit(u, "ram")
    try:
        st = Direct(comp, order, "cpu", steps=1)
        with st:
            b = st.plan[1]
            st._wait(b)
            bufs, device = st._device_copies(b)
            assert len(bufs) == len(device) == len(b.units) > 1
            assert sum(len(h) for h in b.host) > len(b.units)  # weights and biases: fewer copies than tensors
            for u, h, d, buf in zip(b.units, b.host, device, bufs, strict=True):
                first = min(t.data_ptr() for t in h.values())
                first -= first % stream.ALIGN  # the copy starts at the ALIGN boundary before the first
                assert u.block.base.data_ptr() <= first
                for a, t in h.items():
                    got = d[a]
                    assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), a
                    assert buf.data_ptr() <= got.data_ptr() < buf.data_ptr() + buf.numel()
                    assert got.data_ptr() - buf.data_ptr() == t.data_ptr() - first
                    assert got.data_ptr() % stream.ALIGN == t.data_ptr() % stream.ALIGN
    finally:
        for u in units:
            comp.move_unit(u, "disk")
    assert all(u.tier == "disk" for u in units)
