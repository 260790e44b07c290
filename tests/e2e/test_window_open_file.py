"""`loadout FILE` as a desktop double-click runs it: a fresh process opens the window with that file
selected in the library and its inspector shown (offscreen), then closes cleanly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_OPEN = r"""
import json, sys
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
from app.main import create_window

w = create_window(sys.argv[1:])
app = QApplication.instance()
state = {}
def check():
    e = w.inspector.entry
    if e is not None:
        state.update(selected=w.library.current_entry().path, inspected=e.path, arch=e.architecture,
                     text=w.inspector.text())
        w.close()
        app.quit()
t = QTimer(); t.timeout.connect(check); t.start(100)
QTimer.singleShot(90_000, app.quit)
app.exec()
state["engine_running"] = w.client.running
print(json.dumps(state))
"""


def test_loadout_file_selects_it_and_shows_its_inspector(tmp_path):
    from tests.support import synth

    ckpt = synth.write("sdxl_checkpoint", tmp_path / "models" / "my_sdxl.safetensors")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT),
           "LOADOUT_CONFIG_DIR": str(tmp_path / "cfg"), "LOADOUT_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    r = subprocess.run([sys.executable, "-c", _OPEN, str(ckpt)], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=150)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    state = json.loads(r.stdout.strip().splitlines()[-1])
    assert state["selected"] == state["inspected"] == str(ckpt)
    assert state["arch"] == "sdxl" and "Evidence" in state["text"] and "clip_g" in state["text"]
    assert state["engine_running"] is False  # closing the window stopped the engine threads
