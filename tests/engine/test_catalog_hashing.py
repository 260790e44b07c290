"""Hashes: SHA-256, A1111 AutoV2 and the old A1111 model hash; background hashing with cancel; the cache."""

from __future__ import annotations

import hashlib
import os
import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.catalog import BackgroundHasher, LibraryCache, hash_file, hash_missing, is_sparse
from engine.detect import Detection
from engine.errors import Cancelled
from engine.jobs import CancelToken


def dense(path, n: int, seed: int = 0) -> str:
    data = random.Random(seed).randbytes(n)
    with open(path, "wb") as f:
        f.write(data)
    return str(path)


def reference(path) -> tuple[str, str]:
    """SHA-256 of the whole file, and A1111's old hash written the way A1111 defines it (seek + read)."""
    with open(path, "rb") as f:
        whole = hashlib.sha256(f.read()).hexdigest()
        f.seek(0x100000)
        old = hashlib.sha256(f.read(0x10000)).hexdigest()[:8]
    return whole, old


def test_hashes_match_the_definitions_on_a_file_past_the_old_hash_window(tmp_path):
    p = dense(tmp_path / "m.safetensors", 0x100000 + 0x10000 + 12345)
    h = hash_file(p)
    assert (h.sha256, h.old_hash) == reference(p)
    assert h.autov2 == h.sha256[:10] and len(h.autov2) == 10


def test_small_file_old_hash_is_the_hash_of_nothing_as_in_a1111(tmp_path):
    p = dense(tmp_path / "tiny.pt", 1000)
    assert hash_file(p).old_hash == hashlib.sha256(b"").hexdigest()[:8] == reference(p)[1]


@settings(deadline=None, max_examples=25)
@given(size=st.integers(0x100000 - 70000, 0x100000 + 0x10000 + 70000), chunk=st.integers(1000, 300000))
def test_chunking_never_changes_the_hashes(tmp_path_factory, size, chunk):
    p = dense(tmp_path_factory.mktemp("h") / "f.bin", size, seed=size)
    h = hash_file(p, chunk=chunk)
    assert (h.sha256, h.old_hash) == reference(p)


def test_progress_counts_bytes_and_cancel_stops_between_chunks(tmp_path):
    p = dense(tmp_path / "f.bin", 5 * 65536)
    seen = []
    hash_file(p, report=seen.append, chunk=65536)
    assert [s.done for s in seen] == [65536 * i for i in range(1, 6)] and seen[-1].total == 5 * 65536
    token = CancelToken()

    def cancel_after_two(prog):
        if prog.done >= 2 * 65536:
            token.cancel()

    with pytest.raises(Cancelled):
        hash_file(p, token, cancel_after_two, chunk=65536)


def test_sparse_fixtures_are_recognised_and_not_hashed(tmp_path):
    sparse = tmp_path / "big.safetensors"
    with open(sparse, "wb") as f:
        f.write(b"x" * 100)
        f.truncate(2 * 2**30)  # a 2 GiB hole: never read in a test
    small = dense(tmp_path / "small.safetensors", 5000)
    assert is_sparse(os.stat(sparse)) and not is_sparse(os.stat(small))
    items = [(str(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (sparse, small)]
    run = hash_missing(items, None)
    assert list(run.hashed) == [small] and "sparse" in run.skipped[str(sparse)]


def _row(cache, path):
    st = os.stat(path)
    det = Detection(path, st.st_size, "safetensors", kind="lora")
    cache.put_detections([(path, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, "t", det)])
    return path, st.st_size, st.st_mtime_ns


def test_hashes_are_cached_and_a_changed_file_loses_them(tmp_path):
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        a = dense(tmp_path / "a.bin", 3000, 1)
        item = _row(cache, a)
        run = hash_missing([item], cache)
        assert cache.get(a).sha256 == run.hashed[a].sha256 == reference(a)[0]
        # same bytes, detection refreshed (a new detector): hashes stay
        _row(cache, a)
        assert cache.get(a).sha256 == reference(a)[0]
        # the file changes: hashes of the old bytes are dropped
        dense(a, 4000, 2)
        os.utime(a, ns=(item[2] + 10**9, item[2] + 10**9))
        _row(cache, a)
        assert cache.get(a).sha256 is None
        # a stale (path, size, mtime) is not hashed: the file changed after the scan
        run = hash_missing([item], cache)
        assert run.hashed == {} and "changed" in run.skipped[a]


def test_a_moved_file_keeps_its_hashes(tmp_path):
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        a = dense(tmp_path / "a.bin", 3000, 1)
        hash_missing([_row(cache, a)], cache)
        b = str(tmp_path / "b.bin")
        os.rename(a, b)
        _row(cache, b)
        assert cache.get(b).sha256 == reference(b)[0]


def test_background_hasher_runs_in_another_thread_and_cancels(tmp_path):
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        files = [dense(tmp_path / f"{i}.bin", 200_000, i) for i in range(4)]
        items = [_row(cache, f) for f in files]
        threads = []
        hasher = BackgroundHasher(
            cache, on_hashed=lambda p, h: threads.append(threading.current_thread().name)
        )
        run = hasher.start(items).join(timeout=60)
        assert set(run.hashed) == set(files) and set(threads) == {"loadout-hasher"}
        assert all(cache.get(f).sha256 == reference(f)[0] for f in files)  # read from this thread

        # Cancel: the token is checked per chunk, so a cancel before start hashes nothing and keeps state.
        more = [_row(cache, dense(tmp_path / f"m{i}.bin", 200_000, 10 + i)) for i in range(2)]
        h2 = BackgroundHasher(cache)
        h2.cancel()
        run2 = h2.start(more).join(timeout=60)
        assert h2.cancelled and run2.hashed == {} and cache.get(more[0][0]).sha256 is None
