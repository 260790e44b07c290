"""`loadout` with no sub-command, as a user starts it: the window comes up, detects the device, and
Ctrl+C closes it with the engine thread stopped (a live QThread at exit would abort the process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_launch_detect_and_interrupt_cleanly(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "PYTHONPATH": str(ROOT)}
    log = tmp_path / "log.txt"
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-m", "app.launch", str(tmp_path)], cwd=ROOT, env=env,
                             stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            deadline = time.monotonic() + 90
            while "VRAM state" not in log.read_text() and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
            assert "VRAM state" in log.read_text(), log.read_text()
            p.send_signal(signal.SIGINT)
            rc = p.wait(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
    text = log.read_text()
    assert rc == 0, text
    assert "QThread: Destroyed while thread is still running" not in text
    assert "Traceback" not in text
