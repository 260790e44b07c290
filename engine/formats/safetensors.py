"""Our own bounded, validated safetensors reader, a lazy mmap tensor reader, and atomic writers.

The header is untrusted input: its length, JSON, dtypes, shapes and offsets are all checked before
anything is believed, and nothing is allocated in proportion to a number read from the file until that
number has been checked against the file's real size. Reading the header never touches tensor data.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import FormatError
from ..gcpause import gc_paused
from .atomic import atomic_output
from .dtypes import nbytes_for, torch_dtype
from .index import IndexedTensor, index_of_header
from .magic import HEAD_BYTES, MAX_HEADER_BYTES, what_is
from .mapping import frombuffer, map_whole
from .st_header import (  # noqa: F401 - re-exported: the reader's types and parsers live there
    SafetensorsHeader,
    TensorInfo,
    _parse_fast,
    _parse_header,
    parse_header,
)

# MAX_HEADER_BYTES (engine.formats.magic, which recognises a safetensors file by it): the largest
# header this reader accepts. The header's JSON is validated in engine.formats.st_header.


def read_header(path: str | os.PathLike) -> SafetensorsHeader:
    """Read and validate a .safetensors header. Reads 8 + header bytes, never tensor data."""
    p = os.fspath(path)
    raw, size = read_raw_header(p)
    return parse_header(raw, path=p, file_size=size)


def read_raw_header(p: str) -> tuple[bytes, int]:
    """(the header's JSON bytes, the file's size), with the length prefix checked against the file."""
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise FormatError(f"{p}: the file is {size} bytes long, too short to be a safetensors file")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES:
                first = head + f.read(HEAD_BYTES - 8)
                if first[8:9] != b"{":  # no JSON where the header should start: some other file
                    raise FormatError(f"{p}: this is {what_is(first)}, not a safetensors file")
                raise FormatError(
                    f"{p}: the header claims {n:,} bytes (limit {MAX_HEADER_BYTES:,}): "
                    "not a safetensors file, or a corrupt one"
                )
            if 8 + n > size:
                raise FormatError(
                    f"{p}: the header claims {n:,} bytes but the file has only {size:,}: "
                    "the file is truncated or not a safetensors file"
                )
            raw = f.read(n)
    except OSError as e:
        raise FormatError(f"{p}: cannot read the file ({e.strerror or e})") from e
    return raw, size


def index_tensors(p: str) -> tuple[dict[str, IndexedTensor], dict[str, str], int, int]:
    """(tensors, metadata, file size, data size) of a safetensors file for engine.formats' index."""
    raw, size = read_raw_header(p)
    with gc_paused():
        fast = _parse_fast(raw, size, index=True)
    if fast is not None:
        tensors, metadata, data_size = fast
        return tensors, metadata, size, data_size
    with gc_paused():
        h = _parse_header(raw, p, size)  # the exact reader: it raises what is wrong
    idx = index_of_header(h, p)  # (one place builds an index from a header)
    return idx.tensors, idx.metadata, idx.file_size, idx.data_size


class SafetensorsFile:
    """Lazy access to tensors through a private (copy-on-write) mmap: the file is never written.

    Tensors returned by `tensor()` are zero-copy views of the mapping; the mapping stays alive as long
    as any view does (torch keeps a reference to the buffer).
    """

    def __init__(self, path: str | os.PathLike, header: SafetensorsHeader | None = None):
        self.path = os.fspath(path)
        self.header = header or read_header(self.path)
        self._mm: mmap.mmap | None = None

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        # Views handed out keep the mmap alive through their buffer reference; dropping ours is enough.
        self._mm = None

    @property
    def mm(self) -> mmap.mmap:
        if self._mm is None:
            with open(self.path, "rb") as f:
                self._mm = map_whole(f.fileno())
        return self._mm

    def keys(self) -> list[str]:
        return list(self.header.tensors)

    def index(self):
        """The file's ModelIndex from the header already read (what detection reads)."""
        from .index import index_of_header

        return index_of_header(self.header, self.path)

    def tensor(self, name: str):
        """A zero-copy torch view of one tensor (imports torch)."""
        import torch

        info = self.header.tensors.get(name)
        if info is None:
            raise KeyError(name)
        dt = torch_dtype(info.dtype)
        start = self.header.data_start + info.begin
        if info.numel == 0:
            return torch.empty(info.shape, dtype=dt)
        t = frombuffer(self.mm, dt, info.numel, start)
        return t.view(info.shape)


def _header_bytes(entries: Iterable[tuple[str, str, tuple[int, ...]]], metadata: Mapping[str, str] | None):
    header: dict = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    pos = 0
    for name, dtype, shape in entries:
        n = nbytes_for(dtype, math.prod(shape))
        if n is None:
            raise ValueError(f"{name}: {dtype} {shape} does not fill whole bytes")
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + n]}
        pos += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # align the data region to 8 bytes, as the reference writer does
    return raw, pos


def write_sparse(
    path: str | os.PathLike,
    entries: Iterable[tuple[str, str, tuple[int, ...]]],
    metadata: Mapping[str, str] | None = None,
) -> Path:
    """Write a header-faithful sparse checkpoint: a real header, and a hole where the data would be.

    A 6.9 GB SDXL layout costs a few hundred KB of disk; header-only readers see the real file.
    """
    raw, data_len = _header_bytes(entries, metadata)
    with atomic_output(path) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + data_len)
    return Path(path)


def save_tensors(
    path: str | os.PathLike, tensors: Mapping[str, object], metadata: Mapping[str, str] | None = None
) -> Path:
    """Write torch tensors as .safetensors, atomically (temporary file, then rename), streaming each tensor."""
    from .dtypes import dtype_name

    items = [(k, v.detach().contiguous().cpu()) for k, v in tensors.items()]
    raw, _ = _header_bytes(((k, dtype_name(v.dtype), tuple(v.shape)) for k, v in items), metadata)
    with atomic_output(path) as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for _, v in items:
            if v.numel():
                f.write(memoryview(v.view(-1).view(_byte_dtype()).numpy()))
    return Path(path)


def _byte_dtype():
    import torch

    return torch.uint8
