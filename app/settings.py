"""Settings in the user config folder ($LOADOUT_CONFIG_DIR, else platformdirs' XDG_CONFIG_HOME place):
window layout, library folders, sample rate. One INI file, so tests can point it at a temp folder."""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QSettings


def config_dir() -> Path:
    env = os.environ.get("LOADOUT_CONFIG_DIR")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_config_dir("loadout", appauthor=False))


def settings() -> QSettings:
    d = config_dir()
    d.mkdir(parents=True, exist_ok=True)
    return QSettings(str(d / "loadout.ini"), QSettings.Format.IniFormat)


def library_folders() -> list[str]:
    v = settings().value("library/folders", [])
    if isinstance(v, str):
        v = [v]
    return [str(p) for p in (v or [])]


def set_library_folders(paths: list[str]) -> None:
    s = settings()
    s.setValue("library/folders", list(paths))
    s.sync()


def sample_rate_hz() -> float:
    try:
        return min(20.0, max(1.0, float(settings().value("graph/sample_hz", 10.0))))
    except (TypeError, ValueError):
        return 10.0
