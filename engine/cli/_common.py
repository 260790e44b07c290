"""Helpers shared by the sub-commands: exit codes, JSON output, errors on stderr."""

from __future__ import annotations

import json
import sys

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_OOM = 4
EXIT_CANCELLED = 130


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2, default=_default)
    sys.stdout.write("\n")


def _default(o):
    if hasattr(o, "to_json"):
        return o.to_json()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def print_error(msg: str) -> None:
    print(f"loadout: {msg}", file=sys.stderr)


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'. Sizes are binary, as ComfyUI's 'GB' flags are."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
