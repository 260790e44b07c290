"""`loadout scan DIR… [--json] [--hash]`: the library — every model file below the folders with its
detection, read from the cache when unchanged. Hashes are shown from the cache; `--hash` computes the
missing ones (whole-file reads, progress on stderr).

Exit status: 0 when every model file found is usable; 3 when a path given does not exist, or any file
found is bad (corrupt, truncated, not a model) or unreadable — the others are still listed. Real models
in formats Loadout cannot load yet (`error.type == "unsupported"`, e.g. nvfp4 or bitsandbytes 4-bit) are listed and do not make
the scan fail; neither do folders an extra_model_paths.yaml names but that do not exist (ComfyUI's
example file names several that most people do not have): they are listed under problems.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

from ..formatting import algo_names
from ..jobs import Progress, no_report
from ._common import EXIT_BAD_INPUT, EXIT_OK, human_bytes, print_error, print_json

NAME = "scan"
HELP = "list every model file in folders (ComfyUI, A1111/Forge, extra_model_paths.yaml, any folder)"
DESCRIPTION = __doc__


def add_arguments(p) -> None:
    p.add_argument(
        "paths", nargs="+", metavar="DIR", help="folders, model files or extra_model_paths.yaml files to scan"
    )
    p.add_argument("--json", action="store_true", help="print a JSON array, one Detection object per file")
    p.add_argument(
        "--hash", action="store_true", help="compute missing SHA-256 / AutoV2 hashes (reads whole files)"
    )


class _StderrProgress:
    """Progress on stderr at most a few times a second: one rewritten line on a terminal, lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.finished: tuple | None = None

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        final = bool(p.total) and p.done >= p.total
        if final and self.finished == (p.stage, p.total):
            return  # one final line per stage
        if now - self.last < (0.2 if self.tty else 2.0) and not final:
            return
        if final:
            self.finished = (p.stage, p.total)
        self.last = now
        if p.fraction is None:
            count = f"{p.done} so far in"  # the walk: no total yet
        elif p.stage == "Hashing":  # done and total are bytes
            count = f"{100 * p.fraction:5.1f}% {human_bytes(p.done)} of {human_bytes(p.total)}"
        else:  # files: the counts, then the share
            count = f"{p.done}/{p.total} files ({100 * p.fraction:.0f}%)"
        line = f"{p.stage}: {count} {p.detail}"
        if self.tty:
            sys.stderr.write("\r" + line[:120].ljust(120) + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def _problem_json(p) -> dict:
    from ..catalog import error_detection
    from ..detect import Failure

    d = error_detection(p.path, None, Failure(p.type, p.message)).to_json()
    del d["summary"]  # a problem (a missing or unreadable folder) is no file: its object never had one
    d["library"] = {"problem": True}
    return d


def _with_hashes(lib, done) -> object:
    """The library with the hashes a HashFiles request computed."""
    sha, old = dict(done.hashed), dict(done.old_hashes)
    entries = tuple(
        dataclasses.replace(e, sha256=sha[e.path], old_hash=old.get(e.path)) if e.path in sha else e
        for e in lib.entries
    )
    return dataclasses.replace(lib, entries=entries)


def _print_human(lib, notes: dict) -> None:
    rows = []
    for e in lib.entries:
        lora = e.detection.lora
        arch = e.architecture or "-"
        if lora and lora.algos:
            arch += f" ({algo_names(lora.algos)})"
        rel = os.path.relpath(e.path, e.root)
        flag = ""
        if e.error:
            flag = f"  ! {e.error.type}: {e.error.message}"
        elif e.kind_mismatch:
            flag = f"  (in a {e.declared_kind} folder)"
        if e.path in notes:
            flag += f"  [{notes[e.path]}]"
        if e.matches_civitai is False:
            flag += "  ! SHA-256 differs from the one its .civitai.info lists (another or a damaged download)"
        rows.append(
            (
                e.kind or "-",
                arch,
                human_bytes(e.size),
                e.autov2 or "-",
                rel + ("/" if e.is_dir else "") + flag,
            )
        )
    if rows:
        w0 = max(4, *(len(r[0]) for r in rows))
        w1 = max(4, *(len(r[1]) for r in rows))
        print(f"{'KIND':<{w0}}  {'ARCH':<{w1}}  {'SIZE':>9}  {'AUTOV2':<10}  PATH")
        for r in rows:
            print(f"{r[0]:<{w0}}  {r[1]:<{w1}}  {r[2]:>9}  {r[3]:<10}  {r[4]}")
    for p in lib.problems:
        print(f"problem: {p.path}: {p.message}")
    bad = len(lib.bad)
    print(
        f"{len(lib.entries)} model files ({lib.from_cache} from cache, {lib.read} read) in {lib.seconds:.2f} s"
        + (f"; {bad} bad" if bad else "")
    )


def run(args) -> int:
    from ..catalog import scan

    missing = [p for p in args.paths if not os.path.exists(p)]
    for p in missing:
        print_error(f"{p}: no such file or folder")
    report = _StderrProgress() if sys.stderr.isatty() else no_report
    # What the window's Scan request runs (Engine.scan hands it to catalog.scan), called directly: the
    # facade and its request and event classes cost a warm re-scan ~20 ms of imports, a sixth of its run.
    lib = scan([p for p in args.paths if p not in missing], report=report)
    hash_notes: dict = {}
    if args.hash:
        from ..facade import Engine
        from ..requests import HashFiles

        todo = tuple((e.path, e.size, e.mtime_ns) for e in lib.entries if not e.sha256 and not e.is_dir)
        done = Engine().run(HashFiles(todo), report=_StderrProgress())
        lib, hash_notes = _with_hashes(lib, done), {**dict(done.skipped), **dict(done.failed)}
    if args.json:
        out = [e.to_json() for e in lib.entries] + [_problem_json(p) for p in lib.problems]
        print_json(out, plain=True)
    else:
        _print_human(lib, hash_notes)
    unreadable = [p for p in lib.problems if p.type == "unreadable"]
    return EXIT_BAD_INPUT if (missing or lib.bad or unreadable) else EXIT_OK
