"""`loadout inspect FILE… [--json]`: what each model file is, from its header alone.

Output: human text, or with --json one Detection object for a single file and a JSON array of them for
several (DESIGN.md: "a JSON array when a command takes several files"; one file keeps `| jq .kind`
simple). Exit 3 when any file is bad or unsupported; the others are still reported. Never a traceback.
"""

from __future__ import annotations

import sys

from ..catalog.layout import display_name
from ..formatting import algo_names
from ._common import EXIT_BAD_INPUT, EXIT_OK, human_bytes, print_json

NAME = "inspect"
HELP = "what a model file is: kind, architecture, components, LoRA facts, metadata (header only)"
DESCRIPTION = (
    "Detect each FILE (or diffusers folder) from its header without loading tensors. With --json: an "
    "object for one file, an array for several. Exit status 3 if any file is unreadable or unsupported."
)


def add_arguments(parser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="model files or diffusers folders")
    parser.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    parser.add_argument(
        "--read-values",
        action="store_true",
        help="also read the few weight values SD2's v-prediction check needs (opt-in)",
    )


def run(args) -> int:
    from ..facade import Engine
    from ..requests import Inspect

    results = Engine().run(Inspect(tuple(args.files), args.read_values))  # header-only, torch-free
    if args.json:
        print_json(results[0].to_json() if len(results) == 1 else [r.to_json() for r in results])
    else:
        # Evidence uses "→"; a console that cannot show it (a Windows pipe in cp1252) gets "?" instead
        # of a UnicodeEncodeError.
        if hasattr(sys.stdout, "reconfigure"):
            sys.stdout.reconfigure(errors="replace")
        for i, r in enumerate(results):
            if i:
                print()
            print(format_text(r))
    return EXIT_BAD_INPUT if any(r.error for r in results) else EXIT_OK


def _count(n: int) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return str(n)


def format_text(d) -> str:
    """A Detection as text a user reads in a terminal."""
    lines = [
        f"{display_name(d.path) or d.path}  ({human_bytes(d.file_bytes)}, {d.format or 'unknown format'})"
    ]
    if d.error:
        lines.append(f"  error         {d.error.type}: {d.error.message}")
    if d.kind != "unknown" or not d.error:
        for label, value in (
            ("kind", d.kind),
            ("architecture", d.architecture),
            *((("also", ", ".join(d.also)),) if d.also else ()),
            ("variant", d.variant),
            ("prediction", d.prediction),
        ):
            lines.append(f"  {label:<13} {value if value is not None else '-'}")
    if d.components:
        lines.append(f"  components    {_count(d.params)} parameters")
        width = max(len(c.prefix or "(none)") for c in d.components.values())
        for name, c in d.components.items():
            lines.append(
                f"    {name:<12} {c.prefix or '(none)':<{width}}  {c.tensors:>6} tensors  "
                f"{_count(c.params):>9}  {human_bytes(c.bytes):>10}  {c.dtype or '-'}"
            )
    if d.lora:
        lr = d.lora
        facts = [
            f"format {lr.format or '?'}",
            "algos " + algo_names(lr.algos) if lr.algos else None,
            f"rank {lr.rank}" if lr.rank is not None else None,
            f"alpha {lr.alpha:g}" if isinstance(lr.alpha, (int, float)) else None,
            "targets " + ", ".join(lr.targets) if lr.targets else None,
            f"base {lr.base or '?'}",
        ]
        lines.append("  LoRA          " + " · ".join(f for f in facts if f))
    lines += _summary_lines(d.summary)
    if d.evidence:
        lines.append("  evidence")
        for e in d.evidence:
            shape = f" {list(e.shape)}" if e.shape is not None else ""
            lines.append(f"    - {e.reason}")
            if e.key:
                lines.append(f"        {e.key}{shape}")
    return "\n".join(lines)


def _summary_lines(s) -> list[str]:
    from ..detect.result import thaw  # nested values print as the JSON-like lists / dicts they came from

    out = []
    t = s.training
    if t:
        net = t.get("network_module")
        bits = [
            f"base {t['base_model']}" if t.get("base_model") else None,
            f"network {net}" if net else None,
            f"dim {t['network_dim']}" if "network_dim" in t else None,
            f"alpha {t['network_alpha']:g}" if isinstance(t.get("network_alpha"), (int, float)) else None,
            "args " + ", ".join(f"{k}={thaw(v)}" for k, v in t["network_args"].items())
            if t.get("network_args")
            else None,
            f"resolution {t['resolution']}" if t.get("resolution") else None,
            f"{t['epochs']} epochs" if "epochs" in t else None,
            f"{t['steps']} steps" if "steps" in t else None,
            f"output {t['output_name']}" if t.get("output_name") else None,
        ]
        out.append("  training      " + " · ".join(b for b in bits if b))
        if t.get("top_tags"):
            out.append("  top tags      " + ", ".join(f"{tag} ({n})" for tag, n in t["top_tags"]))
        if t.get("comment"):
            out.append(f"  comment       {t['comment']}")
    spec = s.modelspec
    if spec:
        out.append("  modelspec     " + " · ".join(f"{k.replace('_', ' ')}: {v}" for k, v in spec.items()))
    for k, v in list(s.other.items())[:10]:
        out.append(f"  {k[:13]:<13} {v}")
    return out
