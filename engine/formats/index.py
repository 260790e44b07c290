"""One header-only view of every model container: what tensors a file holds, never their data.

Detection, the library and the CLI see every format through `open_index(path) -> ModelIndex`, so they
need not know whether the bytes are safetensors, a torch zip, a legacy pickle or GGUF. Building an
index reads headers only (the safetensors JSON, a torch zip's `data.pkl` through a restricted unpickler,
GGUF's key/value and tensor tables) and never imports torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Annotated

import msgspec

from ..errors import FormatError, UnsupportedModel

__all__ = ["IndexedTensor", "ModelIndex", "open_index", "INDEX_FORMATS"]

# Values of ModelIndex.format.
INDEX_FORMATS = ("safetensors", "torch-zip", "pickle", "gguf")


# The safetensors format's own limit on a tensor's rank is not written down; 16 is what our readers accept.
MAX_DIMS = 16
_Dim = Annotated[int, msgspec.Meta(ge=0)]


class IndexedTensor(msgspec.Struct, frozen=True, order=True, gc=False, rename={"offset": "data_offsets"}):
    """One tensor as a header describes it.

    dtype is a safetensors dtype name ('F16', 'BF16', 'F32', 'I64', ...) for every format; GGUF's
    quantized types keep their ggml names ('Q4_K', 'Q8_0', ...). offset is the absolute byte offset of
    the data in the file where the format has one (safetensors, GGUF), else None (zip members, pickles).
    Immutable and built positionally, as the NamedTuple it replaces was.

    A msgspec Struct because an index of a big checkpoint holds thousands: the safetensors reader
    decodes a header's entries straight into these (C, no per-tensor Python), then sets name, nbytes
    and the absolute offset by C-level passes — a third of what building a tuple per tensor cost a
    library scan (engine.formats.safetensors._parse_fast). The field annotations are what that decode
    checks: non-negative dimensions, at most MAX_DIMS of them; `offset` arrives as the JSON's
    `data_offsets` pair and is replaced before anyone sees it. gc=False: it holds no containers that
    could close a cycle (a str, a tuple of ints, ints), so the collector never walks thousands of them.
    """

    name: str = ""
    dtype: str | None = None
    shape: Annotated[tuple[_Dim, ...], msgspec.Meta(max_length=MAX_DIMS)] | None = None
    nbytes: int = 0
    offset: int | tuple[_Dim, _Dim] | None = None

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def _replace(self, **changes) -> IndexedTensor:
        """A copy with some fields changed (the NamedTuple spelling, shared with TensorInfo)."""
        return msgspec.structs.replace(self, **changes)


@dataclass(frozen=True)
class ModelIndex:
    """What a model file holds, read from its header alone.

    data_size is the bytes of tensor data the file stores (shared storages counted once), file_size the
    file's length. metadata holds string metadata (safetensors `__metadata__`, GGUF key/values rendered
    as text, a pickled checkpoint's top-level scalars such as `global_step`). pickle_globals lists the
    Python globals a pickled file references (all of them allowed, or open_index would have refused).
    """

    path: str
    format: str
    file_size: int
    data_size: int
    tensors: dict[str, IndexedTensor]
    metadata: dict[str, str] = field(default_factory=dict)
    pickle_globals: tuple[str, ...] = ()

    @property
    def params(self) -> int:
        return sum(t.numel for t in self.tensors.values())

    def bytes_by_dtype(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors.values():
            out[t.dtype] = out.get(t.dtype, 0) + t.nbytes
        return out


def _from_safetensors(path: str) -> ModelIndex:
    from .safetensors import index_tensors

    tensors, metadata, file_size, data_size = index_tensors(path)
    return ModelIndex(path, "safetensors", file_size, data_size, tensors, metadata)


def index_of_header(h, path: str) -> ModelIndex:
    """The index of a safetensors file whose header has been read already (no second read)."""
    start = h.data_start
    tensors = {
        n: IndexedTensor(n, t.dtype, t.shape, t.end - t.begin, start + t.begin) for n, t in h.tensors.items()
    }
    return ModelIndex(path, "safetensors", h.file_size, h.data_size, tensors, dict(h.metadata))


def open_index(path: str | os.PathLike, kind: str | None = None) -> ModelIndex:
    """Index a model file from its header: safetensors, torch zip, legacy/bare pickle or GGUF.

    `kind`: what `sniff` said of this file, when the caller has asked already (a library scan's
    detection does, to name what a non-model file is), so the file is not opened once more for it.
    Raises FormatError for a corrupt, truncated, hostile or unrecognised file (its message says which)
    and UnsupportedModel for a real container Loadout cannot read at all.
    """
    from . import sniff

    p = os.fspath(path)
    if kind is None:
        try:
            kind = sniff(p)
        except OSError as e:
            raise FormatError(f"{p}: cannot read the file ({e.strerror or e})", path=p) from e
    if kind == "safetensors":
        return _from_safetensors(p)
    if kind in ("torch-zip", "pickle"):
        from .pickles import index_pickle

        return index_pickle(p)
    if kind == "gguf":
        from .gguf import index_gguf

        return index_gguf(p)
    if kind == "directory":
        raise UnsupportedModel(f"{p} is a folder, not a model file", path=p)
    if kind == "empty":
        raise FormatError(f"{p}: the file is empty (an interrupted download?)", path=p)
    # Unrecognised bytes: let the reader the file's name promises explain what is wrong (a truncated
    # download, a damaged header) instead of a generic "unknown format".
    suffix = os.path.splitext(p)[1].lower()
    if suffix in (".safetensors", ".sft", ".latent"):
        return _from_safetensors(p)
    raise FormatError(
        f"{p}: not a model file Loadout knows (not safetensors, a torch checkpoint or GGUF)", path=p
    )
