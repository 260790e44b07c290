"""`loadout plan`: will it fit? Predicted peak memory per step from the headers alone, and the mode."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments, options_from_args
from ._common import EXIT_OK, human_bytes, print_json

NAME = "plan"
HELP = "will it fit? predicted peak memory of load, patch and decode, and the mode that fits"
DESCRIPTION = (
    "Predict, from the file headers alone, the peak device memory of loading the model, patching it with "
    "LoRAs and decoding an image, and say which mode fits: full, partial (how much stays resident) or "
    "tiled decode (which tile size). --vram GB asks about a hypothetical device of that size."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, metavar="FILE", help="checkpoint or diffusion model")
    parser.add_argument("--lora", action="append", default=[], metavar="FILE", help="a LoRA (repeatable)")
    parser.add_argument(
        "--decode", metavar="WxH[xF]",
        help="image size to decode, e.g. 1024x1024; a video with a Wan-family VAE: WxHxF, e.g. 832x480x81",
    )  # fmt: skip
    parser.add_argument("--vram", type=float, metavar="GB", help="a hypothetical device of this size (GiB)")
    parser.add_argument("--json", action="store_true", help="machine-readable output (Plan JSON)")
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..errors import EngineError, InvalidRequest, from_json
    from ..facade import Engine
    from ..plan import parse_size
    from ..requests import Inspect, PlanRequest

    try:
        decode = parse_size(args.decode) if args.decode else None
    except ValueError as e:
        raise InvalidRequest(str(e)) from None
    if args.vram is not None and not args.vram > 0:
        raise InvalidRequest("--vram must be a positive number of GiB")
    engine = Engine()
    (det,) = engine.run(Inspect((args.model,)))  # header-only and torch-free: a bad file is refused first
    if det.error is not None:
        if args.json:
            print_json({"model": args.model, "error": det.error.to_json()})
        # main() prints it and picks the exit code (3: a bad file)
        raise from_json(det.error.to_json(), args.model)
    engine.detect(options_from_args(args))
    try:
        plan = engine.run(PlanRequest(args.model, tuple(args.lora), decode, args.vram))
    except EngineError as e:  # reported here in JSON; main() prints it and picks the exit code
        if args.json:
            print_json({"model": args.model, "error": e.to_json()})
        raise
    if args.json:
        print_json(plan)
    else:
        print(render_text(args.model, plan))
    return EXIT_OK


def render_text(model: str, plan: dict) -> str:
    lines = [
        f"Plan for {model}",
        f"  device: {plan['device']}, budget for weights {human_bytes(plan['budget_bytes'])}",
    ]
    for s in plan["steps"]:
        d = s["detail"]
        line = f"  {s['step']:<7} peak {human_bytes(s['peak_bytes']):>10}  {s['mode']}"
        if s["step"] == "load":
            line += f" ({d['resident_fraction']:.0%} of {human_bytes(d['bytes'])} {d['component']} resident"
            line += f", {d['modules_resident']}/{d['modules']} modules)"
        elif s["step"] == "patch":
            line += f" ({len(d['loras'])} LoRA, {human_bytes(d['lora_bytes'])})"
            line += "".join(f"\n    warning: {w}" for w in d.get("warnings", ()))
        elif s["step"] == "step":
            line += f" ({d['width']}x{d['height']}"
            if d["s_per_step"] is not None:
                line += f", {d['s_per_step']:.2f} s/step predicted: full {d['s_per_step_full']:.2f}"
                line += f", partial {d['s_per_step_partial']:.2f}; from a measured {d['calibrated_from']['width']}"
                line += f"x{d['calibrated_from']['height']} step)"
            else:
                line += "; s/step: not measured yet)"
            if d["streamed_bytes_per_step"]:
                line += f"\n    streams {human_bytes(d['streamed_bytes_per_step'])} per step"
        elif s["step"] == "decode" and s["mode"] == "tiled":
            line += f" (tile {d['tile']} px, overlap {d['overlap']} px)"
        if s["step"] == "decode" and "frames" in d:
            line += f", {d['frames']} frames in chunks of {d['tile_frames']} latent frames"
            line += ", retry snapshots in host RAM" if d.get("retry_snapshot") == "host" else ""
            line += f"; full frames would need {human_bytes(d['full_bytes'])}" if s["mode"] == "tiled" else ""
        if s["step"] == "sound":
            line += (
                f" ({d['seconds']:g} s at {d['sample_rate']} Hz, {d['vocoder']}; on {d['device']}, float32)"
            )
        if "advice" in d:  # any step's: what to change when it does not fit, or what to measure
            line += f"\n    advice: {d['advice']}"
        lines.append(line)
    if plan["steps"]:
        lines.append(
            f"  kept free for sampling: {human_bytes(plan['steps'][0]['detail'].get('min_inference_bytes'))}"
        )
    lines.append("  fits" if plan["fits"] else "  does NOT fit")
    return "\n".join(lines)
