"""The residency policy under exact injected budgets, on the CPU: the device tier is a real copy in RAM,
the offload tier the file's mmap — every byte in the ledger is checked against the tensors themselves."""

from __future__ import annotations

import gc
import threading

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from residency_files import write_components

from engine.errors import Cancelled
from engine.jobs import CancelToken
from engine.model import Component
from engine.residency import Policy, Residency

ROWS = [64, 128, 256, 512]


@pytest.fixture
def ckpt(tmp_path):
    return write_components(tmp_path / "m.safetensors", {n: ROWS for n in "abc"})


def comps(path, names="abc"):
    return [Component(n, path, f"{n}.") for n in names]


def manager(budget: int, **kw) -> Residency:
    kw.setdefault("vram_state", "NORMAL_VRAM")
    policy = Policy(reserve_bytes=0, min_inference_bytes=0, vram_budget=budget, **kw)
    return Residency("cpu", probe=lambda: 1 << 50, policy=policy)


def assert_true_ledger(m: Residency, *cs: Component) -> None:
    """The ledger says what the tensors say, component by component."""
    snap = m.snapshot()
    for c in cs:
        row = snap.get(c.name)
        measured = c.measured_tiers()
        if row is None:
            assert measured["device"] == measured["ram"] == 0
            continue
        assert (row.device_bytes, row.ram_bytes, row.disk_bytes) == (
            measured["device"],
            measured["ram"],
            measured["disk"],
        )


def test_load_a_fits(ckpt):
    a, b, _ = comps(ckpt)
    m = manager(a.full_bytes() + b.full_bytes())
    events = []
    m.subscribe(events.append)
    m.load([a])
    row = m.snapshot().get("a")
    assert row.device_bytes == a.full_bytes() and row.resident == 1.0
    assert [e.kind for e in events] == ["Loaded"] and events[0].bytes_moved == a.full_bytes()
    assert_true_ledger(m, a)


def test_loading_b_evicts_the_least_recently_used(ckpt):
    a, b, c = comps(ckpt)
    full = a.full_bytes()
    m = manager(2 * full)
    m.load([a])
    m.load([b])
    m.load([a])  # a is used again: b is now the least recently used
    m.load([c])
    snap = m.snapshot()
    assert snap.get("c").resident == 1.0
    assert snap.get("a").resident == 1.0
    assert snap.get("b").device_bytes < full  # evicted only as far as needed
    assert snap.device_bytes <= 2 * full
    assert_true_ledger(m, a, b, c)


def test_partially_offloaded_ones_go_first(ckpt):
    a, b, c = comps(ckpt)
    full = a.full_bytes()
    m = manager(2 * full)
    m.load([a])
    m.load([b])
    m.unload(b, 1000)  # b (the most recent) is now partially offloaded
    before_a = m.snapshot().get("a").device_bytes
    m.load([c])
    snap = m.snapshot()
    assert snap.get("a").device_bytes == before_a  # b paid first although a is older
    assert_true_ledger(m, a, b, c)


def test_a_pinned_component_is_never_evicted(ckpt):
    a, b, c = comps(ckpt)
    full = a.full_bytes()
    m = manager(2 * full)
    m.load([a])
    m.pin(a)
    m.load([b])
    m.load([c])  # must take b's memory, never a's
    assert m.snapshot().get("a").resident == 1.0 and m.snapshot().get("a").pinned
    m.pin(c)
    m.load([b])  # both others pinned: b loads partially into what is left (nothing)
    snap = m.snapshot()
    assert snap.get("a").resident == 1.0 and snap.get("c").resident == 1.0
    assert snap.get("b").device_bytes == 0
    assert_true_ledger(m, a, b, c)


