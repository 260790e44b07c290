"""Halo exchange: what lets tiles agree with the whole pass without carrying the overlap as context.

A tile computes its core plus a halo of context, and a convolution near the halo's outer edge reads
zero padding where the whole image has data: the error moves inward by the kernel's reach with each
convolution. Carrying one context wide enough for the whole network (the overlap's) costs its area
at every layer: 1.3x the image at 1024^2 with 512-px tiles, 3.5x with the window's 128-px tiles.
Here a tile carries only its *core* from pass to pass; each pass starts from the core plus the halo
that pass's own convolutions need (1-2 px for an AutoencoderKL pass between two GroupNorms), taken
from the neighbours' cores of the previous pass. The cores are then the whole pass's values, the
halo is discarded, and nothing is feathered. A stretch without a GroupNorm to stop at is cut into
passes where a pass's halo would exceed MAX_HALO_PX at its own resolution.

This module plans the passes and their halos from a step list (`cut`, `Plan`), places tiles' boxes
(`box`, `core_in`) and moves the strips between neighbours (`InPlace` where the store keeps the
states themselves, else `Exchange`; `gather`); the executor that runs the passes is
engine.vae.tiling.run_tiled.
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from .choice import Tile

MAX_HALO_PX = 2


def _conv_halo(m: nn.Conv2d, need: int) -> int:
    """The input halo (px per side) a convolution needs for `need` px of exact output per side."""
    out = 0
    for d in range(2):
        k, st, dil = m.kernel_size[d], m.stride[d], m.dilation[d]
        reach = dil * (k - 1)
        p = reach // 2 if isinstance(m.padding, str) else m.padding[d]
        out = max(out, st * need + max(p, reach - p))
    return out


def _module_halo(m: nn.Module, need: int) -> int:
    """The input halo of a module for `need` px of exact output: a convolution's own, or, for a
    composite of stride-1 convolutions and pointwise layers, `need` plus every convolution's reach
    (an upper bound of its longest path). A layer that mixes the whole image cannot be tiled."""
    if isinstance(m, nn.Conv2d):
        return _conv_halo(m, need)
    halo = need
    for c in m.modules():
        if isinstance(c, (nn.GroupNorm, nn.LayerNorm, nn.MultiheadAttention, nn.Upsample)):
            raise ValueError(f"{type(c).__name__} inside a tiled step mixes the whole image")
        if isinstance(c, nn.Conv2d):
            if c.stride != (1, 1):
                raise ValueError("a strided convolution inside a composite tiled step")
            halo += _conv_halo(c, 0)
    return halo


def stride(s: tuple) -> int:
    if s[0] == "s2d":  # space-to-depth: a 2x2 cell becomes a pixel, as under a stride-2 convolution
        return 2
    return s[1].stride[0] if s[0] == "module" and isinstance(s[1], nn.Conv2d) else 1


def need(steps: list[tuple]) -> int:
    """The halo (px at the input's resolution) `steps` need for their output's core to be exact:
    walked backwards, an entry popped from the skip stack needs the halo x has where it is added
    (the needs of entries still to be pushed, walking back, follow the resolution as x's does)."""
    need, popped = 0, []
    for s in reversed(steps):
        op = s[0]
        if op == "module":
            need = _module_halo(s[1], need)
            st = stride(s)
            popped = [v * st for v in popped]
        elif op in ("up2", "d2s"):  # an upsample, or a depth-to-space (a 2x2 cell from one pixel)
            need = -(-need // 2)
            popped = [-(-v // 2) for v in popped]
        elif op == "s2d":  # a 2x2 cell into one pixel: twice the halo before it
            need *= 2
            popped = [v * 2 for v in popped]
        elif op == "pop_add":
            popped.append(need if s[1] is None else _module_halo(s[1], need))
        elif op == "push":
            need = max(need, popped.pop() if popped else 0)
    return max([need, *popped])


def cut(steps: list[tuple]) -> list[list[tuple]]:
    """The passes: a new one at every GroupNorm (its statistics are the whole image's) and, within
    a pass, before a step that would take its halo beyond MAX_HALO_PX."""
    segs: list[list[tuple]] = [[]]
    for s in steps:
        gn = s[0] == "gn" and segs[-1]
        wide = s[0] == "module" and any(t[0] == "module" for t in segs[-1])
        if gn or (wide and need(segs[-1] + [s]) > MAX_HALO_PX):
            # an upsample or a bottom/right zero pad belongs to the convolution after it (stored
            # before the upsample, a state is a quarter of the size)
            lead = []
            while segs[-1] and segs[-1][-1][0] in ("up2", "pad_br"):
                lead.insert(0, segs[-1].pop())
            segs.append(lead)
        segs[-1].append(s)
    return [seg for seg in segs if seg]


class Plan:
    """Per pass: the scale (px per latent unit) and halo of x at its start; of each entry of the skip
    stack (bottom first) its scale and halo, and whether the pass pops it (`touch`: an entry the pass
    only carries is never loaded); and per entry at the pass's end, its scale and the halo it was
    made with (`kept`)."""

    def __init__(self, segs: list[list[tuple]], in_scale: float):
        self.x: list[tuple[float, int]] = []
        self.stack: list[list[tuple[float, int]]] = []
        self.touch: list[list[bool]] = []
        self.kept: list[list[tuple[float, int]]] = []
        self.made: list[list[bool]] = []  # per entry at the pass's end: made in that pass (not carried)
        scale, held = float(in_scale), []  # held: (scale, halo made with) per stack entry
        held_from: list[int] = []  # per stack entry: the pass that made it
        for seg in segs:
            strided = 1
            for s in seg:
                strided *= stride(s)
            # Region offsets scale with the resolution: a stride-2 convolution must start on an even
            # pixel of its input, so the halo is a multiple of the strides ahead in the pass.
            halo = -(-need(seg) // strided) * strided
            entry_halo = [0] * len(held)
            touch = [False] * len(held)
            marks: list[int | None] = list(range(len(held)))
            end, end_from = list(held), list(held_from)
            sc = scale
            for s in seg:
                op = s[0]
                if op in ("up2", "d2s"):
                    sc *= 2
                elif op == "s2d":
                    sc /= 2
                elif op == "scale":
                    sc *= s[1]
                elif op == "push":
                    marks.append(None)
                    end.append((sc, round(halo * sc / scale)))
                    end_from.append(len(self.x))
                elif op == "pop_add":
                    j = marks.pop()
                    end.pop()
                    end_from.pop()
                    if j is not None:  # an entry from an earlier pass: as wide as x where it is added
                        if held[j][0] != sc:
                            raise ValueError("a skip added at another resolution than it was pushed at")
                        entry_halo[j], touch[j] = round(halo * sc / scale), True
            self.x.append((scale, halo))
            self.stack.append([(h[0], e) for h, e in zip(held, entry_halo, strict=True)])
            self.touch.append(touch)
            self.kept.append([(sc, round(halo * sc / scale)), *end])
            self.made.append([True, *[f == len(self.x) - 1 for f in end_from]])
            scale, held, held_from = sc, end, end_from
        self.end_scale = scale
        self.end_depth = len(held)

    def stored(self, in_place: bool) -> list[list[int]]:
        """Per pass but the last, per entry of its end state: the halo (px) it waits in the store with.
        As made (`kept`); `in_place` (see InPlace), widened to what its next use reads, so that
        the neighbours' strips can be written into it when the pass ends. A carried entry keeps
        what it had (stack entries keep their places: a pass pops from the top)."""
        out: list[list[int]] = []
        for p in range(len(self.x) - 1):
            row = []
            for k, (_, e) in enumerate(self.kept[p]):
                if not self.made[p][k]:
                    row.append(out[p - 1][k])
                else:
                    row.append(max(e, self.next_use(p, k)[1]) if in_place else e)
            out.append(row)
        return out

    def next_use(self, p: int, k: int) -> tuple[int, int]:
        """The pass after p that next loads entry k of p's end state (0: x), and the halo it needs."""
        if k == 0:
            return p + 1, self.x[p + 1][1]
        for q in range(p + 1, len(self.x)):
            if self.touch[q][k - 1]:
                return q, self.stack[q][k - 1][1]
        raise ValueError("a skip entry that is never added")


def _span(c0: int, c1: int, scale: float, halo: int, n: int) -> tuple[int, int]:
    """Rows (or columns) [a, b) at `scale` of a core [c0, c1) (latent units) plus `halo`, clipped to
    the image's n latent units."""
    return max(0, round(c0 * scale) - halo), min(round(n * scale), round(c1 * scale) + halo)


@functools.lru_cache(maxsize=1 << 14)
def box(t: Tile, scale: float, halo: int, hw: tuple[int, int]) -> tuple[int, int, int, int]:
    """Tile t's core plus `halo` px at `scale`, clipped to the image. Pure, and asked for the same few
    hundred boxes tens of thousands of times by a decode (each tile, pass and neighbour): remembered,
    as Python arithmetic is part of the per-tile cost a GPU's launch-bound tiled decode waits on."""
    y0, y1, x0, x1 = t.core
    return (*_span(y0, y1, scale, halo, hw[0]), *_span(x0, x1, scale, halo, hw[1]))


class Exchange:
    """The strips of each tile's core that its neighbours' next pass reads as halo, for a store that
    keeps copies of the states (on disk, or in pinned host RAM for a GPU): given (a copy: the state
    leaves the device) when a tile's pass ends, taken when the neighbour gathers its next input."""

    def __init__(self, tiles: list[Tile], hw: tuple[int, int], reach: int):
        self.tiles, self.hw = tiles, hw
        self.strips: dict[tuple[int, int, int], list[tuple[int, int, torch.Tensor]]] = {}
        self.near = _neighbours(tiles, reach)

    def give(self, p: int, i: int, k: int, core: torch.Tensor, scale: float, halo: int) -> None:
        """Tile i's core of state entry k (at `scale`) as its neighbours' halos of `halo` px in pass
        p (a neighbour may still have to run the pass before: strips are kept per pass)."""
        if halo <= 0:
            return
        mine = box(self.tiles[i], scale, 0, self.hw)
        for j in self.near[i]:
            want = box(self.tiles[j], scale, halo, self.hw)
            y0, y1, x0, x1 = _overlap(mine, want)
            if y0 < y1 and x0 < x1:
                part = core[:, :, y0 - mine[0] : y1 - mine[0], x0 - mine[2] : x1 - mine[2]].clone()
                self.strips.setdefault((p, j, k), []).append((y0 - want[0], x0 - want[2], part))

    def take(self, out: torch.Tensor, p: int, j: int, k: int) -> None:
        """Write what tile j's neighbours gave for entry k of pass p into `out` (tile j's region)."""
        for dy, dx, part in self.strips.pop((p, j, k), ()):
            out[:, :, dy : dy + part.shape[2], dx : dx + part.shape[3]] = part


class InPlace:
    """The halo exchange where the store keeps each state itself (RAM on the CPU; the device's own
    memory on a GPU): when a pass has ended, every tile's halo is written straight into its stored
    state from its neighbours' stored cores (`exchange`), the states already as wide as their next use
    reads (`Plan.stored`; `widen` when a batch puts them). The next pass reads every state in place.

    On a grid of tiles (as `choice.plan_tiles` lays them) whose cores are at least as wide as the
    halo, in two sweeps, as a stencil code exchanges halos: first each tile's core rows with its left
    and right neighbours, then whole rows with the neighbours above and below, their left and right
    halos included, which now hold the diagonal neighbours' cores. A strip is then one copy from an
    edge neighbour and none from a diagonal one. Elsewhere, one copy from each neighbour whose core
    lies in the halo. Where strips were given (a clone where the neighbour ran later) and taken (a
    copy), a 1024^2 decode in 9 tiles (width 32, GPU-sized bands) dispatched 4,829 ops; with one copy
    per neighbour, 3,711; in two sweeps, 3,263 (the full decode: 187) -- the kernel launches a GPU's
    tiled decode waits on; the window's TAESD preview in 16 batched tiles, 4,701 -> 2,566. A copy
    reads a core (in the second sweep, with the halo columns the first has written) and writes a
    halo, so no copy reads what a later one writes."""

    def __init__(self, tiles: list[Tile], hw: tuple[int, int], reach: int, batches: list[list[int]], n: int):
        self.tiles, self.hw, self.n = tiles, hw, n
        self.slot = [(0, 0)] * len(tiles)  # per tile: its batch, and its place in the batch
        for b, batch in enumerate(batches):
            for j, i in enumerate(batch):
                self.slot[i] = (b, j)
        self.near = _neighbours(tiles, reach)
        self.grid = _grid(tiles)

    def widen(self, state, kept, stored, t0: Tile) -> list[torch.Tensor | None]:
        """A batch's end state (None: an entry it carries), each entry made narrower than it waits
        (`kept`: per entry, its scale and the halo it was made with; `stored`: the halo it waits with)
        in a new tensor, its halo left for `exchange` (a tensor listed twice is widened once)."""
        out = list(state)
        done: dict[tuple[int, int], torch.Tensor] = {}
        for k, t in enumerate(state):
            (sc, e), s = kept[k], stored[k]
            if t is not None and s > e:
                if (id(t), s) not in done:
                    done[id(t), s] = _widen(t, t0, sc, e, s, self.hw)
                out[k] = done[id(t), s]
        return out

    def exchange(self, entries: list[tuple[int, float, int, int]], held) -> None:
        """Fill the halos of the entries a pass made -- (k, scale, halo stored with, halo the next use
        reads) each -- in every batch's stored tensors (`held(b)`: batch b's list)."""
        batches = 1 + max(b for b, _ in self.slot)
        done: dict[tuple, int] = {}  # the same tensors (x left on the skip stack): the widest halo done
        for k, sc, s, h in entries:
            ts = [held(b)[k] for b in range(batches)]
            key = (*map(id, ts), s)
            if h <= 0 or done.get(key, -1) >= h:
                continue
            done[key] = h
            if self.grid is not None and h <= self._narrowest(sc):
                self._sweeps(ts, sc, s, h)
            else:
                self._each(ts, sc, s, h)

    def _rows(self, ts, i):
        b, j = self.slot[i]
        return ts[b][j * self.n : (j + 1) * self.n]

    def _narrowest(self, sc: float) -> int:
        boxes = [box(t, sc, 0, self.hw) for t in self.tiles]
        return min(min(y1 - y0, x1 - x0) for y0, y1, x0, x1 in boxes)

    def _sweeps(self, ts, sc, s, h) -> None:
        at, hw = self.grid, self.hw
        for pairs, rows in ((self._pairs(at, 0, 1), True), (self._pairs(at, 1, 0), False)):
            for i, m in pairs:  # m right of (first sweep) or below (second) i
                for a, c in ((i, m), (m, i)):  # c's cells of a's halo
                    ca, cc = box(self.tiles[a], sc, 0, hw), box(self.tiles[c], sc, 0, hw)
                    ha, hc = box(self.tiles[a], sc, h, hw), box(self.tiles[c], sc, h, hw)
                    # first sweep: c's core columns beside a's core rows; second: c's core rows, over
                    # a's columns and its halo's (c's halo columns there hold the diagonal cores)
                    src, want = (cc, (ca[0], ca[1], ha[2], ha[3])) if rows else ((*cc[:2], *hc[2:]), ha)
                    _strip(self._rows(ts, a), box(self.tiles[a], sc, s, hw),
                           self._rows(ts, c), box(self.tiles[c], sc, s, hw), src, want)  # fmt: skip

    @staticmethod
    def _pairs(at: dict, dr: int, dc: int) -> list[tuple[int, int]]:
        return [(i, at[r + dr, c + dc]) for (r, c), i in at.items() if (r + dr, c + dc) in at]

    def _each(self, ts, sc, s, h) -> None:
        for i, t in enumerate(self.tiles):
            for m in self.near[i]:
                tm = self.tiles[m]
                _strip(self._rows(ts, i), box(t, sc, s, self.hw), self._rows(ts, m), box(tm, sc, s, self.hw),
                       box(tm, sc, 0, self.hw), box(t, sc, h, self.hw))  # fmt: skip


def _grid(tiles: list[Tile]) -> dict[tuple[int, int], int] | None:
    """(row, column) -> tile, where the tiles' cores are the cells of a full grid; else None."""
    ys = sorted({t.core[:2] for t in tiles})
    xs = sorted({t.core[2:] for t in tiles})
    at = {(ys.index(t.core[:2]), xs.index(t.core[2:])): i for i, t in enumerate(tiles)}
    full = len(at) == len(tiles) == len(ys) * len(xs)
    chained = all(a[1] == b[0] for a, b in (*itertools.pairwise(ys), *itertools.pairwise(xs)))
    return at if full and chained else None


def _strip(dst, dst_box, src, src_box, core, want) -> None:
    """Copy src's part of `core` that lies in `want` into dst (tensors holding the regions dst_box
    and src_box of the image, in pixels at one scale)."""
    y0, y1, x0, x1 = _overlap(core, want)
    if y0 < y1 and x0 < x1:
        dst[:, :, y0 - dst_box[0] : y1 - dst_box[0], x0 - dst_box[2] : x1 - dst_box[2]] = src[
            :, :, y0 - src_box[0] : y1 - src_box[0], x0 - src_box[2] : x1 - src_box[2]
        ]


def _overlap(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> tuple[int, int, int, int]:
    """The rows and columns two boxes (y0, y1, x0, x1) share (empty where an end is not past a start)."""
    return max(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), min(a[3], b[3])


def _widen(t: torch.Tensor, t0: Tile, sc: float, e: int, s: int, hw: tuple[int, int]) -> torch.Tensor:
    """A batch's tensor made with `e` px of halo (tile t0's region: every tile of a batch has the
    same), in a new one with `s` px, its halo left for the neighbours to write."""
    have, need = box(t0, sc, e, hw), box(t0, sc, s, hw)
    out = t.new_empty(t.shape[0], t.shape[1], need[1] - need[0], need[3] - need[2])
    out[:, :, have[0] - need[0] : have[1] - need[0], have[2] - need[2] : have[3] - need[2]] = t
    return out


def _neighbours(tiles: list[Tile], reach: int) -> list[list[int]]:
    """Per tile, the tiles whose core may lie in its halo: within `reach` latent units of its core."""
    return [
        [j for j, b in enumerate(tiles) if j != i and _near(a.core, b.core, reach)]
        for i, a in enumerate(tiles)
    ]


def _near(a: tuple[int, int, int, int], b: tuple[int, int, int, int], m: int) -> bool:
    return b[0] < a[1] + m and a[0] - m < b[1] and b[2] < a[3] + m and a[2] - m < b[3]


def core_in(t: Tile, scale: float, halo: float, hw: tuple[int, int]) -> tuple[slice, slice]:
    """Where tile t's core lies in a tensor holding its core plus `halo` px at `scale`."""
    h = round(halo)
    y0, y1, x0, x1 = box(t, scale, 0, hw)
    a, _, c, _ = box(t, scale, h, hw)
    return slice(y0 - a, y1 - a), slice(x0 - c, x1 - c)


def gather(stored, kept, want, ex, p, tiles, batch, hw, n):
    """The batch's state for pass p: each entry loaded (None: one the pass only carries) its core
    plus the halo pass p needs. Where the stored tensor (kept with `kept` px of halo) holds at least
    that, it or a view of it; else a new tensor with the stored one copied in. Then the halo is
    overwritten with the neighbours' strips (`ex`; None: they are in place already, see InPlace)."""
    out = []
    t0 = tiles[batch[0]]
    for k, ((sc, h), t, e) in enumerate(zip(want, stored, kept, strict=True)):
        if t is None:
            out.append(None)
            continue
        have, need = box(t0, sc, e, hw), box(t0, sc, h, hw)
        if have == need:
            view = t
        elif h <= e:
            view = t[:, :, need[0] - have[0] : need[1] - have[0], need[2] - have[2] : need[3] - have[2]]
        else:
            if ex is None:  # in place, a state waits as wide as its use reads (Plan.stored)
                raise ValueError("a state stored narrower than the pass reading it in place")
            view = _widen(t, t0, sc, e, h, hw)
        if h > 0 and ex is not None:
            for j, i in enumerate(batch):
                ex.take(view[j * n : (j + 1) * n], p, i, k)
        out.append(view)
    return out[:1], out[1:]
