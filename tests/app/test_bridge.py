"""The engine client as a submitter uses it: each request's outcome reaches that submitter's callbacks, in
the GUI thread; a failure nobody takes reaches the user's one error path; a cancellation is no failure;
a callback of a widget deleted meanwhile is skipped. And a panel handles its own results, no window."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from PySide6.QtCore import QCoreApplication, QObject, QThread

from app.bridge import EngineClient
from engine import discover
from engine.requests import FindLibraries, Load, LoraCoverage, Scan


@pytest.fixture
def client():
    c = EngineClient()
    yield c
    c.shutdown()


class Recorder(QObject):
    """A GUI-thread QObject whose bound methods note the thread each callback ran in."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, object, int, bool]] = []

    def _note(self, what: str, payload) -> None:
        gui = QThread.currentThread() == QCoreApplication.instance().thread()
        self.calls.append((what, payload, threading.get_ident(), gui))

    def on_done(self, result) -> None:
        self._note("done", result)

    def on_failed(self, info) -> None:
        self._note("failed", info)

    def on_progress(self, p) -> None:
        self._note("progress", p)

    def on_cancelled(self) -> None:
        self._note("cancelled", None)

    def kinds(self) -> list[str]:
        return [c[0] for c in self.calls]


def test_callbacks_run_in_the_gui_thread_while_the_work_runs_in_the_engine_threads(
    qtbot, client, files, monkeypatch
):
    ran_in = []
    monkeypatch.setattr(discover, "find_installs", lambda: ran_in.append(threading.get_ident()) or ["x"])
    r = Recorder()
    client.submit(FindLibraries(), r.on_done, r.on_failed, on_progress=r.on_progress)
    client.submit(Scan((files["dir"],)), r.on_done, r.on_failed, on_progress=r.on_progress)
    client.submit(Load(files["ckpt"]), r.on_done, r.on_failed)  # before detection: an expected failure
    qtbot.waitUntil(lambda: r.kinds().count("done") == 2 and "failed" in r.kinds(), timeout=60_000)
    gui = threading.get_ident()
    assert ran_in and ran_in[0] != gui  # the work ran elsewhere ...
    assert {(ident, in_gui) for _, _, ident, in_gui in r.calls} == {(gui, True)}  # ... every callback here
    assert ("done", ("x",)) in [c[:2] for c in r.calls]
    assert "progress" in r.kinds()  # the scan's progress reached its submitter too
    info = next(p for k, p, *_ in r.calls if k == "failed")
    assert info.expected and "device is not ready" in info.message


def test_a_failure_goes_to_its_on_failed_or_else_to_the_users_error_path(qtbot, client, files):
    errors = []
    client.error.connect(errors.append)
    taken = Recorder()
    with qtbot.waitSignal(client.idle, timeout=30_000):
        client.submit(Load(files["ckpt"]), taken.on_done, taken.on_failed)
    assert taken.kinds() == ["failed"] and errors == []  # its submitter took it
    with qtbot.waitSignal(client.error, timeout=30_000) as blocker:
        client.submit(Load(files["ckpt"]))  # nobody takes it: the message bar / crash dialog does
    assert blocker.args[0].expected and "device is not ready" in blocker.args[0].message
    client.report_error(taken.calls[0][1])  # an on_failed that also wants the user told hands it on
    assert len(errors) == 2


def test_a_cancelled_job_is_not_a_failure(qtbot, client, files, monkeypatch):
    release = threading.Event()
    monkeypatch.setattr(discover, "find_installs", lambda: release.wait(30) and [])
    errors = []
    client.error.connect(errors.append)
    r = Recorder()
    client.submit(FindLibraries())  # holds the IO thread: the scan behind it has not started
    job = client.submit(Scan((files["dir"],)), r.on_done, r.on_failed, on_cancelled=r.on_cancelled)
    client.cancel(job, "Stopped by the user.")
    release.set()
    qtbot.waitUntil(lambda: bool(r.calls), timeout=30_000)
    qtbot.waitUntil(lambda: not client.busy, timeout=30_000)
    assert r.kinds() == ["cancelled"] and errors == []


def test_a_callback_of_a_deleted_widget_is_skipped(qtbot, client, files):
    import shiboken6

    gone = Recorder()
    client.submit(LoraCoverage(files["lora"], files["ckpt"]), gone.on_done)
    shiboken6.delete(gone)  # a dialog closed while its job ran
    with qtbot.waitSignal(client.idle, timeout=30_000):
        pass  # no RuntimeError from calling into a deleted C++ object (the excepthook would fail the test)


def test_the_lora_stack_handles_its_own_coverage_result(qtbot, client, files):
    """No window: the panel sends its request and shows the answer itself."""
    from app.widgets.lora_stack import LoraStackPanel

    stack = LoraStackPanel()
    qtbot.addWidget(stack)
    stack.attach(client)
    base = SimpleNamespace(path=files["ckpt"], kind="checkpoint", error=None, name="sd15", architecture="sd1")
    stack.on_library_changed([base])
    assert stack.base() == files["ckpt"]
    stack.add(files["lora"])
    qtbot.waitUntil(lambda: stack.row_widget(0).badge.text() == "264/264 modules", timeout=30_000)
    assert stack.total.text().startswith("coverage 264/264 modules")


def test_the_decode_panel_asks_the_engine_for_its_estimate(qtbot, client, files, tmp_path):
    """The estimate's header reads run in the client's peek thread; the panel shows the answer."""
    import torch

    from app.widgets.decode import DecodePanel
    from engine.formats.latent import write_latent

    latent = tmp_path / "small.latent"
    write_latent(latent, torch.zeros(1, 4, 16, 16))
    dec = DecodePanel()
    qtbot.addWidget(dec)
    dec.attach(client)
    dec.vae_box.addItem("vae", files["vae"])
    dec.set_input(str(latent))
    qtbot.waitUntil(lambda: dec.estimate.text().startswith("128×128 decode: full ≈"), timeout=30_000)
    dec.set_input(str(tmp_path / "missing.latent"))
    qtbot.waitUntil(lambda: "missing.latent:" in dec.estimate.text(), timeout=30_000)
    assert "c0392b" in dec.estimate.text()  # shown in red in the panel, not as an error message
