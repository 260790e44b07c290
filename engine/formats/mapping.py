"""Mapping a model file into memory: the whole file, for zero-copy tensor views (SafetensorsFile and the
formats built on it), and torch views of such a mapping."""

from __future__ import annotations

import mmap
import platform
import sys

# A private writable mapping is charged in full against the kernel's commit limit (any of its pages could
# be written and copied), so under Linux's default heuristic overcommit a file larger than RAM + swap -- a
# 26 GB HunyuanVideo or a 41 GB Qwen-Image on a 24 GB machine without swap -- could not be mapped at all
# (ENOMEM), though a partial load reads a fraction of it. Nothing writes into these views (a bake in place
# goes into transfer.FileBlock's own mapping of a module's span), so the mapping reserves nothing
# (MAP_NORESERVE, honoured unless overcommit is strict); where it is still refused (strict overcommit,
# Windows' commit limit) the file is mapped read-only and shared, which is never charged.
_GENERIC_MMAN = ("x86_64", "i686", "aarch64", "armv7l", "riscv64", "s390x")  # asm-generic/mman.h's value
_NORESERVE = getattr(
    mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" and platform.machine() in _GENERIC_MMAN else 0
)


def map_whole(fd: int) -> mmap.mmap:
    """The whole file, mapped copy-on-write without a reservation, or read-only where that is refused."""
    try:
        if hasattr(mmap, "MAP_PRIVATE"):
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            return mmap.mmap(fd, 0, flags=mmap.MAP_PRIVATE | _NORESERVE, prot=prot)
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    except OSError:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)


def frombuffer(mm: mmap.mmap, dtype, count: int, offset: int):
    """torch.frombuffer of a file mapping; a read-only one (map_whole's fallback) without torch's warning
    that such a tensor must not be written (nothing writes into these views)."""
    import torch

    with memoryview(mm) as view:
        writable = not view.readonly
    if writable:
        return torch.frombuffer(mm, dtype=dtype, count=count, offset=offset)
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(mm, dtype=dtype, count=count, offset=offset)
