"""Decoding video latents (B, C, T, h, w) with a Wan-family VAE: spatial tiles with overlap, temporal
chunks that carry each tile's causal cache, and out-of-memory retries that never lose what is done.

The order of work: the decoder's head (post-quant conv, conv1, the middle block whose attention spans
each whole frame) runs untiled at latent resolution over every frame, chunk by chunk; then each spatial
tile (core plus context, engine.vae.choice.plan_tiles) runs the up path over all frames in chunks of
`tile_frames` latent frames, its own `Stream` carrying the causal convolutions' last input frames from
chunk to chunk, so chunk boundaries are exact. Tiles are blended into the output with a linear ramp
across their core borders (engine.vae.tiling's blend). Memory is that of one chunk of one tile, its cache,
the head's output and the result.

After an out-of-memory (on a GPU) a chunk is retried from a snapshot of its tile's cache (on the device, or
in pinned host RAM where the budget is tight: `Snapshots`) with half the frames
(exact), then with the full-resolution levels one output frame at a time (exact); then the tile's
remaining work is split into four smaller tiles, which restart at that
chunk without a cache, warmed up on `overlap_frames` earlier latent frames whose output is discarded
(exact when the warm-up reaches the clip's start); below the smallest tile the rest runs on the CPU.

A decoder that is not causal (LTX-Video: its convolutions see the next frames) says so with `time_context`:
its head then runs over the whole clip at once, and each chunk of every tile decodes as a clip of its own
with that many latent frames of context on each side, their output dropped (`_widened`); exact where the
context covers the up path's reach. The Wan VAEs have none and run as above.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import ops
from ..events import Tiling
from ..jobs import CancelToken, Progress, Report, TileDone, no_report
from ..memory import trim_heap
from . import choice
from .choice import Tile, plan_tiles
from .tiling import _ramp
from .wan import Stream, WanVAE

MIN_SPLIT_PX = 64  # an out-of-memory split stops at tiles of this many output pixels a side
SPLIT_CONTEXT_PX = 32  # context a split tile gets on each side (> 50 dB against the whole pass)


def frames_out(latent_frames: int, time_factor: int = 4) -> int:
    return 1 + time_factor * (latent_frames - 1) if latent_frames > 0 else 0


def frame_span(a: int, b: int, tf: int) -> tuple[int, int]:
    """Output frames of latent frames [a, b)."""
    return (0 if a == 0 else 1 + tf * (a - 1)), 1 + tf * (b - 1)


@dataclass
class Counters:
    oom_retries: int = 0
    cpu_fallback: bool = False
    notes: list[str] | None = None
    snapshot: str | None = None  # where the chunks' retry snapshots were kept: "device", "host" or None


class Snapshots:
    """Each chunk's retry snapshot: the causal cache its tile had before it, to run it again from after
    an out-of-memory. `where` "device": the cache's own tensors (entries are replaced, never mutated), so
    the old cache stays on the device beside the new one while the chunk runs. "host": copies in pinned
    host RAM, made on a side stream beside the compute (each old tensor is kept for that stream until
    its copy is done), copied back only after a failure -- the device then holds one cache. Where RAM
    cannot be pinned, the rest of the decode keeps them on the device."""

    def __init__(self, device: torch.device, where: str, counters: Counters):
        self.device, self.where, self.counters = device, where, counters
        self.side = torch.cuda.Stream(device) if where == "host" and device.type == "cuda" else None
        counters.snapshot = where

    def take(self, stream: Stream) -> Stream:
        if self.where == "device":
            return stream.copy()
        snap = Stream()
        snap.started, snap.keep = set(stream.started), stream.keep
        try:
            if self.side is None:  # a host snapshot of a CPU run (tests): plain copies
                snap.frames = {k: t.clone() for k, t in stream.frames.items()}
                return snap
            self.side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(self.side):
                for k, t in stream.frames.items():
                    h = torch.empty_like(t, device="cpu", pin_memory=True)
                    h.copy_(t, non_blocking=True)
                    t.record_stream(self.side)  # not reused by the compute before the copy has read it
                    snap.frames[k] = h
        except RuntimeError as e:  # pinned RAM refused (a locked-memory limit)
            self.where = self.counters.snapshot = "device"
            if self.counters.notes is not None:
                self.counters.notes.append(f"retry snapshots stay on the device: host RAM not pinned ({e})")
            return stream.copy()
        return snap

    def back(self, snap: Stream) -> Stream:
        """A stream to run the chunk again from; `snap` stays as it was (it may be needed again)."""
        if self.device.type == "cpu" or all(t.device.type != "cpu" for t in snap.frames.values()):
            return snap.copy()  # on the device already (or a CPU run's): its tensors are never mutated
        if self.side is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.side)
        out = Stream()
        out.started, out.keep = set(snap.started), snap.keep
        out.frames = {k: h.to(self.device, non_blocking=True) for k, h in snap.frames.items()}
        return out


class _Ctx:
    """What every tile of one decode shares."""

    def __init__(self, vae, head, out, wsum, tf, f, blend, overlap_frames, device, dtype, token, report, counters,
                 on_oom, snapshot):  # fmt: skip
        self.vae, self.head, self.out, self.wsum = vae, head, out, wsum
        self.tf, self.f, self.blend, self.overlap_frames = tf, f, blend, overlap_frames
        self.device, self.dtype, self.token, self.report = device, dtype, token, report
        self.counters, self.on_oom = counters, on_oom
        self.snapshots = Snapshots(device, snapshot, counters) if snapshot and _can_retry(device) else None
        self.done, self.total = 0, 1


def decode_video(
    vae: WanVAE,
    z: torch.Tensor,
    tiling: Tiling,
    *,
    device: torch.device,
    dtype: torch.dtype,
    token: CancelToken | None = None,
    report: Report = no_report,
    counters: Counters | None = None,
    cpu_fallback: Callable[[], object] | None = None,
    stage: str = "VAE decode",
    snapshot: str | None = "device",
) -> torch.Tensor:
    """(B, z, T, h, w) VAE-space latent -> (B, F, C, H, W) float32 on the CPU in [-1, 1], F = 1 + 4 (T - 1).
    `tiling`: full (one tile) or tiled, with `tile_frames` latent frames per chunk (0: all). `snapshot`:
    where each chunk's retry snapshot waits on a GPU ("device" or "host": Snapshots; None: no retries;
    engine.vae.choice.snapshot_for decides)."""
    counters = counters if counters is not None else Counters(notes=[])
    b, _, t, h, w = z.shape
    f, tf = vae.downscale, vae.time_factor
    n = tiling.tile_frames or t
    chunks = [(a, min(t, a + n)) for a in range(0, t, n)]
    if tiling.tiled:
        tile_l, overlap_l = max(1, tiling.tile_px // f), max(0, tiling.overlap_px // f)
        tiles = plan_tiles(h, w, tile_l, overlap_l)
        # the band reaches half of itself past a core: never past the context its tiles compute (a tile of 2
        # latent units with an overlap of 1 has none, and its ramp then read outside its output)
        ctx = min(overlap_l, tile_l // 2) // 2  # plan_tiles' context per side
        blend = min(tiling.overlap_px // 2, 32, 2 * ctx * f)
    else:
        tiles = [Tile((0, h, 0, w), (0, h, 0, w))]
        blend = 0
    stream = Stream()
    parts = []
    # a decoder that is not causal (time_context) runs its head -- latent resolution, cheap -- over the whole
    # clip at once: exact, whatever its reach; its tiles' chunks then need only the up path's context
    for a, c in [(0, t)] if getattr(vae, "time_context", 0) else chunks:
        if token is not None:
            token.raise_if_cancelled()
        # the head runs before any tile is done: say so, rather than leave the last stage's bar standing
        report(
            Progress(stage, 0, len(tiles) * len(chunks), f"middle block, latent frames {a}-{c - 1} of {t}")
        )
        parts.append(vae.decode_head(z[:, :, a:c].to(device=device, dtype=dtype), stream))
    head = torch.cat(parts, dim=2) if len(parts) > 1 else parts[0]
    del parts, stream
    if not torch.isfinite(head).all() and dtype != torch.float32:
        from .tiling import NonFinite

        raise NonFinite("non-finite activations in the decoder's middle block")
    channels = vae.cfg.image_channels
    out = torch.zeros(b, frames_out(t, tf), channels, h * f, w * f)
    wsum = torch.zeros(1, 1, h * f, w * f)
    ctx = _Ctx(vae, head, out, wsum, tf, f, blend, tiling.overlap_frames, device, dtype, token, report, counters,
               cpu_fallback, snapshot)  # fmt: skip
    ctx.total = len(tiles) * len(chunks)
    for i, tile in enumerate(tiles):
        _tile(ctx, tile, (h, w), chunks, 0, i, len(tiles), stage)
    del head
    out /= wsum
    return out.clamp_(-1, 1)


def _region(tile: Tile, f: int, blend: int, hw, parent=None):
    """Where a tile writes (output pixels) and with which weights: its core widened by half the blend band
    where a neighbour exists, linear ramps across the band (engine.vae.tiling._ramp), so the weights of
    neighbours sum to one. A tile split from `parent` after an out-of-memory writes the parent's weights
    over its own part of the parent's region (the parent's weights are in wsum already)."""
    h, w = hw
    y0, y1, x0, x1 = (v * f for v in tile.core)
    if parent is not None:
        py0, py1, px0, px1, wy, wx, _ = parent
        ry0 = py0 if tile.core[0] * f == _core_edge(parent, 0) else y0
        ry1 = py1 if tile.core[1] * f == _core_edge(parent, 1) else y1
        rx0 = px0 if tile.core[2] * f == _core_edge(parent, 2) else x0
        rx1 = px1 if tile.core[3] * f == _core_edge(parent, 3) else x1
        return (ry0, ry1, rx0, rx1, wy[ry0 - py0 : ry1 - py0], wx[rx0 - px0 : rx1 - px0], parent[6])
    half = blend // 2
    ry0 = y0 - (half if tile.core[0] > 0 else 0)
    ry1 = y1 + (half if tile.core[1] < h else 0)
    rx0 = x0 - (half if tile.core[2] > 0 else 0)
    rx1 = x1 + (half if tile.core[3] < w else 0)
    wy = _ramp(ry1 - ry0, y0, y1, tile.core[0] == 0, tile.core[1] == h, blend, ry0)
    wx = _ramp(rx1 - rx0, x0, x1, tile.core[2] == 0, tile.core[3] == w, blend, rx0)
    return (ry0, ry1, rx0, rx1, wy, wx, (y0, y1, x0, x1))


def _core_edge(region, side: int) -> int:
    return region[6][side]


def _tile(ctx: _Ctx, tile: Tile, hw, chunks, start: int, index: int, count: int, stage: str,
          warm_from: int | None = None, parent=None) -> None:  # fmt: skip
    """Chunks `start`.. of one tile; `warm_from`: the latent frame a cache-less restart warms up from."""
    region = _region(tile, ctx.f, ctx.blend, hw, parent)
    if parent is None:
        ry0, ry1, rx0, rx1, wy, wx, _ = region
        ctx.wsum[:, :, ry0:ry1, rx0:rx1] += wy[:, None] * wx[None, :]
    stream = Stream()
    fa = 1 if warm_from is not None else None  # output frames at once in the full-resolution levels
    # one latent frame at a time: the restart is after an out-of-memory (not for a VAE with time_context,
    # whose chunks each decode as a clip of their own)
    if warm_from is not None and not getattr(ctx.vae, "time_context", 0):
        for a in range(warm_from, chunks[start][0]):
            _run_chunk(ctx, tile, (a, a + 1), stream, None, fa)
    j, snap, again = start, None, False
    snaps = ctx.snapshots if ctx.snapshots is not None and ctx.snapshots.device == ctx.device else None
    while j < len(chunks):
        a, c = chunks[j]
        if ctx.token is not None:
            ctx.token.raise_if_cancelled()
        if not again:  # a chunk run again starts from the snapshot it already has
            snap = None
            snap = snaps.take(stream) if snaps is not None else None
        again = False
        stream.keep = j < len(chunks) - 1  # the tile's last chunk: no frames to carry on
        try:
            _run_chunk(ctx, tile, (a, c), stream, region, fa)
            failed = False
        except torch.OutOfMemoryError:
            if snap is None:
                raise
            failed = True
        if failed:  # out of the except block: the failure's frames (and their tensors) are gone
            stream = None
            _release(ctx.device)
            ctx.counters.oom_retries += 1
            if c - a > 1:  # the same chunk in halves, from the cache it started with: exact
                half = (c - a + 1) // 2
                chunks = chunks[:j] + [(a, a + half), (a + half, c)] + chunks[j + 1 :]
                ctx.total += 1
                _note(ctx, f"out of memory; {c - a} latent frames per chunk -> {half}")
            elif fa is None:  # the full-resolution levels one output frame at a time: exact again
                fa = 1
                _note(ctx, "out of memory; the full-resolution levels run one frame at a time")
            else:
                _split(ctx, tile, hw, chunks, j, index, count, stage, region)
                return
            stream, again = snaps.back(snap), True
            continue
        j += 1
        ctx.done += 1
        rect = tuple(v * ctx.f for v in tile.core)
        ctx.report(Progress(stage, min(ctx.done, ctx.total), ctx.total,
                            f"tile {index + 1}/{count}, latent frames {a}-{c - 1} of {chunks[-1][1]}",
                            TileDone(j, len(chunks), index, count, rect)))  # fmt: skip


def _split(ctx: _Ctx, tile: Tile, hw, chunks, j: int, index: int, count: int, stage: str, region) -> None:
    """The tile ran out of memory at one frame per chunk: its core in four (with the same context), each
    restarting at chunk j; below the smallest tile, the rest of it on the CPU."""
    y0, y1, x0, x1 = tile.core
    f = ctx.f
    if min(y1 - y0, x1 - x0) * f < 2 * MIN_SPLIT_PX:
        if ctx.device.type == "cpu" or ctx.on_oom is None:
            raise torch.OutOfMemoryError("the VAE decode does not fit even in the smallest tile")
        _note(ctx, f"out of memory at the smallest tile: tile {index + 1} continues on the CPU")
        ctx.counters.cpu_fallback = True
        device, dtype = ctx.device, ctx.dtype
        with ctx.on_oom():  # the castable ops compute on the CPU in float32 inside
            ctx.device, ctx.dtype = torch.device("cpu"), torch.float32
            try:
                _tile(ctx, tile, hw, chunks, j, index, count, stage, _warm(ctx, chunks, j), region)
            finally:
                ctx.device, ctx.dtype = device, dtype
        return
    c = max(tile.core[0] - tile.pad[0], tile.pad[1] - tile.core[1], tile.core[2] - tile.pad[2],
            tile.pad[3] - tile.core[3], SPLIT_CONTEXT_PX // f)  # fmt: skip
    ym, xm = (y0 + y1) // 2, (x0 + x1) // 2
    h, w = hw
    subs = []
    for cy in ((y0, ym), (ym, y1)):
        for cx in ((x0, xm), (xm, x1)):
            pad = (max(0, cy[0] - c), min(h, cy[1] + c), max(0, cx[0] - c), min(w, cx[1] + c))
            subs.append(Tile((cy[0], cy[1], cx[0], cx[1]), pad))
    _note(ctx, f"out of memory; tile {index + 1} split in 4 from latent frame {chunks[j][0]}")
    ctx.total += 3 * (len(chunks) - j)
    for sub in subs:
        _tile(ctx, sub, hw, chunks, j, index, count, stage, _warm(ctx, chunks, j), region)


def _can_retry(device: torch.device) -> bool:
    """Whether a chunk keeps a snapshot of its tile's cache to be retried from (Snapshots). Kept on the
    device it holds the cache's previous frames until the chunk is done -- a second cache (at 832x480,
    width 16, chunks of one latent frame: 1.58 GB peak with it, 1.0 GB without). On the CPU an
    allocation that fails is a RuntimeError, never torch's OutOfMemoryError, so nothing there is
    retried: no snapshot."""
    return device.type != "cpu"


def _warm(ctx: _Ctx, chunks, j: int) -> int:
    return max(0, chunks[j][0] - ctx.overlap_frames)


def _run_chunk(
    ctx: _Ctx, tile: Tile, span, stream: Stream, region, frames_at_once: int | None = None
) -> None:
    """Latent frames [a, c) of one tile through the up path; `region` None: a warm-up (output dropped)."""
    a, c = span
    py0, py1, px0, px1 = tile.pad
    a0, c0 = _widened(ctx.vae, a, c, ctx.head.shape[2])
    x = ctx.head[:, :, a0:c0, py0:py1, px0:px1].to(device=ctx.device, dtype=ctx.dtype)
    if (a0, c0) != (a, c):  # a clip of its own: its frame l is the clip's frame l + tf * a0
        y = ctx.vae.decode_up(x, Stream(), frames_at_once)
        fa, fb = frame_span(a, c, ctx.tf)
        y = y[:, :, fa - ctx.tf * a0 : fb - ctx.tf * a0]
    else:
        y = ctx.vae.decode_up(x, stream, frames_at_once)
    del x
    if region is None:
        return
    if ctx.dtype != torch.float32 and not torch.isfinite(y).all():
        from .tiling import NonFinite

        raise NonFinite("non-finite output")
    ry0, ry1, rx0, rx1, wy, wx, _ = region
    oy, ox = py0 * ctx.f, px0 * ctx.f
    fa, fb = frame_span(a, c, ctx.tf)
    wgt = (wy[:, None] * wx[None, :]).to(y.device)
    part = (y[:, :, :, ry0 - oy : ry1 - oy, rx0 - ox : rx1 - ox].float() * wgt).transpose(1, 2).cpu()
    del y
    ctx.out[:, fa:fb, :, ry0:ry1, rx0:rx1] += part
    del part
    if ctx.device.type == "cpu":
        trim_heap()


def _widened(vae, a: int, c: int, t: int) -> tuple[int, int]:
    """Latent frames [a, c) with the VAE's `time_context` frames on each side (within the clip): a decoder
    that is not causal (engine.vae.ltx) decodes each chunk as a clip of its own, exact where the context
    covers its temporal reach. 0 (the Wan VAEs, causal): the chunk alone, its history in the Stream."""
    n = getattr(vae, "time_context", 0)
    return (max(0, a - n), min(t, c + n)) if n and (a > 0 or c < t) else (a, c)


def _note(ctx: _Ctx, text: str) -> None:
    if ctx.counters.notes is not None:
        ctx.counters.notes.append(text)


def _release(device: torch.device) -> None:
    from .run import _free  # the run's own release (release_memory, then the CUDA cache)

    _free(device)


def pass_video(vae, x, direction, tiling, device, dtype, budget, token, report, info):
    """engine.vae.run's pass for a video VAE: chunked (and tiled) decode of 5-D latents, a 4-D latent as one
    frame; encode of clips (N, 3, F, H, W) by the VAE's own `encode`, an image as a one-frame clip."""
    from .run import _compute, _finish, job_of

    stage = f"VAE {direction}"
    still = x.dim() == 4
    with _compute(vae, device, dtype, budget), ops.cancel_scope(token), torch.inference_mode():
        if direction == "encode":
            report(Progress(stage, 0, 1))
            xin = x.to(device=device, dtype=dtype)
            lat = vae.encode(xin.unsqueeze(2) if still else xin)
            report(Progress(stage, 1, 1))
            info.mode, info.tiles = "full", 1
            info.tiling_estimate_bytes = info.estimate_bytes  # what ran: the whole pass, never tiled
            return _finish(vae, lat[:, :, 0] if still else lat, direction)
        z = x.unsqueeze(2) if still else x
        counters = Counters(notes=info.notes)
        info.notes.extend(getattr(vae, "notes", ()))  # what the loader had to assume (engine.vae.ltx_loading)
        info.mode = tiling.mode
        info.tile_px, info.overlap_px = (tiling.tile_px, tiling.overlap_px) if tiling.tiled else (None, None)
        info.tiles = max(1, len(tiling.rects))
        info.tile_frames, info.overlap_frames = tiling.tile_frames, tiling.overlap_frames

        if getattr(vae, "own_driver", False):
            return own_driver(vae, z, tiling, device, dtype, report, stage, still)

        @contextlib.contextmanager
        def on_cpu():
            with _compute(vae, torch.device("cpu"), torch.float32, None):
                yield

        snapshot = choice.snapshot_for(job_of(vae, x, direction, device, dtype), tiling, budget)
        clip = decode_video(vae, z, tiling, device=device, dtype=dtype, token=token, report=report,
                            counters=counters, cpu_fallback=on_cpu if device.type == "cuda" else None,
                            stage=stage, snapshot=snapshot)  # fmt: skip
        info.snapshot = counters.snapshot
        info.oom_retries += counters.oom_retries
        info.cpu_fallback = counters.cpu_fallback
        clip = ((clip + 1) / 2).clamp_(0, 1)
        if clip.shape[2] > 3:  # Qwen-Image-Layered's RGBA VAE: the colour planes (alpha is its 4th)
            info.notes.append(f"the VAE decodes {clip.shape[2]} channels: kept the first three (RGB)")
            clip = clip[:, :, :3]
        return clip[:, 0].contiguous() if still else clip


def own_driver(vae, z, tiling, device, dtype, report, stage, still):
    """A VAE whose release defines its decode's chunks and tiles (engine.vae.minimax_h3): run as it is, a
    progress line and a TileDone after each tile."""

    def on_tile(chunk, chunks, index, count, rect):
        report(Progress(stage, chunk * count + index + 1, chunks * count,
                        f"chunk {chunk + 1}/{chunks}, tile {index + 1}/{count}",
                        TileDone(chunk + 1, chunks, index, count, rect)))  # fmt: skip

    tile = (tiling.tile_px, tiling.overlap_px) if tiling.tiled else None
    clip = vae.decode_clips(z.to(device=device, dtype=dtype), tile, on_tile)  # (B, 3, F, H, W), frame-major
    clip = clip.add_(1).div_(2).clamp_(0, 1).transpose(1, 2)
    return clip[:, 0].contiguous() if still else clip.contiguous()
