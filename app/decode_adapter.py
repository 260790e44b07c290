"""Decode/encode for the window on top of engine.vae (the engine has no facade `decode` yet): loads the
VAE once per file, works out the tiles the run will use (so the panel can draw them as they finish),
and returns the image as plain RGB bytes. Runs in the engine thread only."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from engine.errors import FormatError


@dataclass(frozen=True)
class Decode:
    vae: str
    latent: str
    mode: str = "auto"  # auto | full | tiled
    tile: int = 512  # output pixels (tiled mode)
    overlap: int = 64


@dataclass(frozen=True)
class Encode:
    vae: str
    image: str
    out: str
    mode: str = "auto"
    tile: int = 512
    overlap: int = 64


@dataclass(frozen=True)
class DecodeResult:
    width: int
    height: int
    rgb: bytes  # height * width * 3, row-major
    info: dict  # engine.vae RunInfo JSON: mode, tiles, tile_px, estimate_bytes, ...
    seconds: float
    source: str  # the latent (decode) or the written latent file (encode)


def _vae(engine, path: str):
    from engine.vae import load_vae

    path = os.path.abspath(path)
    cache = engine.__dict__.setdefault("vaes", {})
    vae = cache.get(path)
    if vae is None:
        cache.clear()  # one VAE at a time: they are not in the residency ledger yet
        vae = cache[path] = load_vae(path)
    return vae


def _tiles(vae, lat_hw, mode, tile, overlap, budget_device) -> list[tuple[int, int, int, int]]:
    """Output-pixel core rectangles (y0, y1, x0, x1) in the order tiles finish (empty: full decode)."""
    from engine.vae import run
    from engine.vae.tiling import plan_tiles

    f = vae.downscale
    if mode == "full":
        return []
    if mode == "auto":
        import torch

        spec = run._spec(vae)
        budget = run.memory_budget(torch.device(budget_device))
        if run.estimate.full_bytes(spec, "decode", lat_hw[0] * lat_hw[1] * f * f, 4) <= budget:
            return []
        tile, overlap = run.default_tile_px(torch.device(budget_device), vae, budget)
    tiles = plan_tiles(lat_hw[0], lat_hw[1], max(1, tile // f), max(0, overlap // f))
    return [tuple(v * f for v in t.core) for t in tiles]


def _rgb(img) -> tuple[int, int, bytes]:
    import torch

    x = (img[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return x.shape[1], x.shape[0], x.numpy().tobytes()


def decode(engine, req: Decode, token, report) -> DecodeResult:
    from engine.formats.latent import read_latent
    from engine.residency import Event
    from engine.vae import decode as vae_decode
    from engine.vae.run import RunInfo

    vae = _vae(engine, req.vae)
    token.raise_if_cancelled()
    latent = read_latent(req.latent)
    if latent.dim() != 4:
        raise FormatError(f"{os.path.basename(req.latent)}: a video latent (5-D) cannot be decoded here yet.")
    device = str(next(vae.parameters()).device) if any(True for _ in vae.parameters()) else "cpu"
    tiles = _tiles(vae, tuple(latent.shape[2:]), req.mode, req.tile, req.overlap, device)
    info = RunInfo()
    tiled = {"auto": None, "full": False, "tiled": True}[req.mode]
    kw = dict(tile=req.tile, overlap=req.overlap) if req.mode == "tiled" else {}
    emit = engine.on_event or (lambda e: None)
    t0 = time.perf_counter()
    emit(Event("DecodeStarted", os.path.basename(req.vae), 0, 0.0,
               detail={"tiles": tiles, "latent": list(latent.shape), "mode": req.mode}))  # fmt: skip
    try:
        img = vae_decode(vae, latent, tiled=tiled, token=token, report=report, info=info, **kw)
    except BaseException:
        emit(
            Event(
                "Cancelled", os.path.basename(req.vae), 0, time.perf_counter() - t0, detail={"job": "decode"}
            )
        )
        raise
    w, h, rgb = _rgb(img)
    dt = time.perf_counter() - t0
    emit(Event("DecodeFinished", os.path.basename(req.vae), len(rgb), dt, detail=info.to_json()))
    return DecodeResult(w, h, rgb, info.to_json(), dt, req.latent)


def encode(engine, req: Encode, token, report) -> DecodeResult:
    """Encode an image to a .latent file; the result shows the latent decoded back (a round trip)."""
    import numpy as np
    import torch
    from PIL import Image

    from engine.formats.latent import write_latent
    from engine.vae import encode as vae_encode
    from engine.vae.run import RunInfo

    vae = _vae(engine, req.vae)
    try:
        im = Image.open(req.image).convert("RGB")
    except OSError as e:
        raise FormatError(f"{os.path.basename(req.image)}: not an image Loadout can read ({e})") from e
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    info = RunInfo()
    t0 = time.perf_counter()
    tiled = {"auto": None, "full": False, "tiled": True}[req.mode]
    kw = dict(tile=req.tile, overlap=req.overlap) if req.mode == "tiled" else {}
    lat = vae_encode(vae, x, tiled=tiled, token=token, report=report, info=info, **kw)
    token.raise_if_cancelled()
    write_latent(req.out, lat)
    w, h, rgb = _rgb(torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)[None])
    return DecodeResult(w, h, rgb, {**info.to_json(), "latent_shape": list(lat.shape), "out": req.out},
                        time.perf_counter() - t0, req.out)  # fmt: skip
