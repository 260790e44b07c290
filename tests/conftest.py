"""Shared test set-up: headless Qt, private cache/config folders, the reference data, GPU markers."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

# Before any QApplication exists (pytest-qt creates it lazily): no display needed.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Never touch the user's real library cache or settings.
_state = tempfile.mkdtemp(prefix="loadout-test-state-")
# Removed when the session ends: every run made one and they piled up in /tmp.
atexit.register(shutil.rmtree, _state, ignore_errors=True)
os.environ["LOADOUT_CACHE_DIR"] = os.path.join(_state, "cache")
os.environ["LOADOUT_CONFIG_DIR"] = os.path.join(_state, "config")

# CI runs a fixed set of hypothesis examples (a red CI must be reproducible); local runs explore.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

from loadout_test_support import DATA_DIR, ROOT, data_file, run_cli  # noqa: E402

__all__ = ["DATA_DIR", "ROOT", "data_file", "run_cli"]


@pytest.fixture
def shared_data():
    return data_file


@pytest.fixture
def cli():
    return run_cli


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
