"""detect_file: open a file's header (never its tensor data) and detect it; every failure becomes an
`error` in the Detection, never an exception, so a library scan or `loadout inspect` always has an answer."""

from __future__ import annotations

import dataclasses
import logging
import os
import stat

from ..errors import Cancelled, EngineError, FormatError
from ..gcpause import gc_paused
from ..jobs import CancelToken, Progress, Report, no_report
from .result import Detection, Evidence, Failure

log = logging.getLogger(__name__)


def detect_file(path: str | os.PathLike, *, read_values: bool = False) -> Detection:
    """Detect one file (or a diffusers folder) from its header. read_values=True additionally reads the
    few weight values that SD2's v-prediction check needs (opt-in; still no full tensor load)."""
    p = os.fspath(path)
    size = None
    fmt = None
    try:
        st = os.stat(p)  # one stat for both questions (a library scan asks them of every file)
        if stat.S_ISDIR(st.st_mode):
            from .folder import detect_folder

            return detect_folder(p)
        size = st.st_size
        # Imported here, so the catalog's error_detection and guarded do not load the rules.
        from ..formats import open_index, sniff
        from ..formats.magic import what_file_is
        from .core import detect_index

        fmt = sniff(p)
        if fmt == "empty":
            raise FormatError("the file is empty (0 bytes): an interrupted download or copy?")
        if fmt == "unknown":
            what = what_file_is(p)
            if size < 64 and what != "a text file":
                raise FormatError(f"the file is only {size} bytes long: a truncated download?")
            raise FormatError(f"this is {what}, not a model file")
        index = open_index(p, fmt)  # headers only: safetensors JSON, a torch zip's data.pkl, GGUF tables
        d = detect_index(index, path=p)
        if d.file_bytes is None:
            d = dataclasses.replace(d, file_bytes=size)
        if read_values:
            d = _check_values(p, d)
        return d
    except EngineError as e:
        return Detection(path=p, file_bytes=size, format=fmt, error=failure_of(e, p))
    except OSError as e:
        msg = f"cannot read the file ({e.strerror or e})"
        return Detection(path=p, file_bytes=size, format=fmt, error=Failure("format", msg))
    except Exception as e:  # a reader bug: one odd file must not end a library scan; logged with its stack
        log.debug("detecting %s failed", p, exc_info=True)  # no stack on a user's console
        msg = f"Loadout could not read this file ({type(e).__name__}: {e}); please report it"
        return Detection(path=p, file_bytes=size, format=fmt, error=Failure("error", msg))


def failure_of(e: EngineError, path: str) -> Failure:
    """A Detection's `error` from the exception a reader raised: its message without the file's path
    in front (a reader names the file for a caller that has nothing else; the Detection holds its path
    beside the message, and every listing shows it there). errors.from_json puts it back for a
    command that stops on the file."""
    message = e.message
    for prefix in (f"{path}: ", f"{os.path.basename(path)}: "):
        if message.startswith(prefix) and len(message) > len(prefix):
            message = message[len(prefix) :]
            break
    return Failure(e.type, message)


def error_detection(path: str, size: int | None, error: Failure) -> Detection:
    """The Detection of a file that could not be detected."""
    return Detection(path=path, file_bytes=size, format=None, error=error)


def guarded(detector, path: str, size: int | None) -> tuple[Detection, bool]:
    """A library scan's detection of one file: (detection, cacheable). Errors become the entry's
    `error`; one bad file never stops a scan; a cancel does (nothing of it is cached)."""
    try:
        with gc_paused():  # a header's thousands of short-lived objects hold no cycles
            return detector(path), True
    except Cancelled:
        raise
    except EngineError as e:
        return error_detection(path, size, failure_of(e, path)), True
    except Exception as e:  # a bug in detection must not hide the rest of the library; not cached
        log.exception("detection failed on %s", path)
        msg = (
            f"Loadout could not inspect this file ({type(e).__name__}: {e}); this is a bug, please report it"
        )
        return error_detection(path, size, Failure("internal", msg)), False


def detect_chunk(items: list[tuple[str, int]]) -> list[tuple[str, Detection, bool]]:
    """A scan worker's task (engine.catalog.parallel): detect a few files. It lives here so that a
    worker process imports engine.detect alone."""
    return [(p, *guarded(detect_file, p, size)) for p, size in items]


def detect_files(
    paths, *, read_values: bool = False, token: CancelToken | None = None, report: Report = no_report
) -> tuple[Detection, ...]:
    """detect_file for each path, in order, with a cancel check and a Progress between files. Even a
    bug in detection yields an answer for its file (with `error`), never a traceback."""
    token = token or CancelToken()
    out = []
    for i, p in enumerate(paths):
        token.raise_if_cancelled()
        report(Progress("Reading headers", i, len(paths), os.path.basename(os.fspath(p))))
        try:
            out.append(detect_file(p, read_values=read_values))
        except Exception as e:  # detect_file reports its own failures; this is a bug outside its guard
            log.debug("detecting %s failed", p, exc_info=True)  # no stack on a user's console
            msg = f"detection failed unexpectedly ({type(e).__name__}: {e}); please report this file"
            out.append(
                Detection(path=os.fspath(p), file_bytes=None, format=None, error=Failure("error", msg))
            )
    report(Progress("Reading headers", len(paths), len(paths), "done"))
    return tuple(out)


def _check_values(path: str, d: Detection) -> Detection:
    """The opt-in SD2 v-prediction check (see values.py)."""
    if d.architecture != "sd2" or d.prediction is not None or d.error is not None:
        return d
    if d.format not in ("safetensors", "torch-zip"):
        why = f"the SD2 value check reads .safetensors and torch-zip files, not {d.format}; prediction left unknown"
        return dataclasses.replace(d, evidence=d.evidence + (Evidence("", None, why),))
    from .values import SD2_V_THRESHOLD, sd2_is_v

    prefix = d.components["unet"].prefix if "unet" in d.components else ""
    try:
        is_v, std, key = sd2_is_v(path, prefix, d.format)
    except (KeyError, EngineError) as e:
        ev = Evidence(prefix, None, f"SD2 value check not possible ({e}); prediction left unknown")
        return dataclasses.replace(d, evidence=d.evidence + (ev,))
    pred = "v" if is_v else "eps"
    info = d.evidence + (
        Evidence(
            key,
            None,
            f"std of these weights {std:.4f} {'>' if is_v else '≤'} {SD2_V_THRESHOLD} → {pred}-prediction",
        ),
    )
    return dataclasses.replace(d, prediction=pred, evidence=info)
