"""A torch zip checkpoint's tensors for loading (`.ckpt` / `.pt` / `.pth` / `.bin` written by torch.save
since torch 1.6), zero-copy from the file like a safetensors file's.

torch.save stores each storage as its own zip member, uncompressed, its data aligned to 64 bytes
(torch/csrc/jit/serialization: `PyTorchStreamWriter`), and the pickle says which tensor views which
storage at what element offset and strides. A tensor that is a contiguous view therefore is one byte
range of the file: the same TensorInfo a safetensors header gives, with offsets from the file's start
(`data_start` 0). So the loader, the residency tiers and the streaming read a .ckpt exactly as they read
a .safetensors: mmap views on the disk tier, reads by offset into RAM, never a copy of the whole file.

The pickle is read by the restricted scanner (engine.formats.pickles): nothing in it runs. Legacy
(pre-1.6) files keep their storages after the pickle with no alignment; they, compressed members, a
big-endian file and non-contiguous views are refused with what to do instead.
"""

from __future__ import annotations

import os
import struct
import zipfile
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormatError, UnsupportedModel
from .safetensors import SafetensorsFile, TensorInfo

CONVERT = "convert it to .safetensors (for example with a trusted script, or re-save it with a current torch)"


@dataclass
class TorchZipTable:
    """A torch zip checkpoint's tensors as a safetensors header lists them: one TensorInfo per tensor (its
    flattened name, as the index and detection name it), byte offsets from the file's start."""

    path: str
    file_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)
    data_start: int = 0
    index: Any = None  # the file's ModelIndex, from the same scan of the pickle

    @property
    def data_size(self) -> int:
        return sum(t.end - t.begin for t in self.tensors.values())


def _member_data_offset(f, info: zipfile.ZipInfo, p: str) -> int:
    """Where a stored member's bytes begin: after its local header, whose name and extra field lengths
    may differ from the central directory's (zip spec 4.3.7)."""
    f.seek(info.header_offset)
    head = f.read(30)
    if len(head) < 30 or head[:4] != b"PK\x03\x04":
        raise FormatError(f"{p}: the zip entry of {info.filename!r} is damaged: the file is corrupt", path=p)
    name_len, extra_len = struct.unpack("<HH", head[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    want = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != want:
            return False
        want *= size
    return True


def read_torch_zip(path: str | os.PathLike) -> TorchZipTable:
    """The TensorInfo table of a torch zip checkpoint, from its pickle (restricted scan) and zip directory;
    reads no tensor data."""
    from .pickles import _scan, index_of_scan

    p = os.fspath(path)
    scan = _scan(p)
    fmt, storages, size = scan[0], scan[3], scan[4]
    if fmt != "torch-zip":
        raise UnsupportedModel(
            f"{os.path.basename(p)}: a legacy torch file (saved before torch 1.6): Loadout loads torch "
            f"checkpoints in the zip format only; {CONVERT}",
            path=p,
        )
    index, found = index_of_scan(p, *scan)  # detection's index, from the one scan of the pickle
    try:
        starts = _storage_starts(p, size, storages)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        EOFError,
        OSError,
        ValueError,
        struct.error,
        NotImplementedError,
    ) as e:
        # a damaged directory or local header, a name that is not text: _scan read the pickle through
        # the directory alone; this is the first look at the members' own headers and bytes
        raise FormatError(
            f"{p}: the checkpoint's zip entries are damaged ({e}): the file is corrupt", path=p
        ) from None
    tensors: dict[str, TensorInfo] = {}
    for name, t in found.items():
        if not _contiguous(t.shape, t.strides):
            raise UnsupportedModel(
                f"{os.path.basename(p)}: tensor {name!r} is a strided view of its storage; {CONVERT}", path=p
            )
        begin = starts[t.storage.key] + t.offset * t.storage.stype.itemsize
        tensors[name] = TensorInfo(name, t.dtype, t.shape, begin, begin + t.nbytes)
    return TorchZipTable(p, size, tensors, dict(index.metadata), index=index)


def _small(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes:
    """A short text member's first bytes, never inflating more (a member may lie about its size)."""
    with zf.open(info) as m:
        return m.read(16)


def _storage_starts(p: str, size: int, storages: dict) -> dict[str, int]:
    """Each storage's first byte in the file (UnicodeDecodeError is a ValueError)."""
    with zipfile.ZipFile(p) as zf, open(p, "rb") as f:
        members = {i.filename: i for i in zf.infolist()}
        prefix = next(n[: -len("data.pkl")] for n in members if n.endswith("data.pkl") and n.count("/") == 1)
        order = members.get(f"{prefix}byteorder")
        if order is not None and _small(zf, order).strip() not in (b"", b"little"):
            raise UnsupportedModel(f"{os.path.basename(p)}: a big-endian torch checkpoint; {CONVERT}", path=p)
        starts: dict[str, int] = {}
        for key in storages:
            m = members[f"{prefix}data/{key}"]  # _scan checked that each is there, whole and not encrypted
            if m.compress_type != zipfile.ZIP_STORED:
                raise UnsupportedModel(
                    f"{os.path.basename(p)}: storage {key!r} is compressed in the zip (torch.save never "
                    f"does that: was the file re-zipped?); {CONVERT}",
                    path=p,
                )
            starts[key] = _member_data_offset(f, m, p)
            if starts[key] + m.file_size > size:  # a local header longer than the directory said
                raise FormatError(f"{p}: storage {key!r} runs past the end of the file: truncated", path=p)
    return starts


class TorchZipFile(SafetensorsFile):
    """Lazy, zero-copy access to a torch zip checkpoint's tensors through the same private mmap
    SafetensorsFile uses (everything that binds, moves or measures a SafetensorsFile's tensors takes
    this too)."""

    def __init__(self, path: str | os.PathLike, header: TorchZipTable | None = None):
        self.path = os.fspath(path)
        self.header = header or read_torch_zip(self.path)  # type: ignore[assignment]
        self._mm = None

    def index(self):
        return self.header.index  # type: ignore[attr-defined]


__all__ = ["TorchZipFile", "TorchZipTable", "read_torch_zip"]
