"""The facade's decode and encode: the VAE is a residency-ledger component (placed by the same
Residency.load as checkpoints — budget, eviction of other unpinned models, --cpu-vae — and kept loaded
afterwards, as ComfyUI keeps its VAE), then engine.vae runs it. Runs in the engine thread only.

A checkpoint's VAE is built runnable when the checkpoint is loaded (see `runnable_vae`), so decoding
with that checkpoint reuses the loaded weights instead of loading them a second time.
"""

from __future__ import annotations

import os
import time

from .errors import FormatError
from .requests import Decode, DecodeResult, Encode

VAE_PREFIXES = ("first_stage_model.", "vae.")


def component_name(vae) -> str:
    """'vae' for an AutoencoderKL; the TAESD-family name with its half ('taesd_decoder') otherwise."""
    if getattr(vae, "kind", "") != "vae_approx":
        return "vae"
    halves = [h for h in ("encoder", "decoder") if hasattr(vae, h)]
    return vae.name if len(halves) == 2 else f"{vae.name}_{halves[0]}"


def _key_prefix(path: str) -> str:
    """The file's key prefix of the VAE tensors, so LoRA lookups see the checkpoint's own key names."""
    if not path.endswith((".safetensors", ".sft")):
        return ""
    from .formats.safetensors import read_header

    keys = read_header(path).tensors
    return next((p for p in VAE_PREFIXES if any(k.startswith(p) for k in keys)), "")


def runnable_vae(path: str, device_report, *, pair: bool = True):
    """The VAE in `path` as a ModuleComponent with the placement rules build_components uses (device,
    --cpu-vae, --vae-dtype, forced dtypes)."""
    from collections import Counter

    from .model.dtypes import overrides_from_options, place
    from .model.wrapped import ModuleComponent
    from .vae import load_vae

    vae = load_vae(path, pair=pair)
    params = list(vae.parameters())
    counts = Counter(str(p.dtype).removeprefix("torch.") for p in params if p.is_floating_point())
    file_dtype = counts.most_common(1)[0][0] if counts else "float32"
    size = sum(p.numel() * p.element_size() for p in params)
    device, kw = "cpu", {}
    if device_report is not None:
        device = device_report.selected.torch_device
        kw = dict(overrides_from_options("vae", device_report.options))
        kw.setdefault("vram_state", device_report.vram_state.value)
        kw.setdefault("info", device_report.selected)
        if device_report.vae_device:
            kw.setdefault("force_device", device_report.vae_device)
    p = place("vae", file_dtype, device, size_bytes=size, **kw)
    return ModuleComponent(
        component_name(vae),
        os.path.abspath(path),
        vae,
        device=p.device,
        storage_dtype=p.storage_dtype,
        compute_dtype=p.compute_dtype,
        key_prefix=_key_prefix(path),
    )


def is_runnable(c) -> bool:
    return hasattr(c.module, "decode_head") or hasattr(c.module, "encode_tail")


def vae_for(engine, path: str):
    """The runnable VAE component of `path`: the one already built (a loaded checkpoint's, or an
    earlier decode's), else a new one. A header-built 'vae' component of the same file (from an
    earlier Load) holds the same weights: it is unloaded and replaced, so they are never held twice."""
    engine.need_residency()
    path = os.path.abspath(path)
    for (p, _n), c in engine.components.items():
        if p == path and is_runnable(c):
            return c
    comp = runnable_vae(path, engine.report)
    old = engine.components.pop((path, "vae"), None)
    if old is not None and engine.residency is not None:
        engine.residency.unload(old)
    engine.components[(path, comp.name)] = comp
    return comp


