"""`loadout load`: load a model's components under the device budget and show the ledger and events —
a way to try the residency manager as a user (the window's Load / Unload buttons do the same)."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments, options_from_args
from ._common import EXIT_OK, human_bytes, print_json, whole_number

NAME = "load"
HELP = "load a model's components under the memory budget and show where every byte went"
DESCRIPTION = (
    "Build the model's components (as detected), load them onto the device under the budget — fully or "
    "partially — optionally free some bytes again, and print the ledger (device / RAM / disk per "
    "component) and the events. Nothing is kept after the command ends."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", metavar="FILE", help="a checkpoint, diffusion model, VAE or text encoder")
    parser.add_argument("--component", action="append", default=[], help="only these components")
    parser.add_argument(
        "--unload-bytes",
        type=whole_number(0, "bytes"),
        metavar="N",
        help="then free N bytes of the first one",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..errors import EngineError, InvalidRequest, from_json
    from ..facade import Engine
    from ..requests import Inspect, Load, Unload

    events = []
    engine = Engine(on_event=events.append)  # the same facade the window's Load button uses
    (det,) = engine.run(Inspect((args.model,)))  # header-only and torch-free: refused before torch loads
    if det.error is not None:
        if args.json:
            print_json({"model": args.model, "error": det.error.to_json()})
        # main() prints it and picks the exit code (3: a bad file)
        raise from_json(det.error.to_json(), args.model)
    names = [n for n in det.components if n != "other"]
    if args.component:
        missing = set(args.component) - set(names)
        if missing:
            has = ", ".join(names) or "none"
            raise InvalidRequest(f"no component {', '.join(sorted(missing))} in this file (it has {has})")
        names = list(args.component)
    engine.detect(options_from_args(args))
    try:
        done = engine.run(Load(args.model, tuple(names)))
    except EngineError as e:  # reported here in JSON; main() prints it and picks the exit code
        if args.json:
            print_json({"model": args.model, "error": e.to_json()})
        raise
    if args.unload_bytes:
        done = engine.run(Unload(args.model, names[0], args.unload_bytes))
    m = engine.residency
    snap = done.snapshot
    out = {
        "device": m.device,
        "vram_state": m.policy.vram_state.value,
        "budget_bytes": m.budget(),
        "ledger": snap.to_json()["components"],
        "events": [e.to_json() for e in events],
    }
    if args.json:
        print_json(out)
    else:
        print(
            f"device {m.device} ({m.policy.vram_state.value}), budget left {human_bytes(out['budget_bytes'])}"
        )
        print(f"  {'component':<10} {'device':>10} {'RAM':>10} {'disk':>10}  resident")
        for c in snap.components:
            print(
                f"  {c.name:<10} {human_bytes(c.device_bytes):>10} {human_bytes(c.ram_bytes):>10} "
                f"{human_bytes(c.disk_bytes):>10}  {c.resident:6.1%}"
            )
        for e in events:
            print(
                f"  {e.kind:<18} {e.component:<8} {human_bytes(e.bytes_moved):>10} in {e.duration_s * 1000:.1f} ms"
            )
    engine.unload_all()
    engine.close()
    return EXIT_OK
