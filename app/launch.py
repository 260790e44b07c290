"""The `loadout` entry point: a sub-command goes to the engine CLI (no Qt imported), anything else
(nothing, or paths) opens the window."""

from __future__ import annotations

import sys


def _wants_cli(argv: list[str]) -> bool:
    if not argv:
        return False
    from engine.cli import command_names

    return argv[0] in command_names() or argv[0] in ("-h", "--help", "--version")


def main(argv: list[str] | None = None) -> int:
    # A frozen (PyInstaller) app re-runs itself for multiprocessing workers: let those through.
    import multiprocessing

    multiprocessing.freeze_support()
    argv = sys.argv[1:] if argv is None else argv
    if _wants_cli(argv):
        from engine.cli import main as cli_main

        return cli_main(argv)
    from app.main import run

    return run(argv)


def gui_main() -> int:
    """Entry for double-click launchers (a GUI script on Windows opens no console)."""
    from app.main import run

    return run(sys.argv[1:])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
