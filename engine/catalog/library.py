"""`scan()`: the library — every model below some folders with its detection, from the cache when the
file is unchanged (same path, size and mtime_ns), read from its header otherwise. Hashes are only
looked up here; computing them is the background hasher's job (hashing.py).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..detect.file import error_detection
from ..detect.result import Detection, Failure
from ..jobs import CancelToken, Progress, Report, no_report
from .cache import LibraryCache
from .hashing import autov2
from .layout import Root, display_name, read_extra_model_paths
from .notes import read_notes
from .parallel import Detector, auto_workers, default_detector, detect_many
from .walk import Problem, discover

__all__ = ["Library", "LibraryEntry", "detector_fingerprint", "error_detection", "resolve_roots", "scan"]

log = logging.getLogger("loadout.catalog")

# Kinds a folder may declare that detection can also report: only these are compared for a mismatch.
DETECTABLE_KINDS = {
    "checkpoint", "diffusion_model", "vae", "vae_approx", "text_encoder", "clip_vision", "lora",
    "embedding", "controlnet", "ip_adapter", "upscaler",
}  # fmt: skip


@dataclass(frozen=True)
class LibraryEntry:
    """One model of the library with its (immutable) Detection; to_json() is its DESIGN.md JSON object."""

    path: str
    root: str
    declared_kind: str | None
    is_dir: bool
    size: int
    mtime_ns: int
    detection: Detection
    sha256: str | None
    old_hash: str | None
    preview: str | None
    notes: dict | None
    from_cache: bool

    @property
    def name(self) -> str:
        """What the window calls it (layout.display_name: a diffusers component by its folders)."""
        if self.is_dir:
            return os.path.basename(os.path.normpath(self.path))
        return display_name(self.path)

    @property
    def kind(self) -> str:
        return self.detection.kind

    @property
    def architecture(self) -> str | None:
        return self.detection.architecture

    @property
    def error(self) -> Failure | None:
        return self.detection.error

    @property
    def autov2(self) -> str | None:
        return autov2(self.sha256)

    @property
    def kind_mismatch(self) -> bool:
        """The folder says one kind and the header another (e.g. a LoRA in checkpoints/)."""
        return (
            self.declared_kind in DETECTABLE_KINDS
            and self.kind in DETECTABLE_KINDS
            and (not self.error or self.error.type == "unsupported")  # a GGUF still has a kind
            and self.declared_kind != self.kind
        )

    @property
    def matches_civitai(self) -> bool | None:
        """Whether the file's SHA-256 is the one its .civitai.info lists (None until both are known):
        False means a different or damaged download."""
        listed = (self.notes or {}).get("civitai_sha256")
        return None if not (listed and self.sha256) else listed == self.sha256

    def to_json(self) -> dict:
        d = self.detection.to_json()
        d["library"] = {
            "root": self.root,
            "declared_kind": self.declared_kind,
            "kind_mismatch": self.kind_mismatch,
            "is_dir": self.is_dir,
            "mtime_ns": self.mtime_ns,
            "sha256": self.sha256,
            "autov2": self.autov2,
            "model_hash_old": self.old_hash,
            "matches_civitai": self.matches_civitai,
            "preview": self.preview,
            "notes": self.notes,
            "from_cache": self.from_cache,
        }
        return d


@dataclass(frozen=True)
class Library:
    roots: tuple[Root, ...]
    entries: tuple[LibraryEntry, ...]
    problems: tuple[Problem, ...]
    read: int  # files whose header was read this time
    from_cache: int
    dropped: int  # cache rows of files that are gone
    seconds: float

    @property
    def bad(self) -> list[LibraryEntry]:
        """Entries that are not usable models: corrupt, truncated, not a model (not 'unsupported')."""
        return [e for e in self.entries if e.error and e.error.type != "unsupported"]

    def to_json(self) -> dict:
        return {
            "roots": [dataclasses.asdict(r) for r in self.roots],
            "entries": [e.to_json() for e in self.entries],
            "problems": [p.to_json() for p in self.problems],
            "stats": {"read": self.read, "from_cache": self.from_cache, "dropped": self.dropped,
                      "seconds": round(self.seconds, 3)},
        }  # fmt: skip


@functools.lru_cache(maxsize=1)
def detector_fingerprint() -> str:
    """Identifies the detection code: cached detections made by other code are read again."""
    from .. import __version__, detect

    h = hashlib.sha1(f"{__version__}/{getattr(detect, '__version__', '')}".encode())
    base = os.path.dirname(os.path.abspath(detect.__file__))
    for dirpath, _dirs, files in sorted(os.walk(base)):
        for name in sorted(files):
            if name.endswith(".py"):
                st = os.stat(os.path.join(dirpath, name))
                h.update(
                    f"{os.path.relpath(os.path.join(dirpath, name), base)}:{st.st_size}:{st.st_mtime_ns};".encode()
                )
    return "detect:" + h.hexdigest()[:16]


def resolve_roots(paths: Iterable[str | os.PathLike], *, follow_yaml: bool = True) -> list[Root]:
    """Command-line paths -> roots: a folder, a single model file, or an extra_model_paths.yaml; a
    folder holding an extra_model_paths.yaml (a ComfyUI install) also adds the folders it names."""
    roots: list[Root] = []
    for raw in paths:
        p = os.path.abspath(os.fspath(raw))
        if p.lower().endswith((".yaml", ".yml")) and os.path.isfile(p):
            roots += read_extra_model_paths(p)
            continue
        roots.append(Root(p))
        extra = os.path.join(p, "extra_model_paths.yaml")
        if follow_yaml and os.path.isfile(extra):
            roots += read_extra_model_paths(extra)
    return roots


def scan(
    paths: Iterable[str | os.PathLike] | None = None,
    *,
    roots: list[Root] | None = None,
    cache: LibraryCache | None = None,
    detector: Detector | None = None,
    detector_id: str | None = None,
    token: CancelToken | None = None,
    report: Report = no_report,
    workers: int | None = None,
) -> Library:
    """Scan folders into a Library. Reads only the headers of new or changed files; drops cache rows of
    files that are gone. `cache=None` uses the user's cache file. Cancelling keeps what was detected.
    `workers`: processes for reading headers (None = automatic: several only for big cold scans)."""
    t0 = time.perf_counter()
    token = token or CancelToken()
    roots = list(roots or []) + (resolve_roots(paths) if paths is not None else [])
    own_cache = cache is None
    cache = cache or LibraryCache()
    detector = detector or default_detector
    det_id = detector_id or detector_fingerprint()
    try:
        found, problems, unlisted = discover(roots, token, report)
        cached = cache.get_many(f.path for f in found)
        todo = [
            f
            for f in found
            if not (
                (c := cached.get(f.path))
                and c.matches(f.size, f.mtime_ns)
                and c.detector == det_id
                and c.detection is not None
            )
        ]
        fresh: dict[str, Detection] = {}
        pending: list[tuple] = []
        n_workers = auto_workers(len(todo), detector) if workers is None else workers
        try:
            for f, d, cacheable in detect_many(todo, detector, token, report, n_workers):
                fresh[f.path] = d
                if cacheable:
                    pending.append((f.path, f.size, f.mtime_ns, f.dev, f.ino, det_id, d))
                if len(pending) >= 256:
                    cache.put_detections(pending)
                    pending = []
        finally:
            if pending:  # a cancel keeps what was already read
                cache.put_detections(pending)
        report(Progress("Reading headers", len(todo), len(todo), "done"))
        if fresh:  # re-read the hash columns: a moved file takes its hashes along
            cached.update(cache.get_many(fresh, detections=False))

        seen = {f.path for f in found}
        gone = []
        for r in roots:
            if os.path.isdir(r.path):
                skip = [os.path.join(u, "") for u in unlisted]
                gone += [
                    p for p in cache.paths_under(r.path) if p not in seen and not p.startswith(tuple(skip))
                ]
        dropped = cache.drop(gone) if gone else 0

        entries = []
        for f in found:
            c = cached.get(f.path)
            same = c is not None and c.matches(f.size, f.mtime_ns)
            det = fresh.get(f.path)
            if det is None:
                det = c.detection
            entries.append(
                LibraryEntry(
                    f.path, f.root, f.declared_kind, f.is_dir, f.size, f.mtime_ns,
                    det,
                    c.sha256 if same else None, c.old_hash if same else None,
                    f.preview, read_notes(f.notes, os.path.basename(f.path)), f.path not in fresh,
                )
            )  # fmt: skip
        return Library(
            tuple(roots),
            tuple(entries),
            tuple(problems),
            len(todo),
            len(found) - len(todo),
            dropped,
            time.perf_counter() - t0,
        )
    finally:
        if own_cache:
            cache.close()
