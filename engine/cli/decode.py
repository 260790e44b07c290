"""`loadout decode`: a latent (.latent or .safetensors) through a VAE to a PNG, tiled when needed."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments
from ._common import EXIT_OK, human_bytes, print_json
from ._vae_common import StderrProgress, add_tile_arguments, device_and_dtype

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
    import time

    from ..formats.latent import read_latent
    from ..vae import load_vae
    from ..vae.images import save_png
    from ..vae.run import RunInfo, decode

    latent = read_latent(args.latent)
    if latent.dim() == 5:
        from ..errors import UnsupportedModel

        raise UnsupportedModel(f"{args.latent}: a video (5-D) latent; only image latents decode here")
    vae = load_vae(args.vae)
    device, dtype = device_and_dtype(args)
    tiled = False if args.no_tile else (True if args.tile else None)
    info = RunInfo()
    t0 = time.perf_counter()
    image = decode(
        vae,
        latent,
        tile=args.tile,
        overlap=args.overlap,
        tiled=tiled,
        device=device,
        dtype=dtype,
        report=StderrProgress(args.quiet),
        info=info,
    )
    seconds = time.perf_counter() - t0
    paths = save_png(image, args.out)
    result = {
        "vae": args.vae,
        "latent": args.latent,
        "outputs": paths,
        "size": [image.shape[3], image.shape[2]],
        "device": str(device),
        "seconds": round(seconds, 3),
        **info.to_json(),
    }
    if args.json:
        print_json(result)
    else:
        how = (
            f"{info.tiles} tiles of {info.tile_px} px (overlap {info.overlap_px})"
            if info.mode == "tiled"
            else "full"
        )
        print(
            f"decoded {tuple(latent.shape)} -> {image.shape[3]}x{image.shape[2]} on {device} ({info.dtype}, "
            f"{how}) in {seconds:.1f} s; estimate {human_bytes(info.estimate_bytes)} for a full decode"
        )
        for n in info.notes:
            print(f"  note: {n}")
        for p in paths:
            print(f"  wrote {p}")
    return EXIT_OK
