"""The one place a decode's or encode's tiling is decided: full or tiled, which tiles, how many at a
time — from the memory estimate, the real compute dtype, the batch and the budget. Pure and
torch-free: the run executes what this returns (engine.vae.run), the Decode panel outlines exactly
those tiles (they travel in DecodeStarted), and an out-of-memory retry asks `retry` for the next one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..events import Tiling
from . import estimate

MIN_TILE_PX = 128


@dataclass(frozen=True)
class Tile:
    core: tuple[int, int, int, int]  # y0, y1, x0, x1 in latent units: the part this tile owns
    pad: tuple[int, int, int, int]  # the box it computes: core plus context, clipped to the image


def _splits(n: int, core: int) -> list[tuple[int, int]]:
    k = max(1, math.ceil(n / max(1, core)))
    edges = [round(i * n / k) for i in range(k + 1)]
    return [(edges[i], edges[i + 1]) for i in range(k)]


def release_tiles(
    length: int, tile: int, min_overlap: int, step: int
) -> tuple[list[int], list[int], list[int]]:
    """Tile starts, lengths and overlaps over `length` px: the fewest `tile`-px tiles whose overlaps are at least
    `min_overlap`, the slack spread over the overlaps round robin in `step`-px units: MiniMax-H3's VAE
    decodes in these tiles, its released output (diffusers AutoencoderKLMiniMaxH3._split_tiles; engine.vae.minimax_h3)."""
    if tile >= length:
        return [0], [length], []
    n = math.ceil(length / tile)
    while tile * n - min_overlap * (n - 1) < length:
        n += 1
    overlaps = [min_overlap] * (n - 1)
    for i in range((tile * n - sum(overlaps) - length) // step):
        overlaps[i % (n - 1)] += step
    starts = [0]
    for o in overlaps:
        starts.append(starts[-1] + tile - o)
    return starts, [tile] * n, overlaps


def release_rects(lat_hw: tuple[int, int], f: int, tile_px: int, overlap_px: int) -> tuple:
    """The output rectangles (y0, y1, x0, x1) of release_tiles over a frame of `lat_hw` latent units."""
    ys, xs = (release_tiles(n * f, tile_px, overlap_px, f) for n in lat_hw)
    return tuple(
        (y, y + ly, x, x + lx)
        for y, ly in zip(ys[0], ys[1], strict=True)
        for x, lx in zip(xs[0], xs[1], strict=True)
    )


def plan_tiles(h: int, w: int, tile: int, overlap: int) -> list[Tile]:
    """Tiles over an h x w latent: `tile` and `overlap` in latent units, as ComfyUI's tiled node
    (tiles of `tile` stepping by `tile - overlap`); each core gets overlap / 2 of context per side.
    An image VAE's tiles compute their cores plus the halos each pass needs (engine.vae.tiling), so
    there `pad` only bounds a tile's box; a video VAE's tiles compute all of `pad`."""
    tile = max(1, tile)
    ctx = max(0, min(overlap, tile // 2) // 2)  # an overlap beyond half the tile only costs time
    core = max(1, tile - 2 * ctx)
    tiles = []
    for y0, y1 in _splits(h, core):
        for x0, x1 in _splits(w, core):
            pad = (max(0, y0 - ctx), min(h, y1 + ctx), max(0, x0 - ctx), min(w, x1 + ctx))
            tiles.append(Tile((y0, y1, x0, x1), pad))
    return tiles


def box_px(t: Tile, px_scale: int) -> int:
    """Image pixels of a tile's box (its `pad`): what a batch's size is counted in."""
    return (t.pad[1] - t.pad[0]) * (t.pad[3] - t.pad[2]) * px_scale * px_scale


def batch_tiles(tiles: list[Tile], px_scale: int, batch_px: int, reach: int = 1) -> list[list[int]]:
    """Tile indices grouped into batches of tiles of one shape (core size, and how near each image
    edge it lies, up to `reach` latent units -- the widest halo any pass reads: every pass's region,
    clipped to the image, is then the same for all), each at most `batch_px` image pixels of computed
    box (always at least one tile). Small tiles run as few large ops instead of many small ones: per
    op overhead and, on a busy CPU, the thread pool's barriers dominate 16x16 latents. (Grouped by
    which edges a core touches only, 8-px tiles -- 1-latent cores, a pass reading 2 px of halo at the
    latent's scale -- put tiles one unit from an edge, their halo clipped, in a batch with tiles that
    were not: the decode came out wrong.)"""
    if batch_px <= 0:
        return [[i] for i in range(len(tiles))]
    h = max(t.core[1] for t in tiles)
    w = max(t.core[3] for t in tiles)
    r = max(1, reach)
    groups: dict[tuple, list[int]] = {}
    for i, t in enumerate(tiles):
        y0, y1, x0, x1 = t.core
        near = (min(y0, r), min(h - y1, r), min(x0, r), min(w - x1, r))
        key = (y1 - y0, x1 - x0, *near, t.pad[1] - t.pad[0], t.pad[3] - t.pad[2])
        groups.setdefault(key, []).append(i)
    out = []
    for idx in groups.values():
        k = max(1, batch_px // box_px(tiles[idx[0]], px_scale))  # one shape per group
        out += [idx[j : j + k] for j in range(0, len(idx), k)]
    # The batch holding the last tile runs last: a pass's final progress report names the last tile,
    # as it did one tile at a time (a GUI that drops reports between frames still sees it).
    return sorted(out, key=max)


@dataclass(frozen=True)
class Job:
    """What is to be run: `lat_hw` latent rows and columns, `batch` images, `downscale` pixels per
    latent unit, `esize` bytes per element of the compute dtype, on a CUDA device or not."""

    spec: estimate.VaeSpec
    direction: str  # "decode" | "encode"
    lat_hw: tuple[int, int]
    batch: int
    downscale: int
    esize: int
    cuda: bool
    frames: int = 1  # latent frames of a video latent (1 for images)

    @property
    def pixels(self) -> int:
        return self.lat_hw[0] * self.lat_hw[1] * self.downscale**2 * self.batch

    def video_bytes(
        self, tile_px: int | None, tile_frames: int, overlap_px: int | None = None, snapshot: str = "device"
    ) -> int:
        """A video decode's peak (estimate.video_bytes); `snapshot`: where a GPU run keeps its chunks'
        retry snapshot ("device" or "host", see snapshot_for)."""
        return estimate.video_bytes(self.spec, self.pixels, self.frames, self.esize, tile_px=tile_px,
                                    tile_frames=tile_frames, result_in_ram=not self.cuda,
                                    tile_area=self.largest_tile_area(tile_px, overlap_px),
                                    snapshot_on_device=self.cuda and snapshot == "device")  # fmt: skip

    def largest_tile_area(self, tile_px: int | None, overlap_px: int | None = None) -> int | None:
        """Output pixels of the largest box a video tile computes (core plus context) when the frame is
        cut into `tile_px` tiles with `overlap_px` (default: the family's context on each side) -- as the
        run plans them: at 832x480, 512-px tiles are 272x448 boxes, not 512x512."""
        if tile_px is None:
            return None
        overlap = self.spec.context_px(self.direction) * 2 if overlap_px is None else overlap_px
        return largest_box_px(self.lat_hw, self.downscale, tile_px, overlap) * self.batch


def largest_box_px(lat_hw: tuple[int, int], downscale: int, tile_px: int, overlap_px: int) -> int:
    """Output pixels of the largest box (core plus context) of the tiles the run plans (plan_tiles)."""
    f, (h, w) = downscale, lat_hw
    boxes = [t.pad for t in plan_tiles(h, w, max(1, tile_px // f), max(0, overlap_px // f))]
    return max((y1 - y0) * (x1 - x0) for y0, y1, x0, x1 in boxes) * f * f


def default_tile_px(job: Job, budget: int, snapshot: str = "device") -> tuple[int, int]:
    """Tile and overlap in output pixels: as big as a quarter of the budget allows, in 64-px steps;
    the overlap gives each tile the context its receptive field needs (see estimate.CONTEXT_PX)."""
    overlap = job.spec.context_px(job.direction) * 2
    tile = 1024 if job.cuda else 512
    if job.spec.video:  # one latent frame per chunk; what the head's output leaves of the budget
        while tile > MIN_TILE_PX and job.video_bytes(tile, 1, snapshot=snapshot) > budget:
            tile -= 64
        return tile, min(overlap, tile // 2)
    while tile > MIN_TILE_PX and estimate.tile_bytes(job.spec, tile, job.esize, job.direction) > budget / 4:
        tile -= 64
    return tile, min(overlap, tile // 2)


MAX_TILE_FRAMES = 4  # latent frames per chunk: beyond this a chunk costs memory and gains no speed


def tile_frames_for(
    job: Job, budget: int, tile_px: int | None, overlap_px: int | None = None, snapshot: str = "device"
) -> int:
    """Latent frames per temporal chunk: the most (up to MAX_TILE_FRAMES) whose chunk fits `budget`."""
    n = min(MAX_TILE_FRAMES, job.frames)
    while n > 1 and job.video_bytes(tile_px, n, overlap_px, snapshot) > budget:
        n -= 1
    return max(1, n)


def choose_video(
    job: Job, budget: int, mode: str = "auto", tile: int | None = None, overlap: int | None = None,
    tile_frames: int | None = None, overlap_frames: int = 0,
) -> Tiling:  # fmt: skip
    """A video decode's tiling: full frames when one chunk of a latent frame fits `budget` (the head's
    output and, on a CPU, the result included), else the biggest tiles that do; then as many latent
    frames per chunk as fit. The causal cache makes every chunking exact. On a GPU the plan that keeps
    each chunk's retry snapshot on the device is taken while it has latent frames per chunk to give;
    at one, where the snapshot in host RAM lets the frame go in bigger tiles (or whole), or lets the
    smallest tile fit at all, the plan for that, and the run keeps the snapshot there (snapshot_for).
    (Bigger tiles recompute less context; more frames per chunk gain little, and each chunk's
    snapshot is a copy over the bus.)"""
    args = (job, budget, mode, tile, overlap, tile_frames, overlap_frames)
    on_device = _choose_video(*args, snapshot="device")
    if not job.cuda or on_device.tile_frames > 1:
        return on_device
    on_host = _choose_video(*args, snapshot="host")
    if _frame_area(on_host) > _frame_area(on_device) or snapshot_for(job, on_device, budget) == "host":
        return on_host
    return on_device


def _frame_area(t: Tiling) -> float:
    return float("inf") if not t.tiled else t.tile_px


def _choose_video(job, budget, mode, tile, overlap, tile_frames, overlap_frames, snapshot) -> Tiling:
    if job.spec.kind in estimate.VIT_KINDS:  # its release decodes in its own tiles: they are its output
        if mode == "full":
            return Tiling("full", tile_frames=estimate.VIT_CHUNK)
        tile, overlap = tile or estimate.VIT_TILE[0], estimate.VIT_TILE[1] if overlap is None else overlap
        rects = release_rects(job.lat_hw, job.downscale, tile, overlap)
        return Tiling("tiled", tile, overlap, rects, tile_frames=estimate.VIT_CHUNK)
    full_fits = job.video_bytes(None, 1, snapshot=snapshot) <= budget
    if mode == "full" or (mode == "auto" and tile is None and full_fits):
        n = tile_frames or tile_frames_for(job, budget, None, snapshot=snapshot)
        return Tiling("full", tile_frames=n, overlap_frames=overlap_frames)
    d_tile, d_overlap = default_tile_px(job, budget, snapshot)
    tile = tile or d_tile
    overlap = d_overlap if overlap is None else overlap
    n = tile_frames or tile_frames_for(job, budget, tile, overlap, snapshot)
    t = tiled(job, tile, overlap, 0)
    return Tiling("tiled", t.tile_px, t.overlap_px, t.rects, 0, n, overlap_frames)


def snapshot_for(job: Job, tiling: Tiling, budget: int) -> str | None:
    """Where a GPU video decode keeps each chunk's retry snapshot (the causal cache the chunk started
    from, engine.vae.video): None on a CPU (its failed allocations are not retried); "device" when the
    plan fits `budget` with it there (a reference: free of copies) or there is one chunk (an empty
    cache); else "host", copied to pinned RAM beside the compute, which frees a whole cache of device
    memory -- at one latent frame per chunk the cache is over twice the chunk's activations
    (estimate.K_VIDEO_CACHE against K_VIDEO_FRAME), so a tight budget gets far bigger tiles."""
    if not job.cuda:
        return None
    n = tiling.tile_frames or job.frames
    if n >= job.frames:
        return "device"
    tile = (tiling.tile_px, tiling.overlap_px) if tiling.tiled else (None, None)
    return "device" if job.video_bytes(tile[0], n, tile[1], "device") <= budget else "host"


def tiled(job: Job, tile_px: int, overlap_px: int, batch_px: int) -> Tiling:
    """The tiling of `job` with tiles of `tile_px` and `overlap_px` (output pixels, rounded to whole
    latent units as the run uses them)."""
    f = job.downscale
    tile_l, overlap_l = max(1, tile_px // f), max(0, overlap_px // f)
    rects = tuple(tuple(v * f for v in t.core) for t in plan_tiles(*job.lat_hw, tile_l, overlap_l))
    return Tiling("tiled", tile_l * f, overlap_l * f, rects, batch_px)


def choose(
    job: Job, budget: int, mode: str = "auto", tile: int | None = None, overlap: int | None = None
) -> Tiling:
    """`mode` auto: full when a full pass's activations fit `budget` (the runtime and the weights are
    already resident), else tiled; `full` and `tiled` as asked. Tiles smaller than the budget allows
    run in batches no larger than one budget-sized tile: as fast as big tiles, and no more memory."""
    if mode == "full":
        return Tiling("full")
    full_fits = estimate.activation_bytes(job.spec, job.direction, job.pixels, job.esize) <= budget
    if mode == "auto" and tile is None and full_fits:
        return Tiling("full")
    d_tile, d_overlap = default_tile_px(job, budget)
    tile = tile or d_tile
    overlap = d_overlap if overlap is None else overlap
    return tiled(job, tile, overlap, d_tile**2)


def store_for(job: Job, tiling: Tiling, budget: int, disk: bool | None = None) -> str:
    """Where a tiled run's tile states wait between its lock-step passes: "disk" (temporary files; on
    the CPU when the image's states would take over half the budget, or as `disk` says), "ram" (a CPU
    run), "device" (a GPU run whose states fit `budget` beside a batch of tiles, the result and the
    head's output) or "host" (pinned host RAM). Copying them to the host and back each pass made a
    1024^2 decode (SD VAE width, fp16, 512-px tiles, H200) take 17x the full decode's time, 2.4 s of its
    3.3 s in the copies; kept on the device, its peak is still 0.44x the full decode's. A retry's
    tiling (unbatched: the run ran out of memory) keeps them on the host: it must really use less."""
    states = estimate.store_bytes(job.spec, job.direction, job.pixels, job.esize)
    if disk if disk is not None else (not job.cuda and states > budget / 2):
        return "disk"
    if not job.cuda:
        return "ram"
    if not tiling.batch_px:
        return "host"
    # what the run adds to the resident runtime and weights, its states kept beside the batch
    need = _tiled_peak(job, tiling, with_states=True) - estimate.RUNTIME_BYTES - job.spec.weight_bytes
    return "device" if need <= budget else "host"


def computed_px(job: Job, tiling: Tiling) -> int:
    """Output pixels a tiled pass computes at once at most: the boxes of its largest batch of tiles
    (batch_tiles, as the run batches them), for every image of the latent."""
    f = job.downscale
    tiles = plan_tiles(*job.lat_hw, max(1, tiling.tile_px // f), max(0, tiling.overlap_px // f))
    batches = batch_tiles(tiles, f, tiling.batch_px)
    return max(sum(box_px(tiles[i], f) for i in b) for b in batches) * job.batch


def _tiled_peak(job: Job, tiling: Tiling, with_states: bool) -> int:
    # at least one whole tile (estimate.one_tile_px: never larger than the image)
    tile = estimate.one_tile_px(tiling.tile_px, tuple(v * job.downscale for v in job.lat_hw))
    return estimate.tiled_bytes(job.spec, job.direction, job.pixels, 0, job.esize, ram_store=with_states,
                                computed_px=max(tile, computed_px(job, tiling)))  # fmt: skip


def peak_bytes(job: Job, tiling: Tiling, budget: int, disk: bool | None = None) -> int:
    """The estimate of running `tiling` as the run will (engine.vae.run): runtime and weights, then a
    whole pass; or the head's output, a batch of tiles, the result, and the tile states where they wait
    in the memory the pass computes in (RAM on a CPU, the device when store_for keeps them there); a
    video decode's chunk of frames with its causal cache. `budget` and `disk` as the run has them."""
    if job.spec.video:
        tiled = tiling.tiled
        return job.video_bytes(tiling.tile_px if tiled else None, tiling.tile_frames or job.frames,
                               tiling.overlap_px if tiled else None, snapshot_for(job, tiling, budget) or "")  # fmt: skip
    if not tiling.tiled:
        return estimate.full_bytes(job.spec, job.direction, job.pixels, job.esize)
    return _tiled_peak(job, tiling, store_for(job, tiling, budget, disk) in ("ram", "device"))


def retry(job: Job, previous: Tiling, budget: int) -> Tiling | None:
    """The tiling after an out-of-memory with `previous`: tiles (the default for what is free now)
    after a full pass, else half the tile size down to MIN_TILE_PX; None when nothing smaller is left.
    Never batched: the retry must really use less memory."""
    if job.spec.video:
        return _retry_video(job, previous, budget)
    if not previous.tiled:
        return tiled(job, *default_tile_px(job, budget), 0)
    if previous.tile_px // 2 < MIN_TILE_PX:
        return None
    t = previous.tile_px // 2
    return tiled(job, t, min(previous.overlap_px, t // 2), 0)


def _retry_video(job: Job, previous: Tiling, budget: int) -> Tiling | None:
    """A whole video decode that ran out of memory outside the tiles' own retries (in the head): one
    latent frame per chunk, then smaller tiles."""
    if previous.tile_frames != 1:
        return Tiling(previous.mode, previous.tile_px, previous.overlap_px, previous.rects, 0, 1,
                      previous.overlap_frames)  # fmt: skip
    if not previous.tiled:  # the tiles of the least memory: the retry snapshots in host RAM if need be
        t = tiled(job, *default_tile_px(job, budget, "host"), 0)
    elif previous.tile_px // 2 < MIN_TILE_PX:
        return None
    else:
        size = previous.tile_px // 2
        t = tiled(job, size, min(previous.overlap_px, size // 2), 0)
    return Tiling("tiled", t.tile_px, t.overlap_px, t.rects, 0, 1, previous.overlap_frames)
