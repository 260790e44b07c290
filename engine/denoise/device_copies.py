"""The CUDA side of streaming (engine.denoise.stream): a batch's host->device copies issued on a side
stream ahead of the compute, and the bound on the streamed bytes the card holds at once.

The streamer keeps the plan of batches, the ring and the reader thread; this mixin only issues the
copies, each with an event the compute stream waits for, and lets them go (see Streamer._enter).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..model import transfer
from ..model.transfer import ALIGN

if TYPE_CHECKING:
    from .stream import _Batch as Batch

LOOKAHEAD_COPIES = 3  # batches whose device copies are in flight ahead of the compute (CUDA)


def carve(buf: torch.Tensor, at: int, host: list) -> list:
    """Views of `buf` (a copy of the bytes starting at host address `at`) for each host tensor in
    `host` (per unit, attr -> tensor, every one inside those bytes), at the same offsets."""
    typed: dict = {}
    return [
        {a: transfer.typed_view(buf, typed, t.data_ptr() - at, t.dtype, tuple(t.shape)) for a, t in h.items()}
        for h in host
    ]


def _span(base: torch.Tensor, tensors) -> tuple[int, int] | None:
    """The byte range [lo, hi) of `base` (a host block's bytes) that holds every one of `tensors`, from
    the ALIGN boundary at or before the first, or None when one lies outside it."""
    start, end = base.data_ptr(), base.data_ptr() + base.numel()
    lo, hi = end, start
    for t in tensors:
        p = t.data_ptr()
        lo, hi = min(lo, p), max(hi, p + t.numel() * t.element_size())
    if lo < start or hi > end or lo >= hi:
        return None
    # from an ALIGN boundary: the copies keep their host addresses modulo ALIGN, as a staged batch's do
    return max(start, lo - lo % ALIGN) - start, hi - start


class DeviceCopies:
    """Mixed into Streamer: its CUDA copies (the attributes are the streamer's)."""

    def _passed(self, k: int) -> None:
        """CUDA: the CPU has queued every op of the batches before k; an event on the compute stream
        marks where the GPU will be done with their device copies (see _room)."""
        done = None
        for j in range(max(self._k, 0), k):
            b = self.plan[j]
            if b.flight is not None:
                if done is None:
                    done = torch.cuda.Event()
                    done.record(torch.cuda.current_stream(self.device))
                b.flight[1] = done
                b.flight = None

    def _room(self, nbytes: int, now: bool) -> bool:
        """CUDA: whether a batch's nbytes may be copied to the device while at most flight_bytes of
        streamed weights are there. Batches the GPU has passed leave the count; for the batch the compute
        needs `now` the CPU waits for the GPU to pass them, for one ahead it never waits (it is issued
        later). The caching allocator frees a copy once the compute stream's work on it is done, so
        waiting here is what keeps the device from holding every batch the CPU has queued work for."""
        while self._flight and self._in_flight + nbytes > self.flight_bytes:
            size, done = self._flight[0]
            if done is None:  # the oldest is still in use: only batches ahead wait
                return now
            if now:
                done.synchronize()
            elif not done.query():
                return False
            self._flight.popleft()
            self._in_flight -= size
        return True

    def _device_copies(self, b: Batch) -> tuple[list, list]:
        """Batch b's tensors on the device, copied without blocking (on CUDA, from page-locked host
        memory), a span of host bytes at a time into one device buffer, the tensors views of it at
        their offsets in the span (so they keep their host alignment modulo ALIGN): a staged batch's
        whole ring region; a pinned RAM-tier unit ("direct") its block's span, copied from where it is.
        A launch-bound step paid a copy, and the compute a record_stream, for each tensor. Returns the
        device allocations (what the compute stream records) and, per unit, attr -> tensor."""
        if b.mode == "stage" and b.slot is not None:
            lo, hi = b.slot.start, b.slot.end
            buf = self._span_copy(self._block.base[lo:hi])
            return [buf], carve(buf, self._block.base.data_ptr() + lo, b.host)
        bufs, out = [], []
        for u, h in zip(b.units, b.host, strict=True):
            base = getattr(u.block, "base", None)
            span = _span(base, h.values()) if base is not None else None
            if span is None:  # not all in its block (cannot happen for a RAM-tier unit): one by one
                d = {a: t.to(self.device, non_blocking=True) for a, t in h.items()}
                bufs += d.values()
            else:
                buf = self._span_copy(base[span[0] : span[1]])
                bufs.append(buf)
                d = carve(buf, base.data_ptr() + span[0], [h])[0]
            out.append(d)
        return bufs, out

    def _span_copy(self, host: torch.Tensor) -> torch.Tensor:
        buf = torch.empty(host.numel(), dtype=torch.uint8, device=self.device)
        buf.copy_(host, non_blocking=True)
        return buf

    def _issue(self, k: int) -> None:
        """Issue the device copies of batches k, k+1, … (k always; the next ones when their host bytes
        are ready), each with an event the compute stream waits for."""
        self._issued = max(self._issued, k)
        end = min(len(self.plan), k + 1 + LOOKAHEAD_COPIES)
        while self._issued < end:
            b = self.plan[self._issued]
            if self._issued > k and not b.ready.is_set():
                break
            if not self._room(b.device_bytes, now=self._issued == k):
                break
            self._wait(b)
            # No wait on the compute stream: the buffers come from the copy stream's own pool, and
            # record_stream in _enter keeps them from being reused before the compute is done with them.
            with torch.cuda.stream(self._stream):
                b.buffers, b.device = self._device_copies(b)
                ev = torch.cuda.Event()
                ev.record(self._stream)
            b.event = ev
            b.flight = [b.device_bytes, None]
            self._flight.append(b.flight)
            self._in_flight += b.device_bytes
            self.peak_flight = max(self.peak_flight, self._in_flight)
            self._done(b, ev)
            b.host = None
            self._issued += 1
