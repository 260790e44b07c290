"""Settings apply when the user presses Save, without a restart: a new --vram-budget reaches the engine's
report and budget and the status bar; options that move components warn first ("unloads N loaded
components", with Cancel) and then unload them; the sample rate and library folders change live."""

from __future__ import annotations

import pytest
from app_test_support import engine_of, wait_job

from engine.requests import Configure, Load

GIB = 1024**3


@pytest.fixture(scope="module")
def small_vae(tmp_path_factory):
    """A real small VAE file (the SD layout at width 32, ~5 MB fp16) that loads in milliseconds."""
    import torch

    from engine.formats.safetensors import save_tensors
    from engine.vae.autoencoder_kl import AutoencoderKL, KLConfig

    sd = AutoencoderKL(KLConfig(ch=32)).state_dict()
    g = torch.Generator().manual_seed(0)
    path = tmp_path_factory.mktemp("settings") / "small_vae.safetensors"
    return str(save_tensors(path, {k: torch.randn(v.shape, generator=g).half() for k, v in sd.items()}))


def _open(qtbot, w):
    from PySide6.QtWidgets import QDialogButtonBox

    w.settings_action.trigger()
    dlg = w.settings_dialog
    qtbot.waitUntil(dlg.isVisible, timeout=5000)
    save = dlg.findChild(QDialogButtonBox).button(QDialogButtonBox.StandardButton.Save)
    return dlg, save


def test_a_new_vram_budget_applies_now_and_the_status_bar_says_so(qtbot, window):
    w = window
    before = w.device_status.state_label.text()
    assert engine_of(w).report.vram_budget_bytes is None
    dlg, save = _open(qtbot, w)
    dlg.budget.setValue(1.5)
    dlg.rate.setValue(5)
    save.click()
    done = wait_job(qtbot, w, Configure)
    assert done.report.vram_budget_bytes == int(1.5 * GIB) and done.unloaded == ()
    assert engine_of(w).report is done.report
    assert engine_of(w).residency.policy.vram_budget == int(1.5 * GIB)
    assert engine_of(w).residency.budget() <= 1.5 * GIB
    st = w.device_status  # the status bar's device side
    assert st.state_label.text() != before and "cap 1.5 GiB" in st.state_label.text()
    assert st.report is done.report and st.report.budget_bytes(2**50) == int(1.5 * GIB)  # the label's figure
    assert st.timer.interval() == 200  # 5 samples a second, live
    assert "Device options applied" in w.messages.text


def test_a_smaller_budget_keeps_loaded_models_and_offloads_what_no_longer_fits(qtbot, window, small_vae):
    w = window
    w.client.submit(Load(small_vae))
    full = wait_job(qtbot, w, Load).snapshot.get("vae").device_bytes
    dlg, save = _open(qtbot, w)
    dlg.budget.setValue(round(full / 2 / GIB, 3))  # about half the VAE
    save.click()  # a budget change: no warning, nothing unloaded
    assert dlg.confirm is None
    done = wait_job(qtbot, w, Configure)
    row = done.snapshot.get("vae")
    assert done.unloaded == () and row is not None and 0 < row.device_bytes < full
    assert done.evicted_bytes >= full - row.device_bytes
    assert w.loaded.table.rowCount() == 1 and w.loaded.row_texts()[0][5] != "100 %"
    assert "offloaded to fit the new budget" in w.messages.text


def test_options_that_move_components_warn_first_and_cancel_keeps_them(qtbot, window, small_vae):
    from PySide6.QtWidgets import QMessageBox

    w = window
    w.client.submit(Load(small_vae))
    wait_job(qtbot, w, Load)
    sent = []
    w.client.job_started.connect(lambda job: sent.append(type(job.request)))
    dlg, save = _open(qtbot, w)
    dlg.cpu_vae.setChecked(True)
    save.click()
    box = dlg.confirm
    assert box is not None and box.isVisible()
    assert box.text() == "Applying these options unloads 1 loaded component."
    box.button(QMessageBox.StandardButton.Cancel).click()
    qtbot.waitUntil(lambda: dlg.confirm is None, timeout=5000)
    assert dlg.isVisible() and Configure not in sent  # still editing; nothing applied

    save.click()
    dlg.confirm.button(QMessageBox.StandardButton.Ok).click()
    done = wait_job(qtbot, w, Configure)
    assert done.unloaded == ("vae",) and done.snapshot.components == ()
    assert done.report.options.cpu_vae and w.device_status.options.cpu_vae
    assert w.loaded.table.rowCount() == 0 and "unloaded vae" in w.messages.text
    assert "VAE on cpu" in w.device_status.state_label.toolTip()


