"""The library's roots: the folders and files the user gave (the command line, drops, Settings, the first
run, a bake), each once and in order; those added to stay are saved in the settings for the next start."""

from __future__ import annotations

import os

from app import settings as app_settings


class LibraryPaths:
    def __init__(self) -> None:
        self.paths: list[str] = []

    def add(self, paths, *, persist: bool) -> tuple[list[str], list[str]]:
        """Add `paths` (made absolute); returns (those that exist, in order, new or not; those missing).
        With `persist` the existing ones join the saved library folders."""
        found, missing = [], []
        for p in map(os.path.abspath, paths):
            if not os.path.exists(p):
                missing.append(p)
                continue
            if p not in self.paths:
                self.paths.append(p)
            found.append(p)
        if persist and found:
            saved = app_settings.library_folders()
            app_settings.set_library_folders(saved + [p for p in found if p not in saved])
        return found, missing

    def saved(self) -> list[str]:
        """The saved library folders that still exist and are not roots yet (the next start's library)."""
        return [p for p in app_settings.library_folders() if os.path.exists(p) and p not in self.paths]

    def unsaved_folders(self) -> list[str]:
        """The root folders this run only (the command line's): in the library, not in the saved list."""
        saved = {os.path.abspath(p) for p in app_settings.library_folders()}
        return [p for p in self.paths if os.path.isdir(p) and p not in saved]

    def keep_folders(self, folders: list[str], listed: list[str]) -> list[str]:
        """Settings' folder list was saved: drop the root folders the user took out of it (`listed` when
        the dialog opened, not in `folders` now); returns those dropped. Roots from elsewhere — the
        command line's, which are not saved — stay: changing a budget must not empty the library."""
        removed = [p for p in self.paths if os.path.isdir(p) and p in listed and p not in folders]
        self.paths = [p for p in self.paths if p not in removed]
        return removed

    def __contains__(self, path: str) -> bool:
        return path in self.paths
