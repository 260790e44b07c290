"""A uniform, read-only view of a model's keys, shapes, dtypes and metadata for the detection rules.

Detection is a pure function of this view, so rules are tested with plain dictionaries. Any object
with `tensors` (name -> info with dtype, shape, nbytes) and `metadata` adapts: our safetensors header,
`engine.formats.ModelIndex` (safetensors, pickled torch files, GGUF), or a dict written in a test.
"""

from __future__ import annotations

import math
import operator
import re
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from itertools import compress, islice, repeat

from ..formats.dtypes import DTYPES, nbytes_for
from ..formats.index import ModelIndex


@dataclass(frozen=True)
class TensorMeta:
    dtype: str
    shape: tuple[int, ...]
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class KeyIndex:
    """Keys with shapes and dtypes, the file's metadata, its container format and sizes."""

    tensors: dict[str, TensorMeta]  # or any info with dtype, shape (a tuple) and nbytes
    metadata: dict[str, str] = field(default_factory=dict)
    format: str = "safetensors"
    file_size: int | None = None
    data_size: int | None = None
    path: str = ""

    def has(self, key: str) -> bool:
        return key in self.tensors

    def shape(self, key: str) -> tuple[int, ...] | None:
        t = self.tensors.get(key)
        return None if t is None else t.shape

    def dim(self, key: str | None, i: int) -> int | None:
        """Size of dimension i of a tensor, or None when the key or the dimension does not exist."""
        shape = self.shape(key) if key else None
        return shape[i] if shape is not None and -len(shape) <= i < len(shape) else None

    def with_prefix(self, prefix: str) -> list[str]:
        pool = self._pool(prefix)
        # str.startswith mapped over the pool: the test runs in C, not once per key in Python bytecode
        return list(compress(pool, map(str.startswith, pool, repeat(prefix))))

    def has_prefix(self, prefix: str) -> bool:
        """Whether any key starts with `prefix`."""
        pool = self._pool(prefix)
        return any(map(str.startswith, pool, repeat(prefix)))

    @cached_property
    def text(self) -> str:
        """Every key followed by a newline, in one string: a substring search asks something of every key
        in one C loop (how often a word occurs, whether any key ends in `.x`: `".x\n" in text`)."""
        return "\n".join(self.tensors) + "\n"

    def bucketed(self) -> bool:
        """Whether the suffix index exists: every model's detection builds it, a LoRA's never."""
        return "_reversed" in self.__dict__

    def count_ending(self, suffixes: tuple[str, ...]) -> int:
        """How many keys end with one of `suffixes` (a key counted once per suffix it ends with), from
        the suffix index: two bisections per suffix instead of a test per key."""
        return sum(hi - lo for lo, hi in map(self._ending_slice, suffixes))

    def _ending_in(self, suffix: str) -> list[str]:
        """The keys that are `suffix` or end with `.suffix`, in the file's order: one slice of the suffix
        index, the hits sorted by position (never a pass over every key)."""
        lo, hi = self._ending_slice("." + suffix)
        found = list(map(_REVERSED, self._reversed[lo:hi]))
        if suffix in self.tensors:
            found.append(suffix)
        if len(found) > 1:
            found.sort(key=self._position.__getitem__)
        return found

    def _ending_slice(self, suffix: str) -> tuple[int, int]:
        """The slice of `_reversed` holding the keys that end with `suffix` (they start with it reversed)."""
        r, s = self._reversed, suffix[::-1]
        lo = bisect_left(r, s)
        if not s:
            return lo, len(r)
        if s[-1] < "\U0010ffff":  # the first text after every one that starts with s
            return lo, bisect_left(r, s[:-1] + chr(ord(s[-1]) + 1), lo)
        hi = lo
        while hi < len(r) and r[hi].startswith(s):
            hi += 1
        return lo, hi

    @cached_property
    def _reversed(self) -> list[str]:
        """The suffix index: every key reversed, sorted, so the keys ending with a text are one slice
        found by bisection. Built by C passes (a reversal per key, one sort): an SDXL checkpoint's 2,500
        keys in 4.5M instructions, where grouping them by their last three segments in a Python loop
        cost 9M, the largest part of its detection. (Sorting positions by reversed key instead, to
        skip `_position`, cost more than both.)"""
        return sorted(map(_REVERSED, self.tensors))

    @cached_property
    def _position(self) -> dict[str, int]:
        """Each key's place in the file, to put a lookup's hits back in the file's order."""
        return dict(zip(self.tensors, range(len(self.tensors)), strict=True))

    @cached_property
    def heads(self) -> dict[str, list[str]]:
        """Keys grouped by their first dotted segment (`model`, `first_stage_model`, `conditioner`, …),
        built in one pass: a question about `first_stage_model.` looks at that group only."""
        out: dict[str, list[str]] = {}
        keys = list(self.tensors)
        n = len(keys)
        # Where the keys stop ascending (one C pass). safetensors' own writer orders a header by dtype,
        # then by name: a file is a few sorted runs. In a sorted run the keys under `head.` are one slice,
        # ended where `head/` would sort ('/' follows '.'), so a checkpoint's 2,500 keys are grouped by a
        # bisection per head and run instead of a split per key.
        descents = list(compress(range(1, n), map(operator.gt, keys, islice(keys, 1, None))))
        if len(descents) * 8 <= n:
            bounds = [0, *descents, n]
            for lo, hi in zip(bounds, bounds[1:], strict=False):
                i = lo
                while i < hi:
                    head, dot, _ = keys[i].partition(".")
                    j = bisect_left(keys, head + "/", i, hi) if dot else i + 1
                    group = out.get(head)
                    if group is None:
                        out[head] = keys[i:j]
                    else:
                        group.extend(keys[i:j])
                    i = j
            return out
        for k in keys:
            head = k.partition(".")[0]
            group = out.get(head)
            if group is None:
                out[head] = [k]
            else:
                group.append(k)
        return out

    def _pool(self, prefix: str):
        """The keys that can start with `prefix`: its first segment's group when it has a dot."""
        head, dot, _ = prefix.partition(".")
        return self.heads.get(head, ()) if dot else self.tensors

    def count_blocks(self, prefix: str) -> int:
        """How many numbered children `prefix{N}.` exist (N from 0 without gaps), as block counters do."""
        found = set()
        pool, start = self._pool(prefix), len(prefix)
        for k in compress(pool, map(str.startswith, pool, repeat(prefix))):  # the prefix's keys only
            end = k.find(".", start)
            number = k[start:end]
            if end > start and number.isdecimal():  # what `\d+\.` matches (any Unicode digit: int reads it)
                found.add(int(number))
        n = 0
        while n in found:
            n += 1
        return n

    def prefixes_for(self, suffix: str) -> list[str]:
        """Every prefix P (empty or ending in '.') such that P + suffix is a key (memoised per index), in
        the file's order. The keys are `suffix` or end with `.suffix`: one slice of the suffix index."""
        memo = self._memo
        if suffix not in memo:
            n = len(suffix)
            memo[suffix] = [k[: len(k) - n] for k in self._ending_in(suffix)]
        return memo[suffix]

    @cached_property
    def _memo(self) -> dict[str, list[str]]:
        return {}

    @cached_property
    def by_pattern(self) -> dict[str, list[str]]:
        """Keys grouped by their name with every numeric segment written `#` (`blocks.#.attn.q.weight`):
        built in one pass, so rules about repeated blocks look at a few dozen groups, not every key."""
        out: dict[str, list[str]] = {}
        sub = _NUMERIC_SEGMENT.sub
        for k in self.tensors:
            out.setdefault(sub("#", k), []).append(k)
        return out

    def matches(self, suffix: str) -> list[tuple[str, str]]:
        """(prefix, key) for every key that is prefix + `suffix`, `#` in `suffix` standing for any block
        number, so a shard holding blocks 20-29 answers as well as the whole model. Only the keys that
        end like `suffix` are looked at (the suffix index's slice for its segments after the last `#`);
        memoised per index."""
        memo = self._matched
        if suffix in memo:
            return memo[suffix]
        want = suffix.split(".")
        n = len(want)
        literal = want[n - want[::-1].index("#") :] if "#" in want else want
        pool = self._ending_in(".".join(literal)) if literal else self.tensors
        out = []
        for k in pool:
            segs = k.split(".")
            if len(segs) >= n and all(
                w == s or (w == "#" and s.isdigit()) for w, s in zip(want, segs[-n:], strict=True)
            ):
                out.append((".".join(segs[:-n]) + "." if len(segs) > n else "", k))
        memo[suffix] = out
        return out

    def locate(self, suffix: str) -> dict[str, str]:
        """{prefix: key} for every prefix under which `suffix` matches (see `matches`), keeping the
        lowest-numbered key (`blocks.0` before `blocks.12`)."""
        found: dict[str, str] = {}
        for prefix, k in self.matches(suffix):
            old = found.get(prefix)
            if old is None or (len(k), k) < (len(old), old):
                found[prefix] = k
        return found

    @cached_property
    def _matched(self) -> dict[str, list[tuple[str, str]]]:
        return {}

    def first_match(self, pattern: str) -> str | None:
        """The first key (in natural block order) matching a regular expression."""
        rx = re.compile(pattern)
        tail = _literal_tail(pattern)
        segs = tail.split(".")
        # A tail of three whole segments or more (`.1.transformer_blocks.0.attn2.to_k.weight`): only the
        # keys ending in its last three segments can match.
        pool = self._ending_in(".".join(segs[-3:])) if len(segs) >= 4 else self.tensors
        hits = [k for k in pool if k.endswith(tail) and rx.fullmatch(k)]
        return min(hits, key=_natural) if hits else None


