"""The memory graph's throttled drawing: what is plotted equals the samples kept, a hidden graph draws
nothing and catches up when shown, and the sample history keeps order and maxima past its capacity."""

from __future__ import annotations

import numpy as np
import pytest

from app.widgets.graph_history import GIB, SampleHistory
from app.widgets.vram_graph import VramGraph, runs_compressed
from engine.memory import ComponentResidency, MemorySample


def _sample(
    t: float, rss: int, comps: dict[str, int] | None = None, torch: int | None = None
) -> MemorySample:
    return MemorySample(
        timestamp=1e9 + t, monotonic=1000.0 + t, device_kind="cpu", device_index=0, device_label="CPU RAM",
        device_total=64 * GIB, device_used=20 * GIB + rss, device_free=44 * GIB - rss, device_source="psutil",
        process_device_bytes=rss, torch_allocated=torch, torch_reserved=torch, torch_active=None,
        process_rss=rss, ram_total=64 * GIB, ram_available=44 * GIB - rss,
        residency=tuple(ComponentResidency(n, b, 0) for n, b in (comps or {}).items()),
    )  # fmt: skip


def _curve_at(item, xs: np.ndarray) -> np.ndarray:
    """The plotted polyline evaluated at the sample times (what a user sees at each sample)."""
    x, y = item.getData()
    ok = np.isfinite(y)
    return np.interp(xs, x[ok], y[ok])


@pytest.fixture
def graph(qtbot):
    g = VramGraph()
    qtbot.addWidget(g)
    g.resize(700, 320)
    return g


