"""Streaming the offloaded modules of a partially loaded component through a forward pass, reading ahead.

The ops of a forward run in a known order (the denoiser lists it: `op_order()`), so the weights of the
next offloaded modules can be on their way while the current ones compute:

* a reader thread makes them ready, in that order, at most the ring's size ahead of the compute: on
  the CPU a disk-tier module is mapped from the file (a populated private mapping of its span, as a
  load's RAM copy: the page-cache pages themselves, no copy; unmapped once its op returns), anything
  else is read into a ring of host memory (`os.preadv` straight from the file for the disk tier, or a
  copy of a RAM-tier tensor); either way RSS holds only what is in flight;
* on the CPU the op computes from those bytes directly (cast and patched by the op as its own weight
  would be: the bytes are the file's, at the file's alignment, so a partial run gives the full run's
  bits). Mapping instead of copying saved 0.76 s of CPU per step streaming 3.1 GB (SD1.5 at 10 %);
* on CUDA the ring is page-locked and the main thread issues each module's host→device copy on a side
  stream a few modules ahead, records an event, and makes the compute stream wait for it just before
  the op runs (the idea of ComfyUI's async offload — a copy stream, pinned buffers, events; our own
  code). Pinned RAM-tier tensors skip the ring and are copied from where they are.

Every streamed byte is counted, so the ledger and the Step result say what one step streamed.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import torch

from ..model.transfer import ALIGN, HostBlock, read_into, view_in
from ..ops import Castable, Embedding

MIN_RING = 64 * 1024 * 1024
LOOKAHEAD_COPIES = 3  # device copies in flight ahead of the compute (CUDA)


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
class _Item:
    unit: object
    ready: threading.Event = field(default_factory=threading.Event)
    host: dict | None = None
    slot: _Slot | None = None
    device: dict | None = None
    event: object = None
    mapped: object = None  # CPU, disk tier: the file mapping its host tensors view (transfer.FileBlock)


class Streamer:
    """Attach to a component for a run of `steps` forwards; `with` it around the steps."""

    def __init__(self, component, order: list, device, *, steps: int, pinned=None, ring_bytes=None):
        self.c = component
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.units = {id(u.module): u for u in component.units if streamable(u)}
        per_step = [self.units[id(op)] for op in order if id(op) in self.units]
        listed = {id(u) for u in per_step}
        per_step += [u for u in self.units.values() if id(u) not in listed]  # unlisted: at the end
        self.plan = [_Item(u) for _ in range(steps) for u in per_step]
        self.unit_bytes = {id(u): u.nbytes_now for u in self.units.values()}
        self.bytes_per_step = sum(self.unit_bytes.values())
        needs = [self._need(u) for u in self.units.values()]
        largest, total = max(needs, default=0), sum(needs)
        # Two of the largest modules at least (one computing, the next arriving); never more than one
        # step's worth (a small model streams whole without holding more than it reads).
        want = ring_bytes or max(MIN_RING, 2 * largest)
        self.ring_bytes = max(largest, min(max(want, 2 * largest), total))
        self.streamed = 0  # bytes handed to ops so far
        self.sync_reads = 0  # modules read on demand (not in the plan's order)
        self.hits = 0  # modules whose bytes were already there (host: read; CUDA: copy issued) when asked
        self._pinned = pinned
        self._next = 0  # the plan position the compute will ask for next
        self._issued = 0  # CUDA: plan positions whose device copy is issued
        self._slots: deque[_Slot] = deque()
        self._head = 0
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._block: HostBlock | None = None
        self._stream = None

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
        for it in self.plan:
            it.host = it.device = it.slot = it.event = it.mapped = None
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

    def _direct(self, u) -> bool:
        """CUDA copies a pinned RAM-tier unit from where it is: no staging."""
        return self.cuda and u.tier == "ram" and u.block is not None and getattr(u.block, "pinned", False)

    def _read_all(self) -> None:
        try:
            for it in self.plan:
                if self._direct(it.unit):
                    it.host = {a: getattr(it.unit.module, a) for a in it.unit.infos}
                else:
                    # The ring's room bounds how far ahead the reader goes, mapped units included
                    # (their pages count in RSS while mapped, as the ring's do).
                    slot = self._alloc(self._need(it.unit))
                    if slot is None:
                        return
                    it.slot = slot
                    if self._mappable(it.unit):
                        it.host, it.mapped = self._map(it.unit)
                    else:
                        it.host = self._stage(it.unit, slot.start)
                it.ready.set()
        except BaseException as e:  # handed to the compute thread, which raises it
            self._error = e
            for it in self.plan:
                it.ready.set()

    def _alloc(self, n: int) -> _Slot | None:
        """A region of n bytes in the ring, waiting until the ops that used it are done."""
        while True:
            with self._cond:
                while True:
                    if self._stop:
                        return None
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
            pending.event.synchronize()  # its device copy has read the bytes: the region is free
            with self._cond:
                pending.event = None

    def _mappable(self, u) -> bool:
        """On the CPU a disk-tier unit is computed from the file's own pages, mapped (see _stage)."""
        c = self.c
        return (
            not self.cuda
            and u.tier == "disk"
            and getattr(c, "file", None) is not None
            and all(c._in_file(i) for i in u.infos.values())
        )

    def _map(self, u) -> tuple[dict, object]:
        """Unit u's tensors as views of a populated private mapping of its span of the file
        (transfer.FileBlock, as a load's RAM copy): the kernel maps the page-cache pages themselves, so
        a warm stream costs page-table work, not a copy of every byte into the ring (and, cold, the
        reader thread's populate is the read-ahead). The views keep the file's offsets, hence the
        alignment a resident copy has: a partial run still gives the full run's bits."""
        c = self.c
        block = c.file_block(u)
        out = {}
        for attr, info in u.infos.items():
            src = getattr(u.module, attr)
            out[attr] = block.view(c.data_start + info.begin, src.dtype, tuple(src.shape))
        return out, block

    def _stage(self, u, offset: int | None) -> dict:
        """Read unit u's tensors into the ring at `offset` (None: into new tensors), as stored: from the
        file by offset for the disk tier, else a copy of the RAM-tier tensor."""
        out, pos = {}, offset
        c = self.c
        for attr, info in u.infos.items():
            src = getattr(u.module, attr)
            from_file = u.tier == "disk" and getattr(c, "file", None) is not None and c._in_file(info)
            if pos is None:
                dst = torch.empty(src.shape, dtype=src.dtype)
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
        return out

    # -- the compute side ---------------------------------------------------------------------------
    def _fetch(self, op) -> dict:
        u = self.units[id(op)]
        k = self._find(u)
        self.streamed += self.unit_bytes[id(u)]
        if k is None:  # asked out of the plan's order: read it now
            self.sync_reads += 1
            got = self._stage(u, None)
            return {a: t.to(self.device) for a, t in got.items()} if self.cuda else got
        for j in range(self._next, k):  # skipped plan entries (the order changed): let their bytes go
            self._skip(self.plan[j])
        self._next = k + 1
        it = self.plan[k]
        self.hits += it.ready.is_set() and (not self.cuda or k < self._issued)
        if not self.cuda:
            # The previous op has returned (the CPU computes synchronously): its bytes go first, so the
            # reader always has room for this one, however the ring is fragmented.
            if k > 0:
                self._done(self.plan[k - 1])
            self._wait(it)
            return it.host
        self._issue(k)
        compute = torch.cuda.current_stream(self.device)
        compute.wait_event(it.event)
        out = it.device
        for t in out.values():
            t.record_stream(compute)  # allocated on the copy stream, used on this one
        it.device = it.event = None
        return out

    def _skip(self, it: _Item) -> None:
        self._wait(it)
        if it.event is not None:  # CUDA: copied already; its ring bytes go once the copy is done
            it.device = it.event = None
        else:
            self._done(it)

    def _find(self, u) -> int | None:
        for j in range(self._next, min(len(self.plan), self._next + 8)):
            if self.plan[j].unit is u:
                return j
        return None

    def _wait(self, it: _Item) -> None:
        it.ready.wait()
        if self._error is not None:
            raise self._error

    def _done(self, it: _Item, event=None) -> None:
        with self._cond:
            if it.slot is not None:
                it.slot.consumed = True
                it.slot.event = event
                it.slot = None
                self._cond.notify_all()
        if not self.cuda:
            it.host = it.mapped = None

    def _issue(self, k: int) -> None:
        """Issue the device copies of plan entries k, k+1, … (k always; the next ones when their host
        bytes are ready), each with an event the compute stream waits for."""
        self._issued = max(self._issued, k)
        end = min(len(self.plan), k + 1 + LOOKAHEAD_COPIES)
        while self._issued < end:
            it = self.plan[self._issued]
            if self._issued > k and not it.ready.is_set():
                break
            self._wait(it)
            # No wait on the compute stream: the buffers come from the copy stream's own pool, and
            # record_stream in _fetch keeps them from being reused before the compute is done with them.
            with torch.cuda.stream(self._stream):
                it.device = {a: t.to(self.device, non_blocking=True) for a, t in it.host.items()}
                ev = torch.cuda.Event()
                ev.record(self._stream)
            it.event = ev
            self._done(it, ev)
            it.host = None
            self._issued += 1
