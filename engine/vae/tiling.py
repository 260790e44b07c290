"""Tiled execution with whole-image GroupNorm statistics — tiles that agree with the full pass.

The idea is the multidiffusion "Tiled VAE" one (pkuliyi2015/multidiffusion-upscaler-for-automatic1111,
tilevae.py): a GroupNorm is a global operation, so tiles run in lock-step; at every GroupNorm each tile
contributes the per-group moments of its own *core* (the part of the image it owns, so every pixel is
counted once), the moments are combined (Chan's parallel formula, float64) into the whole image's
mean/variance, and every tile is normalised with those. The path is a flat list of steps; a tile's
state (activation plus pending residuals) waits in a `TileStore` between GroupNorms — in RAM, or in a
temporary file when the budget says the image is too large, so process memory stays bounded by one
tile whatever the image size. Tiles carry `context` on each side (half the overlap) that absorbs the
zero-padding error at their edges; with context >= the receptive field the cores are exact, and a
narrow linear feather at the core borders hides whatever remains.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..jobs import CancelToken, Progress, Report, TileDone, no_report
from ..memory import trim_heap
from .choice import Tile, plan_tiles  # noqa: F401  (plan_tiles: the tiles run_tiled is given)


class TileStore:
    """Where tile states wait between lock-step passes: RAM (or host RAM for a GPU decode)."""

    def __init__(self, device: torch.device):
        self.device = device
        self._items: dict[int, list[torch.Tensor]] = {}

    def put(self, i: int, tensors: list[torch.Tensor]) -> None:
        self._items[i] = [t.to("cpu", copy=False) for t in tensors]

    def get(self, i: int) -> list[torch.Tensor]:
        return [t.to(self.device) for t in self._items.pop(i)]

    def close(self) -> None:
        self._items.clear()


class DiskStore(TileStore):
    """Tile states in a temporary folder, written and read with plain file I/O (not mmap), so they
    never count in the process's memory; the kernel's page cache may keep them, and may drop them."""

    def __init__(self, device: torch.device, folder: str | None = None):
        super().__init__(device)
        self.dir = Path(tempfile.mkdtemp(prefix="loadout-tiles-", dir=folder))
        # per batch: (dtype, shape) of each tensor written, or the index of an earlier entry it repeats
        self._meta: dict[int, list[tuple[torch.dtype, tuple[int, ...]] | int]] = {}

    def put(self, i: int, tensors: list[torch.Tensor]) -> None:
        # A tensor listed twice (a pass ending in a `push` leaves x on the skip stack too) is written
        # once and read back as one tensor: read twice it held two copies of the largest state.
        meta: list[tuple[torch.dtype, tuple[int, ...]] | int] = []
        seen: dict[int, int] = {}
        path = self.dir / f"{i}.bin"
        # Each batch's file is overwritten pass after pass, never unlinked until close: rewriting pages
        # the page cache already holds is cheaper than allocating fresh ones and freeing the old file's.
        with open(path, "r+b" if path.exists() else "wb") as f:
            for j, t in enumerate(tensors):
                if id(t) in seen:
                    meta.append(seen[id(t)])
                    continue
                seen[id(t)] = j
                a = t.detach().to("cpu").contiguous()
                meta.append((a.dtype, tuple(a.shape)))
                if a.numel():
                    f.write(memoryview(a.reshape(-1).view(torch.uint8).numpy()))
        self._meta[i] = meta

    def get(self, i: int) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        path = self.dir / f"{i}.bin"
        with open(path, "rb") as f:
            for m in self._meta.pop(i):
                if isinstance(m, int):  # the same tensor as an earlier entry
                    out.append(out[m])
                    continue
                dtype, shape = m
                t = torch.empty(shape, dtype=dtype)
                if t.numel():
                    f.readinto(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                out.append(t.to(self.device))
        return out

    def close(self) -> None:
        self._meta.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


class NonFinite(Exception):
    """A pass produced NaN/inf (fp16 overflow): the caller re-runs in fp32."""


def _segments(steps: list[tuple]) -> list[list[tuple]]:
    segs: list[list[tuple]] = [[]]
    for s in steps:
        if s[0] == "gn":
            segs.append([])
        segs[-1].append(s)
    return segs


# A convolution whose output exceeds this runs in bands of output rows (see _conv_rows).
BAND_BYTES = 2 << 20


def _bands(conv: nn.Conv2d, n: int, hh: int, ww: int, esize: int):
    """(r0, r1, a, b) per band of output rows [r0, r1) of `conv` over an input hh x ww: the band reads
    input rows [a, b), its rows plus the kernel's halo (zero padding only at the true edges)."""
    ph = conv.padding[0]
    rows = max(1, BAND_BYTES // (n * conv.out_channels * ww * esize))
    for r0 in range(0, hh, rows):
        r1 = min(hh, r0 + rows)
        yield r0, r1, max(0, r0 - ph), min(hh, r1 + ph)


def _bandable(m) -> bool:
    """A stride-1 'same' 2-D convolution: its output rows can be computed band by band."""
    return (
        isinstance(m, nn.Conv2d)
        and m.stride == (1, 1)
        and m.dilation == (1, 1)
        and m.padding_mode == "zeros"
        and isinstance(m.padding, tuple)
        and m.kernel_size[0] == 2 * m.padding[0] + 1
        and m.kernel_size[1] == 2 * m.padding[1] + 1
    )


def _conv_rows(conv: nn.Conv2d, x: torch.Tensor, up: bool) -> torch.Tensor:
    """conv(x), or conv(nearest 2x upsample of x) with `up`, computed in bands of output rows written
    into the output: the upsampled input is never whole, and the convolution's own temporaries (oneDNN
    reorders its input and output: 1.2x the output measured at 64 channels, 376x400) are a band's.
    Each band reads its rows plus the kernel's halo, and zero padding only at the true edges, so the
    result is the whole convolution's up to the kernel's blocking (measured: identical for 3x3, 1e-6
    for a 1x1 shortcut). With in-place SiLU and adds, the fused shortcut and one copy of a state that
    sat twice in the tile store, the tiled decode's peak at 1024^2 (width 32, 512-px tiles) went from
    259-267 MiB above the process to 190 MiB (the full decode's: 930-990 MiB)."""
    n, _, h, w = x.shape
    hh, ww = (2 * h, 2 * w) if up else (h, w)
    bands = list(_bands(conv, n, hh, ww, x.element_size()))
    if len(bands) == 1 and not up:
        return conv(x)
    out = None
    for r0, r1, a, b in bands:  # a, b: input rows after the upsample
        if up:
            lo = a // 2
            band = F.interpolate(x[:, :, lo : (b - 1) // 2 + 1], scale_factor=2.0, mode="nearest")
            band = band[:, :, a - 2 * lo : a - 2 * lo + (b - a)]
        else:
            band = x[:, :, a:b]
        y = conv(band)
        del band
        if out is None:
            out = torch.empty(n, y.shape[1], hh, y.shape[3], dtype=y.dtype, device=y.device)
        out[:, :, r0:r1] = y[:, :, r0 - a : r1 - a]
        del y
    return out


def _split(state: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """A stored tile state [x, *stack] as ([x], stack), keeping no other reference to x."""
    return state[:1], state[1:]


def _add_conv_rows(x: torch.Tensor, conv: nn.Conv2d, r: torch.Tensor) -> None:
    """x += conv(r), in bands of rows as _conv_rows computes them (the same sums, added in place)."""
    n, _, hh, ww = r.shape
    for r0, r1, a, b in _bands(conv, n, hh, ww, r.element_size()):
        y = conv(r[:, :, a:b])
        x[:, :, r0:r1] += y[:, :, r0 - a : r1 - a]
        del y


def _run_steps(steps, held, stack, scale, stats):
    """Run `steps` on the one tensor in `held` (taken out of it: the caller keeps no reference, so
    each activation is freed as soon as the next one replaces it)."""
    x = held.pop()
    # In place where it is safe: SiLU/ReLU overwrite and the residual add accumulates into a tensor
    # this loop made itself (`own`), never into the input crop, a tensor on the skip stack or one a
    # module handed back unchanged. Convolutions over big activations run in row bands (_conv_rows),
    # an upsample feeding one never whole.
    own = False
    up = False  # a nearest 2x upsample waiting for the convolution after it
    last = len(steps) - 1
    for i, s in enumerate(steps):
        op = s[0]
        if up and not (op == "module" and _bandable(s[1])):
            x = F.interpolate(x, scale_factor=2.0, mode="nearest")
            up, own = False, True
        if op == "module":
            m = s[1]
            y = _conv_rows(m, x, up) if _bandable(m) else m(x)
            own = y is not x and y.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
            x, up = y, False
            del y
        elif op == "gn":
            x = s[1](x, stats)
            own = True
        elif op == "silu":
            x = F.silu(x, inplace=own)
            own = True
        elif op == "relu":
            x = F.relu(x, inplace=own)
            own = True
        elif op == "push":
            stack.append(x)
            own = False
        elif op == "pop_add":
            r = stack.pop()
            if s[1] is not None and own and _bandable(s[1]):
                _add_conv_rows(x, s[1], r)  # the shortcut's output is never whole
            else:
                r = s[1](r) if s[1] is not None else r
                if own and r.shape == x.shape:
                    x += r
                else:
                    x = x + r
                    own = True
            del r
        elif op == "up2":
            up = i < last  # deferred: the next step may be a convolution that reads it in bands
            if not up:
                x = F.interpolate(x, scale_factor=2.0, mode="nearest")
                own = True
            scale *= 2
        elif op == "pad_br":
            x = F.pad(x, (0, 1, 0, 1))
            own = True
        elif op == "scale":
            scale *= s[1]
        else:  # pragma: no cover - a programming error in a step list
            raise ValueError(f"unknown step {op}")
    return x, scale


def _core_slices(t: Tile, scale: float):
    y0, y1, x0, x1 = t.core
    py0, _, px0, _ = t.pad
    return (
        slice(round((y0 - py0) * scale), round((y1 - py0) * scale)),
        slice(round((x0 - px0) * scale), round((x1 - px0) * scale)),
    )


def _ramp(n_out: int, a: int, b: int, lo_edge: bool, hi_edge: bool, band: int, start: int):
    """1-D blend weights over output rows [start, start + n_out) for a core [a, b): 1 inside,
    linear ramps of width `band` centred on core borders that have a neighbour."""
    pos = torch.arange(start, start + n_out, dtype=torch.float32) + 0.5
    w = torch.ones(n_out)
    if band > 0:
        if not lo_edge:
            w = w * ((pos - (a - band / 2)) / band).clamp(0, 1)
        if not hi_edge:
            w = w * (((b + band / 2) - pos) / band).clamp(0, 1)
    return w


def run_tiled(
    x_whole: torch.Tensor,
    steps: list[tuple],
    tiles: list[Tile],
    *,
    in_scale: int,
    out_scale: int,
    out_channels: int,
    latent_hw: tuple[int, int],
    store: TileStore,
    blend: int = 0,
    token: CancelToken | None = None,
    report: Report = no_report,
    stage: str = "VAE decode",
    check_finite: bool = False,
    batch_px: int = 0,
    trim_slack: int = 0,
) -> torch.Tensor:
    """Run `steps` over `tiles` of `x_whole` (at `in_scale` pixels per latent unit) in lock-step
    through every GroupNorm, and assemble the cores (feathered over `blend` output pixels). Tiles of
    the same size run together as one batch of up to `batch_px` output pixels (0: one at a time).
    On the CPU, free heap beyond `trim_slack` bytes is handed back to the system after each batch."""
    segs = _segments(steps)
    n, dev = x_whole.shape[0], x_whole.device
    hh, ww = latent_hw[0] * out_scale, latent_hw[1] * out_scale
    out = torch.zeros(n, out_channels, hh, ww, dtype=torch.float32, device=dev)
    wsum = torch.zeros(1, 1, hh, ww, dtype=torch.float32, device=dev)
    total, done = len(segs) * len(tiles), 0
    stats = None
    start_scale = in_scale
    px = max(in_scale, out_scale)  # image pixels per latent unit, either way
    batches = batch_tiles(tiles, px, batch_px)
    try:
        for p, seg in enumerate(segs):
            last = p == len(segs) - 1
            acc = None
            for b, batch in enumerate(batches):
                if token is not None:
                    token.raise_if_cancelled()
                if p == 0:
                    held = [torch.cat([_crop(x_whole, tiles[i], in_scale) for i in batch])]
                    stack: list[torch.Tensor] = []
                else:
                    held, stack = _split(store.get(b))
                bstats = None if stats is None else tuple(v.repeat(len(batch), 1) for v in stats)
                x, scale = _run_steps(seg, held, stack, start_scale, bstats)
                if not last:
                    groups = segs[p + 1][0][1].num_groups
                    for j, i in enumerate(batch):
                        ys, xs = _core_slices(tiles[i], scale)
                        # No name for the core view: one outliving the loop kept this batch's whole
                        # state alive through the next batch's pass (19 MiB at 1024^2, width 32).
                        core = x[j * n : (j + 1) * n, :, ys, xs]
                        acc = ops.combine_moments(acc, ops.group_moments(core, groups))
                        del core
                    store.put(b, [x, *stack])
                else:
                    for j, i in enumerate(batch):
                        _blend_into(
                            out, wsum, x[j * n : (j + 1) * n].float(), tiles[i], scale, blend, latent_hw
                        )
                del x, stack
                if x_whole.device.type == "cpu":
                    # Tiles differ in size: the heap fragments and grows unless freed pages go back,
                    # but every page given back is faulted in (zeroed) again by the next tile, so free
                    # heap up to `trim_slack` is kept for it (engine.vae.run sets it from the estimate).
                    trim_heap(trim_slack)
                for i in batch:
                    done += 1
                    rect = tuple(v * px for v in tiles[i].core)
                    tile = TileDone(p + 1, len(segs), i, len(tiles), rect)
                    report(
                        Progress(
                            stage, done, total, f"pass {p + 1}/{len(segs)}, tile {i + 1}/{len(tiles)}", tile
                        )
                    )
            if not last:
                mean, m2, cnt = acc
                stats = (mean, m2 / cnt)
                if check_finite and not (torch.isfinite(mean).all() and torch.isfinite(stats[1]).all()):
                    raise NonFinite(f"GroupNorm statistics overflowed in pass {p + 1}")
            start_scale = scale  # where the next segment starts
            del acc
    finally:
        store.close()
    out /= wsum
    return out


def _crop(x_whole: torch.Tensor, t: Tile, in_scale: int) -> torch.Tensor:
    py0, py1, px0, px1 = t.pad
    return x_whole[:, :, py0 * in_scale : py1 * in_scale, px0 * in_scale : px1 * in_scale]


def batch_tiles(tiles: list[Tile], px_scale: int, batch_px: int) -> list[list[int]]:
    """Tile indices grouped into batches of equal computed size, each at most `batch_px` image pixels
    (always at least one tile). Small tiles run as few large ops instead of many small ones: per op
    overhead and, on a busy CPU, the thread pool's barriers dominate ops on 16x16 latents."""
    if batch_px <= 0:
        return [[i] for i in range(len(tiles))]
    groups: dict[tuple[int, int], list[int]] = {}
    for i, t in enumerate(tiles):
        groups.setdefault((t.pad[1] - t.pad[0], t.pad[3] - t.pad[2]), []).append(i)
    out = []
    for (h, w), idx in groups.items():
        k = max(1, batch_px // (h * w * px_scale * px_scale))
        out += [idx[j : j + k] for j in range(0, len(idx), k)]
    # The batch holding the last tile runs last: a pass's final progress report names the last tile,
    # as it did one tile at a time (a GUI that drops reports between frames still sees it).
    return sorted(out, key=max)


def _blend_into(out, wsum, y, t: Tile, scale, blend, latent_hw):
    h, w = latent_hw
    py0, py1, px0, px1 = t.pad
    y0, y1, x0, x1 = (round(v * scale) for v in t.core)
    oy, ox = round(py0 * scale), round(px0 * scale)
    half = blend // 2
    # the written region: the core widened by half the band where a neighbour exists
    ry0 = max(oy, y0 - (half if t.core[0] > 0 else 0))
    ry1 = min(oy + y.shape[2], y1 + (half if t.core[1] < h else 0))
    rx0 = max(ox, x0 - (half if t.core[2] > 0 else 0))
    rx1 = min(ox + y.shape[3], x1 + (half if t.core[3] < w else 0))
    wy = _ramp(ry1 - ry0, y0, y1, t.core[0] == 0, t.core[1] == h, blend, ry0).to(out.device)
    wx = _ramp(rx1 - rx0, x0, x1, t.core[2] == 0, t.core[3] == w, blend, rx0).to(out.device)
    wgt = wy[:, None] * wx[None, :]
    patch = y[:, :, ry0 - oy : ry1 - oy, rx0 - ox : rx1 - ox]
    out[:, :, ry0:ry1, rx0:rx1] += patch * wgt
    wsum[:, :, ry0:ry1, rx0:rx1] += wgt
