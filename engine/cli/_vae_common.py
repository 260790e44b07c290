"""Shared by `loadout decode` and `loadout encode`: tile options, device/dtype choice, progress."""

from __future__ import annotations

import argparse
import sys

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def add_tile_arguments(parser: argparse.ArgumentParser, *, no_tile: bool) -> None:
    g = parser.add_argument_group("tiling (output pixels, as ComfyUI's tiled VAE nodes)")
    g.add_argument("--tile", type=_px, metavar="PX", help="tile size; default: full if it fits, else tiled")
    g.add_argument(
        "--overlap", type=_px0, metavar="PX", help="overlap between tiles (default 64 decode, 128 encode)"
    )
    if no_tile:
        g.add_argument("--no-tile", action="store_true", help="never tile (may run out of memory)")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")


def _px(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of pixels") from None
    if v < 64 or v % 8:
        raise argparse.ArgumentTypeError(f"{v}: a tile is at least 64 pixels and a multiple of 8")
    return v


def _px0(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of pixels") from None
    if v < 0 or v % 8:
        raise argparse.ArgumentTypeError(f"{v}: the overlap is >= 0 and a multiple of 8")
    return v


def device_and_dtype(args):
    """The torch device and compute dtype from the shared device flags (--cpu, --cpu-vae, --device N,
    --vae-dtype, --force-*). Default: the selected device, fp32 on a CPU, bf16/fp16 on a GPU that
    computes well in it."""
    import torch

    from ..devices import detect_devices, options_from_args

    report = detect_devices(options_from_args(args))
    device = torch.device(report.vae_device)
    name = args.vae_dtype or args.force_dtype
    if name is None:
        sel = report.selected
        name = "fp32" if device.type == "cpu" else ("bf16" if sel.bf16 else "fp16" if sel.fp16 else "fp32")
    return device, getattr(torch, DTYPES[name])


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
