"""`loadout bake --base CKPT --lora FILE[:S_MODEL[:S_CLIP]]… --out OUT.safetensors`: merge LoRAs into a
new checkpoint, written atomically and never over an input."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

from ._common import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE, print_error, print_json

NAME = "bake"
HELP = "merge LoRAs into a new checkpoint (atomic write; inputs are never touched)"
DESCRIPTION = (
    "Merge one or more LoRAs into a base checkpoint and write a new .safetensors file. Each --lora is "
    "FILE, FILE:STRENGTH (model and text encoders alike) or FILE:S_MODEL:S_CLIP; strengths are read from "
    "the right and only numbers count, so C:\\loras\\x.safetensors:0.8 works."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--base", required=True, metavar="CKPT", help="the base checkpoint")
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


def _same_file(a: str, b: str) -> bool:
    """True if the paths name one file: the same resolved path, or (hard link) the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _load_base(path: str):
    """name -> tensor (zero-copy mmap views for safetensors) and the base's metadata."""
    from ..formats import sniff

    kind = sniff(path)
    if kind == "safetensors":
        from ..formats.safetensors import SafetensorsFile

        f = SafetensorsFile(path)
        return {k: f.tensor(k) for k in f.header.tensors}, dict(f.header.metadata)
    if kind in ("torch-zip", "pickle"):
        from ..formats.pickles import load_state_dict

        return load_state_dict(path), {}
    from ..errors import FormatError

    raise FormatError(f"{path}: not a checkpoint Loadout can bake into (found: {kind})")


def run(args: argparse.Namespace) -> int:
    from ..formats.safetensors import save_tensors
    from ..jobs import Progress
    from ..patcher import LoraEntry, ModelPatcher

    specs = [parse_lora_spec(s) for s in args.lora]
    inputs = [args.base] + [f for f, _, _ in specs]
    for p in inputs:
        if not os.path.isfile(p):
            print_error(f"{p}: no such file")
            return EXIT_BAD_INPUT
    if not args.out.endswith(".safetensors"):
        print_error("--out must name a .safetensors file")
        return EXIT_USAGE
    if os.path.exists(args.out) or os.path.islink(args.out):
        for p in inputs:
            if _same_file(args.out, p):
                print_error(f"--out {args.out} is one of the inputs ({p}); choose another file")
                return EXIT_USAGE
    weights, base_meta = _load_base(args.base)
    patcher = ModelPatcher(weights)
    stack = [LoraEntry(f, sm, sc) for f, sm, sc in specs]
    summary = []
    for f, sm, sc in specs:
        cov = patcher.coverage(f)
        summary.append(
            {
                "file": os.path.basename(f),
                "sha256": _sha256(f),
                "strength_model": sm,
                "strength_clip": sc,
                "modules": cov.modules,
                "mapped": cov.mapped,
            }
        )
        if not args.json:
            print(f"{f}: {cov.mapped}/{cov.modules} modules placed", file=sys.stderr)

    def report(p: Progress) -> None:
        if not args.json and p.total and (p.done == p.total or p.done % 100 == 0):
            print(f"\r{p.stage} {p.done}/{p.total}", end="\n" if p.done == p.total else "", file=sys.stderr)

    rep = patcher.apply(stack, report=report)
    meta = dict(base_meta)
    meta["loadout.bake"] = json.dumps(
        {"base": os.path.basename(args.base), "loras": summary, "patched_keys": len(rep.patched)}
    )
    save_tensors(args.out, patcher.weights, meta)
    result = {"out": args.out, "base": args.base, "loras": summary, "patched_keys": len(rep.patched)}
    if args.json:
        print_json(result)
    else:
        print(f"wrote {args.out}: {len(rep.patched)} weights patched by {len(specs)} LoRA(s)")
    return EXIT_OK
