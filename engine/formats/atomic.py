"""Atomic output: write to a temporary file beside the target, fsync, then rename over it."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".part"):
    """Yield a temporary path beside the target for a writer that opens files by name (FFmpeg); the
    target appears (or is replaced) only if the block succeeds, after the data is synced."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=suffix, dir=target.parent)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_output(path: str | os.PathLike, mode: str = "wb"):
    """Yield a file object; the target appears (or is replaced) only if the block succeeds."""
    with atomic_path(path) as tmp, open(tmp, mode) as f:
        yield f
