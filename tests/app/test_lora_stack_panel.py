"""The LoRA stack as a user edits it: add from the library and by drop, coverage badge and unmatched
list, reorder, strengths, apply (the right SetLoras request), revert, and the patched layer map."""

from __future__ import annotations

import os
from pathlib import Path

from app_test_support import drop, wait_job

from engine.requests import Bake, Load, LoraCoverage, SetLoras, StackItem


def _jobs(window):
    sent = []
    window.client.job_started.connect(lambda job: sent.append(job.request))
    return sent


def test_stack_edits_send_the_right_requests_and_show_coverage(qtbot, window, files, tmp_path):
    w = window
    w.library.add_paths([files["dir"]], select_first=False)
    qtbot.waitUntil(lambda: w.library.model.row_of(files["lora"]) is not None, timeout=30_000)
    w.library.select_path(files["ckpt"])  # choosing a checkpoint makes it the stack's base
    assert w.stack.base() == files["ckpt"]
    sent = _jobs(w)
    e = w.library.model.entries[w.library.model.row_of(files["lora"])]
    w.library.add_to_stack_requested.emit(e)  # context menu → Add to LoRA stack
    cov = wait_job(qtbot, w, LoraCoverage)
    assert cov.coverage["mapped"] == cov.coverage["modules"] == 264
    row = w.stack.row_widget(0)
    qtbot.waitUntil(lambda: row.badge.text() == "264/264 modules", timeout=5000)
    box = w.stack.show_unmatched(files["lora"])  # the badge's click
    assert "264/264" in box.text() and "Every module is matched" in box.informativeText()
    box.close()

    # a second LoRA by drop on the stack (a copy of the same file), then reorder and edit
    other = tmp_path / "second.safetensors"
    other.write_bytes(Path(files["lora"]).read_bytes())
    drop(w.stack.list, [str(other)])
    qtbot.waitUntil(lambda: len(w.stack.stack()) == 2, timeout=30_000)
    w.stack.move(1, 0)
    assert [os.path.basename(s.file) for s in w.stack.stack()] == ["second.safetensors", "style.safetensors"]
    w.stack.row_widget(0).model.spin.setValue(0.5)
    w.stack.row_widget(0).clip.slider.setValue(10)  # slider → spin box: 0.5
    w.stack.row_widget(1).enabled.setChecked(False)
    assert w.stack.stack() == (
        StackItem(str(other), 0.5, 0.5, True),
        StackItem(files["lora"], 1.0, 1.0, False),
    )

    # apply before the base is loaded: an actionable message
    w.stack.apply_button.click()
    qtbot.waitUntil(lambda: "Load sd15_test" in w.messages.text, timeout=30_000)
    assert isinstance(sent[-1], SetLoras) and sent[-1].stack == w.stack.stack()

    # load the text encoder (header-faithful, 235 MiB) and apply: patches land on the fly
    w.client.submit(Load(files["ckpt"], ("clip_l",)))
    wait_job(qtbot, w, Load)
    w.stack.apply_button.click()
    res = wait_job(qtbot, w, SetLoras)
    assert res.stack == w.stack.stack() and res.patched > 0
    assert set(res.patched_units) == {"unet", "clip_l"}
    assert w.stack.state.text().startswith("Applied: 1 LoRA(s)")
    assert any(kind == "Patched" for _, kind, _ in w.graph.events)
    assert w.loaded.select(files["ckpt"], "clip_l")
    assert len(w.loaded.layer_map.patched) == len(res.patched_units["clip_l"]) > 0

    w.stack.revert_button.click()
    res = wait_job(qtbot, w, SetLoras)
    assert res.stack == () and res.patched == 0 and res.restored > 0
    assert w.loaded.layer_map.patched == frozenset()


def test_a_checkpoint_dropped_on_the_stack_is_refused_with_a_message(qtbot, window, files):
    w = window
    w.library.add_paths([files["ckpt"]], select_first=False)
    qtbot.waitUntil(lambda: w.library.model.row_of(files["ckpt"]) is not None, timeout=30_000)
    drop(w.stack.list, [files["ckpt"]])
    assert "not a LoRA" in w.messages.text and w.stack.stack() == ()


def test_bake_writes_a_new_checkpoint_that_joins_the_library(qtbot, window, files, tmp_path):
    from tests.support import synth

    w = window
    base = synth.write("sd1_checkpoint", tmp_path / "small.safetensors", dense=False)
    # baking reads every base tensor: use the LoRA's own keys on a tiny dense base instead of 2 GB
    from engine.formats.safetensors import read_header

    hdr = read_header(base)
    rows = [(k, "F16", tuple(i.shape)) for k, i in hdr.tensors.items() if k.startswith("cond_stage_model.")]
    dense = synth.write(rows, tmp_path / "te_only.safetensors", dense=True, max_dense_bytes=300 << 20)
    out = tmp_path / "baked.safetensors"
    w.stack.bake(str(dense), (StackItem(files["lora"], 1.0, 0.7),), str(out))
    res = wait_job(qtbot, w, Bake, timeout=120_000)
    assert res.out == str(out) and out.exists() and res.bytes == out.stat().st_size
    meta = read_header(out).metadata
    assert "loadout.bake" in meta and "style.safetensors" in meta["loadout.bake"]
    qtbot.waitUntil(lambda: w.library.model.row_of(str(out)) is not None, timeout=30_000)


def test_a_lora_made_for_another_model_shows_the_engines_warning(qtbot, window, files):
    w = window
    w.library.add_paths([files["dir"]], select_first=False)
    qtbot.waitUntil(lambda: w.library.model.row_of(files["lora"]) is not None, timeout=30_000)
    qtbot.waitUntil(lambda: w.library.model.row_of(files["sdxl"]) is not None, timeout=30_000)
    w.library.select_path(files["sdxl"])  # an SD1 LoRA on an SDXL base
    e = w.library.model.entries[w.library.model.row_of(files["lora"])]
    w.library.add_to_stack_requested.emit(e)
    cov = wait_job(qtbot, w, LoraCoverage)
    assert cov.coverage["mapped"] < cov.coverage["modules"]
    row = w.stack.row_widget(0)
    qtbot.waitUntil(lambda: row.warning.isVisible(), timeout=5000)
    # The panel shows the engine's sentence as it is (the plan prints the same one).
    assert row.warning.text() == f"⚠ {cov.coverage['warning']}"
    assert cov.coverage["warning"].startswith("made for SD1: ")
    assert "onto this SDXL model" in cov.coverage["warning"]


def test_a_long_lora_name_is_elided_in_the_middle_to_the_rows_width(qtbot):
    # Two versions of a LoRA differ at the end of their names: the row keeps the start and the end,
    # drops ".safetensors", and the whole path is the tooltip.
    from app.widgets.lora_stack import StackRow

    path = "/loras/a_very_long_character_lora_name_trained_for_sdxl_v2_epoch_000040.safetensors"
    row = StackRow(StackItem(path))
    qtbot.addWidget(row)
    row.resize(320, 60)
    row.show()
    qtbot.waitUntil(lambda: "…" in row.enabled.text(), timeout=2_000)
    shown = row.enabled.text()
    assert shown.startswith("a_very") and shown.endswith("000040") and ".safetensors" not in shown
    assert row.enabled.toolTip() == path
    row.resize(1200, 60)
    qtbot.waitUntil(
        lambda: row.enabled.text() == os.path.basename(path).removesuffix(".safetensors"), timeout=2_000
    )
