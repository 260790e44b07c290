"""The first window: it appears before torch is imported, shows the detected device, VRAM state and
free memory, looks for the user's libraries off the GUI thread on a first start, stops its engine thread on
close, keeps paths, and turns unhandled errors into dialogs."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from app.excepthooks import CrashReporter, ErrorInfo, install_excepthooks, uninstall_excepthooks
from app.main_window import MainWindow
from engine.devices import DeviceOptions

ROOT = Path(__file__).resolve().parents[2]

# Runs in a fresh interpreter: other tests in this process have imported torch long ago.
_FRESH_WINDOW = r"""
import json, sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from app.main import create_window

w = create_window([])
state = {
    "torch_at_show": "torch" in sys.modules,
    "visible": w.isVisible(),
    "exposed": bool(w.windowHandle() and w.windowHandle().isExposed()),
    "title": w.windowTitle(),
    "status_at_show": w.device_status.device_label.text(),
}
app = QApplication.instance()
def done(report):
    state["selected"] = report.selected.torch_device
    QTimer.singleShot(0, w.close)
w.client.devices_detected.connect(done)
QTimer.singleShot(120_000, app.quit)  # a hang fails the test instead of blocking it
app.exec()
st = w.device_status
state.update(device=st.device_label.text(), vram=st.state_label.text(), memory=st.memory_label.text(),
             torch_after="torch" in sys.modules, engine_running=w.client.running)
print(json.dumps(state))
"""


def test_window_appears_before_torch_then_shows_the_device():
    r = subprocess.run(
        [sys.executable, "-c", _FRESH_WINDOW], cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    state = json.loads(r.stdout.strip().splitlines()[-1])
    assert state["visible"] and state["exposed"] and state["title"] == "Loadout"
    assert state["torch_at_show"] is False, "torch was imported before the window appeared"
    assert state["status_at_show"].startswith("Detecting devices")
    assert state["torch_after"] is True  # the engine thread did import it, afterwards
    assert state["device"].startswith("Device: ") and state["vram"].startswith("VRAM state: ")
    assert "free" in state["memory"] and "weight budget" in state["memory"]
    assert state["engine_running"] is False


def test_status_bar_shows_device_state_and_memory(qtbot):
    import torch

    w = MainWindow(DeviceOptions(vram_budget_gb=1.0))
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.client.devices_detected, timeout=60_000):
        w.start()
    st = w.device_status  # the status bar's device, VRAM state and memory
    assert st.timer.isActive()
    if not torch.cuda.is_available():
        assert st.device_label.text().startswith("Device: CPU")
        assert st.state_label.text() == "VRAM state: DISABLED · cap 1.0 GiB"  # --vram-budget shown
        assert st.memory_label.text().startswith("RAM free")
    assert "weight budget" in st.memory_label.text() and "GiB" in st.memory_label.text()
    # The budget respects --vram-budget 1: at most 1.0 GiB.
    budget = st.report.budget_bytes(10**13)
    assert budget == 1024**3
    first = st.memory_label.toolTip()
    assert "Process RSS" in first
    w.close()
    assert not w.client.running


def test_closing_during_detection_stops_the_engine_thread(qtbot):
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    w.start()
    assert w.client.running
    w.close()  # cancels the job's token and waits for the thread
    assert not w.client.running


def test_detection_failure_is_an_expected_error_dialog(qtbot):
    w = MainWindow(DeviceOptions(device_index=7))  # no machine here has an 8th device of its kind
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.client.failed, timeout=60_000) as blocker:
        w.start()
    info = blocker.args[0]
    assert isinstance(info, ErrorInfo) and info.expected and "--device 7" in info.message
    qtbot.waitUntil(lambda: bool(w.reporter.dialogs), timeout=5000)
    assert w.device_status.device_label.text() == "Device detection failed"
    assert "--device 7" in w.reporter.dialogs[0].text()
    w.close()
    assert not w.client.running


def test_paths_from_the_command_line_and_drops_are_kept(qtbot, tmp_path):
    a, b = tmp_path / "sdxl.safetensors", tmp_path / "loras"
    a.write_bytes(b"x")
    b.mkdir()
    w = MainWindow(paths=[str(a)], restore_layout=False)
    qtbot.addWidget(w)
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(b)), QUrl.fromLocalFile(str(a))])
    ev = QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                    Qt.KeyboardModifier.NoModifier)  # fmt: skip
    w.dropEvent(ev)
    assert w.library.roots.paths == [str(a), str(b)]  # no duplicates, order kept
    w.close()


def test_default_layout_fits_a_1280_by_800_laptop_screen(qtbot):
    """Every dock's minimum width adds up: a panel that insists on its width pushes the window off a
    laptop screen and clips the LoRA stack (it did: 1523 px)."""
    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    hint = w.minimumSizeHint()
    assert hint.width() <= 1280 and hint.height() <= 800 - 60, hint  # 60 px: title bar and a panel
    w.resize(1280, 740)
    qtbot.wait(50)
    for key, dock in w.docks.items():
        if dock.isVisible():
            g = dock.geometry()
            assert g.right() < w.width() and g.bottom() < w.height(), (key, g)
    w.close()


def test_the_window_looks_for_libraries_off_the_gui_thread(qtbot, monkeypatch):
    """First start with no library: the search (engine.discover, seconds on a big disk) runs in the
    engine client's IO thread while the window stays responsive; then the question is asked."""
    from PySide6.QtCore import QSettings, QThread, QTimer
    from PySide6.QtWidgets import QApplication

    from app.first_run import FirstRunDialog, first_run_done
    from engine import discover

    seen = []

    def find_installs(**_kw):
        seen.append((threading.get_ident(), QThread.currentThread().objectName()))
        return []

    monkeypatch.setattr(discover, "find_installs", find_installs)
    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    w.offer_first_run = True

    def answer_start_empty(tries=3000):
        dlg = QApplication.activeModalWidget()
        if not isinstance(dlg, FirstRunDialog):
            if tries:  # the dialog comes once the search is done
                QTimer.singleShot(20, lambda: answer_start_empty(tries - 1))
            return
        assert "No ComfyUI" in dlg.message.text()  # nothing found: the demo is offered
        (start_empty,) = [b for b in dlg.buttons.buttons() if b.text() == "Start empty"]
        qtbot.mouseClick(start_empty, Qt.MouseButton.LeftButton)

    QTimer.singleShot(0, answer_start_empty)
    w.start()
    qtbot.waitUntil(
        lambda: first_run_done(QSettings(str(_ini()), QSettings.Format.IniFormat)), timeout=60_000
    )
    # searched once, in the client's IO thread (never the GUI thread); then the dialog asked
    assert seen == [(seen[0][0], "loadout-io")] and seen[0][0] != threading.get_ident()
    w.close()


