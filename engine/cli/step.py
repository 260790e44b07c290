"""`loadout step`: run a denoiser's forward pass under the residency manager and time it."""

from __future__ import annotations

import argparse

from ..catalog.layout import display_name
from ..devices import add_device_arguments, options_from_args
from ._common import EXIT_OK, human_bytes, print_json, whole_number

NAME = "step"
HELP = "run the denoiser's forward pass, fully or partially loaded, and time a step"
DESCRIPTION = (
    "Load the model's denoiser (UNet of SD1/SD2/SDXL, FLUX.1 dev/schnell transformer) under the memory "
    "budget — fully, or partially with the rest streamed from RAM or disk while it computes — and run "
    "its forward pass STEPS times on the inputs of --inputs (names as the original codebases call them: "
    "UNet x, timesteps, context[, y]; FLUX.1 img, img_ids, txt, txt_ids, timesteps, y[, guidance]) or on "
    "seeded random inputs for an image of --size. Reports seconds per step (median), the first step, "
    "peak memory above the start, resident and streamed bytes; --out writes the last output (tensor "
    "`out`, float32)."
)


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 512x512") from None
    if w <= 0 or h <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be positive")
    return w, h


_positive = whole_number(1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", required=True, metavar="FILE", help="a checkpoint or a denoiser alone")
    p.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[:S]",
        help="a LoRA at strength S (repeatable; FILE:S:C gives its text-encoder part strength C); "
        "the output says how many of its modules reach the model",
    )
    p.add_argument("--inputs", metavar="IN.safetensors", help="the forward's inputs (default: random)")
    p.add_argument(
        "--size", type=_size, default=(512, 512), metavar="WxH", help="image size for random inputs"
    )
    p.add_argument(
        "--steps", type=_positive, default=1, metavar="N", help="forward passes to run (default 1)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument(
        "--component", metavar="NAME",
        help="step this component of the file (e.g. clip_l, t5xxl) instead of its denoiser",
    )  # fmt: skip
    p.add_argument(
        "--out", metavar="OUT.safetensors",
        help="write the last output as tensor `out` (float32; LTX-2's audio stream's beside it as `audio_out`)",
    )  # fmt: skip
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_device_arguments(p)


# Kinds of file `step` refuses before loading anything, with what runs them instead. (An `unknown` or
# a controlnet file goes on: a DiT of no known release may still run, read from its shapes.)
_RUNS = "`loadout step` runs a checkpoint's or a diffusion model's denoiser, or a text encoder"
_NOT_STEPPED = {
    "vae": f"a VAE: `loadout decode` and `encode` run it; {_RUNS}",
    "vae_approx": f"a TAESD-family preview VAE: `loadout decode` and `encode` run it; {_RUNS}",
    "upscaler": f"an upscaler; {_RUNS}",
    "clip_vision": f"a CLIP vision encoder; {_RUNS}",
    "ip_adapter": f"an IP-Adapter; {_RUNS}",
}


def _not_stepped(kind: str) -> str | None:
    """What a file of `kind` is and what runs it, when `step` has no forward of its own to time."""
    from ..detect.result import not_a_model  # LoRAs and embeddings: no model at all

    what = not_a_model(kind)
    return f"{what}; {_RUNS}" if what is not None else _NOT_STEPPED.get(kind)


def run(args: argparse.Namespace) -> int:
    from ..errors import InvalidRequest, from_json
    from ..facade import Engine
    from ..requests import Inspect, StackItem, Step
    from .bake import parse_lora_spec

    engine = Engine()
    (det,) = engine.run(Inspect((args.model,)))  # header-only and torch-free: refused before torch loads
    if det.error is not None:
        if args.json:
            print_json({"model": args.model, "error": det.error.to_json()})
        # main() prints it and picks the exit code (3: a bad file)
        raise from_json(det.error.to_json(), args.model)
    what = _not_stepped(det.kind)
    if what is not None:  # a file that has no forward of its own to time: say what runs it
        e = InvalidRequest(f"{args.model}: this is {what}")
        if args.json:
            print_json({"model": args.model, "error": e.to_json()})
        raise e
    loras = None
    if args.lora:
        loras = tuple(StackItem(*parse_lora_spec(spec)) for spec in args.lora)
    try:
        engine.detect(options_from_args(args))
        r = engine.run(
            Step(
                args.model,
                loras,
                args.inputs,
                tuple(args.size),
                args.steps,
                args.out,
                args.seed,
                args.component,
            ),
            report=_StderrSteps(args.json),
        )
    finally:
        engine.close()
    if args.json:
        print_json(r.to_json())
        return EXIT_OK
    print(
        f"{r.architecture} {r.component} ({r.naming} naming) on {r.device} in {r.dtype}, {r.mode}: "
        f"{human_bytes(r.resident_bytes)} resident, {human_bytes(r.streamed_bytes_per_step)} streamed per step"
    )
    print(
        f"  {r.steps} step(s): {r.s_per_step:.3f} s/step (median), first {r.first_step_s:.3f} s; "
        f"peak {human_bytes(r.peak_device_bytes)} above the start"
    )
    for lo in r.loras:
        strength = f"{lo['strength_model']:g}"
        if lo["strength_clip"] != lo["strength_model"]:
            strength += f"/{lo['strength_clip']:g}"
        # the warning, when there is one, says the counts too
        fit = lo["warning"] or f"{lo['mapped']}/{lo['modules']} modules placed"
        print(f"  LoRA {display_name(lo['file'])} at {strength}: {fit}")
    if r.ignored_inputs:
        took = ", ".join(r.input_shapes)
        print(f"  ignored input(s) {', '.join(r.ignored_inputs)}: this model takes {took}")
    print(f"  output {list(r.output_shape)}" + (f" written to {r.out}" if r.out else ""))
    return EXIT_OK


class _StderrSteps:
    """'step 3/20  0.84 s' on stderr, when it is a terminal and no JSON was asked for."""

    def __init__(self, quiet: bool):
        import sys

        self.quiet = quiet or not sys.stderr.isatty()

    def __call__(self, p) -> None:
        if self.quiet or p.stage != "step":
            return
        import sys

        sys.stderr.write(f"\rstep {p.done}/{p.total}  {p.detail}" + ("\n" if p.done >= p.total else ""))
        sys.stderr.flush()
