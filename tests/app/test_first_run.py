"""The first-run dialog driven as a user would: tick, accept, decline, the demo library (written by the
engine thread); the answer is remembered in the INI settings under LOADOUT_CONFIG_DIR and the question
is not asked twice. The window's search for libraries runs off the GUI thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QSettings, Qt, QTimer
from PySide6.QtWidgets import QApplication, QDialog, QPushButton, QWidget

from app.bridge import EngineClient
from app.first_run import (
    KEY_CHOICE,
    KEY_PATHS,
    FirstRunDialog,
    ask_first_run,
    demo_dir,
    first_run_done,
    first_run_due,
    reset_first_run,
)
from engine.discover import find_installs
from engine.requests import WriteDemo


def _file(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)


@pytest.fixture
def installs(tmp_path):
    """A git ComfyUI and an A1111 WebUI in a temporary home, found by the real discovery."""
    home = tmp_path / "home"
    comfy = home / "src" / "ComfyUI"
    for p in ("main.py", "comfy/sd.py"):
        _file(comfy / p, 0)
    _file(comfy / "models" / "checkpoints" / "a.safetensors", 4096)
    webui = home / "stable-diffusion-webui"
    _file(webui / "webui.py", 0)
    _file(webui / "models" / "Stable-diffusion" / "b.safetensors", 100)
    found = find_installs(home, system=False)
    assert [i.app for i in found] == ["comfyui", "a1111"]
    return found


@pytest.fixture
def settings(tmp_path):
    s = QSettings(str(tmp_path / "config" / "loadout.ini"), QSettings.Format.IniFormat)
    yield s
    s.sync()


@pytest.fixture
def no_leaks(qapp):
    """Every dialog a test made is gone afterwards (deleted, not just hidden)."""
    before = set(map(id, QApplication.topLevelWidgets()))
    yield
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    QApplication.processEvents()
    left = [w for w in QApplication.topLevelWidgets() if id(w) not in before]
    assert not left, f"leaked widgets: {left}"


@pytest.fixture
def client():
    c = EngineClient()
    yield c
    c.shutdown()


class Answering:
    """Stands in for the engine client where a test only needs to see what was asked: every request
    is answered at once (or refused, when `refuse`)."""

    def __init__(self, refuse: bool = False) -> None:
        self.sent: list = []
        self.refuse = refuse

    def submit(self, request, on_done=None, on_failed=None, **_):
        if self.refuse:
            raise AssertionError(f"sent {request!r}")
        self.sent.append(request)
        if on_done is not None:
            on_done(())


def _button(dlg, text: str) -> QPushButton:
    (b,) = [b for b in dlg.buttons.buttons() if b.text() == text]
    return b


def _close(dlg) -> None:
    dlg.deleteLater()


def test_tick_and_accept_scans_only_the_ticked(qtbot, installs, no_leaks):
    dlg = FirstRunDialog(installs)
    dlg.show()
    assert [b.isChecked() for b in dlg.boxes] == [True, True]
    assert dlg.boxes[0].text().startswith("ComfyUI · 1 model file · 4.0 KiB\n")
    qtbot.mouseClick(dlg.boxes[1], Qt.MouseButton.LeftButton)  # untick the WebUI
    qtbot.mouseClick(_button(dlg, "Scan selected"), Qt.MouseButton.LeftButton)
    assert dlg.result() == FirstRunDialog.DialogCode.Accepted and dlg.choice == "scan"
    assert dlg.chosen_paths() == [Path(installs[0].root) / "models"]
    _close(dlg)


def test_nothing_ticked_cannot_accept(qtbot, installs, no_leaks):
    dlg = FirstRunDialog(installs)
    dlg.show()
    for b in dlg.boxes:
        qtbot.mouseClick(b, Qt.MouseButton.LeftButton)
    assert not _button(dlg, "Scan selected").isEnabled()
    qtbot.mouseClick(dlg.boxes[0], Qt.MouseButton.LeftButton)
    assert _button(dlg, "Scan selected").isEnabled()
    _close(dlg)


def test_decline_is_remembered_and_not_asked_again(qtbot, installs, settings, no_leaks):
    def answer_not_now():
        dlg = QApplication.activeModalWidget()
        assert isinstance(dlg, FirstRunDialog)
        qtbot.mouseClick(_button(dlg, "Not now"), Qt.MouseButton.LeftButton)

    assert first_run_due(settings)
    QTimer.singleShot(0, answer_not_now)
    assert ask_first_run(None, settings, installs) == []
    assert settings.value(KEY_CHOICE) == "none" and first_run_done(settings)
    assert not first_run_due(settings)  # not asked again
    reset_first_run(settings)
    assert not first_run_done(settings)


def test_accept_through_ask_first_run_saves_the_folders(qtbot, installs, settings, no_leaks):
    def answer_scan():
        dlg = QApplication.activeModalWidget()
        qtbot.mouseClick(_button(dlg, "Scan selected"), Qt.MouseButton.LeftButton)

    window = QWidget()  # stands in for the main window: the dialog must not stay behind as its child
    QTimer.singleShot(0, answer_scan)
    paths = ask_first_run(window, settings, installs)
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    assert window.findChildren(QDialog) == []
    window.deleteLater()
    assert paths == [Path(installs[0].root) / "models", Path(installs[1].root) / "models"]
    # A fresh QSettings on the same file (the next start) sees the answer.
    again = QSettings(settings.fileName(), QSettings.Format.IniFormat)
    assert again.value(KEY_CHOICE) == "scan"
    assert again.value(KEY_PATHS) == [str(p) for p in paths]


def test_existing_library_folders_skip_the_question(settings, no_leaks):
    settings.setValue("library/folders", ["/somewhere/models"])
    assert not first_run_due(settings)  # so the window never looks for libraries
    assert settings.value(KEY_CHOICE) == "none"


def test_none_found_offers_the_demo_and_writes_it(qtbot, tmp_path, client, no_leaks):
    target = tmp_path / "data" / "demo-library"
    dlg = FirstRunDialog([], demo_path=target, client=client)
    dlg.show()
    assert "No ComfyUI" in dlg.message.text() and not dlg.boxes
    with qtbot.waitSignal(dlg.accepted, timeout=120_000):
        qtbot.mouseClick(_button(dlg, "Open the demo library"), Qt.MouseButton.LeftButton)
        assert "Writing the demo library" in dlg.status.text()
    assert dlg.choice == "demo" and dlg.chosen_paths() == [target]
    assert (target / "README.md").is_file()
    assert (target / "models" / "checkpoints" / "sd15_demo.safetensors").is_file()
    _close(dlg)


def test_demo_failure_is_shown_and_the_user_can_start_empty(qtbot, tmp_path, client, no_leaks):
    blocker = tmp_path / "file-not-folder"
    blocker.write_text("x")  # a file where the demo folder would go: writing it fails for real

    dlg = FirstRunDialog([], demo_path=blocker / "demo", client=client)
    dlg.show()
    qtbot.mouseClick(_button(dlg, "Open the demo library"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dlg.error is not None, timeout=60_000)
    assert "Could not write the demo library" in dlg.status.text()
    assert _button(dlg, "Start empty").isEnabled()
    qtbot.mouseClick(_button(dlg, "Start empty"), Qt.MouseButton.LeftButton)
    assert dlg.result() == FirstRunDialog.DialogCode.Rejected and dlg.chosen_paths() == []
    _close(dlg)


def test_existing_demo_is_reused(qtbot, tmp_path, no_leaks):
    from engine.catalog.demo import DEMO_CURRENT, DEMO_LATENT

    target = tmp_path / "demo"
    for rel in ("README.md", DEMO_CURRENT, DEMO_LATENT):
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        (target / rel).write_text("x")

    dlg = FirstRunDialog([], demo_path=target, client=Answering(refuse=True))  # it must not rewrite the demo
    qtbot.mouseClick(_button(dlg, "Open the demo library"), Qt.MouseButton.LeftButton)
    assert dlg.choice == "demo"
    _close(dlg)


def test_demo_dir_follows_xdg_data_home(tmp_path, monkeypatch):
    if os.name == "nt":
        pytest.skip("XDG_DATA_HOME is a Linux convention")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert demo_dir() == tmp_path / "xdg" / "loadout" / "demo-library"


def test_an_older_demo_is_written_again(qtbot, tmp_path, no_leaks):
    """A demo library from before the preview decoder (its TAESD decoded to black) is replaced."""
    target = tmp_path / "demo"
    target.mkdir()
    (target / "README.md").write_text("# demo\n")
    written = Answering()
    dlg = FirstRunDialog([], demo_path=target, client=written)
    qtbot.mouseClick(_button(dlg, "Open the demo library"), Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dlg.choice == "demo", timeout=10_000)
    assert written.sent == [WriteDemo(str(target))]
    _close(dlg)
