"""`loadout encode`: an image (PNG/JPEG) through a VAE encoder to a ComfyUI .latent."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments
from ._common import EXIT_OK, print_json
from ._vae_common import StderrProgress, add_tile_arguments, device_and_dtype

NAME = "encode"
HELP = "VAE encode an image to a .latent (full or tiled)"
DESCRIPTION = (
    "Encode an image with a VAE or TAESD-family encoder into a ComfyUI-compatible .latent (VAE space, with "
    "the latent_format_version_0 marker). Width and height are cropped to multiples of 8, as ComfyUI does."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vae", required=True, metavar="FILE", help="VAE, checkpoint with a VAE, or TAESD encoder"
    )
    parser.add_argument("--image", required=True, metavar="IMG", help="PNG or JPEG")
    parser.add_argument(
        "--out", required=True, metavar="FILE.latent", help="the .latent to write (atomically)"
    )
    add_tile_arguments(parser, no_tile=False)
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    import time

    from ..formats.latent import write_latent
    from ..vae import load_vae
    from ..vae.images import load_image
    from ..vae.run import RunInfo, encode

    image = load_image(args.image)
    vae = load_vae(args.vae)
    device, dtype = device_and_dtype(args)
    info = RunInfo()
    t0 = time.perf_counter()
    latent = encode(
        vae,
        image,
        tile=args.tile,
        overlap=args.overlap,
        tiled=True if args.tile else None,
        device=device,
        dtype=dtype,
        report=StderrProgress(args.quiet),
        info=info,
    )
    seconds = time.perf_counter() - t0
    write_latent(args.out, latent.contiguous())
    result = {
        "vae": args.vae,
        "image": args.image,
        "output": args.out,
        "latent_shape": list(latent.shape),
        "device": str(device),
        "seconds": round(seconds, 3),
        **info.to_json(),
    }
    if args.json:
        print_json(result)
    else:
        print(
            f"encoded {image.shape[3]}x{image.shape[2]} -> latent {tuple(latent.shape)} on {device} "
            f"({info.dtype}, {info.mode}) in {seconds:.1f} s; wrote {args.out}"
        )
    return EXIT_OK
