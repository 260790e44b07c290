"""`loadout bake --base CKPT --lora FILE[:S_MODEL[:S_CLIP]]… --out OUT.safetensors`: merge LoRAs into a
new checkpoint, written atomically and never over an input. A client of the engine's Bake request
(engine.bake): only the strength syntax and the printing live here."""

from __future__ import annotations

import argparse
import math
import sys

from ._common import EXIT_OK, print_json

NAME = "bake"
HELP = "merge LoRAs into a new checkpoint (atomic write; inputs are never touched)"
DESCRIPTION = (
    "Merge one or more LoRAs into a base checkpoint and write a new .safetensors file. Each --lora is "
    "FILE, FILE:STRENGTH (model and text encoders alike) or FILE:S_MODEL:S_CLIP; strengths are read from "
    "the right and only numbers count, so C:\\loras\\x.safetensors:0.8 works."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--base", "--model", dest="base", required=True, metavar="CKPT",
        help="the base checkpoint (--model, as `step` and `plan` call it, works too)",
    )  # fmt: skip
    p.add_argument(
        "--lora",
        action="append",
        required=True,
        metavar="FILE[:S_MODEL[:S_CLIP]]",
        help="a LoRA (repeatable)",
    )
    p.add_argument("--out", required=True, metavar="OUT.safetensors", help="the merged checkpoint to write")
    p.add_argument("--json", action="store_true", help="print a JSON summary")


def _number(s: str) -> float | None:
    try:
        v = float(s)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse_lora_spec(spec: str) -> tuple[str, float, float]:
    """'FILE[:S_MODEL[:S_CLIP]]' -> (file, s_model, s_clip), reading numbers from the right only.

    One number sets both strengths. A colon followed by anything but a number belongs to the path.
    """
    rest, found = spec, []
    while len(found) < 2 and ":" in rest:
        head, tail = rest.rsplit(":", 1)
        value = _number(tail)
        if value is None:
            break
        found.insert(0, value)
        rest = head
    if not found:
        return spec, 1.0, 1.0
    if len(found) == 1:
        return rest, found[0], found[0]
    return rest, found[0], found[1]


def run(args: argparse.Namespace) -> int:
    from ..bake import COVERAGE_STAGE
    from ..facade import Engine
    from ..jobs import Progress
    from ..requests import Bake, StackItem

    def report(p: Progress) -> None:
        if args.json:
            return
        if p.stage == COVERAGE_STAGE:
            print(p.detail, file=sys.stderr)
        elif p.total and (p.done == p.total or p.done % 100 == 0):
            print(f"\r{p.stage} {p.done}/{p.total}", end="\n" if p.done == p.total else "", file=sys.stderr)

    stack = tuple(StackItem(f, sm, sc) for f, sm, sc in map(parse_lora_spec, args.lora))
    res = Engine().run(Bake(args.base, stack, args.out), report=report)  # the window's Bake, exactly
    if args.json:
        print_json(
            {"out": args.out, "base": args.base, "loras": list(res.loras), "patched_keys": res.patched_keys}
        )
    else:
        print(f"wrote {args.out}: {res.patched_keys} weights patched by {len(stack)} LoRA(s)")
    return EXIT_OK
