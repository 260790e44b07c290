"""Reading many headers: in this process, or — for a big cold scan — in worker processes.

Header parsing and detection are pure Python, so threads would queue on the GIL; worker processes
(forked from a one-thread command line, else spawned: the GUI has threads, and a fork copies their
locks; see start_method) parse in parallel and send
back Detection objects (pickled). Workers import engine.detect only (no torch, no Qt, not the catalog:
the worker's function is engine.detect.file.detect_chunk, so a worker starts 40 ms sooner). Results arrive in completion
order; the caller stores them as they come, so a cancel keeps everything finished so far.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator

from ..cpus import usable_cpus
from ..detect.file import detect_chunk, guarded
from ..detect.result import Detection
from ..jobs import CancelToken, Progress, Report
from .walk import Found

log = logging.getLogger("loadout.catalog")

Detector = Callable[[str], Detection]
MIN_FILES_FOR_WORKERS = 128  # below this, starting processes costs more than it saves
CHUNK = 16


def default_detector(path: str):
    from .. import detect  # resolved per call, so a wrapped engine.detect.detect_file is honoured

    return detect.detect_file(path)


def detect_one(detector: Detector, path: str, size: int) -> tuple[Detection, bool]:
    """(detection, cacheable). Errors become the entry's `error`; one bad file never stops a scan."""
    return guarded(detector, path, size)


def auto_workers(n_files: int, detector: Detector) -> int:
    """How many worker processes a scan of `n_files` new files should use (1 = none).

    Only the default detector can run in a worker (a caller's function may not be importable there),
    and not in a frozen app until its entry point calls multiprocessing.freeze_support().
    """
    if detector is not default_detector or n_files < MIN_FILES_FOR_WORKERS or getattr(sys, "frozen", False):
        return 1
    # One worker per usable CPU: the scanning process itself only waits and stores results, and the
    # workers run at a lower priority (_lower_priority), so the window's thread still gets a core when
    # it needs one. On 2 CPUs this halves a big cold scan (measured: 2.2 s against 4.2 s in one process).
    return max(1, min(8, usable_cpus(), n_files // CHUNK))


def start_method() -> str:
    """How scan workers start: forked where that is safe, else spawned.

    A forked worker starts with the rules already imported: 0.1 s sooner than a spawned one, which
    starts an interpreter and imports engine.detect (5 % of a 1,000-file cold scan on 2 cores). Safe
    means one thread in this process (the command line): a fork copies only the calling thread, so a
    lock another thread held (the window's, torch's thread pools, Qt's) would stay locked in the
    child. Never on macOS, whose system libraries refuse to run after a fork."""
    import threading

    if (
        sys.platform.startswith("linux")
        and threading.active_count() == 1
        and not any(m in sys.modules for m in ("torch", "PySide6.QtCore"))
    ):
        return "fork"
    return "spawn"


def _lower_priority() -> None:
    """Worker initializer: below the app's priority, so a big scan never makes the window stutter."""
    try:
        if hasattr(os, "nice"):  # POSIX: no psutil import, 16 ms of each worker's start
            os.nice(5)  # the kernel caps it at 19
        else:
            import psutil

            psutil.Process().nice(psutil.BELOW_NORMAL_PRIORITY_CLASS)
    except Exception:  # noqa: BLE001 - a priority we cannot set only costs responsiveness
        log.debug("could not lower a scan worker's priority", exc_info=True)


def detect_many(
    todo: list[Found], detector: Detector, token: CancelToken, report: Report, workers: int
) -> Iterator[tuple[Found, Detection, bool]]:
    """Yield (found, detection, cacheable) for every file of `todo`, reporting Progress."""
    n = len(todo)
    if workers <= 1 or n == 0:
        for i, f in enumerate(todo):
            report(Progress("Reading headers", i, n, os.path.basename(f.path)))
            token.raise_if_cancelled()  # after the report, so a cancel from a progress callback counts
            yield (f, *detect_one(detector, f.path, f.size))
        return
    # Imported here: a scan that finds nothing new (most of them) never starts a worker.
    import concurrent.futures as cf
    import multiprocessing

    by_path = {f.path: f for f in todo}
    # Biggest files first: a checkpoint's header (2,500 tensors) costs ten LoRAs', so the chunks left
    # when one worker runs dry are cheap ones, and the two workers finish together instead of one
    # waiting on the other's last checkpoints. Results are keyed by path; their order never mattered.
    order = sorted(todo, key=lambda f: -f.size)
    chunks = [[(f.path, f.size) for f in order[i : i + CHUNK]] for i in range(0, n, CHUNK)]
    ex = cf.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context(start_method()), initializer=_lower_priority
    )
    try:
        futures = [ex.submit(detect_chunk, c) for c in chunks]
        done = 0
        for fut in cf.as_completed(futures):
            token.raise_if_cancelled()
            for path, d, cacheable in fut.result():
                done += 1
                yield by_path[path], d, cacheable
            report(Progress("Reading headers", done, n, os.path.basename(path)))
    finally:
        ex.shutdown(wait=True, cancel_futures=True)  # a cancel waits only for chunks already running
