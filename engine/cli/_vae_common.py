"""Shared by `loadout decode` and `loadout encode`, two clients of the engine's Decode and Encode
requests: the tile options and how they become request fields, progress on stderr, the engine they
run in, and the PNG written from a DecodeResult. The device, the dtype and the tiles are the engine's
choice (engine.decoding), the same as the window's."""

from __future__ import annotations

import argparse
import sys

from ._common import whole_number


def add_tile_arguments(parser: argparse.ArgumentParser, *, no_tile: bool) -> None:
    g = parser.add_argument_group("tiling (output pixels, as ComfyUI's tiled VAE nodes)")
    g.add_argument("--tile", type=_px, metavar="PX", help="tile size; default: full if it fits, else tiled")
    g.add_argument(
        "--overlap", type=_px0, metavar="PX", help="overlap between tiles (default 64 decode, 128 encode)"
    )
    if no_tile:
        g.add_argument("--no-tile", action="store_true", help="never tile (may run out of memory)")
        g.add_argument(
            "--tile-frames", type=_frames, metavar="N",
            help="video: latent frames per temporal chunk (default: as many as the memory allows, up to 4); "
            "chunks carry the causal cache, so any N gives the same frames",
        )  # fmt: skip
        g.add_argument(
            "--overlap-frames", type=_frames0, default=0, metavar="N",
            help="video: latent frames re-decoded as warm-up when a chunk must restart without its cache "
            "(after an out-of-memory split); default 0",
        )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


_px = whole_number(64, "pixels", 8)  # a tile
_px0 = whole_number(0, "pixels", 8)  # an overlap
_frames = whole_number(1, "latent frames")
_frames0 = whole_number(0, "latent frames")


def tiling(args: argparse.Namespace) -> dict:
    """The Decode / Encode request's mode, tile and overlap from the flags; an unset flag is left to the
    request (the VAE's own overlap, the estimate's tile)."""
    kw: dict = {"mode": "full" if getattr(args, "no_tile", False) else "tiled" if args.tile else "auto"}
    if args.tile:
        kw["tile"] = args.tile
    if args.overlap is not None:
        kw["overlap"] = args.overlap  # auto mode: the overlap should the estimate choose tiles
    if getattr(args, "tile_frames", None):
        kw["tile_frames"] = args.tile_frames
    if getattr(args, "overlap_frames", 0):
        kw["overlap_frames"] = args.overlap_frames
    return kw


def engine_for(args: argparse.Namespace):
    """An Engine with devices detected from the device flags (--cpu, --cpu-vae, --device N, --vae-dtype,
    --force-*), as the window's settings do; returns (engine, device report)."""
    from ..devices import options_from_args
    from ..facade import Engine

    engine = Engine()
    return engine, engine.detect(options_from_args(args))


# Keys of a DecodeResult's info that the engine adds for the window; the CLI prints engine.vae's
# RunInfo fields as it always has.
ENGINE_ONLY_INFO = ("vae_component", "device", "latent_shape", "out", "shown")


def run_info(info) -> dict:
    return {k: v for k, v in info.items() if k not in ENGINE_ONLY_INFO}


def write_pngs(result, out: str, batch: int) -> list[str]:
    """The decoded image(s) as PNG, each written atomically; a batch becomes NAME_0.png, NAME_1.png, ..."""
    from pathlib import Path

    from PIL import Image

    from ..errors import EngineError
    from ..formats.atomic import atomic_output

    images = result.images or (result.rgb,)
    if len(images) != batch:
        raise EngineError(
            f"the latent holds a batch of {batch} images but the engine returned {len(images)}: "
            "this build decodes single-image latents only"
        )
    target = Path(out)
    paths = (
        [target]
        if batch == 1
        else [target.with_name(f"{target.stem}_{i}{target.suffix}") for i in range(batch)]
    )
    for rgb, p in zip(images, paths, strict=True):
        with atomic_output(p) as f:
            Image.frombytes("RGB", (result.width, result.height), rgb).save(f, format="PNG")
    return [str(p) for p in paths]


class StderrProgress:
    """One updating line on stderr per stage: 'VAE decode  37/120'."""

    def __init__(self, quiet: bool):
        self.quiet = quiet or not sys.stderr.isatty()
        self._last = -1

    def __call__(self, p) -> None:
        if self.quiet or not p.total:
            return
        pct = int(100 * p.done / p.total)
        if pct != self._last:
            self._last = pct
            sys.stderr.write(f"\r{p.stage}  {p.done}/{p.total}  {pct}%")
            if p.done >= p.total:
                sys.stderr.write("\n")
            sys.stderr.flush()
