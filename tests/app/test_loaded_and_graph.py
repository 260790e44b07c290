"""Loaded panel, layer map and memory graph as a user drives them: load a dense VAE, free part of it,
pin it, unload it — the table, the graph's band and the process RAM line all follow the ledger."""

from __future__ import annotations

import os

import psutil
from app_test_support import wait_job

from engine.requests import Load, Pin, Unload


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _settle(qtbot, window, n=3):
    """Let the sampler take a few fresh samples."""
    start = len(window.graph.t)
    qtbot.waitUntil(lambda: len(window.graph.t) >= start + n, timeout=10_000)


def test_load_unload_dense_component_moves_table_graph_and_ram(qtbot, window, files):
    w = window
    w.library.add_paths([files["vae"]])
    qtbot.waitUntil(lambda: w.library.current_entry() is not None, timeout=30_000)
    # The RAM line is the whole process: anything else freed during the load offsets it. Earlier tests
    # leave ~50 MB that a first load in this process sometimes frees (it passes alone, not always after
    # them), and hashing reads the file in the background. So: let the hash finish, warm up with one
    # load and unload (as a benchmark warms up), collect, hand the heap back, and wait for RSS to hold
    # still before the baseline. Then the line must move by this load alone.
    from engine.memory import release_memory
    from engine.requests import UnloadAll

    qtbot.waitUntil(lambda: w.library.model.sha256(w.library.current_entry()) is not None, timeout=60_000)
    w.client.submit(Load(files["vae"]))
    wait_job(qtbot, w, Load)
    w.client.submit(UnloadAll())
    wait_job(qtbot, w, UnloadAll)
    prev = -1
    for _ in range(20):
        release_memory()
        qtbot.wait(150)
        now = _rss()
        if abs(now - prev) < 2 * 2**20:
            break
        prev = now
    _settle(qtbot, w)
    rss0 = _rss()
    w.load_action.trigger()  # Load the selected library file, as the toolbar button does
    snap = wait_job(qtbot, w, Load).snapshot
    c = snap.components[0]
    assert c.name == "vae" and c.device_bytes == c.full_bytes > 100 * 2**20
    rows = w.loaded.row_texts()
    assert rows[0][0] == "vae" and rows[0][5] == "100 %"
    _settle(qtbot, w)
    # the graph's band for the component equals its ledger bytes; the RAM line moved by that much
    assert w.graph.area_top_bytes("vae") == c.device_bytes
    grew = w.graph.lines["ram"][-1] * 2**30 - rss0
    assert abs(grew - c.device_bytes) <= 0.10 * c.device_bytes, (grew, c.device_bytes)
    # the layer map shows every module on the device
    assert w.loaded.layer_map.counts()["device"] == c.device_bytes
    # a Loaded event marker is on the graph
    assert any(kind == "Loaded" for _, kind, _ in w.graph.events)

    # Free 64 MB: partially offloaded (to the file on a CPU device), shown as such
    w.loaded.free_spin.setValue(64)
    w.loaded.free_button.click()
    part = wait_job(qtbot, w, Unload).snapshot.components[0]
    assert part.device_bytes <= c.device_bytes - 64 * 2**20 and part.resident < 1
    assert w.loaded.row_texts()[0][5] != "100 %"
    assert w.loaded.layer_map.counts()["device"] == part.device_bytes

    # Keep in VRAM: the pin checkbox sends Pin and the ledger says pinned
    from PySide6.QtCore import Qt

    w.loaded.table.item(0, 6).setCheckState(Qt.CheckState.Checked)
    assert wait_job(qtbot, w, Pin).snapshot.components[0].pinned

    w.unload_action.trigger()  # the selected component
    after = wait_job(qtbot, w, Unload).snapshot
    assert after.components == () and w.loaded.table.rowCount() == 0
    _settle(qtbot, w)
    assert w.graph.area_top_bytes("vae") == 0
    dropped = w.graph.lines["ram"][-1] * 2**30 - rss0
    assert dropped < 0.10 * c.device_bytes  # the RAM came back
    assert any(kind == "Unloaded" for _, kind, _ in w.graph.events)


