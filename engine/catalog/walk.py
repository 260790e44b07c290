"""Finding model files under library roots: follows symlinks without looping, reports what it cannot
read instead of failing, treats a diffusers folder (model_index.json) as one model, and notes the
preview and note sidecars next to each model from the directory listing it already has.
"""

from __future__ import annotations

import os
import stat as stat_mod
from dataclasses import dataclass

from ..jobs import CancelToken, Progress, Report, no_report
from .layout import Root, declared_kind_for_path, is_model_file

# Sidecar names, in the order they are preferred: an explicit `.preview.*` first, then a bare image.
PREVIEW_SUFFIXES = tuple(
    f"{infix}{ext}" for infix in (".preview", "") for ext in (".png", ".jpg", ".jpeg", ".webp")
)
NOTE_SUFFIXES = (".civitai.info", ".json")


@dataclass(frozen=True)
class Found:
    """One model in the library: a file, or a diffusers folder (is_dir)."""

    path: str  # as found below its root (symlinks not resolved, so users see their own names)
    root: str
    declared_kind: str | None
    is_dir: bool
    size: int  # for a folder: the sum of its files
    mtime_ns: int  # for a folder: the newest of its files
    dev: int
    ino: int
    preview: str | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Problem:
    """Something below a root that could not be read (a file or a folder): reported, not fatal."""

    path: str
    message: str
    type: str = "unreadable"

    def to_json(self) -> dict:
        return {"path": self.path, "type": self.type, "message": self.message}


def _sidecars(stem: str, lower: dict[str, str], folder: str) -> tuple[str | None, tuple[str, ...]]:
    """Preview and note files beside a model, matched without regard to case (`Model.PNG` counts too);
    `lower` maps each lower-cased name in the folder to its real name."""
    stem = stem.lower()
    preview = next((lower[stem + s] for s in PREVIEW_SUFFIXES if stem + s in lower), None)
    notes = tuple(os.path.join(folder, lower[stem + s]) for s in NOTE_SUFFIXES if stem + s in lower)
    return (os.path.join(folder, preview) if preview else None), notes


def _folder_totals(path: str) -> tuple[int, int]:
    """Size and newest mtime of everything in a diffusers folder (following links, as loaders do)."""
    size, newest = 0, os.stat(path).st_mtime_ns
    for dirpath, _dirs, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                st = os.stat(os.path.join(dirpath, name))
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime_ns)
    return size, newest


def _listing(folder: str) -> dict[str, str]:
    try:
        return {n.lower(): n for n in os.listdir(folder)}
    except OSError:
        return {}


_UNSET = object()


class _Walker:
    def __init__(self, token: CancelToken, report: Report):
        self.token, self.report = token, report
        self.found: list[Found] = []
        self.problems: list[Problem] = []
        self.unlisted: list[str] = []  # folders we could not list: their cached rows must be kept
        self._seen_dirs: set[tuple[int, int]] = set()
        self._seen_files: set[tuple[int, int]] = set()
        self._kinds: dict[tuple[str, str, str | None], str | None] = {}  # a folder's hint, asked once

    def add_file(self, path: str, root: Root, names: dict[str, str] | None = None) -> None:
        try:
            st = os.stat(path)
        except OSError as e:
            kind = "a broken link" if os.path.islink(path) else "unreadable"
            self.problems.append(Problem(path, f"{kind}: {e.strerror or e}"))
            return
        if not stat_mod.S_ISREG(st.st_mode):
            return
        if not os.access(path, os.R_OK):
            self.problems.append(Problem(path, "unreadable: permission denied"))
            return
        if (st.st_dev, st.st_ino) in self._seen_files:
            return  # the same file reached through another link or an overlapping root
        self._seen_files.add((st.st_dev, st.st_ino))
        folder, name = os.path.split(path)
        if names is None:
            names = _listing(folder)
        preview, notes = _sidecars(os.path.splitext(name)[0], names, folder)
        key = (folder, root.path, root.kind)
        kind = self._kinds.get(key, _UNSET)
        if kind is _UNSET:  # relpath and the folder names, once per folder, not per file
            kind = self._kinds[key] = declared_kind_for_path(path, root.path, root.kind)
        self.found.append(
            Found(
                path, root.path, kind, False, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, preview, notes
            )
        )

    def add_diffusers(
        self, path: str, root: Root, st: os.stat_result, parent_names: dict[str, str] | None
    ) -> None:
        if (st.st_dev, st.st_ino) in self._seen_files:
            return
        self._seen_files.add((st.st_dev, st.st_ino))
        size, mtime = _folder_totals(path)
        parent, name = os.path.split(os.path.normpath(path))
        if parent_names is None:
            parent_names = _listing(parent)
        preview, notes = _sidecars(name, parent_names, parent)
        kind = declared_kind_for_path(os.path.join(path, "model_index.json"), root.path, root.kind)
        self.found.append(
            Found(path, root.path, kind, True, size, mtime, st.st_dev, st.st_ino, preview, notes)
        )

    def walk_dir(self, top: str, root: Root) -> None:
        stack: list[tuple[str, dict[str, str] | None]] = [(top, None)]
        while stack:
            self.token.raise_if_cancelled()
            folder, parent_names = stack.pop()
            try:
                st = os.stat(folder)
            except OSError as e:
                self.problems.append(Problem(folder, f"unreadable folder: {e.strerror or e}"))
                self.unlisted.append(folder)
                continue
            if (st.st_dev, st.st_ino) in self._seen_dirs:
                continue  # a symlink loop, or a folder already scanned through another path
            self._seen_dirs.add((st.st_dev, st.st_ino))
            try:
                with os.scandir(folder) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as e:
                self.problems.append(Problem(folder, f"cannot list the folder: {e.strerror or e}"))
                self.unlisted.append(folder)
                continue
            names = {e.name.lower(): e.name for e in entries}
            if "model_index.json" in {e.name for e in entries}:
                self.add_diffusers(folder, root, st, parent_names)
                continue
            subdirs = []
            for e in entries:
                if e.name.startswith(".") or e.name == "__pycache__":
                    continue  # hidden folders, and our own atomic writers' temporary files
                try:
                    is_dir = e.is_dir()  # follows symlinks
                except OSError:
                    is_dir = False
                if is_dir:
                    subdirs.append(e.path)
                elif is_model_file(e.name):
                    self.add_file(e.path, root, names)
            stack.extend((d, names) for d in reversed(subdirs))
            self.report(Progress("Finding model files", len(self.found), 0, folder))


def discover(
    roots: list[Root], token: CancelToken | None = None, report: Report = no_report
) -> tuple[list[Found], list[Problem], list[str]]:
    """Every model below `roots` (a root may also be a single file): (found, problems, unlisted folders)."""
    w = _Walker(token or CancelToken(), report)
    for root in roots:
        if os.path.isdir(root.path):
            w.walk_dir(root.path, root)
        elif os.path.isfile(root.path):
            w.add_file(root.path, Root(os.path.dirname(root.path), root.kind, root.source))
        elif os.path.lexists(root.path):
            w.problems.append(Problem(root.path, "not a file or folder Loadout can read (a broken link?)"))
        else:
            w.problems.append(Problem(root.path, "no such file or folder", "missing"))
    return w.found, w.problems, w.unlisted
