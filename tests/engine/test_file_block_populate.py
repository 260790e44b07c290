"""A load's file-mapped RAM copies (transfer.FileBlock) populated together on worker threads: every page is
in the process when `populating()` exits, also when the load inside it failed or was cancelled; and the
tensors a block hands out are the file's bytes."""

from __future__ import annotations

import math
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


@pytest.mark.parametrize("start", [0, 8, 4104])  # the block's span from the file's start, mid-page, a page on
def test_a_blocks_views_are_the_files_bytes_in_any_dtype_and_shape(tmp_path, start):
    """FileBlock.view gives each tensor from the block's bytes seen as its dtype (one strided view where
    the offset allows, else a slice): the file's values, sharing the mapping, for every shape."""
    data = torch.arange(50_000, dtype=torch.float32)
    p = tmp_path / "t.bin"
    p.write_bytes(data.numpy().tobytes())
    fd = os.open(p, os.O_RDONLY)
    try:
        blk = transfer.FileBlock(fd, start, p.stat().st_size)
        cases = [(4 * 1010, torch.float32, (3, 4)), (4 * 2000, torch.float32, ()), (4 * 2001, torch.int32, (2, 0)),
                 (4 * 3000 + 2, torch.bfloat16, (7,)), (4 * 4000 + 1, torch.uint8, (3, 1, 2)),
                 (4 * 5000, torch.float64, (2, 2))]  # fmt: skip
        raw = torch.frombuffer(bytearray(p.read_bytes()), dtype=torch.uint8)
        for at, dtype, shape in cases:
            at += start  # inside the block's span
            v = blk.view(at, dtype, shape)
            n = math.prod(shape) * dtype.itemsize
            want = raw[at : at + n].clone().view(dtype).view(shape)
            assert v.dtype == dtype and v.shape == shape and v.is_contiguous() and torch.equal(v, want), (
                at,
                dtype,
            )
            assert blk.span_of(v) is not None or n == 0  # a view of the block's own mapping
        assert len(blk.typed) == 5  # float32, int32, bfloat16, uint8, float64: each made once
    finally:
        os.close(fd)
