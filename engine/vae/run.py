"""Decode and encode, full or tiled: the mode decided up front from the memory estimate (on a CPU a
decode that does not fit gets the process killed rather than an exception), smaller tiles after a
GPU out-of-memory, fp32 re-runs when fp16/bf16 overflow, progress per tile, cancellation per op."""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from .. import ops
from ..errors import FormatError, OutOfMemory, UnsupportedModel
from ..events import Tiling
from ..jobs import CancelToken, Progress, Report, no_report
from ..memory import release_memory, trim_heap
from . import choice, estimate
from .choice import MIN_TILE_PX  # noqa: F401  (re-exported for callers of the run)
from .clip_estimate import encode_clip_bytes
from .tiling import DiskStore, NonFinite, TileStore, batch_tiles, box_px, plan_tiles, run_tiled


@dataclass
class RunInfo:
    """What a decode/encode actually did, for the CLI's JSON and the GUI's log."""

    mode: str = "full"
    tile_px: int | None = None
    overlap_px: int | None = None
    tiles: int = 1
    dtype: str = "float32"
    fp32_rerun: bool = False
    oom_retries: int = 0
    estimate_bytes: int = 0  # the estimate of a full pass (the CLI's "estimate ... for a full decode")
    tiling_estimate_bytes: int = 0  # the estimate of the tiling that ran (engine.vae.choice.peak_bytes)
    budget_bytes: int | None = None
    store: str | None = None
    snapshot: str | None = None  # video on a GPU: where the chunks' retry snapshots waited (device / host)
    notes: list[str] = field(default_factory=list)
    tile_frames: int | None = None  # video: latent frames per chunk
    overlap_frames: int | None = None
    cpu_fallback: bool = False

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _spec(vae: nn.Module) -> estimate.VaeSpec:
    return estimate.spec_of(vae)


