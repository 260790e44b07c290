"""`python -m tests.support.synth list` / `write NAME PATH [--dtype F16] [--prefix P] [--ckpt] [--dense]` /
`diffusers NAME DIR` / `demo-layouts PATH`: the generator from a shell, for making fixtures and demo files
by hand, and for writing the demo library's layout data again (engine/catalog/demo_layouts.json.gz)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import DIFFUSERS_PIPELINES, info, layout, names, nbytes, write, write_ckpt, write_diffusers


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.support.synth", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="every layout with its kind, architecture and size")
    w = sub.add_parser("write", help="write one layout as a sparse file")
    w.add_argument("name", choices=names())
    w.add_argument("path")
    w.add_argument("--dtype", default="F16")
    w.add_argument("--prefix", default="")
    w.add_argument(
        "--ckpt", action="store_true", help="a pickled torch-zip checkpoint instead of safetensors"
    )
    w.add_argument("--dense", action="store_true", help="real random values (small layouts only)")
    d = sub.add_parser("diffusers", help="write a diffusers pipeline folder")
    d.add_argument("name", choices=sorted(DIFFUSERS_PIPELINES))
    d.add_argument("dir")
    dl = sub.add_parser("demo-layouts", help="write the demo library's layout data (gzip'd JSON)")
    dl.add_argument("path")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for n in names():
            i = info(n)
            gib = nbytes(layout(n)) / 1024**3
            print(f"{n:40s} {i.kind:16s} {i.architecture or '-':16s} {gib:8.2f} GiB (F16)")
    elif args.cmd == "write":
        if args.ckpt:
            write_ckpt(args.name, args.path, dtype=args.dtype, prefix=args.prefix)
        else:
            write(args.name, args.path, dtype=args.dtype, prefix=args.prefix, dense=args.dense)
    elif args.cmd == "demo-layouts":
        from .demo_data import encode

        Path(args.path).write_bytes(encode())
    else:
        write_diffusers(args.name, args.dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