def _feed(g: VramGraph, n: int = 60) -> None:
    rng = np.random.default_rng(1)
    for i in range(n):
        comps = {"unet": 2 * GIB} if 10 <= i < 40 else {}
        if i >= 20:
            comps["vae"] = 160 << 20
        # flat runs (as memory mostly is) broken by steps, so run compression has work to do
        rss = int(GIB + (i // 7) * 50e6 + (rng.integers(0, 2) * 4096 if i % 11 == 0 else 0))
        g.add_sample(_sample(i * 0.1, rss, comps, torch=None if i < 5 else (i // 9) * 2**20))


def test_plotted_data_equals_the_samples_kept(qtbot, graph):
    g = graph
    g.show()
    qtbot.waitExposed(g)
    _feed(g)
    g.redraw(force=True)
    t = g.t
    for key in ("ram", "used", "total"):
        if g.curves[key].isVisible():
            np.testing.assert_allclose(_curve_at(g.curves[key], t), g.lines[key], rtol=0, atol=1e-12)
    g.device_box.setChecked(True)  # off by default on a RAM device; switched on they are drawn at once
    np.testing.assert_allclose(_curve_at(g.curves["used"], t), g.lines["used"], rtol=0, atol=1e-12)
    # the torch lines skip the samples where the allocator was unknown (NaN), and match the rest
    known = np.isfinite(g.lines["allocated"])
    np.testing.assert_allclose(
        _curve_at(g.curves["allocated"], t[known]), g.lines["allocated"][known], rtol=0, atol=1e-12
    )
    # stacked bands: the first component's top is its bytes, the second's top the sum of both
    assert list(g.area_items) == ["unet", "vae"]
    unet, vae = g.areas["unet"], g.areas["vae"]
    np.testing.assert_allclose(_curve_at(g.area_items["unet"], t), unet, atol=1e-12)
    np.testing.assert_allclose(_curve_at(g.area_items["vae"], t), unet + vae, atol=1e-12)
    assert g.area_top_bytes("vae") == 160 << 20 and g.area_top_bytes("unet") == 0
    # the y range starts at 0 and shows everything, with the event markers' row above it
    bottom, top = g.plot.getViewBox().viewRange()[1]
    highest = max(np.nanmax(g.lines[k]) for k in ("used", "total", "ram", "reserved"))
    assert bottom == 0 and highest < top < 1.25 * highest


def test_redraws_are_throttled_and_follow_the_newest_sample(qtbot, graph):
    g = graph
    g.show()
    qtbot.waitExposed(g)
    _feed(g, 5)
    qtbot.waitUntil(lambda: g.draws >= 1, timeout=5000)
    draws = g.draws
    for i in range(5, 25):  # 20 samples in quick succession: no redraw happens inside add_sample
        g.add_sample(_sample(i * 0.1, GIB))
    assert g.draws == draws
    qtbot.waitUntil(lambda: g.draws > draws, timeout=5000)  # the redraw timer catches up
    x, _ = g.curves["ram"].getData()
    assert x[-1] == pytest.approx(g.t[-1])
    assert 0.25 <= g.redraw_interval_s() <= 1.0


def test_hidden_graph_skips_drawing_and_catches_up_when_shown(qtbot, graph):
    g = graph
    g.show()
    qtbot.waitExposed(g)
    _feed(g, 10)
    g.redraw()
    g.hide()
    draws = g.draws
    for i in range(10, 40):
        g.add_sample(_sample(i * 0.1, 2 * GIB))
    qtbot.wait(600)  # two redraw ticks would have passed
    assert g.draws == draws and not g.should_draw()
    g.show()  # shown again: drawn at once with everything that arrived meanwhile
    assert g.draws == draws + 1
    x, y = g.curves["ram"].getData()
    assert x[-1] == pytest.approx(g.t[-1]) and y[-1] == pytest.approx(2.0)


def test_pan_stops_following_and_hands_over_the_whole_history(qtbot, graph):
    g = graph
    g.show()
    qtbot.waitExposed(g)
    g.window_box.setCurrentIndex(0)  # 30 s
    for i in range(400):  # 40 s of samples: the first 10 s are outside the window
        g.add_sample(_sample(i * 0.1, GIB + i * 4096))
    g.redraw(force=True)
    handed = lambda: g.curves["ram"].getOriginalDataset()[0]  # noqa: E731 - what the graph gave pyqtgraph
    assert handed()[0] > 5  # following: only the window was handed over
    g.plot.getViewBox().sigRangeChangedManually.emit([True, False])  # as a mouse drag does
    assert not g.follow and handed()[0] == 0.0  # at once, not at the next tick
    assert g.redraw_interval_s() == 1.0  # the view stands still: redrawn once a second at most
    g.follow_button.click()
    assert g.follow and handed()[0] > 5


def test_runs_compressed_keeps_the_polyline():
    x = np.arange(12, dtype=float)
    y = np.array([1, 1, 1, 2, 2, np.nan, np.nan, 3, 3, 3, 3, 4], dtype=float)
    cx, cy = runs_compressed(x, y)
    assert list(cx) == [0, 2, 3, 4, 5, 6, 7, 10, 11]  # inner points of flat runs gone, NaN kept
    np.testing.assert_array_equal(np.interp(x[:5], cx[:4], cy[:4]), y[:5])  # the same polyline
    np.testing.assert_array_equal(np.interp(x[7:], cx[6:], cy[6:]), y[7:])


def test_history_trims_to_capacity_and_keeps_order_and_maxima():
    h = SampleHistory(5)
    for i in range(23):  # past twice the capacity: compaction runs more than once
        comps = {"a": 1.0} if i < 18 else {"b": 0.5}
        h.append(float(i), {"used": i, "total": 10, "allocated": np.nan, "reserved": 1, "ram": 30 - i}, comps)
    assert len(h) == 5
    assert list(h.t) == [18.0, 19.0, 20.0, 21.0, 22.0]
    assert list(h.line("used")) == [18, 19, 20, 21, 22]
    assert list(h.areas["a"]) == [0.0] * 5 and list(h.areas["b"]) == [0.5] * 5
    # maxima are over what is kept once compaction has dropped the old samples
    assert h.line_max["ram"] <= 30 - 13 and h.line_max["used"] == 22 and h.line_max["allocated"] == 0.0
    assert h.stack_max >= 0.5


def test_startup_objects_are_frozen_once_devices_are_detected(window):
    """torch and the window's objects leave the collector's reach: a full collection in the engine
    thread then no longer holds the GIL for ~0.2 s (the window's worst stall while decoding)."""
    import gc

    assert window.device_status.report is not None
    assert gc.get_freeze_count() > 10_000


def _legend(g: VramGraph) -> list[str]:
    return [label.text for _, label in g.legend.items]


def test_legend_lists_only_what_is_drawn(graph):
    """On a RAM device the device lines start hidden and torch's counters have no values: neither is
    listed (a hidden curve's entry shows pyqtgraph's crossed-out eye). Components join as they load."""
    graph.show()
    graph.add_sample(_sample(0.0, GIB))
    assert _legend(graph) == ["process RAM"]
    graph.device_box.setChecked(True)
    assert _legend(graph) == ["device total", "device used", "process RAM"]
    graph.add_sample(_sample(0.1, GIB, {"unet": 2 * GIB}))
    graph.redraw(force=True)
    assert _legend(graph)[-1] == "unet"
    graph.device_box.setChecked(False)
    assert _legend(graph) == ["process RAM", "unet"]


def _scene_rect(item):
    return item.mapRectToScene(item.boundingRect())


def test_legend_sits_above_the_curves_and_wraps_to_the_width(graph, qtbot):
    """The legend has its own row above the plot, so it never covers the oldest samples (the top-left
    corner); it holds as many entries a row as the width allows, and never keeps the graph wide."""
    graph.show()
    qtbot.waitExposed(graph)
    graph.add_sample(_sample(0.0, GIB, {"unet": 2 * GIB, "clip_l": GIB // 4, "vae": GIB // 6}))
    graph.device_box.setChecked(True)
    graph.redraw(force=True)
    vb = graph.plot.getPlotItem().vb
    entries = graph.legend.items
    assert len(entries) == 6

    def placed() -> bool:  # where the layout puts the entries once it has run (Qt lays out on its next pass)
        rects = [_scene_rect(item) for pair in entries for item in pair]
        return all(not r.intersects(_scene_rect(vb)) and r.right() <= graph.plot.width() for r in rects)

    qtbot.waitUntil(placed, timeout=2_000)
    wide_rows = {round(_scene_rect(label).top()) for _, label in entries}

    graph.resize(420, 320)
    qtbot.wait(20)
    narrow_rows = {round(_scene_rect(label).top()) for _, label in entries}
    assert len(narrow_rows) > len(wide_rows)
    assert graph.plot.width() <= 420
    for _, label in entries:
        assert _scene_rect(label).right() <= graph.plot.width()
        assert not _scene_rect(label).intersects(_scene_rect(vb))


def test_a_component_relabelled_by_a_second_of_its_name_stays_one_band(qtbot, graph):
    """A second file's `transformer` makes the ledger label both with their files: the first keeps its band
    (its colour and history) under its new name, and no stale `transformer` entry stays in the legend. A
    band left from an unloaded file whose name another file's component takes again says its file."""
    g = graph

    def sample(t, *comps):
        residency = tuple(ComponentResidency(label, size, 0, key) for label, size, key in comps)
        return MemorySample(**{**_sample(t, GIB).__dict__, "residency": residency})

    a, b, c = (
        "/m/a.safetensors\ntransformer",
        "/m/b.safetensors\ntransformer",
        "/m/c.safetensors\ntransformer",
    )
    for i in range(5):
        g.add_sample(sample(i * 0.1, ("transformer", GIB, a)))
    for i in range(5, 10):
        g.add_sample(
            sample(i * 0.1, ("transformer (a.safetensors)", GIB, a), ("transformer (b.safetensors)", GIB, b))
        )
    g.redraw(force=True)
    assert list(g.area_items) == [a, b]
    assert [it.name() for it in g.area_items.values()] == [
        "transformer (a.safetensors)",
        "transformer (b.safetensors)",
    ]
    legend = [label.text for _, label in g.legend.items]
    assert "transformer" not in legend and "transformer (a.safetensors)" in legend
    assert list(g.areas["transformer (a.safetensors)"]) == [1.0] * 10  # one band from the first sample on
    # a unloaded: b alone is `transformer` again (one band, relabelled); then b unloaded and c loaded alone,
    # `transformer` too: the two bands of that label each say their file
    g.add_sample(sample(1.0, ("transformer", GIB, b)))
    g.redraw(force=True)
    assert list(g.areas) == ["transformer (a.safetensors)", "transformer"]
    g.add_sample(sample(1.1))
    g.add_sample(sample(1.2, ("transformer", GIB, c)))
    g.redraw(force=True)
    want = ["transformer (a.safetensors)", "transformer (b.safetensors)", "transformer (c.safetensors)"]
    assert list(g.areas) == want and [it.name() for it in g.area_items.values()] == want


def test_a_marker_says_what_ran_decode_or_encode_image_or_sound(graph):
    """A VAE's encode carries the decode marks (one colour for the pair), named for what ran; a sound says so."""
    from engine.events import DecodeFinished, DecodeStarted

    graph.add_event(DecodeStarted("vae", direction="encode"))
    graph.add_event(DecodeFinished("audio_vae", 3 << 20, 0.25, media="sound"))
    graph.add_event(DecodeStarted("vae", media="video"))
    (_, k1, l1), (_, k2, l2), (_, k3, l3) = graph.events
    assert (k1, l1) == ("DecodeStarted", "EncodeStarted vae")
    assert (k2, l2) == ("DecodeFinished", "DecodeFinished audio_vae (sound) · 3 MiB · 250 ms")
    assert (k3, l3) == ("DecodeStarted", "DecodeStarted vae (video)")
