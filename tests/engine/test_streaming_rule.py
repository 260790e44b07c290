"""engine.model.streaming is the one rule for what streaming holds: the streamer sizes its ring and its
batches by it, and the plan's partial peak counts what the streamer would hold."""

from __future__ import annotations

from denoise_files import SD1_TINY, random_weights, unet_rows, write

from engine import denoise
from engine.denoise.stream import Streamer
from engine.devices import DeviceOptions
from engine.facade import Engine
from engine.model import streaming
from engine.requests import Step

MIB = 1024 * 1024


def test_the_bound_on_a_gpu_is_two_batch_caps_and_never_more_than_a_step():
    assert streaming.in_flight_bytes(30 * MIB, 1000 * MIB, True) == 60 * MIB
    assert streaming.in_flight_bytes(100_000, 1000 * MIB, True) == 2 * streaming.BATCH_MIN  # small modules
    assert streaming.in_flight_bytes(100_000, 3 * MIB, True) == 3 * MIB  # a small model streams whole
    assert streaming.in_flight_bytes(30 * MIB, 0, True) == 0 == streaming.in_flight_bytes(30 * MIB, 0, False)


def test_the_cpu_ring_holds_two_batches_or_min_ring_up_to_a_step():
    assert streaming.in_flight_bytes(10 * MIB, 1000 * MIB, False) == streaming.MIN_RING
    assert streaming.in_flight_bytes(50 * MIB, 1000 * MIB, False) == 100 * MIB
    assert streaming.in_flight_bytes(1 * MIB, 20 * MIB, False) == 20 * MIB


def test_the_streamer_sizes_its_ring_and_batches_by_the_rule(tmp_path):
    path = write(tmp_path / "sd1.safetensors", random_weights(unet_rows(SD1_TINY), 3))
    e = Engine()
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=0.0))
    try:
        assert e.run(Step(str(path), size=(64, 64))).mode == "partial"
        (comp,) = [c for (_, name), c in e.loaded.items() if name == "unet"]
        st = Streamer(comp, denoise.bind(comp, "sd1").op_order(), "cpu", steps=1)
        needs = [b.need for b in st.plan]
        assert st.cap == streaming.batch_cap(max(st.unit_bytes.values()))
        assert st.ring_bytes == streaming.ring_bytes(max(needs), sum(needs))
        assert st.flight_bytes == streaming.FLIGHT_BATCHES * st.cap
    finally:
        e.close()