@settings(max_examples=25, deadline=None)
@given(frac=st.floats(0.0, 1.0), first=st.floats(0.0, 1.0))
def test_partial_loads_never_exceed_the_budget(tmp_path_factory, frac, first):
    path = write_components(tmp_path_factory.mktemp("p") / "m.safetensors", {n: ROWS for n in "ab"})
    a, b = comps(path, "ab")
    budget = int(a.full_bytes() * (0.5 + frac))
    m = manager(budget)
    peak = [0]

    def watch(_p):
        peak[0] = max(peak[0], a.tier_bytes()["device"] + b.tier_bytes()["device"])

    m.load([a], report=watch)
    m.unload(a, int(a.full_bytes() * first))
    m.load([b], report=watch)
    assert peak[0] <= budget
    assert m.snapshot().device_bytes <= budget
    assert_true_ledger(m, a, b)
    # b got all the budget could give: the smallest module it left off did not fit
    left = [u for u in b.units if u.tier != "device" and u.castable]
    room = budget - m.snapshot().device_bytes
    assert all(b.unit_bytes(u, "device") > room for u in left)


def test_unload_frees_what_it_says(ckpt):
    a, _, _ = comps(ckpt)
    m = manager(10 * a.full_bytes(), auto_top_up=False)
    m.load([a])
    before = a.measured_tiers()["device"]
    freed = m.unload(a, 200_000)
    after = a.measured_tiers()["device"]
    assert freed == before - after and freed >= 200_000
    # the fewest modules: 512 rows × 256 × 2 bytes covers 200 kB alone
    assert [u.path for u in a.units if u.tier == "disk"] == ["l3"]
    assert_true_ledger(m, a)
    rest = m.unload(a)
    assert rest == after and a.measured_tiers()["device"] == 0
    assert m.snapshot().get("a") is None


def test_an_unload_rebinds_the_disk_tier_s_own_views(ckpt, monkeypatch):
    """Unloading puts back the views of the file's mapping made when the component was built (the same
    memory, no view made again: that was two thirds of unloading SD1.5's 615 modules)."""
    a, _, _ = comps(ckpt)
    built = {u.path: {k: getattr(u.module, k).data_ptr() for k in u.infos} for u in a.units}
    m = manager(10 * a.full_bytes(), auto_top_up=False)
    m.load([a])
    assert all(getattr(u.module, k).data_ptr() != built[u.path][k] for u in a.units for k in u.infos)

    def no_new_view(name):
        raise AssertionError(f"{name}: a disk view made again")

    monkeypatch.setattr(a.file, "tensor", no_new_view)
    m.unload(a)
    assert {u.path: {k: getattr(u.module, k).data_ptr() for k in u.infos} for u in a.units} == built
    assert a.measured_tiers() == {"device": 0, "ram": 0, "disk": a.full_bytes("disk")}
    assert_true_ledger(m, a)
    m.load([a])  # and it loads again from them
    assert a.measured_tiers()["device"] == a.full_bytes()


def test_unloading_what_is_not_loaded_is_a_no_op(ckpt):
    a, b, _ = comps(ckpt)
    m = manager(10 * a.full_bytes())
    m.load([a])
    events = []
    m.subscribe(events.append)
    assert m.unload(b) == 0 and m.unload("nothing") == 0 and m.unload(b, 100) == 0
    assert events == [] and len(m.snapshot().components) == 1
    m.unload(a)
    assert m.unload(a) == 0
    assert_true_ledger(m, a, b)


def test_a_collected_component_leaves_the_ledger(ckpt):
    a, _, _ = comps(ckpt)
    m = manager(10 * a.full_bytes())
    m.load([a])
    events = []
    m.subscribe(events.append)
    del a
    gc.collect()
    assert m.snapshot().components == ()
    assert [(e.kind, e.collected) for e in events] == [("Unloaded", True)]
    assert m.unload("a") == 0


@pytest.mark.parametrize("k", [0, 1, 3, 4])
def test_cancel_mid_load_leaves_a_true_ledger(ckpt, k):
    a, b, _ = comps(ckpt)
    m = manager(10 * a.full_bytes())
    m.load([b])
    token = CancelToken()
    seen = []

    def report(p):
        seen.append(p.done)
        if len(seen) == k + 1:
            token.cancel("stop at module k")

    events = []
    m.subscribe(events.append)
    with pytest.raises(Cancelled):
        m.load([a], token=token, report=report)
    on_device = [u for u in a.units if u.tier == "device"]
    assert len(on_device) == k + 1  # stopped right after module k, between two modules
    assert_true_ledger(m, a, b)
    assert m.snapshot().get("a").device_bytes == sum(u.nbytes_now for u in on_device)
    assert events[-1].kind == "Cancelled" and events[-1].component == "a"
    m.load([a])  # and it resumes from there
    assert m.snapshot().get("a").resident == 1.0
    assert_true_ledger(m, a, b)


