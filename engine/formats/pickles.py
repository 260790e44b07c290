"""Pickled checkpoints (.ckpt/.pt/.pth/.bin): header-only index and safe loading.

Two containers exist. `torch.save` since torch 1.6 writes a zip: `<name>/data.pkl` (the object graph,
with tensors as persistent references to storages) beside `<name>/data/<key>` (raw storage bytes).
Older torch wrote one stream: pickles of a magic number, a protocol version and system info, the object
graph, the list of storage keys, then each storage as an 8-byte element count and its bytes
(torch/serialization.py `_legacy_save`). A bare pickle (not torch at all) is also met.

Indexing unpickles only the object graph, through the restricted unpickler of `_unpickle`, and checks
every storage against the container's own record of its size; no tensor byte is read. Loading first
runs the same scan (so a hostile global is refused before torch sees the file), then uses
`torch.load(weights_only=True, mmap=True)`, or, for files that pickle known training metadata (which
weights_only refuses), torch.load driven by our restricted unpickler with those classes stubbed.
"""

from __future__ import annotations

import io
import os
import struct
import zipfile
from typing import Any

from ..errors import EngineError, FormatError
from ._unpickle import STUB_GLOBALS, Allowlist, StorageRef, Stub, TensorRef, free_failure, scan_load
from .index import IndexedTensor, ModelIndex

# A real SD checkpoint's data.pkl is ~100-300 KB, with optimizer state a few MB; anything far larger is
# refused rather than unpickled (a pickle can build objects at ~1 byte of input each).
MAX_PICKLE_BYTES = 32 * 1024 * 1024
# torch/serialization.py: MAGIC_NUMBER and PROTOCOL_VERSION of the legacy format.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL = 1001
MAX_WALK_NODES = 2_000_000


# BYTEARRAY8, BINBYTES8, BINUNICODE8: an opcode, an 8-byte little-endian count, then that many bytes.
_COUNTED8 = frozenset(b"\x96\x8e\x8d")


class _BoundedReader:
    """A file wrapper for the C unpickler that refuses to read past a budget (no peek: exact position).

    Without peek the unpickler reads an unframed stream (torch's protocol 2) opcode by opcode, so a
    count read right after a counted opcode is checked against the budget before the unpickler
    allocates for it: a damaged count (BYTEARRAY8 of 10^18 bytes) is a FormatError, not a failed
    allocation -- on which CPython reported "deallocated bytearray object has exported buffers"
    through sys.excepthook (pytest-qt's, in the fuzz test)."""

    def __init__(self, f: Any, budget: int):
        self.f, self.budget = f, budget
        self._opcode = -1  # the byte of the last 1-byte read: the opcode being read

    def _take(self, n: int) -> int:
        if n < 0 or n > self.budget:
            raise FormatError("the pickle is larger than any real checkpoint's (or claims to be)")
        self.budget -= n
        return n

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(self._take(n if n >= 0 else self.budget))
        counted = n == 8 and self._opcode in _COUNTED8 and len(data) == 8
        if counted and int.from_bytes(data, "little") > self.budget:
            raise FormatError("the pickle holds an item larger than the rest of the file")
        self._opcode = data[0] if n == 1 and data else -1
        return data

    def readinto(self, b: Any) -> int:
        # The budget is checked before any view of `b` is made (a view made first stayed alive in the
        # refused read's traceback, holding the unpickler's buffer: the same CPython report as above).
        self._opcode = -1
        n = self._take(len(b))
        return self.f.readinto(b if n == len(b) else memoryview(b)[:n])

    def readline(self) -> bytes:
        self._opcode = -1
        line = self.f.readline(min(self.budget, 1 << 20) + 1)
        self._take(len(line))
        return line


def _zip_data_pkl(zf: zipfile.ZipFile, p: str) -> tuple[str, zipfile.ZipInfo]:
    cands = [i for i in zf.infolist() if i.filename.endswith("data.pkl") and i.filename.count("/") == 1]
    if len(cands) != 1:
        raise FormatError(
            f"{p}: a zip file, but not a torch checkpoint (no single */data.pkl inside)", path=p
        )
    info = cands[0]
    return info.filename[: -len("data.pkl")], info


def _not_encrypted(info: zipfile.ZipInfo, p: str, what: str) -> None:
    """torch.save never encrypts a member; zipfile would refuse one with a RuntimeError (a damaged
    general-purpose flag says so too: found by the fuzz test)."""
    if info.flag_bits & 0x1:
        raise FormatError(
            f"{p}: {what} is marked encrypted, which torch.save never writes: the file is corrupt", path=p
        )


