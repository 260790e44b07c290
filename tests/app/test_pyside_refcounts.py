"""PySide6 6.12.0 drops a reference to None on every void Qt call and to True on every Signal.emit();
before Python 3.12 those objects are not immortal, and a live window aborted within minutes
("Fatal Python error: none_dealloc"). pyproject/constraints keep PySide6 below 6.12; this test fails if
an install ever brings a version with the bug back. Runs in a subprocess: a failure aborts Python."""

import subprocess
import sys

PROBE = r"""
import os, sys
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import QApplication
app = QApplication([])
t = QTimer()
a = sys.getrefcount(None)
for _ in range(200):
    t.setInterval(10)
none_delta = sys.getrefcount(None) - a
class O(QObject):
    s = Signal(int)
o = O()
o.s.connect(lambda x: None)
b = sys.getrefcount(True)
for _ in range(200):
    o.s.emit(1)
print(none_delta, sys.getrefcount(True) - b)
"""


def test_qt_calls_keep_none_and_true_refcounts():
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    none_delta, true_delta = map(int, r.stdout.split())
    assert none_delta >= 0 and true_delta >= 0, f"PySide6 leaks refs: None {none_delta}, True {true_delta}"