def memory_budget(device: torch.device) -> int:
    """Bytes a decode may use on `device` now: free VRAM, or available RAM less a 1 GiB reserve."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return max(0, int(psutil.virtual_memory().available) - estimate.CPU_RESERVE_BYTES)


def _dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


@contextlib.contextmanager
def _compute(vae: nn.Module, device: torch.device, dtype: torch.dtype, budget: int | None = None):
    """Run the castable ops in `dtype` on `device` wherever the weights live; restored afterwards.
    When the weights in `dtype` on `device` take at most 1/8 of `budget` (a VAE is small: TAESD 2.4 MB,
    the SD VAE 335 MB in fp32), they are cast once for the run instead of in every op's forward: a
    tiled decode calls each op once per tile (64 tiles: 1,600 casts of TAESD's fp16 weights, 2 s)."""
    mods = [m for _, m in ops.castable_modules(vae)]
    saved = [(m, m.compute_dtype, m.offload) for m in mods]
    swapped = _precast(mods, device, dtype, budget)
    for m, _, _ in saved:
        w = getattr(m, "weight", None)
        m.compute_dtype = dtype if (w is None or w.dtype != dtype) else None
        m.offload = w is not None and w.device != device
    try:
        yield
    finally:
        for m, name, p in swapped:
            setattr(m, name, p)
        for m, dt, off in saved:
            m.compute_dtype, m.offload = dt, off


def _precast(mods, device, dtype, budget) -> list[tuple[nn.Module, str, nn.Parameter]]:
    """Swap in weights cast to `dtype` on `device` for one run (patched modules excepted: their
    patches apply per forward); returns what to put back."""
    todo = []
    for m in mods:
        if m.weight_functions or m.bias_functions:
            continue
        for name in (m.weight_attr, "bias"):
            p = getattr(m, name, None)
            if p is not None and p.is_floating_point() and (p.dtype != dtype or p.device != device):
                todo.append((m, name, p))
    esize = torch.empty((), dtype=dtype).element_size()
    if not todo or budget is None or sum(p.numel() for _, _, p in todo) * esize > budget // 8:
        return []
    for m, name, p in todo:
        setattr(m, name, nn.Parameter(p.detach().to(device=device, dtype=dtype), requires_grad=False))
    return todo


def job_of(
    vae: nn.Module, x: torch.Tensor, direction: str, device: torch.device, dtype: torch.dtype
) -> choice.Job:
    f = vae.downscale
    lat_hw = (x.shape[-2], x.shape[-1]) if direction == "decode" else (x.shape[-2] // f, x.shape[-1] // f)
    esize = torch.empty((), dtype=dtype).element_size()
    frames = x.shape[2] if x.dim() == 5 and direction == "decode" else 1
    return choice.Job(_spec(vae), direction, lat_hw, x.shape[0], f, esize, device.type == "cuda", frames)


def default_tile_px(
    device: torch.device, vae: nn.Module, budget: int | None = None, direction: str = "decode"
) -> tuple[int, int]:
    """Tile and overlap in output pixels for a float32 pass (see engine.vae.choice.default_tile_px)."""
    budget = budget if budget is not None else memory_budget(device)
    job = choice.Job(_spec(vae), direction, (1, 1), 1, vae.downscale, 4, device.type == "cuda")
    return choice.default_tile_px(job, budget)


def decode(
    vae: nn.Module,
    latent: torch.Tensor,
    *,
    tile: int | None = None,
    overlap: int | None = None,
    tiled: bool | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    budget: int | None = None,
    disk_store: bool | None = None,
    token: CancelToken | None = None,
    report: Report = no_report,
    info: RunInfo | None = None,
    tiling: Tiling | None = None,
    on_tiling: Callable[[Tiling, str], None] | None = None,
    tile_frames: int | None = None,
    overlap_frames: int = 0,
    save_latent: str | None = None,
) -> torch.Tensor:
    """VAE-space latent (N, C, h, w) -> image (N, 3, 8h, 8w) in [0, 1], float32 on the CPU; with a video
    VAE (engine.vae.wan) a 5-D latent (N, C, T, h, w) -> clip (N, 1 + 4 (T - 1), 3, H, W), frame-major.
    `tiled=None` decides from the estimate against `budget`; tile/overlap are output pixels. A
    `tiling` chosen beforehand (engine.vae.choice) is run as it is; `on_tiling(new, reason)` hears of
    every change an out-of-memory retry makes to it. Video: `tile_frames` latent frames per chunk (None:
    as the budget allows), `overlap_frames` of warm-up for a chunk that restarts without its cache.
    `save_latent`: a path the latent is written to (atomically, as a ComfyUI .latent) before the decode
    starts — for a latent that lives only in memory, so no failure can lose it."""
    if not hasattr(vae, "decoder"):
        raise FormatError("this VAE file holds no decoder (a TAESD encoder?): give the decoder file")
    _check_latent(vae, latent)
    if save_latent is not None:
        from ..formats.latent import write_latent

        write_latent(save_latent, latent.detach().float().cpu())
    return _run(
        vae, latent, "decode", tile, overlap, tiled, device, dtype, budget, disk_store, token, report, info,
        tiling, on_tiling, (tile_frames, overlap_frames),
    )  # fmt: skip


def encode(
    vae: nn.Module,
    image: torch.Tensor,
    *,
    tile: int | None = None,
    overlap: int | None = None,
    tiled: bool | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
    budget: int | None = None,
    disk_store: bool | None = None,
    token: CancelToken | None = None,
    report: Report = no_report,
    info: RunInfo | None = None,
    tiling: Tiling | None = None,
    on_tiling: Callable[[Tiling, str], None] | None = None,
) -> torch.Tensor:
    """Image (N, 3, H, W) in [0, 1] -> VAE-space latent (N, C, H/8, W/8); H and W are cropped to
    multiples of 8 (as ComfyUI does). A video VAE also takes a clip (N, 3, F, H, W), F a count its encoder
    takes (engine.decoding.encodable_frames), and returns (N, C, T, h, w)."""
    if not hasattr(vae, "encoder"):
        if getattr(vae, "encodes", False):  # a family Loadout encodes with, from a decoder-only file
            raise FormatError(
                f"{getattr(vae, 'source', 'this VAE')}: this file holds the decoder only: give the VAE file "
                "with its encoder"
            )
        if getattr(vae, "video", False):  # engine.vae.minimax_h3 whose encoder is not built (its GroupNorms)
            raise UnsupportedModel(
                f"{getattr(vae, 'source', 'this VAE')}: Loadout decodes with this video VAE; its encoder is not run yet"
            )
        raise FormatError("this VAE file holds no encoder (a TAESD decoder?): give the encoder file")
    clip = image.dim() == 5 and getattr(vae, "video", False)
    if (image.dim() != 4 and not clip) or image.shape[1] != 3:
        raise FormatError(f"expected an RGB image batch (N, 3, H, W), got {tuple(image.shape)}")
    f = vae.downscale
    hh, ww = image.shape[-2] // f * f, image.shape[-1] // f * f
    if hh == 0 or ww == 0:
        raise FormatError(f"the image is smaller than {f}x{f} pixels")
    image = image[..., :hh, :ww]
    if getattr(getattr(vae, "cfg", None), "image_channels", 3) == 4:
        # an RGBA VAE (Qwen-Image 2.1's, Qwen-Image-Layered's): the image opaque, as its pipeline's
        # convert("RGBA") makes an RGB image (pipeline_qwenimage21.py)
        image = torch.cat([image, torch.ones_like(image[:, :1])], dim=1)
    lo, hi = vae.image_range
    x = image * (hi - lo) + lo
    return _run(
        vae, x, "encode", tile, overlap, tiled, device, dtype, budget, disk_store, token, report, info,
        tiling, on_tiling,
    )  # fmt: skip


def _check_latent(vae, latent):
    video = getattr(vae, "video", False)
    if latent.dim() != 4 and not (video and latent.dim() == 5):
        if latent.dim() == 5:
            raise FormatError(
                f"a video latent {tuple(latent.shape)} needs a video VAE (Wan 2.1 / 2.2, Qwen-Image, Mochi, Cosmos 1.0): this "
                "VAE decodes images"
            )
        raise FormatError(f"expected a latent batch (N, C, h, w), got shape {tuple(latent.shape)}")
    if latent.dim() == 5 and latent.shape[2] > 1 and getattr(getattr(vae, "cfg", None), "frame", False):
        raise FormatError(
            f"a latent of {latent.shape[2]} frames: Qwen-Image 2.1's VAE decodes single images (its 2-D "
            "convolutions carry nothing from frame to frame; diffusers' refuses a second frame too)"
        )
    if latent.shape[1] != vae.latent_channels:
        raise FormatError(
            f"the latent has {latent.shape[1]} channels but this VAE decodes {vae.latent_channels}-channel "
            "latents: use the VAE of the model that made the latent"
        )


def _run(
    vae,
    x,
    direction,
    tile,
    overlap,
    tiled,
    device,
    dtype,
    budget,
    disk_store,
    token,
    report,
    info,
    tiling,
    on_tiling,
    frames: tuple[int | None, int] = (None, 0),  # video: (tile_frames, overlap_frames)
):
    info = info if info is not None else RunInfo()
    device = _concrete(device) if device is not None else _weights_device(vae)
    job = job_of(vae, x, direction, device, dtype)
    budget = budget if budget is not None else memory_budget(device)
    info.budget_bytes = budget
    video = getattr(vae, "video", False) and direction == "decode"
    if video:
        info.estimate_bytes = job.video_bytes(None, 1)
    elif x.dim() == 5:  # a clip to encode (engine.vae.video.pass_video: untiled)
        info.estimate_bytes = encode_clip_bytes(job.spec, job.pixels, x.shape[2], job.esize)
    else:
        info.estimate_bytes = estimate.full_bytes(job.spec, direction, job.pixels, job.esize)
    if tiling is None:
        mode = {None: "auto", False: "full", True: "tiled"}[tiled]
        if video:
            tiling = choice.choose_video(job, budget, mode, tile, overlap, *frames)
        else:
            tiling = choice.choose(job, budget, mode, tile, overlap)
    info.dtype = _dtype_name(dtype)
    while True:
        info.tiling_estimate_bytes = choice.peak_bytes(job, tiling, budget, disk_store)  # as it runs
        try:
            return _attempt_released(vae, x, direction, tiling, device, dtype, budget, disk_store, token, report,
                                     info, job.lat_hw)  # fmt: skip
        except torch.OutOfMemoryError as e:
            _free(device)
            if not can_retry_after_oom(device):
                raise OutOfMemory(f"out of memory during the VAE {direction}: {e}") from e
            # After a GPU OOM: tile, then halve the tiles, down to the minimum.
            nxt = choice.retry(job, tiling, memory_budget(device))
            if nxt is None:
                raise OutOfMemory(
                    f"the VAE {direction} does not fit even with {tiling.tile_px}-px tiles; free memory "
                    "or use --device cpu"
                ) from e
            tiling = nxt
            info.oom_retries += 1
            reason = f"out of memory; retrying with {tiling.tile_px}-px tiles"
            info.notes.append(reason)
            if on_tiling is not None:
                on_tiling(tiling, reason)


def can_retry_after_oom(device: torch.device) -> bool:
    """A GPU raises a catchable out-of-memory; on a CPU the OS kills the process first, so the memory
    estimate decides there and a torch error is final."""
    return device.type == "cuda"


def _concrete(device) -> torch.device:
    """`device` with its index. A tensor on torch.device("cuda") reports cuda:0, and the two compare
    unequal: a run given "cuda" found no weight and no tile state where it computes, so every op took
    the offloaded path (a cast per forward) and the device store's states were copied aside instead of
    written in place (halo.InPlace): 6,931 kernel launches for a 1024^2 decode, 4,634 now (H100, 2026-11-27)."""
    dev = torch.device(device)
    if dev.index is None and dev.type not in ("cpu", "meta"):
        return torch.empty(0, device=dev).device  # the index torch picks for it (the current device)
    return dev


def _weights_device(vae) -> torch.device:
    p = next(vae.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def _free(device, collect: bool = True):
    """Freed memory back to the OS (and the CUDA cache's blocks to the device). `collect`: first collect
    reference cycles, which only a failure makes (its traceback's frames hold tensors). A finished run's
    tensors are freed by reference counting, and a full collection costs 0.1-0.3 s in the window's
    process: as long as a whole GPU decode of a 1024^2 image."""
    if collect:
        release_memory()
    else:
        trim_heap()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _attempt_released(*a):
    """One attempt; whatever happens (done, cancelled, failed) its memory goes back to the OS."""
    failed = True
    try:
        out = _attempt(*a)
        failed = False
        return out
    except BaseException as e:
        # While the exception propagates, its traceback's finished frames still hold this attempt's
        # activations, so a release now would free nothing and they would be freed later, after the
        # heap was trimmed (RSS then stays up by a full-resolution tensor once glibc's mmap threshold
        # has risen). Clear those frames' locals; the traceback keeps its files and lines for the log.
        traceback.clear_frames(e.__traceback__)
        raise
    finally:
        _free(a[4], collect=failed)


def _attempt(vae, x, direction, tiling, device, dtype, budget, disk_store, token, report, info, lat_hw):
    stage = f"VAE {direction}"
    args = (vae, x, direction, tiling, device)
    tail = (budget, disk_store, token, report, info, lat_hw)
    try:
        out = _pass(*args, dtype, *tail)
        if dtype != torch.float32 and not torch.isfinite(out).all():
            raise NonFinite("non-finite output")
    except NonFinite:
        # fp16 overflow (the SDXL VAE's known failure): re-run in fp32, as ComfyUI and A1111 do.
        _free(device)
        info.fp32_rerun = True
        info.notes.append(f"{_dtype_name(dtype)} overflowed; re-ran the {direction} in float32")
        report(Progress(stage, 0, 0, "re-running in float32"))
        out = _pass(*args, torch.float32, *tail)
    return out


def _pass(vae, x, direction, tiling, device, dtype, budget, disk_store, token, report, info, lat_hw):
    if getattr(vae, "video", False):
        from .video import pass_video

        return pass_video(vae, x, direction, tiling, device, dtype, budget, token, report, info)
    f = vae.downscale
    stage = f"VAE {direction}"
    with _compute(vae, device, dtype, budget), ops.cancel_scope(token), torch.inference_mode():
        xin = x.to(device=device, dtype=dtype)
        whole = direction == "encode" and not hasattr(vae, "encode_steps")  # the DC-AE encodes whole
        if whole and tiling.tiled:
            info.notes.append("this VAE encodes the whole image at once (no tiled encode)")
        if not tiling.tiled or whole:
            info.mode, info.tiles = "full", 1
            report(Progress(stage, 0, 1))
            out = vae.decode(xin) if direction == "decode" else vae.encode(xin)
            report(Progress(stage, 1, 1))
            return _finish(vae, out, direction)
        tiles = plan_tiles(lat_hw[0], lat_hw[1], tiling.tile_px // f, tiling.overlap_px // f)
        spec = _spec(vae)
        esize = torch.empty((), dtype=dtype).element_size()
        where = choice.store_for(job_of(vae, x, direction, device, dtype), tiling, budget, disk_store)
        store = DiskStore(device) if where == "disk" else TileStore(device, on_device=where == "device")
        info.mode, info.tile_px, info.overlap_px, info.tiles = (
            "tiled",
            tiling.tile_px,
            tiling.overlap_px,
            len(tiles),
        )
        batch_px = tiling.batch_px
        batches = batch_tiles(tiles, f, batch_px)
        per_batch = max(len(b) for b in batches)
        if per_batch > 1:  # say so: memory is that of the batch (<= the budget's tile), not of one tile
            info.notes.append(f"ran up to {per_batch} tiles at a time (at most {math.isqrt(batch_px)}² px)")
        info.store = where
        # Free heap the next tile may reuse instead of faulting fresh pages in: a quarter of what the
        # estimate budgets for a tile's activations (k_act, calibrated before the executor ran its
        # convolutions in bands, which halved the real peak), so the estimate still bounds the peak.
        # At 1024^2, width 32: 11.5-13.5 s and 159-175 MiB, against 14-16 s and 160-190 MiB trimming
        # after every tile and 11-12 s but 250-265 MiB never trimming. What runs at once is a batch,
        # so the slack is that of the biggest batch's computed boxes, not of one tile: sized for one
        # 128-px tile, the demo's batches of 16 trimmed after every batch of every pass (264 trims,
        # 1.46x the full decode's time against 1.11x).
        batch_box = max(sum(box_px(tiles[i], f) for i in b) for b in batches)
        slack = estimate.tile_bytes(spec, max(tiling.tile_px, math.isqrt(batch_box)), esize, direction) // 4
        common = dict(
            tiles=tiles, latent_hw=lat_hw, store=store, token=token, report=report, stage=stage,
            check_finite=dtype != torch.float32, batch_px=batch_px, trim_slack=slack,
        )  # fmt: skip
        if direction == "decode":
            h = vae.decode_head(xin)
            _guard(h, dtype)
            del xin
            # a head that upsamples (the DC-AE's attention stages) hands the tiles `head_scale` px a latent px
            y = run_tiled(h, vae.decode_steps(), in_scale=getattr(vae, "head_scale", 1), out_scale=f,
                          out_channels=3, **common)  # fmt: skip
            del h
            return _finish(vae, vae.decode_tail(y), direction)
        y = run_tiled(xin, vae.encode_steps(), in_scale=f, out_scale=1, out_channels=_encode_channels(vae),
                      **common)  # fmt: skip
        del xin
        _guard(y, dtype)
        return _finish(vae, vae.encode_tail(y.to(dtype)), direction)


def _guard(t, dtype):
    if dtype != torch.float32 and not torch.isfinite(t).all():
        raise NonFinite("non-finite activations")


def _encode_channels(vae) -> int:
    if hasattr(vae, "encode_channels"):  # a VAE that says what its tiled encoder ends with
        return vae.encode_channels
    if hasattr(vae, "cfg"):
        return vae.cfg.ch * vae.cfg.ch_mult[-1]
    return 64


def _finish(vae, out, direction):
    out = out.float().cpu()
    if direction == "encode":
        return out
    lo, hi = vae.image_range
    return ((out - lo) / (hi - lo)).clamp_(0, 1)
