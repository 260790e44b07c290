"""Streaming the offloaded modules of a partially loaded component through a forward pass, reading ahead.

The ops of a forward run in a known order (the denoiser lists it: `op_order()`), so the weights of the
next offloaded modules can be on their way while the current ones compute:

* the streamed modules go in batches: runs of consecutive modules of that order, of the same kind
  (mapped, staged or pinned; see below), up to the largest module's bytes (BATCH_MIN at least). Each
  batch is made ready, waited for, copied and let go as one, so the costs paid per hand-over (waking
  the reader, a mapping, a device copy's event) are paid per batch, not per module: a model of many
  small modules streamed a module at a time spent most of its step handing modules over;
* a reader thread makes the batches ready, in that order, at most the ring's size ahead of the
  compute: on the CPU a batch of disk-tier modules is mapped from the file (populated private
  mappings of its spans, one per run of neighbouring bytes, as a load's RAM copy: the page-cache pages
  themselves, no copy; its pages dropped by the reader once the compute has moved past the batch, so
  the compute thread does not wait on the page-table work, and populated again the next step, the
  mappings and their views made once), anything else is read into
  a ring of host memory (`os.preadv` straight from the file for the disk tier, or a copy of a RAM-tier
  tensor); either way RSS holds only what is in flight;
* on the CPU the op computes from those bytes directly (cast and patched by the op as its own weight
  would be: the bytes are the file's, at the file's alignment, so a partial run gives the full run's
  bits). Mapping instead of copying saved 0.76 s of CPU per step streaming 3.1 GB (SD1.5 at 10 %);
* on CUDA the ring is page-locked and the main thread issues each batch's host→device copy (one for a
  staged batch's whole ring region, its tensors views of the device buffer) on a side stream a few
  batches ahead, records an event, and makes the compute stream wait for it just before the batch's
  first op runs (the idea of ComfyUI's async offload — a copy stream, pinned buffers,
  events; our own code). Pinned RAM-tier units skip the ring and are copied from where they are, a
  unit's block in one copy.
  The card holds at most FLIGHT_BATCHES batch caps of streamed weights at once: the CPU waits for the
  GPU to pass old batches before it copies the one it needs (engine.denoise.device_copies).

Every streamed byte is counted, so the ledger and the Step result say what one step streamed.
"""

from __future__ import annotations

import bisect
import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from ..model import streaming, transfer
from ..model.streaming import BATCH_MIN
from ..model.transfer import ALIGN, HostBlock, read_into, view_in
from ..ops import Castable, Embedding
from .device_copies import DeviceCopies

# Neighbouring spans of a batch's tensors in the file closer than this are mapped as one (the gap's pages
# are read and mapped too: a few headers' worth, not a module's).
MAP_GAP = 64 * 1024
WINDOW = 8  # how far ahead of the expected module (in modules) an op is still taken as the plan's order


def _at_shift(like: torch.Tensor, shift: int) -> torch.Tensor:
    """An empty CPU tensor of like's dtype and shape whose address is `shift` modulo ALIGN (a fresh one where that
    is off its element grid)."""
    size = like.element_size()
    if shift % size:
        return torch.empty(like.shape, dtype=like.dtype)
    nbytes = like.numel() * size
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    off = (shift - raw.data_ptr()) % ALIGN
    return raw[off : off + nbytes].view(like.dtype).view(like.shape)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def streamable(u) -> bool:
    """An offloaded unit whose op reads its tensors through Castable.cast_params."""
    return u.tier != "device" and isinstance(u.module, Castable) and not isinstance(u.module, Embedding)


@dataclass
class _Slot:
    start: int
    end: int
    consumed: bool = False
    event: object = None  # CUDA: the host->device copy that still reads this region


@dataclass
class _Batch:
    units: list
    mode: str  # "map" (CPU, from the file's pages), "stage" (into the ring) or "direct" (pinned, CUDA)
    need: int  # ring bytes ("direct": none)
    ready: threading.Event = field(default_factory=threading.Event)
    host: list | None = None  # per unit: attr -> host tensor
    slot: _Slot | None = None
    device_bytes: int = 0  # CUDA: what its device copies hold
    device: list | None = None  # CUDA, per unit: attr -> device tensor
    buffers: list | None = None  # CUDA: the device allocations `device` views
    event: object = None
    mapped: list | None = None  # CPU, "map": the file mappings its host tensors view (transfer.FileBlock)
    hit: bool = False  # ready (CPU) / its copy issued (CUDA) when the compute came to it
    flight: list | None = None  # CUDA: its entry in Streamer._flight while the compute has not passed it


