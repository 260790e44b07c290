"""The `loadout` command line. Each sub-command is a module of this package defining NAME, HELP,
add_arguments(parser) and run(args) -> exit code; they are found at start-up, so adding a command
touches no other file. Command modules must not import torch at module level.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from ._common import EXIT_USAGE, exit_code, print_error


def _command_modules(only: str | None = None):
    mods = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or (only is not None and _command_name(info.name) != only):
            continue
        mod = importlib.import_module(f"{__name__}.{info.name}")
        if hasattr(mod, "NAME") and hasattr(mod, "run"):
            mods[mod.NAME] = mod
    return dict(sorted(mods.items()))


def _command_name(module_name: str) -> str:
    return module_name.replace("_", "-").removesuffix("-cmd")


def command_names() -> list[str]:
    """Sub-command names, without importing the command modules."""
    names = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            names.append(_command_name(info.name))
    return names


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole parser, or with `only` the parser of that one sub-command: the others' modules are
    then not imported (their imports cost a short command such as a warm `loadout scan` 15-20 ms,
    a tenth of its run). The top level has no options but --help and --version, so a command line
    whose first word is a command needs no other."""
    parser = argparse.ArgumentParser(
        prog="loadout",
        description="Loadout: know, load, patch and decode Stable-Diffusion-family models within your memory. "
        "With no sub-command (or with paths) it opens the window.",
    )
    parser.add_argument("--version", action="version", version="loadout 0.1.0")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, mod in _command_modules(only).items():
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    first = words[0] if words else None
    parser = build_parser(first if first in command_names() else None)
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on usage errors and 0 on --help
        return int(e.code or 0)
    if not getattr(args, "_run", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(args._run(args) or 0)
    except BrokenPipeError:
        # `loadout scan --json | head`: the reader left. Not an error of ours, and no traceback; point
        # stdout at devnull so the interpreter's final flush does not raise again (Python docs, "Note on
        # SIGPIPE" in the signal module).
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a program killed by it
    except BaseException as e:
        code = exit_code(e)
        if code is None:  # a bug: its traceback is the report
            raise
        print_error(getattr(e, "message", "Interrupted."))
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