_REVERSED = operator.itemgetter(slice(None, None, -1))

# A numeric segment of a dotted key (`blocks.12.` or a leading `3.`): a block index or a Sequential slot.
_NUMERIC_SEGMENT = re.compile(r"(?:(?<=\.)|^)\d+(?=\.|$)")


def _literal_tail(pattern: str) -> str:
    """The plain text a pattern must end with (after its last `\\d+`), to skip most keys cheaply."""
    cut = max(pattern.rfind("\\d+") + 3 if "\\d+" in pattern else 0, 0)
    tail = pattern[cut:]
    if any(c in tail.replace("\\.", "") for c in "()[]|?*+{}^$"):
        return ""
    return re.sub(r"\\(.)", r"\1", tail)


def _natural(key: str):
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", key)]


def as_key_index(obj, *, path: str = "") -> KeyIndex:
    """Adapt a header / ModelIndex / KeyIndex to a KeyIndex (no tensor data is touched)."""
    if isinstance(obj, KeyIndex):
        return obj
    if type(obj) is ModelIndex:  # its readers build tuple shapes and int sizes: used as they are
        return KeyIndex(
            obj.tensors, dict(obj.metadata), obj.format, obj.file_size, obj.data_size, obj.path or path
        )
    tensors = dict(obj.tensors)  # infos with dtype, shape, nbytes are used as they are (no copies)
    for name, t in tensors.items():
        if not isinstance(t.shape, tuple) or getattr(t, "nbytes", None) is None:
            shape = tuple(int(s) for s in t.shape)
            nbytes = getattr(t, "nbytes", None)
            if nbytes is None:
                nbytes = nbytes_for(t.dtype, math.prod(shape)) or 0
            tensors[name] = TensorMeta(str(t.dtype), shape, int(nbytes))
    data_size = getattr(obj, "data_size", None)
    if data_size is None:
        data_size = sum(t.nbytes for t in tensors.values())
    return KeyIndex(
        tensors=tensors,
        metadata={str(k): str(v) for k, v in (getattr(obj, "metadata", None) or {}).items()},
        format=getattr(obj, "format", "safetensors"),
        file_size=getattr(obj, "file_size", None),
        data_size=data_size,
        path=getattr(obj, "path", "") or path,
    )


def index_from_shapes(
    shapes: Mapping[str, Iterable[int] | tuple[str, Iterable[int]]],
    metadata: Mapping[str, str] | None = None,
    *,
    dtype: str = "F16",
    format: str = "safetensors",
) -> KeyIndex:
    """A KeyIndex from {key: shape} or {key: (dtype, shape)}: the way tests state a layout."""
    tensors = {}
    for k, v in shapes.items():
        if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):
            dt, shp = v[0], tuple(v[1])
        else:
            dt, shp = dtype, tuple(v)
        if dt not in DTYPES:
            raise ValueError(f"unknown dtype {dt!r} for {k}")
        tensors[k] = TensorMeta(dt, shp, nbytes_for(dt, math.prod(shp)) or 0)
    size = sum(t.nbytes for t in tensors.values())
    return KeyIndex(tensors, dict(metadata or {}), format, None, size)