def test_cancel_mid_unload_leaves_a_true_ledger(ckpt):
    a, _, _ = comps(ckpt)
    m = manager(10 * a.full_bytes())
    m.load([a])
    token = CancelToken()
    token.cancel()
    with pytest.raises(Cancelled):
        m.unload(a, token=token)
    assert_true_ledger(m, a)


def test_no_vram_streams_everything_and_still_computes(ckpt):
    a, _, _ = comps(ckpt)
    m = manager(10 * a.full_bytes(), vram_state="NO_VRAM")
    m.load([a])
    assert m.snapshot().get("a").device_bytes == 0
    x = torch.randn(2, 256)
    assert a.module.l0(x).shape == (2, 64)


def test_high_vram_never_offloads(ckpt):
    a, _, _ = comps(ckpt)
    m = manager(a.full_bytes() // 2, vram_state="HIGH_VRAM")
    m.load([a])
    assert m.snapshot().get("a").resident == 1.0


def test_top_up_after_memory_frees(ckpt):
    a, b, _ = comps(ckpt)
    full = a.full_bytes()
    m = manager(int(1.5 * full))
    m.load([a])
    m.load([b])  # a is partially evicted to make room
    assert 0 < m.snapshot().get("a").device_bytes < full
    m.unload(b)
    assert m.snapshot().get("a").resident == 1.0  # topped up again
    assert_true_ledger(m, a, b)


def test_disable_smart_memory_unloads_after_each_job(ckpt):
    a, b, _ = comps(ckpt)
    m = manager(10 * a.full_bytes(), disable_smart_memory=True)
    m.load([a, b])
    m.after_job()
    assert m.snapshot().components == ()
    assert a.measured_tiers()["device"] == b.measured_tiers()["device"] == 0


def test_explicit_move(ckpt):
    a, _, _ = comps(ckpt)
    m = manager(10 * a.full_bytes())
    events = []
    m.subscribe(events.append)
    m.move(a, "cpu")
    assert m.snapshot().get("a").resident == 1.0
    m.move(a, "disk")
    assert m.snapshot().get("a").device_bytes == 0 and a.measured_tiers()["disk"] == a.file_bytes
    assert [e.kind for e in events if e.kind == "Moved"] == ["Moved", "Moved"]
    assert_true_ledger(m, a)


def test_events_log_is_bounded_and_a_bad_subscriber_is_harmless(ckpt):
    from engine.events import EventLog

    a, _, _ = comps(ckpt)
    log = EventLog(maxlen=3)
    m = Residency(
        "cpu", probe=lambda: 1 << 50, policy=Policy(reserve_bytes=0, min_inference_bytes=0), events=log
    )
    m.subscribe(lambda e: 1 / 0)
    for _ in range(4):
        m.load([a])
        m.unload(a)
    ev = log.events()
    assert len(ev) == 3 and {e.kind for e in ev} <= {"Loaded", "Unloaded"}
    assert all(e.duration_s >= 0 and e.time > 0 for e in ev)


def test_snapshots_from_another_thread_during_loads(ckpt):
    a, b, c = comps(ckpt)
    m = manager(2 * a.full_bytes())
    stop, seen, errors = threading.Event(), [], []

    def reader():
        while not stop.is_set():
            try:
                s = m.snapshot()
                seen.append(s.device_bytes)
            except Exception as e:  # pragma: no cover - the failure we look for
                errors.append(e)

    t = threading.Thread(target=reader)
    t.start()
    for _ in range(5):
        for x in (a, b, c):
            m.load([x])
    stop.set()
    t.join()
    assert not errors and seen and max(seen) <= 2 * a.full_bytes()


def test_policy_from_the_device_report_and_the_sampler_hook(ckpt):
    from engine import memory
    from engine.devices import DeviceOptions, HardwareFacts, build_report

    facts = HardwareFacts(platform="linux", ram_total=16 << 30)
    report = build_report(facts, DeviceOptions(vram_budget_gb=0.001, disable_smart_memory=True))
    m = Residency.from_report(report)
    assert m.device == "cpu" and m.policy.vram_budget == report.vram_budget_bytes
    assert m.policy.min_inference == report.min_inference_bytes and m.policy.disable_smart_memory
    a, _, _ = comps(ckpt)
    m.policy = Policy.from_report(report, min_inference_bytes=0)
    remove = m.register_with_sampler()
    try:
        m.load([a])
        row = next(r for r in memory.sample().residency if r.name == "a")
        assert row.device_bytes == m.snapshot().get("a").device_bytes <= report.vram_budget_bytes
    finally:
        remove()


OPS = st.lists(
    st.tuples(
        st.sampled_from(["load", "unload", "unload_part", "pin", "unpin", "cancel_load", "top_up"]),
        st.sampled_from("abc"),
        st.integers(0, 600_000),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=30, deadline=None)
@given(ops=OPS, budget_frac=st.floats(0.3, 2.5))
def test_random_sequences_keep_every_invariant(tmp_path_factory, ops, budget_frac):
    """Whatever the order of loads, unloads, pins and cancels: the ledger is the tensors' truth, the
    device never holds more than the budget, and a pinned component is never evicted by a load."""
    path = write_components(tmp_path_factory.mktemp("seq") / "m.safetensors", {n: ROWS for n in "abc"})
    cs = {c.name: c for c in comps(path)}
    budget = int(cs["a"].full_bytes() * budget_frac)
    m = manager(budget)
    for op, name, n in ops:
        c = cs[name]
        pinned_before = {
            r.name: r.device_bytes for r in m.snapshot().components if r.pinned and r.name != name
        }
        if op == "load":
            m.load([c])
        elif op == "unload":
            m.unload(c)
        elif op == "unload_part":
            m.unload(c, n)
        elif op in ("pin", "unpin"):
            m.pin(c, op == "pin")
        elif op == "top_up":
            m.top_up()
        elif c.tier_bytes()["device"] < c.full_bytes():  # cancel after the first module of a load
            token = CancelToken()

            def report(_p, token=token):
                token.cancel()

            try:
                m.load([c], token=token, report=report)
            except Cancelled:
                pass
        snap = m.snapshot()
        assert snap.device_bytes <= budget
        if op in ("load", "cancel_load"):
            for pname, before in pinned_before.items():
                assert snap.get(pname).device_bytes >= before
        assert_true_ledger(m, *cs.values())


def test_eviction_events_carry_the_bytes_and_extra_memory_is_kept_free(ckpt):
    a, b, _ = comps(ckpt)
    full = a.full_bytes()
    # a simulated device of exactly two components: free = total - what the ledger holds there
    m = Residency("cpu", policy=Policy(reserve_bytes=0, min_inference_bytes=0, vram_state="NORMAL_VRAM"))
    m.probe = lambda: 2 * full - m.snapshot().device_bytes
    events = []
    m.subscribe(events.append)
    m.load([a])
    before = a.measured_tiers()["device"]
    m.load([b], extra_memory=full // 2)  # the job needs half a component of working memory
    evicted = [e for e in events if e.kind == "Evicted"]
    assert [e.component for e in evicted] == ["a"]
    assert evicted[0].bytes_moved == before - a.measured_tiers()["device"] >= full // 2
    assert m.snapshot().device_bytes <= 2 * full - full // 2
    assert all(e.duration_s >= 0 for e in events)
    layers = m.snapshot().get("a").layers  # the layer map: every module with its tier and bytes
    assert {t for _, t, _ in layers} <= {"device", "disk"} and len(layers) == len(a.units)
