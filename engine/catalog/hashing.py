"""File hashes as the community uses them, computed off the scan's path (they read whole files).

* SHA-256 of the whole file; A1111's "AutoV2" short hash is its first 10 hex digits (A1111
  `modules/sd_models.py`: `shorthash = sha256[0:10]`), which Civitai also shows.
* A1111's old "model hash" (AutoV1): SHA-256 of the 0x10000 bytes at offset 0x100000, first 8 hex
  digits (A1111 `model_hash()`, kohya `train_util.model_hash`). It is taken from the same single pass.

Hashing runs in a background thread (`BackgroundHasher`) or on explicit request (`loadout scan
--hash`), never inside a scan; it reports Progress in bytes and stops at the next chunk when cancelled.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..errors import Cancelled, FormatError
from ..jobs import CancelToken, Progress, Report, no_report
from .cache import LibraryCache

CHUNK = 8 * 1024 * 1024
OLD_HASH_OFFSET, OLD_HASH_LEN = 0x100000, 0x10000


@dataclass(frozen=True)
class FileHashes:
    sha256: str
    old_hash: str  # A1111's legacy 8-digit model hash

    @property
    def autov2(self) -> str:
        return self.sha256[:10]


def autov2(sha256: str | None) -> str | None:
    return sha256[:10] if sha256 else None


def hash_file(
    path: str | os.PathLike,
    token: CancelToken | None = None,
    report: Report = no_report,
    *,
    chunk: int = CHUNK,
    done_before: int = 0,
    total: int = 0,
) -> FileHashes:
    """SHA-256 and the old A1111 hash of one file, in one sequential pass of `chunk`-sized reads.

    Progress counts bytes; `done_before`/`total` let a caller report one bar over many files.
    """
    p = os.fspath(path)
    token = token or CancelToken()
    whole = hashlib.sha256()
    window = bytearray()  # the bytes of [OLD_HASH_OFFSET, OLD_HASH_OFFSET + OLD_HASH_LEN)
    pos = 0
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            total = total or size
            name = os.path.basename(p)
            while True:
                token.raise_if_cancelled()
                buf = f.read(chunk)
                if not buf:
                    break
                whole.update(buf)
                lo, hi = max(pos, OLD_HASH_OFFSET), min(pos + len(buf), OLD_HASH_OFFSET + OLD_HASH_LEN)
                if lo < hi:
                    window += buf[lo - pos : hi - pos]
                pos += len(buf)
                report(Progress("Hashing", done_before + pos, total, name))
    except OSError as e:
        raise FormatError(f"{p}: cannot read the file to hash it ({e.strerror or e})") from e
    # A file shorter than 1 MiB hashes an empty window, exactly as A1111 does (it reads past the end).
    return FileHashes(whole.hexdigest(), hashlib.sha256(bytes(window)).hexdigest()[:8])


def is_sparse(st: os.stat_result) -> bool:
    """True for a mostly-hole file (a header-faithful test fixture): hashing it would read gigabytes of
    zeros for a hash that identifies nothing. Where st_blocks is unknown (Windows) nothing is sparse."""
    blocks = getattr(st, "st_blocks", None)
    return blocks is not None and st.st_size > 64 * 2**20 and blocks * 512 < st.st_size // 8


@dataclass
class HashRun:
    """What a hashing run did: hashes per path, files skipped (with why) and failures."""

    hashed: dict[str, FileHashes] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


def hash_missing(
    items: Iterable[tuple[str, int, int]],
    cache: LibraryCache | None,
    token: CancelToken | None = None,
    report: Report = no_report,
    *,
    include_sparse: bool = False,
    on_hashed: Callable[[str, FileHashes], None] | None = None,
    run: HashRun | None = None,
) -> HashRun:
    """Hash each (path, size, mtime_ns) and store the result in `cache` if the file is still the same.

    Folders (diffusers) and sparse fixtures are skipped; a file that changed since it was scanned is
    skipped too (a later scan will list it again). Cancelling keeps every hash finished so far.
    """
    token = token or CancelToken()
    run = run if run is not None else HashRun()  # a caller's run keeps what was done before a cancel
    todo = []
    for path, size, mtime_ns in items:
        try:
            st = os.stat(path)
        except OSError as e:
            run.failed[path] = f"cannot read: {e.strerror or e}"
            continue
        if os.path.isdir(path):
            run.skipped[path] = "not hashed: a folder (diffusers layout)"
        elif (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
            run.skipped[path] = "changed since the scan: scan again"
        elif is_sparse(st) and not include_sparse:
            run.skipped[path] = "not hashed: a sparse file (header-only fixture)"
        else:
            todo.append((path, size, mtime_ns))
    total = sum(s for _, s, _ in todo)
    done = 0
    for path, size, mtime_ns in todo:
        token.raise_if_cancelled()
        try:
            h = hash_file(path, token, report, done_before=done, total=total)
        except FormatError as e:
            run.failed[path] = e.message
            done += size
            continue
        done += size
        if cache is not None and not cache.put_hashes(path, size, mtime_ns, h.sha256, h.old_hash):
            run.skipped[path] = "changed or removed while hashing"
            continue
        run.hashed[path] = h
        if on_hashed:
            on_hashed(path, h)
    report(Progress("Hashing", done, total, "done"))
    return run


class BackgroundHasher:
    """Hash files in a daemon thread so neither the GUI nor a scan waits for whole-file reads.

    `start()` returns at once; `progress` holds the latest Progress; `cancel()` stops at the next chunk;
    `join()` waits and returns the HashRun (or re-raises an unexpected error from the thread).
    """

    def __init__(
        self,
        cache: LibraryCache,
        *,
        on_hashed: Callable[[str, FileHashes], None] | None = None,
        report: Report = no_report,
    ):
        self.cache = cache
        self._report = report  # called in the hasher thread: a GUI forwards it through a queued signal
        self.token = CancelToken()
        self.progress: Progress | None = None
        self.on_hashed = on_hashed
        self.result: HashRun | None = None
        self.cancelled = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def start(self, items: Iterable[tuple[str, int, int]]) -> BackgroundHasher:
        items = list(items)
        self._thread = threading.Thread(target=self._run, args=(items,), name="loadout-hasher", daemon=True)
        self._thread.start()
        return self

    def _run(self, items) -> None:
        def report(p: Progress) -> None:
            self.progress = p
            self._report(p)

        self.result = HashRun()
        try:
            hash_missing(items, self.cache, self.token, report, on_hashed=self.on_hashed, run=self.result)
        except Cancelled:
            self.cancelled = True
        except BaseException as e:  # handed to join() so the owner sees it with its stack
            self._error = e

    def cancel(self) -> None:
        self.token.cancel("Hashing stopped.")

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def join(self, timeout: float | None = None) -> HashRun | None:
        if self._thread is not None:
            self._thread.join(timeout)
        if self._error is not None:
            raise self._error
        return self.result