class Streamer(DeviceCopies):
    """Attach to a component for a run of `steps` forwards; `with` it around the steps."""

    def __init__(
        self, component, order: list, device, *, steps: int, pinned=None, ring_bytes=None, flight_bytes=None
    ):
        self.c = component
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.units = {id(u.module): u for u in component.units if streamable(u)}
        per_step = [self.units[id(op)] for op in order if id(op) in self.units]
        listed = {id(u) for u in per_step}
        per_step += [u for u in self.units.values() if id(u) not in listed]  # unlisted: at the end
        self.unit_bytes = {id(u): u.nbytes_now for u in self.units.values()}
        self.bytes_per_step = sum(self.unit_bytes.values())
        self._pinned = pinned
        batches = self._batches(per_step)
        # per step: unit -> its position in the order; position -> its batch and its place in the batch
        self._n, self._nb, self._steps = len(per_step), len(batches), steps
        self._flat = {id(u): i for i, u in enumerate(per_step)}
        self._batch_of, self._member = [], []
        for j, (units, _, _) in enumerate(batches):
            self._batch_of += [j] * len(units)
            self._member += range(len(units))
        self.plan = [
            _Batch(units, mode, need, device_bytes=need or sum(self.unit_bytes[id(u)] for u in units))
            for _ in range(steps)
            for units, mode, need in batches
        ]
        # CUDA: [bytes, the compute stream's event once the CPU has moved past the batch (None before)]
        self._flight: deque[list] = deque()
        self._in_flight = 0  # the bytes in _flight
        self.flight_bytes = flight_bytes or streaming.FLIGHT_BATCHES * self.cap
        self.peak_flight = 0  # the most streamed bytes the device held at once (CUDA)
        needs = [need for _, _, need in batches]
        largest, total = max(needs, default=0), sum(needs)
        self.ring_bytes = streaming.ring_bytes(largest, total, ring_bytes)
        self.streamed = 0  # bytes handed to ops so far
        self.fetched = 0  # modules handed to ops so far
        self.sync_reads = 0  # modules read on demand (not in the plan's order)
        self.hits = 0  # modules whose bytes were already there (host: read; CUDA: copy issued) when asked
        self._g = 0  # the position (over all steps, in modules) the compute will ask for next
        self._k = -1  # the batch the compute is in
        self._issued = 0  # CUDA: batches whose device copies are issued
        self._slots: deque[_Slot] = deque()
        self._head = 0
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._block: HostBlock | None = None
        self._stream = None
        # CPU: mappings of batches the compute is done with, which the reader unmaps (see _done)
        self._unmap: list = []
        self._reading = True
        # CPU: a mapped batch's mappings and views, by its place in a step, made once and populated again
        # each step (the reader): a step of many small modules spent ~1 ms dropping them (~1.8 us a view)
        self._maps: dict[int, tuple[list, list]] = {}

    @property
    def prefetched(self) -> float:
        """The share of the modules handed to ops whose bytes were on their way before they were asked."""
        return self.hits / max(1, self.fetched)

    def _batches(self, per_step: list) -> list[tuple[list, str, int]]:
        """Runs of consecutive units of one mode, each of at most max(largest unit, BATCH_MIN) bytes."""
        modes = [self._mode(u) for u in per_step]
        needs = [0 if m == "direct" else self._need(u) for u, m in zip(per_step, modes, strict=True)]
        largest = max(max((self.unit_bytes[id(u)] for u in per_step), default=0), max(needs, default=0))
        cap = self.cap = streaming.batch_cap(largest, BATCH_MIN)
        out: list[tuple[list, str, int]] = []
        size = 0
        for u, mode, need in zip(per_step, modes, needs, strict=True):
            nbytes = self.unit_bytes[id(u)]
            if out and out[-1][1] == mode and size + nbytes <= cap:
                units, _, total = out[-1]
                units.append(u)
                out[-1] = (units, mode, total + need)
                size += nbytes
            else:
                out.append(([u], mode, need))
                size = nbytes
        return out

    # -- lifecycle ----------------------------------------------------------------------------------
    def __enter__(self) -> Streamer:
        if not self.units:
            return self
        self._block = HostBlock(self.ring_bytes, self._pinned if self.cuda else None)
        if self.cuda:
            self._stream = torch.cuda.Stream(self.device)
        for u in self.units.values():
            u.module.fetch = self._fetch
        self._thread = threading.Thread(target=self._read_all, name="loadout-stream", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for u in self.units.values():
            u.module.__dict__.pop("fetch", None)
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self.cuda and self._stream is not None:
            self._stream.synchronize()
        for b in self.plan:
            b.host = b.device = b.buffers = b.slot = b.event = b.mapped = b.flight = None
        self._flight.clear()
        self._in_flight = 0
        self._unmap.clear()
        self._maps.clear()
        self._slots.clear()
        if self._block is not None:
            self._block.release()
            self._block = None

    # -- the reader thread --------------------------------------------------------------------------
    @staticmethod
    def _need(u) -> int:
        # + ALIGN each: room to keep a tensor's address where it is modulo ALIGN (see _stage)
        return sum(
            _aligned(t.numel() * t.element_size()) + ALIGN for t in (getattr(u.module, a) for a in u.infos)
        )

    def _mode(self, u) -> str:
        """How unit u streams: "direct" (CUDA copies a pinned RAM-tier unit from where it is), "map" (on
        the CPU a disk-tier unit is computed from the file's own pages, see _map) or "stage" (read into
        the ring, see _stage)."""
        c = self.c
        if self.cuda and u.tier == "ram" and u.block is not None and getattr(u.block, "pinned", False):
            return "direct"
        if (
            not self.cuda
            and u.tier == "disk"
            and getattr(c, "file", None) is not None
            and all(c._in_file(i) for i in u.infos.values())
        ):
            return "map"
        return "stage"

    def _read_all(self) -> None:
        try:
            for i, b in enumerate(self.plan):
                if b.mode == "direct":
                    b.host = [{a: getattr(u.module, a) for a in u.infos} for u in b.units]
                else:
                    # The ring's room bounds how far ahead the reader goes, mapped batches included
                    # (their pages count in RSS while mapped, as the ring's do).
                    slot = self._alloc(b.need)
                    if slot is None:
                        return
                    b.slot = slot
                    if b.mode == "map":
                        got = self._maps.get(i % self._nb)
                        if got is None:
                            got = self._maps[i % self._nb] = self._map(b.units)
                        else:  # its pages went when the compute was done with it last step (_done)
                            for blk in got[1]:
                                blk.populate()
                        b.host, b.mapped = got
                    else:
                        pos, b.host = slot.start, []
                        for u in b.units:
                            got, pos = self._stage(u, pos)
                            b.host.append(got)
                b.ready.set()
            with self._cond:  # from now on the compute thread unmaps what it is done with itself
                self._reading = False
                blocks, self._unmap = self._unmap, []
            self._unmap_all(blocks)
        except BaseException as e:  # handed to the compute thread, which raises it
            self._error = e
            for b in self.plan:
                b.ready.set()

    @staticmethod
    def _unmap_all(blocks: list) -> None:
        for blk in blocks:
            blk.unmap_pages()
        blocks.clear()  # the mappings themselves go here, empty

    def _alloc(self, n: int) -> _Slot | None:
        """A region of n bytes in the ring, waiting until the ops that used it are done (and unmapping,
        meanwhile, the mappings the compute has finished with)."""
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        return None
                    if self._unmap:
                        blocks, self._unmap = self._unmap, []
                        pending = None
                        break
                    while self._slots and self._slots[0].consumed and self._slots[0].event is None:
                        self._slots.popleft()
                        self._cond.notify_all()
                    if not self._slots:
                        self._head = 0
                    start = self._head if self._head + n <= self.ring_bytes else 0
                    busy = [s for s in self._slots if s.start < start + n and start < s.end]
                    if not busy:
                        slot = _Slot(start, start + n)
                        self._slots.append(slot)
                        self._head = start + n
                        return slot
                    pending = next((s for s in busy if s.consumed and s.event is not None), None)
                    if pending is not None:
                        break
                    self._cond.wait()
            if pending is None:
                self._unmap_all(blocks)
                continue
            pending.event.synchronize()  # its device copy has read the bytes: the region is free
            with self._cond:
                pending.event = None

    def _map(self, units: list) -> tuple[list, list]:
        """The units' tensors as views of populated private mappings of their spans of the file
        (transfer.FileBlock, as a load's RAM copy), one mapping per run of spans closer than MAP_GAP:
        the kernel maps the page-cache pages themselves, so a warm stream costs page-table work, not a
        copy of every byte into the ring (and, cold, the reader thread's populate is the read-ahead).
        The views keep the file's offsets, hence the alignment a resident copy has: a partial run
        still gives the full run's bits."""
        c = self.c
        spans = sorted(
            (c.data_start + info.begin, c.data_start + info.end) for u in units for info in u.infos.values()
        )
        runs: list[list[int]] = []
        for lo, hi in spans:
            if runs and lo <= runs[-1][1] + MAP_GAP:
                runs[-1][1] = max(runs[-1][1], hi)
            else:
                runs.append([lo, hi])
        blocks = [transfer.FileBlock(c._fd, lo, hi) for lo, hi in runs]
        starts = [lo for lo, _ in runs]
        host = []
        for u in units:
            out = {}
            for attr, info in u.infos.items():
                src = getattr(u.module, attr)
                at = c.data_start + info.begin
                out[attr] = blocks[bisect.bisect_right(starts, at) - 1].view(at, src.dtype, tuple(src.shape))
            host.append(out)
        return host, blocks

    def _stage(self, u, offset: int | None) -> tuple[dict, int | None]:
        """Read unit u's tensors into the ring at `offset` (None: into new tensors), as stored: from the
        file by offset for the disk tier, else a copy of the RAM-tier tensor. Returns them and the
        ring offset after them."""
        out, pos = {}, offset
        c = self.c
        for attr, info in u.infos.items():
            src = getattr(u.module, attr)
            from_file = u.tier == "disk" and getattr(c, "file", None) is not None and c._in_file(info)
            if pos is None:  # on demand: where the resident copy would sit, modulo ALIGN, too (see below)
                dst = _at_shift(src, (c.data_start + info.begin if from_file else src.data_ptr()) % ALIGN)
            else:
                # The staged copy sits where the resident one would, modulo ALIGN (a file-mapped RAM
                # copy keeps the file's offsets): the CPU's matmul kernels are chosen by the operands'
                # alignment, and a partial run must give the full run's numbers bit for bit.
                shift = (c.data_start + info.begin if from_file else src.data_ptr()) % ALIGN
                dst = view_in(self._block, pos + shift, src.dtype, tuple(src.shape))
                pos += _aligned(shift + dst.numel() * dst.element_size())
            if from_file:
                read_into(c._fd, c.data_start + info.begin, dst)
            else:
                dst.copy_(src)
            out[attr] = dst
        return out, pos

    # -- the compute side ---------------------------------------------------------------------------
    def _fetch(self, op) -> dict:
        u = self.units[id(op)]
        self.streamed += self.unit_bytes[id(u)]
        self.fetched += 1
        f = self._flat[id(u)]
        g = self._g + (f - self._g) % self._n  # the next position of u in the plan
        if g - self._g >= WINDOW or g >= self._n * self._steps:  # out of the plan's order: read it now
            self.sync_reads += 1
            got, _ = self._stage(u, None)
            return {a: t.to(self.device) for a, t in got.items()} if self.cuda else got
        self._g = g + 1
        k = g // self._n * self._nb + self._batch_of[f]
        if k != self._k:
            self._enter(k)
        b = self.plan[k]
        self.hits += b.hit
        return (b.device if self.cuda else b.host)[self._member[f]]

    def _enter(self, k: int) -> None:
        """The compute moves on to batch k: the batches before it are done with (the ops that used them
        have returned on the CPU; on CUDA their work is queued after their tensors' record_stream), and
        batch k's bytes are waited for."""
        if self.cuda:
            self._passed(k)
        if self._k >= 0:
            self._done(self.plan[self._k])
        for j in range(self._k + 1, k):  # skipped (the order changed): let their bytes go
            self._skip(self.plan[j])
        self._k = k
        b = self.plan[k]
        if not self.cuda:
            b.hit = b.ready.is_set()
            self._wait(b)
            return
        b.hit = k < self._issued
        self._issue(k)
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(b.event)
        for buf in b.buffers:  # allocated on the copy stream, used on this one
            buf.record_stream(compute)
        b.event = None

    def _skip(self, b: _Batch) -> None:
        if self.cuda and b.device is not None:  # copied already: its ring bytes go once the copy is done
            b.device = b.buffers = b.event = None
            return
        self._wait(b)
        self._done(b)

    def _wait(self, b: _Batch) -> None:
        b.ready.wait()
        if self._error is not None:
            raise self._error

    def _done(self, b: _Batch, event=None) -> None:
        """Batch b's ring bytes may be reused (CUDA: once `event`, its copy, is done); the CPU lets go of
        its host tensors and mappings, CUDA of the device tensors the compute has used."""
        with self._cond:
            if b.mapped and self._reading:
                # Unmapping costs ~1 ms per 4 MiB of populated pages: the reader does it, beside the
                # compute (a model of many small modules spent a fifth of its partial step on it).
                # Once the reader is done, the last batches' pages (the ring's worth at most) stay
                # until close() lets the mappings go.
                self._unmap += b.mapped
                b.mapped = None
            if b.slot is not None:
                b.slot.consumed = True
                b.slot.event = event
                b.slot = None
                self._cond.notify_all()
        if event is None:
            b.host = b.mapped = b.device = b.buffers = None
