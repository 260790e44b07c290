"""`loadout decode`: a latent (.latent or .safetensors) through a VAE to a PNG, tiled when needed — a
client of the engine's Decode request, so the device, dtype and tiles are chosen as in the window."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments
from ._common import EXIT_OK, human_bytes, print_json
from ._vae_common import StderrProgress, add_tile_arguments, engine_for, run_info, tiling, write_pngs

NAME = "decode"
HELP = "VAE decode a latent to a PNG (full or tiled)"
DESCRIPTION = (
    "Decode a latent in the VAE's own space (a ComfyUI .latent or a safetensors latent) with a VAE or "
    "TAESD-family file and write a PNG. Without --tile the memory estimate decides: full when it fits, "
    "tiled (whole-image GroupNorm statistics, so no seams) when not. A batch writes NAME_0.png, NAME_1.png, ..."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vae", required=True, metavar="FILE", help="VAE, checkpoint with a VAE, or TAESD decoder"
    )
    parser.add_argument("--latent", required=True, metavar="FILE", help=".latent or .safetensors latent")
    parser.add_argument("--out", required=True, metavar="IMG.png", help="the PNG to write (atomically)")
    add_tile_arguments(parser, no_tile=True)
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..formats.latent import latent_info
    from ..requests import Decode

    shape = latent_info(args.latent).shape  # header only: a bad latent is refused before torch loads
    engine, _ = engine_for(args)
    try:
        res = engine.run(Decode(args.vae, args.latent, **tiling(args)), report=StderrProgress(args.quiet))
        paths = write_pngs(res, args.out, shape[0])
    finally:
        engine.close()
    info = run_info(res.info)
    device = res.info["device"]
    result = {
        "vae": args.vae,
        "latent": args.latent,
        "outputs": paths,
        "size": [res.width, res.height],
        "device": device,
        "seconds": round(res.seconds, 3),
        **info,
    }
    if args.json:
        print_json(result)
    else:
        how = (
            f"{info['tiles']} tiles of {info['tile_px']} px (overlap {info['overlap_px']})"
            if info["mode"] == "tiled"
            else "full"
        )
        print(
            f"decoded {tuple(shape)} -> {res.width}x{res.height} on {device} ({info['dtype']}, "
            f"{how}) in {res.seconds:.1f} s; estimate {human_bytes(info['estimate_bytes'])} for a full decode"
        )
        for n in info["notes"]:
            print(f"  note: {n}")
        for p in paths:
            print(f"  wrote {p}")
    return EXIT_OK
