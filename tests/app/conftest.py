"""App test fixtures: a leak check after every test (top-level widgets left visible, engine threads
still running, stray Python threads), small real model files, and a window that has found its device."""

from __future__ import annotations

import threading
import weakref

import pytest

from app import bridge

_clients: weakref.WeakSet = weakref.WeakSet()
_orig_init = bridge.EngineClient.__init__


def _tracking_init(self, *a, **kw):
    _orig_init(self, *a, **kw)
    _clients.add(self)


bridge.EngineClient.__init__ = _tracking_init  # every client a test makes is checked at teardown


@pytest.fixture(autouse=True)
def no_leaks(qapp):
    """Fail the test if it leaves a visible top-level widget, a running engine QThread or a new
    non-daemon Python thread behind (a live QThread at exit aborts the whole run)."""
    before_all = {_ptr(w) for w in qapp.topLevelWidgets()}
    before_widgets = {_ptr(w) for w in qapp.topLevelWidgets() if w.isVisible()}
    before_threads = set(threading.enumerate())
    yield
    qapp.processEvents()
    leaked = [w for w in qapp.topLevelWidgets() if w.isVisible() and _ptr(w) not in before_widgets]
    running = [c for c in list(_clients) if _safe_running(c)]
    threads = [t for t in threading.enumerate() if t not in before_threads and t.is_alive() and not t.daemon]
    for w in leaked:
        w.close()
    for c in running:
        c.shutdown()
    msgs = []
    if leaked:
        msgs.append(
            "top-level widgets left open: "
            + ", ".join(f"{type(w).__name__}({w.windowTitle()!r})" for w in leaked)
        )
    if running:
        msgs.append(f"{len(running)} EngineClient thread(s) still running")
    if threads:
        msgs.append("threads left running: " + ", ".join(t.name for t in threads))
    # Delete (not just hide) every top-level the test made — windows, and the popups their combo boxes
    # own — so later tests start from the same set of top-level widgets.
    from PySide6.QtCore import QEvent

    for w in qapp.topLevelWidgets():
        if _ptr(w) not in before_all and w.parent() is None:
            w.deleteLater()
    qapp.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    qapp.processEvents()
    if msgs:
        pytest.fail("; ".join(msgs))


def _ptr(w) -> int:
    """A widget's C++ address: Python wrapper ids change between topLevelWidgets() calls."""
    import shiboken6

    return shiboken6.getCppPointer(w)[0]


def _safe_running(c) -> bool:
    try:
        return c.running
    except RuntimeError:  # the C++ object is gone: nothing can run
        return False


@pytest.fixture(scope="session")
def files(tmp_path_factory):
    """Small real files: a header-faithful SD1 checkpoint (sparse), a dense SD VAE (~160 MB, loads for
    real), a kohya LoRA, a latent, a corrupt .safetensors and a text file."""
    from engine.catalog import demo_weights as W
    from tests.support import synth

    d = tmp_path_factory.mktemp("lib")
    (d / "checkpoints").mkdir()
    (d / "loras").mkdir()
    (d / "vae").mkdir()
    out = {
        "ckpt": synth.write("sd1_checkpoint", d / "checkpoints" / "sd15_test.safetensors"),
        "sdxl": synth.write("sdxl_checkpoint", d / "checkpoints" / "sdxl_test.safetensors"),
        "vae": synth.write(
            "sd_vae", d / "vae" / "vae_dense.safetensors", dense=True, max_dense_bytes=200 << 20
        ),
        "lora": W.write_kohya_lora(d / "loras" / "style.safetensors"),
    }
    bad = d / "checkpoints" / "broken.safetensors"
    bad.write_bytes(b"\xff" * 8 + b"not a header at all")
    out["bad"] = bad
    txt = d / "notes.txt"
    txt.write_text("hello")
    out["txt"] = txt
    out["dir"] = d
    return {k: str(v) for k, v in out.items()}


@pytest.fixture
def window(qtbot):
    """A shown MainWindow whose devices are detected (torch imported in its engine thread)."""
    from app.main_window import MainWindow

    w = MainWindow(restore_layout=False)
    qtbot.addWidget(w)
    w.show()
    with qtbot.waitSignal(w.client.devices_detected, timeout=120_000):
        w.start()
    yield w
    w.close()


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch, tmp_path):
    """Each test gets its own settings file (saved library folders, layout)."""
    monkeypatch.setenv("LOADOUT_CONFIG_DIR", str(tmp_path / "config"))