def _index_zip(p: str, file_size: int) -> tuple[Any, Allowlist, dict[str, StorageRef]]:
    try:
        zf = zipfile.ZipFile(p)
    except (
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        ValueError,
        EOFError,
        struct.error,
        NotImplementedError,
    ) as e:
        raise FormatError(
            f"{p}: the checkpoint's zip directory is damaged ({e}): the file is truncated or corrupt",
            path=p,
        ) from None
    with zf:
        prefix, info = _zip_data_pkl(zf, p)
        if info.file_size > MAX_PICKLE_BYTES:
            raise FormatError(
                f"{p}: data.pkl claims {info.file_size:,} bytes (limit {MAX_PICKLE_BYTES:,}): "
                "not a real checkpoint, or a hostile one",
                path=p,
            )
        _not_encrypted(info, p, "data.pkl")
        try:
            with zf.open(info) as f:  # in 1 MiB steps: a lying size cannot make one huge inflate
                buf = bytearray()
                while len(buf) <= MAX_PICKLE_BYTES:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    buf += chunk
                raw = bytes(buf)
        except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as e:
            raise FormatError(f"{p}: cannot read data.pkl ({e}): the file is corrupt", path=p) from None
        if len(raw) > MAX_PICKLE_BYTES:
            raise FormatError(f"{p}: data.pkl inflates past {MAX_PICKLE_BYTES:,} bytes: refused", path=p)
        allow = Allowlist(p, load=False)
        storages: dict[str, StorageRef] = {}
        obj = scan_load(io.BytesIO(raw), allow, storages)
        members = {i.filename: i for i in zf.infolist()}
        for key, ref in storages.items():
            m = members.get(f"{prefix}data/{key}")
            if m is None:
                raise FormatError(f"{p}: storage {key!r} is missing from the archive: the file is corrupt")
            _not_encrypted(m, p, f"storage {key!r}")
            if m.file_size != ref.nbytes:
                raise FormatError(
                    f"{p}: storage {key!r} should hold {ref.nbytes:,} bytes but the archive has "
                    f"{m.file_size:,}: the file is corrupt"
                )
            if m.header_offset + m.compress_size > file_size:
                raise FormatError(f"{p}: storage {key!r} lies past the end of the file: truncated")
    return obj, allow, storages


def _index_stream(p: str, file_size: int) -> tuple[Any, Allowlist, dict[str, StorageRef]]:
    allow = Allowlist(p, load=False)
    storages: dict[str, StorageRef] = {}
    with open(p, "rb") as raw:
        f = _BoundedReader(raw, min(file_size, MAX_PICKLE_BYTES))
        first = scan_load(f, allow)
        if first != LEGACY_MAGIC or isinstance(first, bool):
            # A bare pickle: the first object is the content.
            return first, allow, storages
        version = scan_load(f, allow)
        if version != LEGACY_PROTOCOL:
            raise FormatError(f"{p}: legacy torch file of unknown protocol {version!r}", path=p)
        scan_load(f, allow)  # system info
        obj = scan_load(f, allow, storages)
        keys = scan_load(f, allow)
        if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
            raise FormatError(f"{p}: the list of storages is damaged: the file is corrupt", path=p)
        pos = raw.tell()
        for key in keys:  # each storage: int64 element count, then its bytes; we only read the counts
            ref = storages.get(key)
            raw.seek(pos)
            head = raw.read(8)
            if ref is None or len(head) < 8:
                raise FormatError(f"{p}: storage {key!r} is missing or cut off: the file is truncated")
            (n,) = struct.unpack("<q", head)
            if n != ref.numel:
                raise FormatError(f"{p}: storage {key!r} holds {n} elements, {ref.numel} expected: corrupt")
            pos += 8 + ref.nbytes
            if pos > file_size:
                raise FormatError(f"{p}: storage {key!r} runs past the end of the file: truncated", path=p)
        if set(keys) != set(storages):
            raise FormatError(f"{p}: the storage list does not match the tensors: corrupt file", path=p)
    return obj, allow, storages


def _scan(p: str) -> tuple[str, Any, Allowlist, dict[str, StorageRef], int]:
    try:
        size = os.path.getsize(p)
        with open(p, "rb") as f:
            is_zip = f.read(4) == b"PK\x03\x04"
    except OSError as e:
        raise FormatError(f"{p}: cannot read the file ({e.strerror or e})", path=p) from e
    if is_zip:
        return ("torch-zip", *_index_zip(p, size), size)
    return ("pickle", *_index_stream(p, size), size)


def tensor_root(obj: Any) -> Any:
    """Where a checkpoint keeps its weights: `state_dict` (Lightning, SD .ckpt) or the object itself."""
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        return obj["state_dict"]
    return obj


