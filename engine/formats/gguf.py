"""A bounded, validated GGUF header reader, so GGUF models are named for what they are.

Layout (ggml docs/gguf.md, version 3; version 2 is the same little-endian layout): magic "GGUF", u32
version, u64 tensor count, u64 key/value count; each key/value: string key, u32 value type, value
(strings are a u64 length and UTF-8 bytes; arrays a u32 element type, u64 count and the elements); each
tensor info: string name, u32 n_dims, u64 dims (innermost first), u32 ggml type, u64 offset relative to
the data region, which starts at the next multiple of `general.alignment` (default 32) after the infos.
Block sizes per ggml type: gguf-py `GGML_QUANT_SIZES` (block elements, bytes per block).

Every count and length is checked against hard caps and against the bytes left in the file before
anything is allocated or looped over.

ComfyUI-GGUF's converter stores some tensors reshaped (GGUF holds at most 4 dims, and a quantized
row must be whole blocks) and records the shape to restore under `comfy.gguf.orig_shape.<name>`, an
array of int32 (city96/ComfyUI-GGUF loader.py, get_orig_shape); `GGUFTensor.shape` is that shape.
`GGUFFile` gives a loader the tensors themselves, zero-copy from a mmap of the file.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any

from ..errors import FormatError, UnsupportedModel
from .dtypes import DTYPES
from .index import IndexedTensor, ModelIndex
from .mapping import frombuffer
from .safetensors import SafetensorsFile, TensorInfo

MAGIC = b"GGUF"
MAX_TENSORS = 1_000_000
MAX_KV = 1_000_000
MAX_KEY_BYTES = 65_535
MAX_STRING_BYTES = 64 * 1024 * 1024
MAX_ARRAY_LEN = 64 * 1024 * 1024
MAX_DIMS = 8
MAX_ARRAY_DEPTH = 4
ARRAY_PREVIEW = 64  # arrays up to this length are kept in full in metadata

# ggml type id -> (name, block elements, bytes per block). Source: gguf-py gguf/constants.py.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}

# Key/value types: id -> (name, struct format or None for string/array).
_VTYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"),
    1: ("INT8", "<b"),
    2: ("UINT16", "<H"),
    3: ("INT16", "<h"),
    4: ("UINT32", "<I"),
    5: ("INT32", "<i"),
    6: ("FLOAT32", "<f"),
    7: ("BOOL", "<B"),
    8: ("STRING", None),
    9: ("ARRAY", None),
    10: ("UINT64", "<Q"),
    11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    ggml_type: str
    dims: tuple[int, ...]  # GGUF order: innermost first
    offset: int  # absolute, in the file
    nbytes: int
    orig_shape: tuple[int, ...] | None = None  # comfy.gguf.orig_shape.<name>, when the file has one
    interleaved: int = 0  # heads whose rows llama.cpp keeps in rotary-interleaved order (gguf_names)

    @property
    def shape(self) -> tuple[int, ...]:
        """The torch-order shape (outermost first): the original one where the file records it."""
        return self.orig_shape if self.orig_shape is not None else tuple(reversed(self.dims))


@dataclass(frozen=True)
class GGUFHeader:
    path: str
    version: int
    file_size: int
    alignment: int
    data_start: int
    metadata: dict[str, Any]  # small values as Python values; big arrays as ("array", type, count)
    tensors: dict[str, GGUFTensor] = field(default_factory=dict)


class _Reader:
    """Sequential little-endian reads that never go past the end of the file."""

    def __init__(self, f: Any, size: int, path: str):
        self.f, self.size, self.path, self.pos = f, size, path, 0

    def fail(self, what: str) -> FormatError:
        return FormatError(f"{self.path}: GGUF {what}", path=self.path)

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                f"{what} runs past the end of the file (at byte {self.pos:,}): truncated or corrupt"
            )

    def read(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = self.f.read(n)
        if len(b) != n:
            raise self.fail(f"{what}: the file ended early")
        self.pos += n
        return b

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n
        self.f.seek(self.pos)

    def unpack(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt), what))[0]

    def string(self, what: str, cap: int, *, keep: bool = True) -> str | None:
        n = self.unpack("<Q", f"{what} length")
        if n > cap:
            raise self.fail(f"{what} claims {n:,} bytes (limit {cap:,}): corrupt or hostile file")
        if not keep:
            self.skip(n, what)
            return None
        try:
            return self.read(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} is not UTF-8 text: corrupt file") from None


def _value(r: _Reader, vtype: int, what: str, depth: int = 0, *, keep: bool = True) -> Any:
    if vtype not in _VTYPES:
        raise r.fail(f"{what} has unknown value type {vtype}: corrupt file")
    name, fmt = _VTYPES[vtype]
    if fmt is not None:
        v = r.unpack(fmt, what)
        if name == "BOOL":
            if v not in (0, 1):
                raise r.fail(f"{what} is a boolean of value {v}: corrupt file")
            return bool(v)
        return v
    if name == "STRING":
        return r.string(what, MAX_STRING_BYTES, keep=keep)
    if depth >= MAX_ARRAY_DEPTH:
        raise r.fail(f"{what} nests arrays deeper than {MAX_ARRAY_DEPTH}: corrupt or hostile file")
    etype = r.unpack("<I", f"{what} element type")
    count = r.unpack("<Q", f"{what} length")
    if etype not in _VTYPES:
        raise r.fail(f"{what} has unknown element type {etype}: corrupt file")
    if count > MAX_ARRAY_LEN:
        raise r.fail(f"{what} claims {count:,} elements (limit {MAX_ARRAY_LEN:,}): corrupt or hostile file")
    efmt = _VTYPES[etype][1]
    small = keep and count <= ARRAY_PREVIEW
    if efmt is not None and not small:
        r.skip(count * struct.calcsize(efmt), what)  # fixed-size elements: checked against the file, skipped
        return ("array", _VTYPES[etype][0], count)
    if efmt is None and r.size - r.pos < count * 8:  # every string/array element is at least 8 bytes
        raise r.fail(f"{what} claims {count:,} elements but the file is too short for them: corrupt")
    items = [_value(r, etype, what, depth + 1, keep=small) for _ in range(count)]
    return items if small else ("array", _VTYPES[etype][0], count)


def read_gguf(path: str | os.PathLike) -> GGUFHeader:
    """Read and validate a GGUF header (key/values and tensor infos); never reads tensor data."""
    p = os.fspath(path)
    try:
        f = open(p, "rb")  # noqa: SIM115 - closed below
    except OSError as e:
        raise FormatError(f"{p}: cannot read the file ({e.strerror or e})", path=p) from e
    with f:
        size = os.fstat(f.fileno()).st_size
        r = _Reader(f, size, p)
        if r.read(4, "magic") != MAGIC:
            raise r.fail("magic is missing: not a GGUF file")
        version = r.unpack("<I", "version")
        if version in (2, 3):
            pass
        elif version == 1:
            raise UnsupportedModel(f"{p}: GGUF version 1 (a 2023 pre-release) is not supported", path=p)
        elif version & 0xFFFF == 0 and (version >> 24) in (2, 3):
            raise UnsupportedModel(f"{p}: a big-endian GGUF file, which Loadout cannot read", path=p)
        else:
            raise r.fail(f"version {version} is unknown: corrupt file or a format newer than Loadout")
        n_tensors = r.unpack("<Q", "tensor count")
        n_kv = r.unpack("<Q", "key/value count")
        # Each key/value takes at least 13 bytes, each tensor info at least 24: check before looping.
        if n_tensors > MAX_TENSORS or n_kv > MAX_KV or 13 * n_kv + 24 * n_tensors > size - r.pos:
            raise r.fail(
                f"header claims {n_tensors:,} tensors and {n_kv:,} key/values, more than the file can "
                "hold: corrupt or hostile file"
            )
        meta: dict[str, Any] = {}
        for i in range(n_kv):
            key = r.string(f"key #{i}", MAX_KEY_BYTES)
            assert key is not None
            if key in meta:
                raise r.fail(f"key {key!r} appears twice: corrupt file")
            vtype = r.unpack("<I", f"type of {key!r}")
            meta[key] = _value(r, vtype, f"value of {key!r}")
        alignment = meta.get("general.alignment", 32)
        if not isinstance(alignment, int) or isinstance(alignment, bool) or alignment <= 0:
            raise r.fail(f"general.alignment {alignment!r} is not a positive integer: corrupt file")
        if alignment & (alignment - 1) or alignment > 1 << 20:
            raise r.fail(f"general.alignment {alignment} is not a power of two up to 1 MiB: corrupt file")
        infos = []
        names: set[str] = set()
        for i in range(n_tensors):
            name = r.string(f"tensor #{i} name", MAX_KEY_BYTES)
            assert name is not None
            if name in names:
                raise r.fail(f"tensor {name!r} appears twice: corrupt file")
            names.add(name)
            nd = r.unpack("<I", f"tensor {name!r} dims")
            if nd > MAX_DIMS:
                raise r.fail(f"tensor {name!r} claims {nd} dimensions (limit {MAX_DIMS}): corrupt file")
            dims = tuple(r.unpack("<Q", f"tensor {name!r} dims") for _ in range(nd))
            tid = r.unpack("<I", f"tensor {name!r} type")
            off = r.unpack("<Q", f"tensor {name!r} offset")
            infos.append((name, dims, tid, off))
        data_start = -(-r.pos // alignment) * alignment
    tensors = {}
    for name, dims, tid, off in infos:
        if tid not in GGML_TYPES:
            raise UnsupportedModel(
                f"{p}: tensor {name!r} uses ggml type {tid}, which this version of Loadout does not know",
                path=p,
            )
        tname, block, bsize = GGML_TYPES[tid]
        numel = math.prod(dims)
        if numel >= 1 << 62:
            raise FormatError(f"{p}: GGUF tensor {name!r} claims {numel:,} elements: corrupt file", path=p)
        if dims and dims[0] % block:
            raise FormatError(
                f"{p}: GGUF tensor {name!r} of type {tname} has a row of {dims[0]} elements, not a "
                f"multiple of its block of {block}: corrupt file",
                path=p,
            )
        if off % alignment:
            raise FormatError(f"{p}: GGUF tensor {name!r} offset {off} is not aligned: corrupt file", path=p)
        nbytes = numel // block * bsize
        start = data_start + off
        if start + nbytes > size:
            raise FormatError(
                f"{p}: GGUF tensor {name!r} ends at byte {start + nbytes:,} but the file has {size:,}: "
                "the file is truncated (an incomplete download?)",
                path=p,
            )
        orig = _orig_shape(meta, name, numel, p)
        tensors[name] = GGUFTensor(name, tname, dims, start, nbytes, orig)
    prev_end, prev = data_start, None
    for t in sorted(tensors.values(), key=lambda t: t.offset):
        if t.offset < prev_end:
            raise FormatError(f"{p}: GGUF tensor {t.name!r} overlaps {prev!r}: corrupt file", path=p)
        prev_end, prev = t.offset + t.nbytes, t.name
    return GGUFHeader(p, version, size, alignment, data_start, meta, _own_names(meta, tensors, p))


def _own_names(meta: dict[str, Any], tensors: dict[str, GGUFTensor], p: str) -> dict[str, GGUFTensor]:
    """A text encoder in llama.cpp's names (`enc.blk.0.attn_q`, `blk.0.attn_q`) under the transformers
    names its component is built from (engine.formats.gguf_names); any other file as it is."""
    from dataclasses import replace

    from .gguf_names import hf_names, interleaved_heads

    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    renamed = hf_names(arch, tensors)
    if not renamed:
        return tensors
    out: dict[str, GGUFTensor] = {}
    for name, t in tensors.items():
        new = renamed[name]
        if new in out:
            raise FormatError(
                f"{p}: GGUF tensors {out[new].name!r} and {name!r} both name {new}: corrupt file", path=p
            )
        heads = interleaved_heads(arch, meta, new)
        if heads == 0:
            raise FormatError(
                f"{p}: {arch}.attention.head_count is missing or not one number: the q/k rows of {name} "
                "cannot be put back in transformers' order",
                path=p,
            )
        out[new] = replace(t, name=new, interleaved=heads or 0)
    return out


ORIG_SHAPE_KEY = "comfy.gguf.orig_shape."


def _orig_shape(meta: dict[str, Any], name: str, numel: int, p: str) -> tuple[int, ...] | None:
    v = meta.get(ORIG_SHAPE_KEY + name)
    if v is None:
        return None
    ok = isinstance(v, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in v)
    if not ok or math.prod(v) != numel:
        raise FormatError(
            f"{p}: {ORIG_SHAPE_KEY}{name} is {v!r}, not a shape of the tensor's {numel:,} elements: "
            "corrupt file",
            path=p,
        )
    return tuple(v)


def _meta_text(v: Any) -> str:
    if isinstance(v, tuple) and v and v[0] == "array":
        return f"[array of {v[2]} {v[1]}]"
    if isinstance(v, str):
        return v
    return json.dumps(v)


def index_gguf(path: str | os.PathLike) -> ModelIndex:
    """The GGUF file as a ModelIndex: torch-order shapes, ggml type names for quantized dtypes."""
    return _index_of(read_gguf(path))


def _index_of(h: GGUFHeader) -> ModelIndex:
    tensors = {n: IndexedTensor(n, t.ggml_type, t.shape, t.nbytes, t.offset) for n, t in h.tensors.items()}
    meta = {k: _meta_text(v) for k, v in h.metadata.items()}
    data = sum(t.nbytes for t in h.tensors.values())
    return ModelIndex(h.path, "gguf", h.file_size, data, tensors, meta)


@dataclass(frozen=True)
class GGUFTable:
    """A GGUF file's tensors as a safetensors header lists them, for code that reads either: one
    TensorInfo per tensor with its ggml type name as dtype (F32 / F16 / BF16 and the integer types
    share safetensors' names), its torch-order shape (the original one where recorded) and its bytes
    relative to `data_start`."""

    path: str
    file_size: int
    data_start: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, Any]
    interleaved: dict[str, int] = field(default_factory=dict)  # name -> heads (llama.cpp's q/k row order)


class GGUFFile(SafetensorsFile):
    """Lazy, zero-copy access to a GGUF file's tensors through the same private mmap SafetensorsFile
    uses (so everything that binds, moves or measures a SafetensorsFile's tensors takes this too).
    `tensor()` gives typed views for the float and integer types and, for the block types (Q8_0,
    Q4_K, ...), the raw blocks as a flat uint8 view: engine.quant dequantizes them."""

    def __init__(self, path: str | os.PathLike, header: GGUFHeader | None = None):
        self.path = os.fspath(path)
        self.gguf = header or read_gguf(self.path)
        h = self.gguf
        infos = {
            n: TensorInfo(
                n, t.ggml_type, t.shape, t.offset - h.data_start, t.offset - h.data_start + t.nbytes
            )
            for n, t in h.tensors.items()
        }
        rows = {n: t.interleaved for n, t in h.tensors.items() if t.interleaved}
        self.header = GGUFTable(h.path, h.file_size, h.data_start, infos, h.metadata, rows)  # type: ignore[assignment]
        self._mm = None

    def tensor(self, name: str):
        info = self.header.tensors.get(name)
        if info is None:
            raise KeyError(name)
        if info.dtype in DTYPES:
            return super().tensor(name)
        import torch

        if info.nbytes == 0:
            return torch.empty(0, dtype=torch.uint8)
        return frombuffer(self.mm, torch.uint8, info.nbytes, self.header.data_start + info.begin)

    def index(self) -> ModelIndex:
        return _index_of(self.gguf)


def _pack_value(v: Any) -> tuple[int, bytes]:
    if isinstance(v, bool):
        return 7, struct.pack("<B", v)
    if isinstance(v, int):
        return (4, struct.pack("<I", v)) if 0 <= v < 1 << 32 else (11, struct.pack("<q", v))
    if isinstance(v, float):
        return 6, struct.pack("<f", v)
    if isinstance(v, str):
        b = v.encode()
        return 8, struct.pack("<Q", len(b)) + b
    if isinstance(v, list):
        packed = [_pack_value(x) for x in v]
        etype = packed[0][0] if packed else 4
        if any(t != etype for t, _ in packed):
            raise ValueError("GGUF arrays hold one element type")
        return 9, struct.pack("<IQ", etype, len(v)) + b"".join(b for _, b in packed)
    raise TypeError(f"no GGUF value type for {type(v).__name__}")


def write_sparse_gguf(
    path: str | os.PathLike,
    metadata: dict[str, Any],
    tensors: list[tuple[str, str, tuple[int, ...]]],
    *,
    alignment: int = 32,
    version: int = 3,
) -> None:
    """Write a header-faithful GGUF file: real key/values and tensor infos, a hole for the data.

    tensors are (name, ggml type name, torch-order shape). For tests, fixtures and the demo library.
    """
    from .atomic import atomic_output

    by_name = {v[0]: (k, v[1], v[2]) for k, v in GGML_TYPES.items()}
    meta = dict(metadata)
    if alignment != 32:
        meta["general.alignment"] = alignment
    out = [MAGIC, struct.pack("<IQQ", version, len(tensors), len(meta))]
    for k, v in meta.items():
        kb = k.encode()
        t, b = _pack_value(v)
        out.append(struct.pack("<Q", len(kb)) + kb + struct.pack("<I", t) + b)
    pos = 0
    for name, tname, shape in tensors:
        tid, block, bsize = by_name[tname]
        dims = tuple(reversed(shape))
        nb = math.prod(dims) // block * bsize
        nm = name.encode()
        out.append(struct.pack("<Q", len(nm)) + nm + struct.pack("<I", len(dims)))
        out.append(struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", tid, pos))
        pos += -(-nb // alignment) * alignment
    head = b"".join(out)
    head += bytes(-len(head) % alignment)
    with atomic_output(path) as f:
        f.write(head)
        f.truncate(len(head) + pos)
