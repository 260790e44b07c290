"""Shared test set-up: headless Qt, private cache/config folders, the reference data, GPU markers."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

# Before any QApplication exists (pytest-qt creates it lazily): no display needed.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never touch the user's real library cache or settings.
_state = tempfile.mkdtemp(prefix="loadout-test-state-")
os.environ["LOADOUT_CACHE_DIR"] = os.path.join(_state, "cache")
os.environ["LOADOUT_CONFIG_DIR"] = os.path.join(_state, "config")

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


@pytest.fixture
def shared_data():
    return data_file


def _has_cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if any("cuda" in item.keywords for item in items) and not _has_cuda():
        skip = pytest.mark.skip(reason="needs a CUDA device (none here)")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


def run_cli(*args: str, timeout: float = 120, env: dict | None = None, cwd=None):
    """Run `loadout ARGS…` in a subprocess as a user would (the same entry point as the installed
    script, with this checkout first on the path). Returns CompletedProcess with text stdout/stderr."""
    import subprocess
    import sys

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


@pytest.fixture
def cli():
    return run_cli