def flatten(obj: Any, is_tensor: Any) -> dict[str, Any]:
    """Tensors in nested dicts/lists, named by their path joined with '.' (cycles and depth bounded)."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any, int]] = [("", obj, 0)]
    seen: set[int] = set()
    nodes = 0
    while stack:
        name, o, depth = stack.pop()
        nodes += 1
        if nodes > MAX_WALK_NODES:
            raise FormatError("the checkpoint's object graph is implausibly large")
        if is_tensor(o):
            out.setdefault(name, o)
            continue
        if depth > 64 or id(o) in seen:
            continue
        if isinstance(o, dict):
            seen.add(id(o))
            items = [(k, v) for k, v in o.items() if isinstance(k, (str, int)) and not isinstance(k, bool)]
        elif isinstance(o, (list, tuple)):
            seen.add(id(o))
            items = list(enumerate(o))
        else:
            continue
        for k, v in reversed(items):
            stack.append((f"{name}.{k}" if name else str(k), v, depth + 1))
    return out


def _scalar_metadata(obj: Any) -> dict[str, str]:
    if not isinstance(obj, dict):
        return {}
    return {
        str(k): str(v)
        for k, v in obj.items()
        if isinstance(k, str) and isinstance(v, (str, int, float, bool)) and len(str(v)) < 4096
    }


def index_pickle(path: str | os.PathLike) -> ModelIndex:
    """Header-only index of a torch zip, legacy torch or bare pickle file; no tensor data is read."""
    p = os.fspath(path)
    return index_of_scan(p, *_scan(p))[0]


def index_of_scan(p: str, fmt, obj, allow, storages, size) -> tuple[ModelIndex, dict[str, TensorRef]]:
    """The ModelIndex of one `_scan`, and its tensors as found (engine.formats.torchzip reads their
    storages and offsets from the same scan)."""
    found = flatten(tensor_root(obj), lambda o: isinstance(o, TensorRef))
    tensors = {k: IndexedTensor(k, t.dtype, t.shape, t.nbytes) for k, t in found.items()}
    data_size = sum(s.nbytes for s in storages.values())
    meta = _scalar_metadata(obj)
    return ModelIndex(p, fmt, size, data_size, tensors, meta, tuple(sorted(allow.seen))), found


class _LoadUnpicklerModule:
    """The `pickle_module` torch.load drives in load mode: our allowlist, torch's own storage loading."""

    def __init__(self, path: str):
        import pickle

        allow = Allowlist(path, load=True)

        class Unpickler(pickle.Unpickler):
            def find_class(self, module: str, name: str) -> Any:
                return allow.resolve(module, name)

        self.Unpickler = Unpickler
        self.__name__ = "loadout_restricted_pickle"

    def load(self, f: Any, **kw: Any) -> Any:
        return self.Unpickler(f, **kw).load()


def load_pickle(path: str | os.PathLike) -> Any:
    """Load a pickled checkpoint's objects (tensors memory-mapped where the format allows).

    Known training metadata comes back as inert `Stub` objects. A file that references any other
    global is refused with a FormatError naming it, and nothing in it runs.
    """
    import pickle

    import torch

    p = os.fspath(path)
    fmt, _obj, allow, _storages, _size = _scan(p)  # refuses hostile globals before torch opens the file
    mmap = fmt == "torch-zip"
    needs_stubs = bool(allow.seen & STUB_GLOBALS)
    try:
        if not needs_stubs:
            try:
                return torch.load(p, map_location="cpu", weights_only=True, mmap=mmap)
            except pickle.UnpicklingError as e:
                # weights_only refused something our allowlist admits: load it our way. Its unpickler
                # is freed now (see _unpickle.scan_load), or the collector frees it later, anywhere.
                free_failure(e)
        return torch.load(
            p, map_location="cpu", weights_only=False, mmap=mmap, pickle_module=_LoadUnpicklerModule(p)
        )
    except EngineError as e:
        free_failure(e)  # torch's unpickler is freed here, not by the collector (see _unpickle.scan_load)
        raise
    except Exception as e:
        free_failure(e)
        raise FormatError(f"{p}: the checkpoint cannot be loaded ({type(e).__name__}: {e})", path=p) from None


def load_state_dict(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's tensors, flat: `state_dict` when present, nested names joined with '.'."""
    import torch

    obj = load_pickle(path)
    found = flatten(tensor_root(obj), lambda o: isinstance(o, torch.Tensor))
    # A file may pickle nn.Parameters (a trainer's state_dict): they come back requiring grad, and
    # every delta or scale computed from them would build an autograd graph. Plain tensors, same data.
    return {
        k: v.detach() if v.requires_grad or isinstance(v, torch.nn.Parameter) else v for k, v in found.items()
    }


__all__ = ["index_pickle", "load_pickle", "load_state_dict", "Stub", "MAX_PICKLE_BYTES"]