def _place(engine, comp, direction: str, pixels: int, token, report):
    """Load the VAE through the ledger, asking for the pass's own memory on top so other models are
    evicted first when the device is short (ComfyUI loads its VAE with the decode's estimate)."""
    import torch

    from .vae import estimate

    res = engine.need_residency()
    spec = estimate.spec_of(comp.module)
    dtype = _dtype(comp)
    esize = torch.empty((), dtype=dtype).element_size()
    extra = estimate.activation_bytes(spec, direction, pixels, esize)
    if comp.device == res.device:
        extra = min(extra, max(0, res.probe() - res.policy.min_inference) // 2)  # tiles cover the rest
    res.load([comp], extra_memory=extra, token=token, report=report)
    return torch.device(comp.device), dtype


def _dtype(comp):
    """fp32 on a CPU (as the CLI and ComfyUI do); the placement's compute dtype on an accelerator."""
    import torch

    return torch.float32 if comp.device == "cpu" else getattr(torch, comp.compute_dtype)


def _tiles(vae, lat_hw, mode, tile, overlap, device) -> list[tuple[int, int, int, int]]:
    """Output-pixel core rectangles (y0, y1, x0, x1) in the order tiles finish (empty: full decode)."""
    from .vae import estimate, run
    from .vae.tiling import plan_tiles

    f = vae.downscale
    if mode == "full":
        return []
    if mode == "auto":
        budget = run.memory_budget(device)
        px = lat_hw[0] * lat_hw[1] * f * f
        if estimate.activation_bytes(run._spec(vae), "decode", px, 4) <= budget:
            return []
        tile, overlap = run.default_tile_px(device, vae, budget)
    tiles = plan_tiles(lat_hw[0], lat_hw[1], max(1, tile // f), max(0, overlap // f))
    return [tuple(v * f for v in t.core) for t in tiles]


def _rgb(img) -> tuple[int, int, bytes]:
    import torch

    x = (img[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return x.shape[1], x.shape[0], x.numpy().tobytes()


def _mode_kw(req) -> dict:
    kw: dict = {"tiled": {"auto": None, "full": False, "tiled": True}[req.mode]}
    if req.mode == "tiled":
        kw.update(tile=req.tile, overlap=req.overlap)
    return kw


def decode(engine, req: Decode, token, report) -> DecodeResult:
    from .formats.latent import read_latent
    from .residency import Event
    from .vae import decode as vae_decode
    from .vae.run import RunInfo

    latent = read_latent(req.latent)
    if latent.dim() != 4:
        raise FormatError(f"{os.path.basename(req.latent)}: a video latent (5-D) cannot be decoded here yet.")
    comp = vae_for(engine, req.vae)
    vae = comp.module
    if not hasattr(vae, "decoder"):
        raise FormatError(
            f"{os.path.basename(req.vae)} holds no decoder (a TAESD encoder?): choose a decoder."
        )
    f = vae.downscale
    device, dtype = _place(engine, comp, "decode", latent.shape[0] * latent.shape[2] * latent.shape[3] * f * f,
                           token, report)  # fmt: skip
    tiles = _tiles(vae, tuple(latent.shape[2:]), req.mode, req.tile, req.overlap, device)
    info = RunInfo()
    emit = engine.on_event or (lambda e: None)
    t0 = time.perf_counter()
    emit(Event("DecodeStarted", comp.name, 0, 0.0,
               detail={"tiles": tiles, "latent": list(latent.shape), "mode": req.mode, "vae": comp.path}))  # fmt: skip
    try:
        img = vae_decode(vae, latent, device=device, dtype=dtype, token=token, report=report, info=info,
                         **_mode_kw(req))  # fmt: skip
    except BaseException:
        emit(Event("Cancelled", comp.name, 0, time.perf_counter() - t0, detail={"job": "decode"}))
        raise
    w, h, rgb = _rgb(img)
    dt = time.perf_counter() - t0
    out = {**info.to_json(), "vae_component": comp.name, "device": str(device)}
    emit(Event("DecodeFinished", comp.name, len(rgb), dt, detail=out))
    return DecodeResult(w, h, rgb, out, dt, req.latent)


def encode(engine, req: Encode, token, report) -> DecodeResult:
    """Encode an image to a .latent file. The result shows the latent decoded back when the VAE has a
    decoder (a TAESD *_encoder file brings its *_decoder sibling): the round trip is what a model will
    really get from this image; without a decoder it shows the image that was encoded."""
    import numpy as np
    import torch
    from PIL import Image

    from .formats.latent import write_latent
    from .vae import decode as vae_decode
    from .vae import encode as vae_encode
    from .vae.run import RunInfo

    try:
        im = Image.open(req.image).convert("RGB")
    except OSError as e:
        raise FormatError(f"{os.path.basename(req.image)}: not an image Loadout can read ({e})") from e
    comp = vae_for(engine, req.vae)
    if not hasattr(comp.module, "encoder"):
        raise FormatError(
            f"{os.path.basename(req.vae)} holds no encoder (a TAESD decoder?): choose an encoder."
        )
    x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    device, dtype = _place(engine, comp, "encode", x.shape[2] * x.shape[3], token, report)
    info = RunInfo()
    t0 = time.perf_counter()
    lat = vae_encode(comp.module, x, device=device, dtype=dtype, token=token, report=report, info=info,
                     **_mode_kw(req))  # fmt: skip
    token.raise_if_cancelled()
    write_latent(req.out, lat)
    shown = "image"
    if hasattr(comp.module, "decoder"):
        x = vae_decode(comp.module, lat, device=device, dtype=dtype, token=token, report=report,
                       **_mode_kw(req))  # fmt: skip
        shown = "round trip"
    w, h, rgb = _rgb(x)
    out = {**info.to_json(), "latent_shape": list(lat.shape), "out": req.out, "vae_component": comp.name,
           "shown": shown}  # fmt: skip
    return DecodeResult(w, h, rgb, out, time.perf_counter() - t0, req.out)
