"""A safetensors header's JSON, validated: the fast path (msgspec, C-level checks) and the exact reader
that names a bad file's fault. engine.formats.safetensors reads the bytes and re-exports what is here.

The header is untrusted input: its JSON, dtypes, shapes and offsets are all checked before anything is
believed (see engine.formats.safetensors for the length and the file's size).
"""

from __future__ import annotations

import functools
import json
import math
import operator
from dataclasses import dataclass, field
from itertools import repeat
from typing import NamedTuple

import msgspec
from msgspec.structs import force_setattr

from ..errors import FormatError
from ..gcpause import gc_paused
from .dtypes import DTYPES
from .index import MAX_DIMS, IndexedTensor

# MAX_DIMS (engine.formats.index, whose IndexedTensor the fast path decodes into): the largest rank.


class TensorInfo(NamedTuple):
    """One tensor's entry in a header; begin/end are relative to the data region.

    A NamedTuple (immutable, and several times cheaper to build than a frozen dataclass: an SDXL
    header has 2,500 of them).
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    file_size: int
    header_size: int
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_start(self) -> int:
        return 8 + self.header_size

    @property
    def data_size(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)


class _Obj(list):
    """A JSON object as its list of (key, value) pairs: json builds these at C speed, and keeping the
    pairs lets us see duplicate keys, which a dict would silently merge."""


def _as_dict(pairs: _Obj, where: str) -> dict:
    d = dict(pairs)
    if len(d) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise FormatError(f"{where}the header lists the key {k!r} twice: the file is corrupt")
            seen.add(k)
    return d


def _json_kind(v) -> str:
    """'a number', 'a list', … for a metadata value's JSON type (in an error message)."""
    if type(v) is _Obj:
        return "a JSON object"
    if type(v) is list:
        return "a list"
    if type(v) is bool:
        return "a boolean"
    if v is None:
        return "null"
    return "a number"


def _nonneg_ints(xs: list) -> bool:
    """Every item a non-negative int (not a bool: type(True) is bool, not int)."""
    for x in xs:  # noqa: SIM110 - a plain loop beats all(<generator>) in this hot path
        if type(x) is not int or x < 0:
            return False
    return True


_by_offsets = operator.itemgetter(3, 4)  # (begin, end) of a TensorInfo
_BITS = {k: v[0] for k, v in DTYPES.items()}


def parse_header(raw: bytes, *, path: str = "", file_size: int | None = None) -> SafetensorsHeader:
    """Validate a header's JSON bytes (without the 8-byte length) against the file's size."""
    with gc_paused():
        fast = _parse_fast(raw, file_size, index=False)
        if fast is not None:
            tensors, metadata, end = fast
            return SafetensorsHeader(
                path, file_size if file_size is not None else 8 + len(raw) + end, len(raw), tensors, metadata
            )
        return _parse_header(raw, path, file_size)


# The fast path: msgspec decodes the JSON and checks every field's type at C speed (the stdlib's json
# took 2 of the 5.6 ms an SDXL header cost, and checking types in Python as much again; `safe_open`
# itself takes 2.5 ms). A header that fails any check here goes through `_parse_header`, which finds
# the exact fault and says it, so a bad file's message never depends on which path read it.
# Entries decode straight into IndexedTensor (what an index holds): its annotations are the checks (a
# non-negative int per dimension, at most MAX_DIMS, `data_offsets` a pair of them), every field optional
# so that `__metadata__` (read separately) decodes too, and an absent one fails a test below.
_ENTRIES = msgspec.json.Decoder(dict[str, IndexedTensor])


class _Top(msgspec.Struct, gc=False):
    """Only `__metadata__`, as raw bytes: the exact reader below checks its values and duplicate keys."""

    metadata: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw, name="__metadata__")


