"""`loadout libraries`: the model libraries of installed tools (ComfyUI, A1111/Forge, InvokeAI, …) that the
first run offers to scan, found by engine.discover without a long crawl."""

from __future__ import annotations

from ._common import EXIT_OK, human_bytes, print_json

NAME = "libraries"
HELP = "list the model libraries of installed tools (ComfyUI, Forge/A1111, InvokeAI, …) found on this machine"
DESCRIPTION = (
    "Look in the likely places (home, Documents, Desktop, AI, src, git, apps, /opt, other drives on Windows) "
    "a few folders deep for ComfyUI, ComfyUI Desktop, A1111/Forge, InvokeAI, Stability Matrix and SwarmUI; "
    "list each with its model folders, file counts and sizes, and the marker files that identified it. "
    "Only directory entries are read. `loadout scan` the listed folders to detect the models."
)


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the installs as a JSON array")
    p.add_argument(
        "--depth", type=int, default=None, help="folder levels to look below each place (default 3)"
    )
    p.add_argument("--no-system", action="store_true", help="look in the home folder only (not /opt, drives)")


def run(args) -> int:
    from ..discover import MAX_DEPTH, find_installs

    found = find_installs(system=not args.no_system, max_depth=args.depth or MAX_DEPTH)
    if args.json:
        print_json([i.to_json() for i in found])
        return EXIT_OK
    if not found:
        print("No ComfyUI, A1111/Forge, InvokeAI, Stability Matrix or SwarmUI install found.")
        print("Try `loadout demo DIR` for a demo library, or `loadout scan DIR` on your models folder.")
        return EXIT_OK
    for i in found:
        print(
            f"{i.label}: {i.root}  ({i.files} model file{'' if i.files == 1 else 's'}, {human_bytes(i.bytes)})"
        )
        for f in i.folders:
            print(
                f"    {f.files:>6}  {human_bytes(f.bytes):>10}  {f.path}"
                + (" (more not counted)" * f.truncated)
            )
        print("    found by: " + ", ".join(i.evidence))
        for p in i.problems:
            print(f"    problem: {p}")
    print("Scan them with: loadout scan " + " ".join(f'"{p}"' for i in found for p in i.scan_paths))
    return EXIT_OK