def test_library_folder_changes_rescan(qtbot, window, files, tmp_path):
    import os
    import shutil

    w = window
    extra = tmp_path / "more"
    extra.mkdir()
    shutil.copy(files["lora"], extra / "extra_lora.safetensors")
    w.library.add_paths([os.path.dirname(files["ckpt"])], select_first=False)
    qtbot.waitUntil(lambda: w.library.model.row_of(files["ckpt"]) is not None, timeout=30_000)
    dlg, save = _open(qtbot, w)
    dlg.list.clear()
    dlg.list.addItem(str(extra))  # one folder removed, another added
    save.click()
    qtbot.waitUntil(lambda: w.library.model.row_of(str(extra / "extra_lora.safetensors")) is not None,
                    timeout=30_000)  # fmt: skip
    assert w.library.model.row_of(files["ckpt"]) is None
    assert str(extra) in w.library.roots.paths and os.path.dirname(files["ckpt"]) not in w.library.roots.paths


def test_every_device_flag_of_the_command_line_is_in_settings_and_persists(qtbot, window):
    """Dtype flags, the GPU index, --normalvram and --disable-smart-memory are settable from the window
    (not only from the command line), reach the engine on Save and come back in the next dialog."""
    from app.settings_dialog import saved_device_options

    w = window
    dlg, save = _open(qtbot, w)
    dlg.dtypes["vae_dtype"].setCurrentIndex(dlg.dtypes["vae_dtype"].findData("fp16"))
    dlg.dtypes["unet_dtype"].setCurrentIndex(dlg.dtypes["unet_dtype"].findData("fp8_e4m3fn"))
    dlg.smart.setChecked(True)
    dlg.mode.setCurrentIndex(dlg.mode.findData("normalvram"))
    save.click()  # nothing loaded: no warning
    done = wait_job(qtbot, w, Configure)
    o = engine_of(w).report.options  # what the engine detected devices with
    assert (o.vae_dtype, o.unet_dtype, o.disable_smart_memory, o.normalvram) == (
        "fp16",
        "fp8_e4m3fn",
        True,
        True,
    )
    assert done.report is engine_of(w).report
    saved = saved_device_options()
    assert saved["vae_dtype"] == "fp16" and saved["unet_dtype"] == "fp8_e4m3fn"
    assert saved["disable_smart_memory"] and saved["normalvram"] and "device_index" not in saved
    dlg2, _ = _open(qtbot, w)
    assert dlg2.dtypes["vae_dtype"].currentData() == "fp16" and dlg2.smart.isChecked()
    assert dlg2.dtypes["force_dtype"].currentData() is None and dlg2.device_index.value() == -1
    dlg2.reject()


def test_saving_settings_keeps_the_folders_given_on_the_command_line(qtbot, window, files):
    """`loadout ~/models` opens the library on a folder that is not saved (not in Settings' list):
    changing the budget in Settings must not take it out of the library."""
    import os

    w = window
    folder = os.path.dirname(files["ckpt"])
    w.library.add_paths([folder], persist=False, select_first=False)  # what the command line does
    qtbot.waitUntil(lambda: w.library.model.row_of(files["ckpt"]) is not None, timeout=30_000)
    dlg, save = _open(qtbot, w)
    assert folder not in dlg.folders()
    # the dialog says the folder is there for this session, so the list does not read as the whole library
    assert dlg.session_label.isVisibleTo(dlg) and folder in dlg.session_label.text()
    dlg.budget.setValue(2.0)
    save.click()
    wait_job(qtbot, w, Configure)
    assert folder in w.library.roots.paths and w.library.model.row_of(files["ckpt"]) is not None
