"""Tiled execution with whole-image GroupNorm statistics — tiles that agree with the full pass.

The GroupNorm part is the multidiffusion "Tiled VAE" idea (pkuliyi2015/multidiffusion-upscaler-for-
automatic1111, tilevae.py): a GroupNorm is a global operation, so tiles run in lock-step; at every
GroupNorm each tile contributes the per-group moments of its own *core* (the part of the image it
owns, so every pixel is counted once), the moments are combined (Chan's parallel formula, float64)
into the whole image's mean/variance, and every tile is normalised with those. The path is a flat
list of steps, cut into passes at every GroupNorm. Between passes a tile's state (activation plus
pending residuals) waits in a `TileStore` — in RAM, or in temporary files when the budget says the
image is too large, so process memory stays bounded by one tile whatever the image size.

Context is exchanged, not carried: each pass starts from a tile's core plus only the halo its own
convolutions reach (1-2 px between two GroupNorms), filled from the neighbours' cores of the pass
before (engine.vae.halo). Every core is then the whole pass's value, whatever the overlap
(up to the convolutions' blocking: 2e-6 at most, 130 dB), nothing is computed twice but the thin
halos, and nothing needs feathering; the overlap only sets the cores' size (`plan_tiles`).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..jobs import CancelToken, Progress, Report, TileDone, no_report
from ..memory import trim_heap
from .choice import Tile, batch_tiles, box_px, plan_tiles  # noqa: F401  (the run's tiles and batches)
from .groupstats import Moments
from .halo import Exchange, InPlace, Plan, box, core_in, cut, gather


class TileStore:
    """Where tile states wait between lock-step passes: in RAM, or for a GPU decode on the GPU itself
    (`on_device`: nothing is copied) or in pinned host RAM (copied without blocking, in stream order:
    a state goes back to the device on the stream that wrote it, and torch's pinned-memory cache
    reuses a buffer only after the copies that used it are done). A state is a list of tensors (x,
    then the skip stack, bottom first); a pass that only carries an entry gets None for it and puts
    None back: the stored one stays as it is."""

    def __init__(self, device: torch.device, on_device: bool = False):
        self.device = device
        self.home = device if on_device else torch.device("cpu")
        self._pinned = device.type == "cuda" and not on_device
        self._items: dict[int, list[torch.Tensor]] = {}

    def _keep(self, t: torch.Tensor) -> torch.Tensor:
        if t.device == self.home:
            return t
        if self._pinned:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            host.copy_(t, non_blocking=True)
            return host
        return t.to(self.home)

    def keeps(self, t: torch.Tensor) -> bool:
        """Whether `put` keeps t itself (not a copy): it stays as it is until `get` hands it back."""
        return t.device == self.home

    def held(self, i: int) -> list[torch.Tensor | None]:
        """Batch i's stored tensors themselves, to be written into in place (only where `keeps`)."""
        return self._items[i]

    def put(self, i: int, tensors: list[torch.Tensor | None]) -> None:
        old = self._items.get(i, [])
        self._items[i] = [old[k] if t is None else self._keep(t) for k, t in enumerate(tensors)]

    def get(self, i: int, wanted: list[bool] | None = None) -> list[torch.Tensor | None]:
        items = self._items[i]
        out: list[torch.Tensor | None] = []
        for k, t in enumerate(items):
            if wanted is None or wanted[k]:
                out.append(t.to(self.device, non_blocking=self._pinned))
                items[k] = None  # the caller's now: freed when it is done with it
            else:
                out.append(None)
        return out

    def close(self) -> None:
        self._items.clear()


