"""Helpers tests import by name (`from loadout_test_support import data_file, run_cli`).

A module of its own, not conftest: several conftest.py files exist (tests/, tests/app/), and
`from conftest import …` would pick whichever was imported last.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_DATA_ENV = os.environ.get("LOADOUT_TEST_DATA", "")
DATA_DIR = Path(_DATA_ENV) if _DATA_ENV else ROOT.parent / "shared" / "data"


def data_file(rel: str) -> Path:
    """A file from the reference data (../shared/data). Skips when the folder is absent, but fails
    when LOADOUT_TEST_DATA was set explicitly (as CI does) and the file is missing."""
    p = DATA_DIR / rel
    if p.exists():
        return p
    if _DATA_ENV:
        pytest.fail(f"reference file {p} is missing but LOADOUT_TEST_DATA={_DATA_ENV} was set")
    pytest.skip(f"reference data not available ({p}); set LOADOUT_TEST_DATA to ../shared/data")


def run_cli(*args: str, timeout: float = 120, env: dict | None = None, cwd=None):
    """Run `loadout ARGS…` in a subprocess as a user would (the same entry point as the installed
    script, with this checkout first on the path). Returns CompletedProcess with text stdout/stderr."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "app.launch", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
        cwd=cwd or ROOT,
        stdin=subprocess.DEVNULL,
    )
