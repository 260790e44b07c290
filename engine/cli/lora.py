"""`loadout lora inspect LORA --base CKPT`: where each adapter module lands, before anything is applied."""

from __future__ import annotations

import argparse

from ..formatting import algo_names
from ._common import EXIT_OK, exit_code, print_json

NAME = "lora"
HELP = "LoRA tools: 'inspect' shows which base weights a LoRA reaches (coverage) before applying it"


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="lora_command", metavar="ACTION", required=True)
    ins = sub.add_parser(
        "inspect", help="coverage of a LoRA on a base model: mapped, unmatched, shape mismatches"
    )
    ins.add_argument("lora", metavar="LORA", help="the adapter file (.safetensors)")
    ins.add_argument(
        "--base", "--model", dest="base", required=True, metavar="CKPT",
        help="the base checkpoint, header only read (--model, as `step` and `plan` call it, works too)",
    )  # fmt: skip
    ins.add_argument("--json", action="store_true", help="print the coverage JSON")
    ins.add_argument("--all", action="store_true", help="list every unmatched module (default: the first 20)")


def run(args: argparse.Namespace) -> int:
    from ..errors import EngineError
    from ..facade import Engine
    from ..requests import LoraCoverage

    try:
        cov = Engine().run(LoraCoverage(args.lora, args.base)).coverage  # DESIGN.md's coverage JSON
    except EngineError as e:
        if not args.json:
            raise  # main() prints it and picks the exit code
        print_json({"lora": args.lora, "base": args.base, "error": e.to_json()})
        return exit_code(e)
    if args.json:
        print_json(cov)
        return EXIT_OK
    pct = 100.0 * cov["mapped"] / cov["modules"] if cov["modules"] else 0.0
    print(f"{args.lora}")
    print(f"  format {cov['format']}, algorithms {algo_names(cov['algos'])}")
    print(f"  on {args.base}: {cov['mapped']}/{cov['modules']} modules mapped ({pct:.1f}%)")
    if cov.get("warning"):
        print(f"  warning: {cov['warning']}")
    for name, t in cov["targets"].items():
        split = t.get("split") or {}
        fused = f" ({len(split)} fused, placed on {sum(map(len, split.values()))} weights)" if split else ""
        print(f"  {name:<12} {t['mapped']}/{t['modules']}{fused}")
        limit = None if args.all else 20
        for m in t["unmatched"][:limit]:
            print(f"    unmatched: {m}")
        if limit is not None and len(t["unmatched"]) > limit:
            print(f"    … and {len(t['unmatched']) - limit} more unmatched (--all lists them)")
        for sm in t["shape_mismatch"]:
            why = f": {sm['reason']}" if sm.get("reason") else ""
            print(
                f"    shape mismatch: {sm['module']} {sm['lora_shape']} vs {sm['key']} {sm['base_shape']}{why}"
            )
    return EXIT_OK
