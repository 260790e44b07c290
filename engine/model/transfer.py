"""Moving tensor bytes between the three tiers: disk (the file, through our own reads), RAM and device.

* RAM copies live in per-unit anonymous memory maps (``HostBlock``), not in the C heap: dropping a unit's
  block returns its pages to the system at once. (Tensors from ``torch.empty`` on the CPU come from
  malloc, which keeps freed chunks below its dynamic mmap threshold — up to 32 MiB on glibc — so a long
  load/unload loop would not give memory back and the ledger would drift from what the process holds.)
* A RAM copy that keeps the file's dtype and is not page-locked is a ``FileBlock``: a private mapping of
  the unit's span of the file, populated read-only (``MADV_POPULATE_READ``). The kernel maps the
  page-cache pages themselves — no fresh memory to fault in and zero, no copy: a warm load of SD1.5's
  2.1 GB measured 0.08 s here against 0.18-0.35 s for ``load_file`` plus a copy into a built model's
  parameters (benchmarks/bench_load.py), and 0.7-1.2 s for the same reads by ``preadv`` into fresh
  anonymous memory (two reader threads did not change that: the cost was faulting the destination).
  The populate itself is the read-ahead: it faults the span in, and the kernel reads a cold file into
  large page-cache folios (Linux 6.18, ext4: 1.9 of SD1.5's 2.1 GB in 2 MiB folios), which every
  later mapping of them (the next load, a streamed step) maps a folio at a time. (The
  ``POSIX_FADV_WILLNEED`` read-ahead used at first filled the cache in 4 KiB pages, which made warm
  loads cost twice what they do now.) The mapping asks for no huge pages: the kernel makes large
  folios without being asked, and ``MADV_HUGEPAGE`` on the mapping (used until 2026-11-26; it had
  been measured against the WILLNEED read-ahead, never against a plain populate) made SD1.5's warm
  load slower, 0.084 s against 0.061 s (medians of 6 alternated runs, every run slower), and its
  cold load no faster (0.86 s against 0.81 s; cold reads here vary 0.6-1.5 s from run to run). The pages
  count in the process's RSS and USS while mapped, as a copy's would; they are clean file pages, so under memory pressure the kernel may drop
  them and read them again on use instead of failing. A write copies just that page: the one write
  made is a run's in-place bake of a LoRA (engine.denoise.patches), undone by dropping the copied
  pages (`FileBlock.revert`), so the file's bytes come back.
* Other reads (a dtype conversion on the way, a page-locked block) go from the file into the
  destination with ``os.preadv`` — one copy.
* On CUDA a RAM block can be page-locked (``cudaHostRegister``), up to a cap given as a share of RAM, so
  host→device copies run non-blocking on a separate copy stream; a small pinned staging ring serves
  reads from disk straight to the device.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import mmap
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from ..cpus import usable_cpus

ALIGN = 64
_ANON_FLAGS = mmap.MAP_PRIVATE | getattr(mmap, "MAP_POPULATE", 0)
_HUGE = 2 * 1024 * 1024
_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)  # Linux's value where Python lacks the name


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class PinnedAccount:
    """Bytes of host memory page-locked by us, against a cap (a share of RAM, as ComfyUI caps its pinned
    memory: 40% of RAM on Windows, more on Linux — model_management.py, MAX_PINNED_MEMORY)."""

    def __init__(self, cap_bytes: int):
        self.cap = int(cap_bytes)
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.cap:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


class HostBlock:
    """One anonymous mapping holding a unit's RAM copy; tensors are carved out of it as views."""

    def __init__(self, nbytes: int, pinned_account: PinnedAccount | None = None):
        import torch

        self.nbytes = int(nbytes)
        # Private anonymous memory. Blocks of 2 MiB and more ask for transparent huge pages (512× fewer
        # page faults to fill and to free: measured 1.1-1.4 GB/s against 0.65 for 4 KiB pages on this
        # machine); smaller ones are pre-faulted in one kernel call where Linux offers MAP_POPULATE.
        huge = self.nbytes >= _HUGE and hasattr(mmap, "MADV_HUGEPAGE")
        self.mm = mmap.mmap(-1, max(1, self.nbytes), flags=mmap.MAP_PRIVATE if huge else _ANON_FLAGS)
        if huge:
            try:
                self.mm.madvise(mmap.MADV_HUGEPAGE)
            except OSError:  # THP disabled: plain pages
                pass
        self.base = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.typed: dict = {}  # dtype -> base seen as that dtype (typed_view)
        self.pinned = False
        self._account = None
        if pinned_account is not None and torch.cuda.is_available() and pinned_account.take(self.nbytes):
            rc = torch.cuda.cudart().cudaHostRegister(self.base.data_ptr(), max(1, self.nbytes), 0)
            if int(rc) == 0:
                self.pinned = True
                self._account = pinned_account
            else:
                pinned_account.give(self.nbytes)

    def release(self) -> None:
        """Unpin (the views must be dropped by the caller; the mapping goes with the last of them)."""
        if self.pinned:
            import torch

            torch.cuda.synchronize()
            torch.cuda.cudart().cudaHostUnregister(self.base.data_ptr())
            self._account.give(self.nbytes)
            self.pinned = False

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def _libc_madvise():
    """libc's madvise through ctypes, which lets go of the GIL while the kernel works (Python's own
    mmap.madvise holds it): populates can then run side by side. None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        f = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    f.argtypes, f.restype = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
    return f


_MADVISE = _libc_madvise()
_POPULATOR: contextvars.ContextVar[_Populator | None] = contextvars.ContextVar(
    "loadout_populator", default=None
)


class _Populator:
    """The FileBlocks made inside `populating()`, populated together when it exits, on worker threads.
    Not while the loading thread is still mapping: making a mapping takes the process's mmap lock for
    writing, and a populate holds it for reading, so the two only took turns (a partial SD1.5 load went
    0.033 -> 0.050 s populating each block as it was made)."""

    def __init__(self, workers: int):
        self.workers = workers
        self.blocks: list[FileBlock] = []

    def submit(self, block: FileBlock) -> None:
        self.blocks.append(block)

    def wait(self) -> None:
        blocks, self.blocks = self.blocks, []
        # In as many runs of consecutive blocks as workers, of about equal bytes: one task each (not one
        # per block: 615 futures cost more than the populates saved), each run read in file order so
        # a cold file's read-ahead still works; the calling thread populates the first run itself.
        total, runs, run, acc = sum(b.nbytes for b in blocks), [], [], 0
        for b in blocks:
            run.append(b)
            acc += b.nbytes
            if acc * self.workers >= total * (len(runs) + 1) and len(runs) < self.workers - 1:
                runs.append(run)
                run = []
        runs = [r for r in (*runs, run) if r]
        if len(runs) < 2:
            _populate_all(blocks)
            return
        with ThreadPoolExecutor(len(runs) - 1, thread_name_prefix="loadout-populate") as pool:
            later = [pool.submit(_populate_all, r) for r in runs[1:]]
            _populate_all(runs[0])
            for f in later:
                f.result()


def _populate_all(blocks: list[FileBlock]) -> None:
    for b in blocks:
        b.populate()


@contextlib.contextmanager
def populating(workers: int | None = None):
    """FileBlocks made inside are populated when the block exits, however it exits, on `workers`
    threads (default: the usable CPUs, at most 4): a load returns, or is cancelled, with every mapped
    page in place, so the ledger says what the process holds. The kernel maps page-cache pages (and
    reads a cold file's) for several mappings at once. On 2 cores, SD1.5's 2.1 GB (615 units) loaded
    warm: 0.052 -> 0.036 s in-process, a 50 % partial load (471 units) 0.033 -> 0.026 s; bench_load
    (which adds building the components) warm 0.057-0.066 -> 0.049-0.051 s, partial 0.047-0.050 ->
    0.040-0.043 s, cold 0.62-0.63 -> 0.58-0.60 s. Nested: the outer one populates."""
    if _MADVISE is None or _POPULATOR.get() is not None:
        yield
        return
    if workers is None:
        workers = min(4, usable_cpus())
    if workers < 2:
        yield
        return
    pop = _Populator(workers)
    token = _POPULATOR.set(pop)
    try:
        yield
    finally:
        _POPULATOR.reset(token)
        pop.wait()


class FileBlock:
    """A unit's RAM copy as a private, pre-populated mapping of its span of the file: the kernel maps
    the page-cache pages into the process (reading them in first when cold, in large requests) instead
    of copying them into fresh anonymous memory — no page zeroing, no copy. The pages are the process's
    own (they count in its RSS and USS) until the mapping goes; written to, a page is copied (private).
    Used where the RAM copy keeps the file's dtype and is not page-locked (`cudaHostRegister` of a
    private file mapping would force a copy of every page anyway)."""

    pinned = False

    def __init__(self, fd: int, start: int, end: int):
        import torch

        page = mmap.PAGESIZE
        lo = start // page * page
        self.start = start
        self.offset = start - lo
        self.nbytes = end - start
        length = max(1, end - lo)
        self.mm = mmap.mmap(
            fd, length, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE, offset=lo
        )
        self.base = torch.frombuffer(self.mm, dtype=torch.uint8)
        self.typed: dict = {}  # dtype -> base seen as that dtype (typed_view)
        pop = _POPULATOR.get()
        if pop is not None:
            pop.submit(self)
        else:
            self.populate()

    def populate(self) -> None:
        """Fault every page in now, read-only (MADV_POPULATE_READ, Linux 5.14): the page-cache pages
        themselves are mapped; a later write would copy just that page. MAP_POPULATE would not do: on
        a writable private mapping it write-faults, copying every page. Where the kernel refuses, a
        read-ahead hint instead (the pages then come on first use)."""
        if _MADVISE is not None:
            if _MADVISE(self.base.data_ptr(), len(self.mm), _POPULATE_READ) != 0:
                _MADVISE(self.base.data_ptr(), len(self.mm), mmap.MADV_WILLNEED)
            return
        try:
            self.mm.madvise(_POPULATE_READ)
        except (OSError, ValueError):
            self.mm.madvise(mmap.MADV_WILLNEED)

    def view(self, file_start: int, dtype, shape):
        """A tensor over the file's bytes at `file_start` (inside this block's span)."""
        return typed_view(self.base, self.typed, self.offset + file_start - self.start, dtype, shape)

    def unmap_pages(self) -> None:
        """Take the mapping's pages out of the process now (MADV_DONTNEED), with the GIL let go
        (libc's madvise through ctypes): what unmapping costs, ~1 ms per 4 MiB of populated pages here,
        paid on the calling thread instead of wherever the last reference happens to drop (the mapping
        itself goes with the object, then cheaply). Nothing may read the mapping's views afterwards
        expecting them resident: a read faults the file's bytes in again."""
        if _MADVISE is not None:
            _MADVISE(self.base.data_ptr(), len(self.mm), mmap.MADV_DONTNEED)

    def span_of(self, t) -> tuple[int, int] | None:
        """The pages of this mapping (page-aligned offsets [lo, hi)) that tensor t's bytes lie in, or
        None when t is not a view of it."""
        if t.device.type != "cpu":
            return None
        off = t.data_ptr() - self.base.data_ptr()
        n = t.numel() * t.element_size()
        if off < 0 or off + n > self.base.numel():
            return None
        page = mmap.PAGESIZE
        return off // page * page, min(len(self.mm), -(-(off + n) // page) * page)

    def revert(self, spans: list[tuple[int, int]]) -> None:
        """Give up what writes made of the pages in `spans`: MADV_DONTNEED drops a private mapping's
        copied pages, and the mapping reads the file's bytes again (every byte of those pages, not just
        the written ones: nothing else ever writes here), populated as when it was made. The restore
        of an in-place bake (engine.denoise.patches): exact, since the file is the backup."""
        for lo, hi in _merged(spans):
            self.mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            try:
                self.mm.madvise(_POPULATE_READ, lo, hi - lo)
            except (OSError, ValueError):
                pass

    def release(self) -> None:
        pass


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def layout(sizes: list[int]) -> tuple[list[int], int]:
    """Offsets (64-byte aligned) of tensors of `sizes` bytes packed in one block, and the block size."""
    offsets, pos = [], 0
    for n in sizes:
        offsets.append(pos)
        pos = _align(pos + n)
    return offsets, pos


def aligned_like(t):
    """An empty CPU tensor of t's dtype and shape whose address is t's modulo ALIGN. The CPU's matmul
    kernels choose their code by the operands' alignment (a single-row linear, MKL's gemv, rounds
    differently at another offset), so a patched copy of a file-mapped weight must sit where the weight
    does for a streamed op to compute the resident op's bits."""
    import math

    import torch

    size = t.element_size()
    if t.data_ptr() % size:  # a tensor off its own element grid (a packed file's): no view can match it
        return torch.empty(t.shape, dtype=t.dtype)
    nbytes = math.prod(t.shape) * size
    raw = torch.empty(nbytes + ALIGN, dtype=torch.uint8)
    off = (t.data_ptr() - raw.data_ptr()) % ALIGN
    return raw[off : off + nbytes].view(t.dtype).view(t.shape)


def view_in(block: HostBlock, offset: int, dtype, shape):
    """A tensor of `dtype`/`shape` over the block's bytes at `offset`."""
    return typed_view(block.base, block.typed, offset, dtype, shape)


def typed_view(base, typed: dict, offset: int, dtype, shape: tuple):
    """A tensor of `dtype`/`shape` over the bytes of `base` (uint8) at `offset`: one as_strided of the
    bytes seen as `dtype` (made once per dtype and kept in `typed`) where the offset is a multiple of the
    element size, 0.9 us against 2.4 us for a slice and two views -- a streamed step makes one per
    tensor of every module it streams (~900 a step for a model of many small modules). Elsewhere the
    slice: the same tensor."""
    size = dtype.itemsize
    if offset % size == 0:
        seen = typed.get(dtype)
        if seen is None:
            seen = typed[dtype] = base[: base.numel() // size * size].view(dtype)
        return seen.as_strided(shape, _strides(shape), offset // size)
    import math

    return base[offset : offset + math.prod(shape) * size].view(dtype).view(shape)


@functools.lru_cache(maxsize=4096)
def _strides(shape: tuple) -> tuple:
    out, n = [], 1
    for d in reversed(shape):
        out.append(n)
        n *= d
    return tuple(reversed(out))


def read_into(fd: int, file_offset: int, dst) -> None:
    """Read len(dst) bytes of the file at `file_offset` into the CPU tensor `dst` (any dtype)."""
    import torch

    flat = dst.reshape(-1).view(torch.uint8)
    if flat.numel() == 0:
        return
    _pread_all(fd, memoryview(flat.numpy()), file_offset)


def _pread_all(fd: int, mv: memoryview, file_offset: int) -> None:
    done = 0
    while done < len(mv):
        n = os.preadv(fd, [mv[done:]], file_offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {file_offset + done}: the file shrank while loading")
        done += n


class CopyEngine:
    """Host→device copies on a separate CUDA stream with a small pinned staging ring (for disk reads and
    unpinned RAM); on other devices, plain copies. `sync()` makes the compute stream wait for them."""

    def __init__(self, device, staging_bytes: int = 64 * 1024 * 1024):
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.stream = torch.cuda.Stream(self.device) if self.cuda else None
        self._ring: list = []
        self._events: list = []
        self._next = 0
        self._staging_bytes = staging_bytes

    def _slot(self, n: int):
        import torch

        if not self._ring:
            for _ in range(2):
                self._ring.append(torch.empty(self._staging_bytes, dtype=torch.uint8, pin_memory=True))
                self._events.append(None)
        i = self._next
        self._next = (i + 1) % len(self._ring)
        if self._events[i] is not None:
            self._events[i].synchronize()  # the copy that used this slot has finished
        return i, self._ring[i][:n]

    def from_file(self, fd: int, file_offset: int, dst) -> None:
        """Fill the device tensor `dst` (file dtype) from the file, through the pinned staging ring."""
        import torch

        flat = dst.reshape(-1).view(torch.uint8)
        total, done = flat.numel(), 0
        self.stream.wait_stream(torch.cuda.current_stream(self.device))  # dst was allocated there
        while done < total:
            n = min(self._staging_bytes, total - done)
            i, buf = self._slot(n)
            read_into(fd, file_offset + done, buf)
            with torch.cuda.stream(self.stream):
                flat[done : done + n].copy_(buf, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(self.stream)
            self._events[i] = ev
            done += n

    def copy(self, dst, src) -> None:
        """dst.copy_(src) on the copy stream (non-blocking when src is pinned host memory)."""
        import torch

        if not self.cuda:
            dst.copy_(src)
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=src.device.type == "cpu" and src.is_pinned())
            if src.device.type == "cuda":
                src.record_stream(self.stream)

    def sync(self) -> None:
        """Make later work wait for every copy issued so far."""
        if self.cuda:
            import torch

            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            self.stream.synchronize()
