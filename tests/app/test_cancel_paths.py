"""A cancellation reaches the user as "stopped", never as a failure or a crash dialog."""

from __future__ import annotations

import threading

import pytest

from app.bridge import EngineWorker
from app.excepthooks import CrashReporter, install_excepthooks, uninstall_excepthooks
from engine.errors import Cancelled, FormatError
from engine.jobs import CancelToken
from engine.requests import UnloadAll


@pytest.fixture
def reporter(qtbot):
    r = CrashReporter()
    install_excepthooks(r)
    yield r
    uninstall_excepthooks()
    for d in r.dialogs:
        d.close()


@pytest.mark.parametrize(
    ("raised", "signal"), [(Cancelled("Stopped."), "cancelled"), (FormatError("bad file"), "failed")]
)
def test_the_worker_sorts_a_cancel_from_a_failure(qtbot, monkeypatch, raised, signal):
    worker = EngineWorker()

    def run(request, token=None, report=None):
        raise raised

    monkeypatch.setattr(worker.engine, "run", run)
    got = []
    worker.cancelled.connect(lambda job: got.append(("cancelled", job)))
    worker.failed.connect(lambda job, info: got.append(("failed", job)))
    worker.finished.connect(lambda job, result: got.append(("finished", job)))
    worker.run_job(7, UnloadAll(), CancelToken())  # the token itself was never cancelled
    assert got == [(signal, 7)]


def test_a_cancel_escaping_a_thread_is_not_a_crash(qtbot, reporter):
    def stopped():
        raise Cancelled("Hashing stopped.")

    def bad():
        raise RuntimeError("boom")

    for target in (stopped, bad):
        t = threading.Thread(target=target, name=target.__name__)
        t.start()
        t.join()
    qtbot.waitUntil(lambda: bool(reporter.reports), timeout=5000)
    qtbot.wait(50)
    assert [r.message for r in reporter.reports] == ["RuntimeError: boom"]