def test_graph_exports_csv_and_png_and_pauses(qtbot, window, tmp_path):
    g = window.graph
    _settle(qtbot, window)
    g.pause_box.setChecked(True)
    draws = g.draws
    _settle(qtbot, window)
    assert g.draws == draws  # paused: samples are kept, nothing is redrawn
    g.pause_box.setChecked(False)
    assert g.draws > draws
    g.window_box.setCurrentIndex(0)  # 30 s
    assert g.window_s == 30.0
    csv_path, png_path = tmp_path / "m.csv", tmp_path / "m.png"
    g.export_csv(str(csv_path))
    g.export_png(str(png_path))
    lines = csv_path.read_text().splitlines()
    assert lines[0].startswith("t_s,device_used,device_total") and len(lines) >= 4
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_load_error_is_a_message_and_the_app_keeps_working(qtbot, window, files):
    window.client.submit(Load(files["bad"]))
    qtbot.waitUntil(lambda: window.messages.shown, timeout=30_000)
    assert "broken.safetensors" in window.messages.text
    assert not window.reporter.dialogs  # an expected error: no dialog
    window.client.submit(Load(files["lora"]))  # a LoRA is applied, not loaded: also a message, saying so
    qtbot.waitUntil(lambda: "style.safetensors" in window.messages.text, timeout=30_000)
    assert "is a LoRA: it patches a model" in window.messages.text
    assert not window.reporter.dialogs


def test_try_a_step_reports_speed_and_memory_and_stop_keeps_the_ledger(qtbot, window, tmp_path):
    """Load a (tiny, dense) SD1 UNet, select it, Try a step: s/step, peak memory and the mode show, the
    graph marks the step. A long run stopped mid-step leaves the ledger as it was."""
    from engine.requests import Step
    from tests.engine.denoise_files import SD1_TINY, random_weights, unet_rows, write

    unet = str(write(tmp_path / "sd1_tiny.safetensors", random_weights(unet_rows(SD1_TINY), seed=3)))
    w, panel = window, window.loaded
    w.client.submit(Load(unet))
    before = wait_job(qtbot, w, Load).snapshot
    qtbot.waitUntil(lambda: panel.table.rowCount() >= 1, timeout=10_000)
    assert panel.select(unet, before.components[0].name)
    assert panel.step_button.isEnabled()
    panel.steps_spin.setValue(2)
    panel.size_box.setCurrentIndex(panel.size_box.findData(256))
    panel.step_button.click()
    assert not panel.step_button.isEnabled()  # one step job at a time
    r = wait_job(qtbot, w, Step)
    assert r.steps == 2 and r.input_shapes["x"][-1] == 256 // 8 and r.s_per_step > 0
    text = panel.step_label.text()
    assert "s/step" in text and "peak" in text and r.mode in text
    assert os.path.basename(r.model) in text  # which file it was: the table's selection may be another's
    assert any(kind == "StepFinished" for _, kind, _ in w.graph.events)
    assert panel.step_button.isEnabled()
    ledger = [(c.name, c.device_bytes, c.ram_bytes) for c in w.client.snapshot().components]
    progressed = []
    w.client.job_progress.connect(
        lambda job, p: (
            progressed.append(p.done) if isinstance(job.request, Step) and p.stage == "step" else None
        )
    )
    panel.steps_spin.setValue(100)
    panel.try_step()
    qtbot.waitUntil(lambda: bool(progressed), timeout=60_000)
    w.stop_action.trigger()
    qtbot.waitUntil(lambda: panel.step_job is None, timeout=60_000)
    assert panel.step_label.text() == "stopped" and max(progressed) < 100
    assert [(c.name, c.device_bytes, c.ram_bytes) for c in w.client.snapshot().components] == ledger


def test_try_a_step_is_greyed_out_with_its_reason_for_a_family_without_a_forward(qtbot, window, tmp_path):
    """A Cosmos 3 transformer is detected, loads and patches, but Loadout has no forward pass for it:
    its "Try a step" is greyed out and says why, rather than loading the file only to fail."""
    import diffusers

    from tests.engine.denoise_files import random_weights, write
    from tests.engine.layouts_2026.common import meta_shapes
    from tests.engine.test_step_refusal import COSMOS3_SMALL

    rows = meta_shapes(diffusers.Cosmos3OmniTransformer, **COSMOS3_SMALL)
    path = str(
        write(
            tmp_path / "cosmos3_tiny.safetensors",
            random_weights([(k, "F32", v) for k, v in rows.items()], seed=1),
        )
    )
    w, panel = window, window.loaded
    w.library.add_paths([path])
    qtbot.waitUntil(lambda: os.path.abspath(path) in panel.entries, timeout=30_000)
    w.client.submit(Load(path))
    snap = wait_job(qtbot, w, Load).snapshot
    qtbot.waitUntil(lambda: panel.select(path, snap.components[0].name), timeout=10_000)
    assert panel.unload_button.isEnabled() and not panel.step_button.isEnabled()
    assert "no forward pass for cosmos3 yet" in panel.step_button.toolTip()
    assert panel.step_label.text() == panel.step_button.toolTip()  # said beside the button too
    assert panel.try_step() is None and "no forward pass for cosmos3" in panel.step_label.text()
    assert not w.reporter.dialogs  # nothing was submitted to fail