def _ini() -> Path:
    from app.settings import config_dir

    return config_dir() / "loadout.ini"


@pytest.fixture
def reporter(qtbot):
    r = CrashReporter()
    install_excepthooks(r)
    yield r
    uninstall_excepthooks()
    for d in r.dialogs:
        d.close()


def test_unhandled_exception_in_gui_thread_opens_a_crash_dialog(qtbot, reporter):
    try:
        raise ValueError("boom in a slot")
    except ValueError:
        sys.excepthook(*sys.exc_info())
    qtbot.waitUntil(lambda: bool(reporter.dialogs), timeout=5000)
    box = reporter.dialogs[0]
    assert "ValueError: boom in a slot" in box.text()
    assert "Traceback" in box.detailedText() and not reporter.reports[0].expected


def test_unhandled_exception_in_another_thread_reaches_the_gui(qtbot, reporter):
    def bad():
        raise RuntimeError("boom in a worker")

    t = threading.Thread(target=bad, name="worker-x")
    t.start()
    t.join()
    qtbot.waitUntil(lambda: bool(reporter.reports), timeout=5000)
    assert reporter.reports[0].message == "RuntimeError: boom in a worker"
    assert reporter.dialogs and reporter.dialogs[0].isVisible()  # the app keeps running


def test_repeated_crashes_open_at_most_a_few_dialogs(qtbot, reporter):
    for i in range(10):
        reporter.report.emit(ErrorInfo("t", f"bug {i}"))
    qtbot.waitUntil(lambda: len(reporter.reports) == 10, timeout=5000)
    assert len(reporter.dialogs) == CrashReporter.MAX_OPEN


def test_exception_in_a_qt_slot_reaches_the_dialog_and_the_loop_goes_on(qtbot, reporter):
    from PySide6.QtCore import QTimer

    ran = []

    def bad_slot():
        ran.append("bad")
        raise KeyError("from a timer slot")

    QTimer.singleShot(0, bad_slot)
    QTimer.singleShot(50, lambda: ran.append("later"))
    qtbot.waitUntil(lambda: "later" in ran and bool(reporter.reports), timeout=5000)
    assert "KeyError" in reporter.reports[0].message


def test_a_window_closed_with_a_message_reopens_without_an_empty_message_bar(qtbot):
    """The saved layout holds the message bar's visibility: a window closed while it showed an error opened
    the next time with the bar shown and empty. It shows only while there is a message."""
    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.notify("a 512×512 px image is larger than this model's positions", "error")
    assert w.message_bar.isVisible()
    w.save_layout()
    w.close()
    again = MainWindow()
    qtbot.addWidget(again)
    again.show()
    qtbot.waitExposed(again)
    assert not again.message_bar.isVisible() and not again.messages.shown
    again.notify("still shown when there is one", "error")
    assert again.message_bar.isVisible()
    again.close()
