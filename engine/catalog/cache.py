"""The library cache: one SQLite file in the user's cache folder, keyed by (path, size, mtime_ns).

A row holds a file's detection (as its Detection JSON text: the cache is one of the two places that JSON
is written, `--json` output the other) and, once the background hasher has run, its hashes. WAL mode
lets the GUI thread read while the engine thread writes; every thread gets its own connection (sqlite3
connections must not be shared between threads).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from ..detect.result import Detection
from ..errors import EngineError

log = logging.getLogger("loadout.catalog")
_ENCODE = msgspec.json.Encoder().encode
SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    path TEXT PRIMARY KEY,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    dev INTEGER, ino INTEGER,
    detector TEXT NOT NULL,
    detection TEXT NOT NULL,
    sha256 TEXT,
    old_hash TEXT,
    scanned_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS files_inode ON files(dev, ino, size, mtime_ns);
"""


def cache_dir() -> Path:
    """The user cache folder (platformdirs; XDG_CACHE_HOME on Linux), or $LOADOUT_CACHE_DIR."""
    env = os.environ.get("LOADOUT_CACHE_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_cache_dir("loadout", appauthor=False))


@dataclass(frozen=True)
class CachedFile:
    path: str
    size: int
    mtime_ns: int
    detector: str
    detection: Detection | None  # None: the stored JSON is no Detection we can read; detect again
    sha256: str | None
    old_hash: str | None

    def matches(self, size: int, mtime_ns: int) -> bool:
        return self.size == size and self.mtime_ns == mtime_ns


class LibraryCache:
    """Thread-safe access to the cache file: call from any thread, each gets its own connection."""

    def __init__(self, path: str | os.PathLike | None = None):
        self.path = Path(path) if path is not None else cache_dir() / "library.sqlite3"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._all: list[sqlite3.Connection] = []

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                try:
                    conn = self._open()
                except sqlite3.DatabaseError as e:
                    if "not a database" not in str(e) and "malformed" not in str(e):
                        raise
                    # The cache is only a cache: keep the damaged file aside for a bug report, start afresh.
                    log.warning("library cache %s is damaged (%s); starting a new one", self.path, e)
                    os.replace(self.path, self.path.with_name(self.path.name + ".damaged"))
                    for suffix in ("-wal", "-shm"):
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(str(self.path) + suffix)
                    conn = self._open()
            except (OSError, sqlite3.Error) as e:
                raise EngineError(
                    f"cannot open the library cache {self.path} ({e}); set LOADOUT_CACHE_DIR to a writable folder"
                ) from e
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def _open(self) -> sqlite3.Connection:
        # check_same_thread=False only so close() can close every thread's connection at shutdown;
        # each connection is otherwise used by the thread that opened it.
        conn = sqlite3.connect(self.path, timeout=30, check_same_thread=False, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, SCHEMA_VERSION):
                # An older or newer layout: the cache is only a cache, start it afresh.
                conn.execute("DROP TABLE IF EXISTS files")
            conn.executescript(_SCHEMA)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for c in conns:
            c.close()
        self._local = threading.local()

    def __enter__(self) -> LibraryCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @staticmethod
    def _row(r) -> CachedFile:
        try:
            det = Detection.from_json(msgspec.json.decode(r[4]))  # json.loads' answer, 2-3x sooner
        except ValueError as e:  # JSONDecodeError included: a row of another version is detected again
            log.debug("cached detection of %s unreadable (%s): detecting it again", r[0], e)
            det = None
        return CachedFile(r[0], r[1], r[2], r[3], det, r[5], r[6])

    _COLS = "path, size, mtime_ns, detector, detection, sha256, old_hash"

    def get(self, path: str) -> CachedFile | None:
        r = self._conn().execute(f"SELECT {self._COLS} FROM files WHERE path = ?", (path,)).fetchone()
        return self._row(r) if r else None

    def get_many(self, paths: Iterable[str], *, detections: bool = True) -> dict[str, CachedFile]:
        """The rows of `paths` that are cached. `detections=False` leaves each row's detection None
        unread: a scan that has just detected the files only wants their hash columns back, and
        rebuilding 1,000 Detections from their JSON would cost 20 ms for nothing."""
        paths = list(paths)
        out: dict[str, CachedFile] = {}
        conn = self._conn()
        cols = self._COLS if detections else self._COLS.replace("detection", "NULL")
        row = self._row if detections else self._row_without_detection
        for i in range(0, len(paths), 500):  # SQLite limits the number of bound variables
            chunk = paths[i : i + 500]
            q = f"SELECT {cols} FROM files WHERE path IN ({','.join('?' * len(chunk))})"
            for r in conn.execute(q, chunk):
                out[r[0]] = row(r)
        return out

    @staticmethod
    def _row_without_detection(r) -> CachedFile:
        return CachedFile(r[0], r[1], r[2], r[3], None, r[5], r[6])

    def all(self) -> list[CachedFile]:
        """Every cached file (what the GUI shows before a scan has finished)."""
        return [self._row(r) for r in self._conn().execute(f"SELECT {self._COLS} FROM files ORDER BY path")]

    def put_detections(self, rows: Iterable[tuple[str, int, int, int, int, str, Detection]]) -> None:
        """Store (path, size, mtime_ns, dev, ino, detector, detection) rows in one transaction.

        Hashes survive when size and mtime are unchanged (a new detector version does not change the
        bytes); a changed file loses them. A file moved within a filesystem keeps its inode and mtime,
        so its hashes are taken over from the old row.
        """
        now = time.time()
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            for path, size, mtime_ns, dev, ino, detector, detection in rows:
                conn.execute(
                    """INSERT INTO files (path, size, mtime_ns, dev, ino, detector, detection, scanned_at,
                                          sha256, old_hash)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?,
                               (SELECT sha256 FROM files WHERE dev=?4 AND ino=?5 AND size=?2 AND mtime_ns=?3
                                AND sha256 IS NOT NULL LIMIT 1),
                               (SELECT old_hash FROM files WHERE dev=?4 AND ino=?5 AND size=?2 AND mtime_ns=?3
                                AND old_hash IS NOT NULL LIMIT 1))
                       ON CONFLICT(path) DO UPDATE SET
                         sha256 = CASE WHEN files.size = excluded.size AND files.mtime_ns = excluded.mtime_ns
                                  THEN files.sha256 ELSE excluded.sha256 END,
                         old_hash = CASE WHEN files.size = excluded.size AND files.mtime_ns = excluded.mtime_ns
                                    THEN files.old_hash ELSE excluded.old_hash END,
                         size = excluded.size, mtime_ns = excluded.mtime_ns, dev = excluded.dev,
                         ino = excluded.ino, detector = excluded.detector, detection = excluded.detection,
                         scanned_at = excluded.scanned_at""",
                    # msgspec writes the row's JSON in a quarter of json.dumps' time (a cold scan stores
                    # every file's); _row reads it back with msgspec too
                    (path, size, mtime_ns, dev, ino, detector, _ENCODE(detection.to_json()).decode(), now),
                )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    def put_hashes(self, path: str, size: int, mtime_ns: int, sha256: str, old_hash: str | None) -> bool:
        """Record hashes computed for the file as it was at (size, mtime_ns). False when the row is gone
        or the file changed meanwhile (the hashes would describe bytes that are no longer there)."""
        cur = self._conn().execute(
            "UPDATE files SET sha256 = ?, old_hash = ? WHERE path = ? AND size = ? AND mtime_ns = ?",
            (sha256, old_hash, path, size, mtime_ns),
        )
        return cur.rowcount == 1

    def paths_under(self, folder: str) -> list[str]:
        """Cached paths inside `folder` (prefix match on the folder plus a separator)."""
        prefix = os.path.join(folder, "")
        # Range query on the primary key: every string that starts with prefix sorts in [prefix, prefix+\uffff).
        q = "SELECT path FROM files WHERE path >= ? AND path < ?"
        return [r[0] for r in self._conn().execute(q, (prefix, prefix + "\uffff"))]

    def drop(self, paths: Iterable[str]) -> int:
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            n = sum(conn.execute("DELETE FROM files WHERE path = ?", (p,)).rowcount for p in paths)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return n
