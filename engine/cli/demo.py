"""`loadout demo DIR`: write a small demo library (ComfyUI layout) and say what is in it."""

from __future__ import annotations

import sys

from ._common import EXIT_OK, human_bytes, print_json

NAME = "demo"
HELP = "write a small demo library (sparse SD1/SDXL/Flux checkpoints, LoRAs, a preview TAESD, a latent)"
DESCRIPTION = (
    "Write a demo library in ComfyUI layout into DIR: header-faithful sparse checkpoints (real keys and "
    "shapes, a few hundred KB on disk each), small dense LoRAs, a TAESD decoder/encoder pair with hand-set "
    "weights that compute SD1's latent preview (no trained weights ship with Loadout), a latent of a drawn "
    "picture to decode, the picture to encode, previews and notes. DIR/README.md lists every file."
)


def add_arguments(p) -> None:
    p.add_argument("dir", metavar="DIR", help="folder to write (created if needed)")
    p.add_argument("--json", action="store_true", help="print the files written as JSON")


def run(args) -> int:
    from ..catalog.demo import write_demo

    files = write_demo(args.dir)
    if args.json:
        print_json([f.__dict__ for f in files])
        return EXIT_OK
    disk = sum(f.disk_bytes or f.logical_bytes for f in files)
    for f in files:
        print(f"{human_bytes(f.logical_bytes):>10}  {f.path}  ({f.what})")
    print(
        f"{len(files)} files, {human_bytes(sum(f.logical_bytes for f in files))} as models, "
        f"{human_bytes(disk)} on disk; see {args.dir}/README.md",
        file=sys.stdout,
    )
    return EXIT_OK
