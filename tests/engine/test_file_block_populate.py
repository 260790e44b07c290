"""A load's file-mapped RAM copies (transfer.FileBlock) populated together on worker threads: every page is
in the process when `populating()` exits, also when the load inside it failed or was cancelled."""

from __future__ import annotations

import os

import psutil
import pytest
import torch

from engine.model import transfer

MIB = 1 << 20


@pytest.fixture
def cached_file(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(os.urandom(4 * MIB) * 16)  # 64 MiB, in the page cache after the write
    fd = os.open(p, os.O_RDONLY)
    yield fd
    os.close(fd)


def _rss() -> int:
    return psutil.Process().memory_info().rss


@pytest.mark.skipif(transfer._MADVISE is None, reason="populates in threads on Linux only")
def test_blocks_made_inside_are_populated_when_it_exits(cached_file):
    before = _rss()
    with transfer.populating(workers=2):
        blocks = [transfer.FileBlock(cached_file, i * 16 * MIB + 100, (i + 1) * 16 * MIB) for i in range(4)]
        inside = _rss() - before
    after = _rss() - before
    assert inside < 8 * MIB  # mapped, not yet populated
    assert after > 60 * MIB  # every page mapped in when the block ends
    at = 2 * 16 * MIB + 100
    assert blocks[2].view(at, torch.uint8, (4,)).numpy().tobytes() == os.pread(cached_file, 4, at)


@pytest.mark.skipif(transfer._MADVISE is None, reason="populates in threads on Linux only")
def test_a_load_that_fails_inside_still_leaves_its_blocks_populated(cached_file):
    before = _rss()
    blocks = []
    with pytest.raises(RuntimeError, match="cancelled"), transfer.populating(workers=2):
        blocks += [
            transfer.FileBlock(cached_file, 0, 32 * MIB),
            transfer.FileBlock(cached_file, 32 * MIB, 64 * MIB),
        ]
        raise RuntimeError("cancelled")
    assert _rss() - before > 60 * MIB  # what the ledger would say the process holds, it holds
    # a block made outside (a streamed step's) is populated at once, on the calling thread
    before = _rss()
    outside = transfer.FileBlock(cached_file, 0, 16 * MIB)
    assert outside is not None and _rss() - before > 15 * MIB