_TOP = msgspec.json.Decoder(_Top)
_BYTES = {k: b // 8 for k, b in _BITS.items() if b % 8 == 0}


def _spans_match(shapes: list, dtypes: list, sizes: list[int]) -> bool:
    """Every tensor's shape and dtype need exactly its offsets' span (C-level passes, no Python per tensor).

    Bytes first (every dtype but the sub-byte F4 / F6 ones, which take the bits); a shape that is not
    there (None) raises TypeError for the caller."""
    try:
        return list(map(operator.mul, map(math.prod, shapes), map(_BYTES.__getitem__, dtypes))) == sizes
    except KeyError:  # a sub-byte dtype, or one that is not a dtype at all
        pass
    try:
        need = list(map(operator.mul, map(math.prod, shapes), map(_BITS.__getitem__, dtypes)))
    except KeyError:
        return False
    return need == list(map(operator.mul, sizes, repeat(8)))


def _tiled_end(begins: list[int], ends: list[int]) -> int | None:
    """Where the data ends when the tensors tile it from 0 (the reference's own test), else None.

    A writer lays tensors out in its header's order (safetensors' own does), so each begins where the one
    before it ends: two list comparisons. Any other order is sorted by (begin, end) and tested so, each
    tensor beginning where the one before it ends (a zero-byte tensor only at such a boundary). Sizes
    are already known to be non-negative (_spans_match)."""
    if not begins:
        return 0
    if begins[0] == 0 and begins[1:] == ends[:-1]:
        return ends[-1]
    spans = sorted(zip(begins, ends, strict=True))
    if spans[0][0] != 0 or list(map(_FIRST, spans[1:])) != list(map(_SECOND, spans[:-1])):
        return None
    return spans[-1][1]


def _parse_fast(raw: bytes, file_size: int | None, *, index: bool):
    """(tensors, metadata, end of the data) when the header is well-formed, else None.

    With index=True the tensors are IndexedTensor (name, dtype, shape, nbytes, absolute offset), for an
    engine.formats index; else TensorInfo (name, dtype, shape, begin, end), for a header.
    """
    try:
        entries = _ENTRIES.decode(raw)
    except (msgspec.DecodeError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    # msgspec keeps the last of two equal keys; the exact reader refuses them, so any duplicate (two
    # tensors of one name, two data_offsets in one entry) sends the header there. Each tensor entry
    # has exactly one "data_offsets" key, and the text cannot hold it elsewhere except as a string.
    has_meta = "__metadata__" in entries
    if raw.count(b'"data_offsets"') != len(entries) - has_meta:
        return None
    metadata: dict[str, str] = {}
    if has_meta:
        entries.pop("__metadata__")
        try:
            meta_raw = _TOP.decode(raw).metadata
            pairs = json.loads(bytes(meta_raw), object_pairs_hook=_Obj)
        except (msgspec.DecodeError, ValueError, RecursionError):
            return None
        if type(pairs) is not _Obj:
            return None
        try:
            metadata = _as_dict(pairs, "")
        except FormatError:
            return None
        for v in metadata.values():
            if type(v) is not str:
                return None
    # Every check below runs as a C-level pass over all entries (map, slice comparisons): an SDXL
    # header's 2,500 tensors cost 0.8 µs each through a Python loop, a third of that this way.
    infos = list(entries.values())
    dtypes = list(map(_DTYPE_OF, infos))
    shapes = list(map(_SHAPE_OF, infos))
    try:  # an absent shape or data_offsets is None here: TypeError
        pairs = list(map(_OFFSET_OF, infos))
        begins = list(map(_FIRST, pairs))
        ends = list(map(_SECOND, pairs))
        sizes = list(map(operator.sub, ends, begins))
        if not _spans_match(shapes, dtypes, sizes):
            return None  # a shape and dtype that need other than the offsets' span
    except TypeError:
        return None
    pos = _tiled_end(begins, ends)
    if pos is None:
        return None
    data_start = 8 + len(raw)
    if file_size is not None and pos != file_size - data_start:
        return None
    names = list(entries)
    if index:
        # The decoded entries become the index's tensors: their name, size and absolute offset set by C
        # passes (building a tuple per tensor instead cost a third of an SDXL header's parse).
        set_ = force_setattr
        list(map(set_, infos, repeat("name"), names))
        list(map(set_, infos, repeat("nbytes"), sizes))
        list(map(set_, infos, repeat("offset"), map(operator.add, begins, repeat(data_start))))
        return entries, metadata, pos
    # tuple.__new__ through a partial: C all the way (a NamedTuple's _make is a Python function).
    rows = zip(names, dtypes, shapes, begins, ends, strict=True)
    return (
        dict(zip(names, map(functools.partial(tuple.__new__, TensorInfo), rows), strict=True)),
        metadata,
        pos,
    )


_DTYPE_OF, _SHAPE_OF, _OFFSET_OF = (operator.attrgetter(a) for a in ("dtype", "shape", "offset"))
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)


def _parse_header(raw: bytes, path: str, file_size: int | None) -> SafetensorsHeader:
    where = f"{path}: " if path else ""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{where}the safetensors header is not valid UTF-8 text (corrupt file?)") from e
    if not text.lstrip().startswith("{"):
        raise FormatError(f"{where}the safetensors header is not a JSON object (corrupt file?)")
    try:
        pairs = json.loads(text, object_pairs_hook=_Obj)
    except (ValueError, RecursionError) as e:
        raise FormatError(
            f"{where}the safetensors header is not valid JSON ({e}); the file is corrupt"
        ) from None
    if type(pairs) is not _Obj:
        raise FormatError(f"{where}the safetensors header is not a JSON object")
    obj = _as_dict(pairs, where)

    metadata: dict[str, str] = {}
    meta = obj.pop("__metadata__", None)
    if meta is not None:
        if type(meta) is not _Obj:
            raise FormatError(f"{where}__metadata__ must be a JSON object of strings")
        # The format says string -> string, and the reference library (so ComfyUI, diffusers and
        # every tool built on `safe_open`) refuses a file with any other value. Accepting it would
        # tell the user the file works when their other tools will not open it.
        for k, v in _as_dict(meta, where).items():
            if type(v) is not str:
                raise FormatError(
                    f"{where}__metadata__ {k!r} is {_json_kind(v)}, not a string: the safetensors format "
                    "allows only string values, and the reference safetensors library (so ComfyUI "
                    "and diffusers) refuses this file. Re-save it with its metadata values as strings."
                )
            metadata[k] = v

    data_start = 8 + len(raw)
    data_limit = None if file_size is None else file_size - data_start
    tensors: dict[str, TensorInfo] = {}
    bits_of = _BITS
    make = TensorInfo._make  # C-level tuple construction
    for name, entry in obj.items():
        if type(entry) is not _Obj:
            raise FormatError(f"{where}tensor {name!r}: entry is not a JSON object")
        entry = _as_dict(entry, where)
        dtype = entry.get("dtype")
        shape = entry.get("shape")
        offsets = entry.get("data_offsets")
        bits = bits_of.get(dtype) if type(dtype) is str else None
        if bits is None:
            raise FormatError(f"{where}tensor {name!r}: unknown dtype {dtype!r}")
        if type(shape) is not list or len(shape) > MAX_DIMS or not _nonneg_ints(shape):
            raise FormatError(
                f"{where}tensor {name!r}: shape {shape!r} is not a list of non-negative integers"
            )
        if type(offsets) is not list or len(offsets) != 2 or not _nonneg_ints(offsets):
            raise FormatError(
                f"{where}tensor {name!r}: data_offsets {offsets!r} are not [begin, end] with begin <= end"
            )
        begin, end = offsets
        if begin > end:
            raise FormatError(
                f"{where}tensor {name!r}: data_offsets {offsets!r} are not [begin, end] with begin <= end"
            )
        if data_limit is not None and end > data_limit:
            raise FormatError(
                f"{where}tensor {name!r} ends at byte {data_start + end:,} but the file has only "
                f"{file_size:,} bytes: the file is truncated (an incomplete download?)"
            )
        total_bits = math.prod(shape) * bits
        if total_bits != (end - begin) * 8:
            expected = total_bits // 8 if total_bits % 8 == 0 else None
            raise FormatError(
                f"{where}tensor {name!r}: shape {shape} of {dtype} needs {expected} bytes "
                f"but its offsets span {end - begin}"
            )
        tensors[name] = make((name, dtype, tuple(shape), begin, end))

    # Tensors must tile the data region from 0 without gaps or overlaps (as the format requires).
    pos = 0
    for t in sorted(tensors.values(), key=_by_offsets):
        if t.begin < pos:
            raise FormatError(f"{where}tensor {t.name!r} overlaps the tensor before it: the file is corrupt")
        if t.begin > pos:
            raise FormatError(
                f"{where}a gap of {t.begin - pos} bytes precedes tensor {t.name!r}: the file is corrupt"
            )
        pos = t.end
    if data_limit is not None and pos != data_limit:
        # The reference reader refuses this too (the data region must be exactly the tensors' bytes).
        raise FormatError(
            f"{where}{data_limit - pos:,} bytes follow the last tensor: the file is damaged or something "
            "was appended to it"
        )
    return SafetensorsHeader(
        path, file_size if file_size is not None else data_start + pos, len(raw), tensors, metadata
    )