class DiskStore(TileStore):
    """Tile states in a temporary folder, written and read with plain file I/O (not mmap), so they
    never count in the process's memory; the kernel's page cache may keep them, and may drop them.
    One file per stored tensor: an entry a pass only carries is neither read nor written again."""

    def __init__(self, device: torch.device, folder: str | None = None):
        super().__init__(device)
        self.dir = Path(tempfile.mkdtemp(prefix="loadout-tiles-", dir=folder))
        # per batch, per entry: (file, dtype, shape); entries listing the same file are one tensor
        self._meta: dict[int, list[tuple[Path, torch.dtype, tuple[int, ...]]]] = {}
        # Files no entry holds any more, overwritten by the next puts, never unlinked until close:
        # rewriting pages the page cache already holds is cheaper than allocating fresh ones.
        self._spare: list[Path] = []
        self._files = 0

    def keeps(self, t: torch.Tensor) -> bool:
        return False

    def _file(self) -> Path:
        if self._spare:
            return self._spare.pop()
        self._files += 1
        return self.dir / f"{self._files}.bin"

    def put(self, i: int, tensors: list[torch.Tensor | None]) -> None:
        old = self._meta.get(i, [])
        # the files of the entries being replaced (their tensors were read) take the new ones
        kept = {old[k][0] for k, t in enumerate(tensors) if t is None}
        self._spare += list({m[0] for m in old} - kept)
        meta: list[tuple[Path, torch.dtype, tuple[int, ...]]] = []
        # A tensor listed twice (a pass ending in a `push` leaves x on the skip stack too) is written
        # once and read back as one tensor: read twice it held two copies of the largest state.
        seen: dict[tuple, tuple[Path, torch.dtype, tuple[int, ...]]] = {}
        for k, t in enumerate(tensors):
            if t is None:
                meta.append(old[k])
                continue
            same = (t.data_ptr(), t.shape, t.stride(), t.dtype)  # the same tensor, or a view of it
            if same not in seen:
                path = self._file()
                a = t.detach().to("cpu").contiguous()
                with open(path, "r+b" if path.exists() else "wb") as f:
                    if a.numel():
                        f.write(memoryview(a.reshape(-1).view(torch.uint8).numpy()))
                seen[same] = (path, a.dtype, tuple(a.shape))
            meta.append(seen[same])
        self._meta[i] = meta

    def get(self, i: int, wanted: list[bool] | None = None) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = []
        read: dict[Path, torch.Tensor] = {}
        for k, (path, dtype, shape) in enumerate(self._meta[i]):
            if wanted is not None and not wanted[k]:
                out.append(None)
                continue
            if path not in read:
                t = torch.empty(shape, dtype=dtype)
                if t.numel():
                    with open(path, "rb") as f:
                        f.readinto(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
                read[path] = t.to(self.device)
            out.append(read[path])
        return out

    def close(self) -> None:
        self._meta.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


class NonFinite(Exception):
    """A pass produced NaN/inf (fp16 overflow): the caller re-runs in fp32."""


# A convolution whose output exceeds this runs in bands of output rows (see _conv_rows).
BAND_BYTES = 2 << 20


def _bands(conv: nn.Conv2d, n: int, hh: int, ww: int, esize: int, device: torch.device):
    """(r0, r1, a, b) per band of output rows [r0, r1) of `conv` over an input hh x ww: the band reads
    input rows [a, b), its rows plus the kernel's halo (zero padding only at the true edges)."""
    ph = conv.padding[0]
    limit = BAND_BYTES if device.type == "cpu" else ops.GPU_BAND_BYTES
    rows = max(1, limit // (n * conv.out_channels * ww * esize))
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
    bands = list(_bands(conv, n, hh, ww, x.element_size(), x.device))
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


def _add_conv_rows(x: torch.Tensor, conv: nn.Conv2d, r: torch.Tensor) -> None:
    """x += conv(r), in bands of rows as _conv_rows computes them (the same sums, added in place)."""
    n, _, hh, ww = r.shape
    for r0, r1, a, b in _bands(conv, n, hh, ww, r.element_size(), r.device):
        y = conv(r[:, :, a:b])
        x[:, :, r0:r1] += y[:, :, r0 - a : r1 - a]
        del y


def _run_steps(steps, held, stack, scale, stats, own=False):
    """Run `steps` on the one tensor in `held` (taken out of it: the caller keeps no reference, so
    each activation is freed as soon as the next one replaces it). `own`: x is a tensor nobody
    else holds, which the first in-place step may overwrite."""
    x = held.pop()
    # In place where it is safe: SiLU/ReLU overwrite and the residual add accumulates into a tensor
    # this loop made itself (`own`), never into the input crop, a tensor on the skip stack or one a
    # module handed back unchanged. Convolutions over big activations run in row bands (_conv_rows),
    # an upsample feeding one never whole.
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
        elif op in ("d2s", "s2d"):
            # a VAE's own depth-to-space (or space-to-depth): a rearrangement within 2x2 cells, to twice
            # (half) the resolution; a copy, so the next in-place step may overwrite it
            x = s[1](x)
            own = True
            scale = scale * 2 if op == "d2s" else scale / 2
        elif op == "pad_br":
            x = F.pad(x, (0, 1, 0, 1))
            own = True
        elif op == "scale":
            scale *= s[1]
        else:  # pragma: no cover - a programming error in a step list
            raise ValueError(f"unknown step {op}")
    return x, scale


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
    token: CancelToken | None = None,
    report: Report = no_report,
    stage: str = "VAE decode",
    check_finite: bool = False,
    batch_px: int = 0,
    trim_slack: int = 0,
) -> torch.Tensor:
    """Run `steps` over the cores of `tiles` of `x_whole` (at `in_scale` pixels per latent unit) pass
    by pass, in lock-step through every GroupNorm, each pass reading its halo from the neighbours'
    cores of the pass before, and assemble the cores (their union is the image, each pixel once).
    Tiles of the same shape run together as one batch of up to `batch_px` output pixels (0: one at a
    time). On the CPU, free heap beyond `trim_slack` bytes is handed back after each batch."""
    segs = cut(steps)
    plan = Plan(segs, in_scale)
    if round(plan.end_scale) != out_scale or plan.end_depth:
        raise ValueError("the steps do not end at the output's resolution with an empty skip stack")
    n, dev = x_whole.shape[0], x_whole.device
    hw = latent_hw
    out = torch.empty(n, out_channels, hw[0] * out_scale, hw[1] * out_scale, dtype=torch.float32, device=dev)
    total, done = len(segs) * len(tiles), 0
    stats = None
    px = max(in_scale, out_scale)  # image pixels per latent unit, either way
    reach = max([h / sc for sc, h in plan.x] + [h / sc for st in plan.stack for sc, h in st])
    batches = batch_tiles(tiles, px, batch_px, math.ceil(reach))
    # Where the store keeps each state itself, each pass's halos are written straight into the stored
    # states when the pass has ended (InPlace); else each strip is given aside and taken (Exchange).
    in_place = store.keeps(x_whole)
    swap = InPlace(tiles, hw, max(1, math.ceil(reach)), batches, n) if in_place else None
    ex = None if in_place else Exchange(tiles, hw, max(1, math.ceil(reach)))
    stored_halos = plan.stored(in_place)
    cpu = dev.type == "cpu"
    finite: list[torch.Tensor] = []  # per pass with statistics: whether they are finite
    try:
        for p, seg in enumerate(segs):
            last = p == len(segs) - 1
            scale, halo = plan.x[p]
            moments = Moments(n)
            for b, batch in enumerate(batches):
                if token is not None:
                    token.raise_if_cancelled()
                if p == 0:
                    held = [torch.cat([_crop(x_whole, tiles[i], scale, halo, hw) for i in batch])]
                    stack: list[torch.Tensor | None] = []
                else:
                    wanted = [True, *plan.touch[p]]
                    want = [(scale, halo), *plan.stack[p]]
                    stored = store.get(b, wanted)
                    held, stack = gather(stored, stored_halos[p - 1], want, ex, p, tiles, batch, hw, n)
                    del stored
                # x may be overwritten in place unless it is (a view of) a tensor on the skip stack
                own = not any(t is not None and _shares(held[0], t) for t in stack)
                x, end = _run_steps(seg, held, stack, scale, stats, own=own)
                if last:
                    for j, i in enumerate(batch):
                        ys, xs = core_in(tiles[i], end, halo * end / scale, hw)
                        y0, y1, x0, x1 = box(tiles[i], end, 0, hw)
                        out[:, :, y0:y1, x0:x1] = x[j * n : (j + 1) * n, :, ys, xs]
                else:
                    groups = segs[p + 1][0][1].num_groups if segs[p + 1][0][0] == "gn" else 0
                    state = [x, *stack]
                    kept = plan.kept[p]
                    if groups:
                        _add_moments(moments, x, [core_in(tiles[i], *kept[0], hw) for i in batch], n)
                    if swap is not None:  # its halos are written when the pass has ended
                        # a state that is (a view of) the input latent is not written into
                        state = [t.clone() if t is not None and _shares(t, x_whole) else t for t in state]
                        state = swap.widen(state, kept, stored_halos[p], tiles[batch[0]])
                    for j, i in enumerate(batch if ex is not None else ()):
                        for k, (t, (sc, h)) in enumerate(zip(state, kept, strict=True)):
                            if t is None:  # carried, still in the store: its strips were given
                                continue
                            ys, xs = core_in(tiles[i], sc, h, hw)
                            core = t[j * n : (j + 1) * n, :, ys, xs]
                            q, want = plan.next_use(p, k)
                            ex.give(q, i, k, core, sc, want)
                            del core
                    # The whole tensors, halo and all: the next pass reads them in place (a view)
                    # where its halo is no wider, and only the halo is replaced (by the strips).
                    store.put(b, state)
                    del state
                del x, stack, held
                if cpu:
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
            if swap is not None and not last:
                made = [k for k, new in enumerate(plan.made[p]) if new]
                swap.exchange([(k, plan.kept[p][k][0], stored_halos[p][k], plan.next_use(p, k)[1]) for k in made],
                              store.held)  # fmt: skip
            if moments.parts:
                stats = moments.stats(groups)
                if check_finite:
                    finite.append(torch.isfinite(stats.mean).all() & torch.isfinite(stats.var).all())
                    if cpu:
                        _check_finite(finite)
            elif not last:
                stats = None
            del moments
        # On a GPU, checked once: a check at every pass would wait there for the GPU to catch up
        _check_finite(finite)
    finally:
        store.close()
    return out


def _add_moments(moments: Moments, x: torch.Tensor, cores: list[tuple[slice, slice]], n: int) -> None:
    """The moments of a batch's cores (tile j's: rows j*n.. of x, region cores[j]): in one reduction
    when every core lies in the same region of its tile (tiles of one shape away from the image's
    edges), else tile by tile."""
    if all(c == cores[0] for c in cores):
        moments.add(x[:, :, cores[0][0], cores[0][1]])
        return
    for j, (ys, xs) in enumerate(cores):
        moments.add(x[j * n : (j + 1) * n, :, ys, xs])


def _check_finite(finite: list[torch.Tensor]) -> None:
    if finite and not bool(torch.stack(finite).all()):
        raise NonFinite("GroupNorm statistics overflowed")


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _crop(x_whole: torch.Tensor, t: Tile, scale: float, halo: int, hw: tuple[int, int]) -> torch.Tensor:
    y0, y1, x0, x1 = box(t, scale, halo, hw)
    return x_whole[:, :, y0:y1, x0:x1]
