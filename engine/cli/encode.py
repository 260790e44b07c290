"""`loadout encode`: an image (PNG/JPEG) through a VAE encoder to a ComfyUI .latent — a client of the
engine's Encode request, so the device, dtype and tiles are chosen as in the window."""

from __future__ import annotations

import argparse

from ..devices import add_device_arguments
from ._common import EXIT_OK, print_json
from ._vae_common import StderrProgress, add_tile_arguments, engine_for, run_info, tiling

NAME = "encode"
HELP = "VAE encode an image, or a clip with a video VAE, to a .latent (full or tiled)"
DESCRIPTION = (
    "Encode an image with a VAE or TAESD-family encoder into a ComfyUI-compatible .latent (VAE space, with "
    "the latent_format_version_0 marker). Width and height are cropped to multiples of 8, as ComfyUI does. "
    "With a video VAE (Wan 2.1 / 2.2, ...) --image may also be a clip: a video file (MP4, MOV, MKV, WebM), "
    "an animated WebP or GIF, or a folder of frames (PNG / JPEG, in name order); its first frames are "
    "encoded, as many as the VAE takes (1 + 4k for Wan), to a 5-D latent. --audio encodes a sound with LTX-2's audio "
    "VAE into its normalised latent [1, 8, T, 16] (25 latent frames a second), as ComfyUI's LTXV audio encode does, "
    "or with MiniMax-H3's into its reference rows audio_hidden_states [1, 2T, 32] (40 a second)."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--vae", required=True, metavar="FILE", help="VAE, checkpoint with a VAE, or TAESD encoder"
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--image", metavar="IMG",
        help="PNG or JPEG; with a video VAE also CLIP.mp4, CLIP.webp, CLIP.gif or a folder of frames",
    )  # fmt: skip
    what.add_argument(
        "--audio", metavar="SOUND",
        help="a sound (WAV, FLAC, MP3, OGG, M4A, a video's track) for LTX-2's or MiniMax-H3's audio VAE (--vae)",
    )  # fmt: skip
    parser.add_argument(
        "--seconds", type=float, metavar="S", help="--audio: encode at most its first S seconds"
    )
    parser.add_argument(
        "--frames", type=_positive, metavar="N",
        help="a clip: encode at most its first N frames (default: all, rounded down to a count the VAE takes)",
    )  # fmt: skip
    parser.add_argument(
        "--out", required=True, metavar="FILE.latent", help="the .latent to write (atomically)"
    )
    add_tile_arguments(parser, no_tile=False)
    add_device_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from ..requests import Encode

    if args.audio:
        return _audio(args)
    engine, report = engine_for(args)
    req = Encode(args.vae, args.image, args.out, round_trip=False, frames=args.frames, **tiling(args))
    try:
        res = engine.run(req, report=StderrProgress(args.quiet))  # writes the .latent atomically
    finally:
        engine.close()
    info = run_info(res.info)
    device = res.info.get("device", report.vae_device)
    w, h = res.info["image_size"]
    result = {
        "vae": args.vae,
        "image": args.image,
        "output": args.out,
        "latent_shape": res.info["latent_shape"],
        "encoded_size": res.info["encoded_size"],  # [width, height] encoded: cropped to whole latent pixels
        **({"frames": res.info["frames"]} if "frames" in res.info else {}),  # a clip: the frames encoded
        "device": device,
        "seconds": round(res.seconds, 3),
        **info,
    }
    if args.json:
        print_json(result)
    else:
        used = tuple(res.info["encoded_size"])  # whole latent pixels: the rest was cropped
        crop = f" (cropped to {used[0]}x{used[1]})" if used != (w, h) else ""
        if "frames" in res.info:
            crop += f", {res.info['frames']} frames"
        print(
            f"encoded {w}x{h}{crop} -> latent {tuple(res.info['latent_shape'])} on {device} "
            f"({info['dtype']}, {info['mode']}) in {res.seconds:.1f} s; wrote {args.out}"
        )
        for note in info.get("notes") or ():
            print(f"  note: {note}")
    return EXIT_OK


def _audio(args: argparse.Namespace) -> int:
    from ..requests import EncodeAudio

    engine, _ = engine_for(args)
    try:
        res = engine.run(
            EncodeAudio(args.vae, args.audio, args.out, args.seconds), report=StderrProgress(args.quiet)
        )
    finally:
        engine.close()
    info = dict(res.info)
    result = {"vae": args.vae, "audio": args.audio, "output": args.out, "latent_shape": info["latent_shape"],
              "audio_seconds": round(info["audio_seconds"], 3), "source_rate": info["source_rate"],
              "channels": info["channels"], "normalised": info["normalised"], "device": info["device"],
              "seconds": round(res.seconds, 3), "notes": list(info["notes"])}  # fmt: skip
    if args.json:
        print_json(result)
        return EXIT_OK
    print(f"encoded {info['audio_seconds']:.2f} s ({info['channels']} channel(s) at {info['source_rate']} Hz) -> "
          f"latent {tuple(info['latent_shape'])} on {info['device']} (float32) in {res.seconds:.1f} s; wrote {args.out}")  # fmt: skip
    for note in info["notes"]:
        print(f"  note: {note}")
    return EXIT_OK


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return n
