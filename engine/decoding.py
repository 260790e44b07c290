"""The facade's decode and encode: the VAE is a residency-ledger component (placed by the same
Residency.load as checkpoints — budget, eviction of other unpinned models, --cpu-vae — and kept loaded
afterwards, as ComfyUI keeps its VAE), then engine.vae runs it with the tiling engine.vae.choice picks.
Runs in the engine thread only; everything it touches is passed in (`Parts`).

A checkpoint's VAE is built runnable when the checkpoint is loaded (see `runnable_vae`), so decoding
with that checkpoint reuses the loaded weights instead of loading them a second time.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import Cancelled, FormatError
from .events import DecodeFinished, DecodeStarted, EventLog, JobCancelled, Tiling, TilingChanged
from .loaded import LoadedModels
from .requests import Decode, DecodeResult, Encode, frozen


@dataclass(frozen=True)
class Parts:
    """What a decode works with, passed explicitly by the Engine that owns them."""

    loaded: LoadedModels
    residency: object  # engine.residency.Residency
    device_report: object  # engine.devices.DeviceReport
    events: EventLog


VAE_PREFIXES = ("first_stage_model.", "vae.")


def component_name(vae) -> str:
    """'vae' for an AutoencoderKL; the TAESD-family name with its half ('taesd_decoder') otherwise."""
    if getattr(vae, "kind", "") != "vae_approx":
        return "vae"
    halves = [h for h in ("encoder", "decoder") if hasattr(vae, h)]
    return vae.name if len(halves) == 2 else f"{vae.name}_{halves[0]}"


def _key_prefix(keys) -> str:
    """The file's key prefix of the VAE tensors, so LoRA lookups see the checkpoint's own key names."""
    return next((p for p in VAE_PREFIXES if any(k.startswith(p) for k in keys)), "")


def vae_placement(module, device_report):
    """Where a VAE-like module goes and in which dtypes (engine.model.dtypes.place, as build_components places a
    checkpoint's VAE): the device, --cpu-vae, --vae-dtype, forced dtypes, from its weights' dtype and size."""
    from .formats.dtypes import dominant_float_dtype, dtype_name
    from .model.dtypes import overrides_from_options, place

    params = list(module.parameters())
    file_dtype = dominant_float_dtype(dtype_name(p.dtype) for p in params if p.is_floating_point())
    size = sum(p.numel() * p.element_size() for p in params)
    device, kw = "cpu", {}
    if device_report is not None:
        device = device_report.selected.torch_device
        kw = dict(overrides_from_options("vae", device_report.options))
        kw.setdefault("vram_state", device_report.vram_state.value)
        kw.setdefault("info", device_report.selected)
        if device_report.vae_device:
            kw.setdefault("force_device", device_report.vae_device)
    return place("vae", file_dtype, device, size_bytes=size, **kw)


def runnable_vae(path: str, device_report, *, pair: bool = True, header=None):
    """The VAE in `path` as a ModuleComponent with the placement rules build_components uses (device,
    --cpu-vae, --vae-dtype, forced dtypes). `header`: the file's safetensors header, when read already."""
    from .model.wrapped import ModuleComponent
    from .vae import load_vae

    if header is None and path.endswith((".safetensors", ".sft")):
        from .formats.safetensors import read_header

        header = read_header(path)
    vae = load_vae(path, pair=pair, header=header)
    p = vae_placement(vae, device_report)
    return ModuleComponent(
        component_name(vae),
        os.path.abspath(path),
        vae,
        device=p.device,
        storage_dtype=p.storage_dtype,
        compute_dtype=p.compute_dtype,
        key_prefix=_key_prefix(header.tensors) if header is not None else "",
    )


def vae_for(parts: Parts, path: str):
    """The runnable VAE component of `path`: the one already built (a loaded checkpoint's, or an
    earlier decode's), else a new one. A header-built 'vae' component of the same file (from an
    earlier Load) holds the same weights: it is unloaded and replaced, so they are never held twice."""
    path = os.path.abspath(path)
    comp = parts.loaded.runnable_vae(path)
    if comp is not None:
        return comp
    comp = runnable_vae(path, parts.device_report)
    old, _ = parts.loaded.remove(path, "vae")
    if old is not None:
        parts.residency.unload(old)
    parts.loaded.add(path, comp.name, comp)
    return comp


def _place(parts: Parts, comp, direction: str, pixels: int, token, report, frames: int = 1):
    """Load the VAE through the ledger, asking for the pass's own memory on top so other models are
    evicted first when the device is short (ComfyUI loads its VAE with the decode's estimate)."""
    import torch

    from .vae import estimate
    from .vae.clip_estimate import encode_clip_bytes

    res = parts.residency
    spec = estimate.spec_of(comp.module)
    dtype = _dtype(comp)
    esize = torch.empty((), dtype=dtype).element_size()
    if frames > 1:  # a clip to encode
        extra = encode_clip_bytes(spec, pixels, frames, esize, full=False)
    else:
        extra = estimate.activation_bytes(spec, direction, pixels, esize)
    if comp.device == res.device:
        extra = min(extra, max(0, res.probe() - res.policy.min_inference) // 2)  # tiles cover the rest
    res.load([comp], extra_memory=extra, token=token, report=report)
    return torch.device(comp.device), dtype


def _dtype(comp):
    """fp32 on a CPU (as the CLI and ComfyUI do); the placement's compute dtype on an accelerator."""
    import torch

    return torch.float32 if comp.device == "cpu" else getattr(torch, comp.compute_dtype)


def choose_tiling(vae, x, direction: str, req, device, dtype, cap: int | None = None) -> tuple[Tiling, int]:
    """The tiling this pass will run (engine.vae.choice, with the real dtype and batch) and the
    budget it was chosen for: what is free on the device, at most `cap` (--vram-budget)."""
    from .vae import choice, run

    budget = run.memory_budget(device)
    if cap is not None:
        budget = min(budget, cap)
    job = run.job_of(vae, x, direction, device, dtype)
    if getattr(vae, "video", False) and direction == "decode":
        mode = req.mode
        tile = req.tile if mode == "tiled" else None
        extra = dict(
            tile_frames=getattr(req, "tile_frames", None), overlap_frames=getattr(req, "overlap_frames", 0)
        )
        return choice.choose_video(job, budget, mode, tile, req.overlap, **extra), budget
    if req.mode == "tiled":
        return choice.choose(job, budget, "tiled", req.tile, req.overlap), budget
    # auto: the asked overlap applies should the estimate choose tiles (None: the VAE's own)
    return choice.choose(job, budget, req.mode, None, req.overlap), budget


def _decode_inputs(vae, latent, req):
    """A timestep-conditioned decoder's inputs (engine.vae.ltx), set for this decode only: its timestep
    (the request's, else the VAE's default), and the pipelines' noise mixing, seeded, when asked."""
    if not hasattr(vae, "decode_timestep"):
        return latent
    t = getattr(req, "decode_timestep", None)
    vae.decode_timestep = vae.default_decode_timestep if t is None else t
    s = getattr(req, "decode_noise_scale", 0.0)
    if s:  # (1 - s) latent + s noise, as diffusers' LTX pipelines mix before the decode
        import torch

        g = torch.Generator().manual_seed(getattr(req, "seed", 0))
        latent = (1 - s) * latent + s * torch.randn(latent.shape, generator=g, dtype=latent.dtype)
    return latent


def _rgb(img, i: int = 0) -> tuple[int, int, bytes]:
    import torch

    x = (img[i].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous()
    return x.shape[1], x.shape[0], x.numpy().tobytes()


def _batch(img) -> tuple[bytes, ...]:
    """Every image of a batch as rgb (empty for a single image: DecodeResult.rgb holds it)."""
    return tuple(_rgb(img, i)[2] for i in range(img.shape[0])) if img.shape[0] > 1 else ()


def decode(parts: Parts, req: Decode, token, report) -> DecodeResult:
    from .formats.latent import read_latent
    from .vae import decode as vae_decode
    from .vae.run import RunInfo

    latent = read_latent(req.latent)
    comp = vae_for(parts, req.vae)
    vae = comp.module
    if not hasattr(vae, "decoder"):
        raise FormatError(
            f"{os.path.basename(req.vae)} holds no decoder (a TAESD encoder?): choose a decoder."
        )
    video = getattr(vae, "video", False)
    if latent.dim() == 5 and not video:
        raise FormatError(
            f"{os.path.basename(req.latent)} is a video latent {tuple(latent.shape)}: decode it with a video VAE "
            f"(Wan 2.1 / 2.2, Qwen-Image, Mochi, LTX-Video, Cosmos 1.0); {os.path.basename(req.vae)} decodes images"
        )
    latent = _decode_inputs(vae, latent, req)
    f = vae.downscale
    frame_px = latent.shape[0] * latent.shape[-2] * latent.shape[-1] * f * f
    device, dtype = _place(parts, comp, "decode", frame_px * (4 if video else 1), token, report)
    cap = getattr(parts.device_report, "vram_budget_bytes", None)
    tiling, budget = choose_tiling(vae, latent, "decode", req, device, dtype, cap)
    ran = [tiling]

    def retiled(t: Tiling, reason: str) -> None:
        ran[0] = t
        parts.events.emit(TilingChanged(comp.name, tiling=t, reason=reason))

    info = RunInfo()
    t0 = time.perf_counter()
    media = "video" if latent.dim() == 5 else "image"
    started = DecodeStarted(comp.name, vae=comp.path, latent_shape=tuple(latent.shape), requested_mode=req.mode,
                            tiling=tiling, downscale=f, media=media)  # fmt: skip
    with marked(parts, started):
        img = vae_decode(vae, latent, device=device, dtype=dtype, budget=budget, token=token, report=report,
                         info=info, tiling=tiling, on_tiling=retiled)  # fmt: skip
    frames: tuple[bytes, ...] = ()
    fps = 0.0
    if img.dim() == 5:  # a clip (N, F, 3, H, W): the first of the batch, frame by frame
        if img.shape[0] > 1:
            info.notes.append(f"the latent holds {img.shape[0]} clips: the result is the first")
        frames = tuple(_rgb(img[0], i)[2] for i in range(img.shape[1]))
        fps = video_fps(vae)
        img = img[0]
    w, h, rgb = _rgb(img)
    dt = time.perf_counter() - t0
    out = {**info.to_json(), "vae_component": comp.name, "device": str(device),
           "latent_shape": list(latent.shape)}  # fmt: skip
    parts.events.emit(DecodeFinished(comp.name, len(rgb) * max(1, len(frames)), dt, media=media, tiling=ran[0],
                                     dtype=info.dtype, device=str(device), fp32_rerun=info.fp32_rerun,
                                     oom_retries=info.oom_retries))  # fmt: skip
    return DecodeResult(w, h, rgb, frozen(out), dt, req.latent, () if frames else _batch(img), frames, fps)


# Frame rates the families generate at: Wan 2.1 (and 2.2 A14B, on the 2.1 VAE) 16 fps, Wan 2.2 TI2V-5B
# (the 48-channel VAE) 24 fps (Wan2.2 configs: sample_fps).
FPS = {"wan21": 16.0, "wan22": 24.0}
FPS["mochi"] = 30.0  # Mochi 1 (genmoai/mochi's and diffusers' MochiPipeline examples save at 30 fps)


def video_fps(vae) -> float:
    if getattr(vae, "fps", None):  # a VAE that says its family's rate (engine.vae.ltx, hunyuan_video)
        return vae.fps
    own = getattr(vae, "spec_kind", None)
    if own in FPS:
        return FPS[own]
    return FPS["wan22" if getattr(vae.cfg, "residual", False) else "wan21"]


def encode(parts: Parts, req: Encode, token, report) -> DecodeResult:
    """Encode an image, or a clip with a video VAE (engine.vae.clips: a video file, an animated WebP / GIF, a
    folder of frames), to a .latent file. The result shows the latent decoded back when the VAE has a
    decoder (a TAESD *_encoder file brings its *_decoder sibling): the round trip is what a model will
    really get from this image; without a decoder it shows the image that was encoded."""
    import numpy as np
    import torch

    from .formats.latent import write_latent
    from .vae import decode as vae_decode
    from .vae import encode as vae_encode
    from .vae.clips import is_clip
    from .vae.images import read_rgb
    from .vae.run import RunInfo

    comp = vae_for(parts, req.vae)
    video = getattr(comp.module, "video", False)
    if not hasattr(comp.module, "encoder"):
        name = os.path.basename(req.vae)
        if getattr(comp.module, "encodes", False):  # a decoder-only file of a family that encodes
            raise FormatError(f"{name} holds the decoder only: choose the VAE file with its encoder.")
        if not video:  # a video VAE that does not encode: engine.vae.run says so
            raise FormatError(f"{name} holds no encoder (a TAESD decoder?): choose an encoder.")
    info = RunInfo()
    if is_clip(req.image):
        x, size = _clip(comp.module, req, info.notes)  # (1, 3, F, H, W)
    else:
        im = read_rgb(req.image)
        size = im.size
        x = torch.from_numpy(np.asarray(im, dtype=np.float32) / 255.0).permute(2, 0, 1)[None]
    frames = x.shape[2] if x.dim() == 5 else 1
    device, dtype = _place(parts, comp, "encode", x.shape[-2] * x.shape[-1], token, report, frames)
    t0 = time.perf_counter()
    tiling, budget = choose_tiling(comp.module, x, "encode", req, device, dtype)
    media = "video" if x.dim() == 5 else "image"
    started = DecodeStarted(comp.name, direction="encode", vae=comp.path, requested_mode=req.mode, tiling=tiling,
                            downscale=comp.module.downscale, media=media)  # fmt: skip
    with marked(parts, started):
        lat = vae_encode(comp.module, x, device=device, dtype=dtype, budget=budget, token=token, report=report,
                         info=info, tiling=tiling)  # fmt: skip
        token.raise_if_cancelled()
    parts.events.emit(DecodeFinished(comp.name, lat.numel() * 4, time.perf_counter() - t0, direction="encode",
                                     media=media, tiling=tiling, dtype=info.dtype, device=str(device),
                                     fp32_rerun=info.fp32_rerun, oom_retries=info.oom_retries))  # fmt: skip
    write_latent(req.out, lat)
    shown = "image"
    # MiniMax-H3's VAE decodes no frame from fewer than 2 latent frames (the release's chunks of 5, 3 of them
    # dropped by its encoder): then the encoded image or clip is shown
    decodable = getattr(comp.module, "frames_out", lambda t: 1)(lat.shape[2] if lat.dim() == 5 else 1) > 0
    if req.round_trip and hasattr(comp.module, "decoder") and decodable:
        back, budget = choose_tiling(comp.module, lat, "decode", req, device, dtype)
        x = vae_decode(comp.module, lat, device=device, dtype=dtype, budget=budget, token=token, report=report,
                       tiling=back)  # fmt: skip
        shown = "round trip"
    elif x.dim() == 5:
        x = x.transpose(1, 2)  # the clip encoded, frame-major as a decoded clip is: (1, F, 3, H, W)
    clip = x.dim() == 5
    w, h, rgb = _rgb(x[0] if clip else x)
    f = comp.module.downscale  # the encoder crops the image to whole latent pixels (as ComfyUI does)
    out = {**info.to_json(), "latent_shape": list(lat.shape), "out": req.out, "vae_component": comp.name,
           "shown": shown, "device": str(device),
           "encoded_size": [lat.shape[-1] * f, lat.shape[-2] * f], "image_size": list(size)}  # fmt: skip
    if frames > 1 or lat.dim() == 5:
        out["frames"] = frames
    shown_frames = tuple(_rgb(x[0], i)[2] for i in range(x.shape[1])) if clip else ()
    fps = video_fps(comp.module) if shown_frames else 0.0
    return DecodeResult(w, h, rgb, frozen(out), time.perf_counter() - t0, req.out, (), shown_frames, fps)


@contextmanager
def marked(parts: Parts, started: DecodeStarted) -> Iterator[None]:
    """The graph's marks of a job of this module or engine.sound: `started` now, and JobCancelled (at the job's
    direction) when the job stops at a cancel check inside; the caller emits DecodeFinished with what it made."""
    t0 = time.perf_counter()
    parts.events.emit(started)
    try:
        yield
    except Cancelled:
        parts.events.emit(JobCancelled(started.component, 0, time.perf_counter() - t0, at=started.direction))
        raise


def encodable_frames(vae, n: int) -> int:
    """The most of `n` frames the loaded video VAE's encoder takes (engine.vae.frames.encodable_frames)."""
    from .vae.estimate import spec_of
    from .vae.frames import encodable_frames as rule

    return rule(spec_of(vae).kind, n, vae.time_factor)


def _clip(vae, req: Encode, notes: list[str]):
    """The clip `req.image` as (1, 3, F, H, W) in [0, 1], F the most frames the VAE takes of the first
    `req.frames` (all when None); a note says what was left out."""
    import torch

    from .vae.clips import clip_info, read_clip

    name = os.path.basename(req.image.rstrip(os.sep))
    if not getattr(vae, "video", False):
        raise FormatError(f"{name} is a clip: encoding a clip needs a video VAE (Wan, HunyuanVideo, LTX-Video, "
                          "...); this VAE encodes images", path=req.image)  # fmt: skip
    head = clip_info(req.image)
    want = req.frames
    if want is None:  # all of it, unless the frames alone would take a quarter of the RAM: then ask
        import psutil

        one = head.width * head.height * 3 * 5  # uint8 read + float32 clip, per frame
        room = max(1, psutil.virtual_memory().available // 4 // max(1, one))
        if head.frames > room:
            raise FormatError(f"{name}: {head.frames} frames of {head.width}x{head.height} would take "
                              f"{head.frames * one / 2**30:.1f} GiB before encoding: choose how many with "
                              f"--frames (e.g. --frames {encodable_frames(vae, min(room, 81))})",
                              path=req.image)  # fmt: skip
        want = head.frames or room  # a header without a count: read what fits
    arr, _ = read_clip(req.image, max_frames=want)
    n_in = len(arr)
    n = encodable_frames(vae, n_in)
    if n <= 0:
        raise FormatError(f"{name}: {n_in} frame(s) is too few for this VAE's encoder", path=req.image)
    if n < n_in:
        notes.append(f"encoded the first {n} of {n_in} frames: this VAE takes 1 + {vae.time_factor}k frames")
    x = torch.from_numpy(arr[:n]).permute(3, 0, 1, 2)[None].float().div_(255)
    return x, (head.width, head.height)
