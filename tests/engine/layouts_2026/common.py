"""A tiny key -> shape builder and the meta-device references the layout tests compare against."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from engine.detect import detect_index, index_from_shapes

Shapes = dict[str, tuple[int, ...]]


class Rows(dict):
    """key -> shape, filled the way torch.nn lays out its parameters (Linear weight is [out, in])."""

    def t(self, key: str, shape: Iterable[int]) -> None:
        self[key] = tuple(int(s) for s in shape)

    def lin(self, key: str, out: int, inp: int, bias: bool = True) -> None:
        self.t(f"{key}.weight", (out, inp))
        if bias:
            self.t(f"{key}.bias", (out,))

    def norm(self, key: str, n: int, bias: bool = True, name: str = "weight") -> None:
        self.t(f"{key}.{name}", (n,))
        if bias:
            self.t(f"{key}.bias", (n,))

    def conv(self, key: str, out: int, inp: int, k: Iterable[int], bias: bool = True) -> None:
        self.t(f"{key}.weight", (out, inp, *k))
        if bias:
            self.t(f"{key}.bias", (out,))

    def under(self, prefix: str) -> Rows:
        return Rows({prefix + k: s for k, s in self.items()})

    def params(self) -> int:
        return sum(math.prod(s) for s in self.values())


def detect(rows: Shapes, metadata: dict | None = None, dtype: str = "BF16"):
    return detect_index(index_from_shapes(rows, metadata, dtype=dtype))


def shard(rows: Shapes, keep: Callable[[str], bool]) -> Shapes:
    """The keys one shard of a sharded model would hold."""
    return {k: s for k, s in rows.items() if keep(k)}


def blocks_only(rows: Shapes, container: str, lo: int, hi: int) -> Shapes:
    """A middle shard: blocks lo..hi-1 of `container` and nothing else (no stem, no head)."""

    def keep(k: str) -> bool:
        if not k.startswith(container):
            return False
        n = k[len(container) :].split(".", 1)[0]
        return n.isdigit() and lo <= int(n) < hi

    return shard(rows, keep)


def meta_shapes(cls, *args, **config) -> Shapes:
    """The state dict shapes of a diffusers class (keyword config) or a transformers class (a config
    object) built on the meta device: the real module tree, no memory."""
    import torch

    with torch.device("meta"):
        model = cls(*args, **config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def converted(convert: Callable, rows: Shapes, **kw) -> Shapes:
    """Run a diffusers single-file converter on meta tensors of `rows`; the shapes it produces."""
    import torch

    tensors = {k: torch.empty(s, device="meta") for k, s in rows.items()}
    out = convert(tensors, **kw)
    return {k: tuple(v.shape) for k, v in out.items()}


def assert_same(mine: Shapes, ref: Shapes) -> None:
    missing = sorted(set(ref) - set(mine))
    extra = sorted(set(mine) - set(ref))
    wrong = sorted((k, mine[k], ref[k]) for k in set(mine) & set(ref) if mine[k] != ref[k])
    assert not (missing or extra or wrong), (
        f"missing {missing[:4]} ({len(missing)}) extra {extra[:4]} ({len(extra)}) wrong {wrong[:4]} ({len(wrong)})"
    )
