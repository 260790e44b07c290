"""A tiny layout builder: the shapes of torch's standard layers, written as (key, dtype, shape) rows.

The shapes are those of torch.nn's own parameters (Linear weight is [out, in], Conv2d weight is
[out, in, k, k], norms hold a weight and a bias of [channels]) so every architecture module only
has to say which layer sits where, exactly as the model's own source builds it.
"""

from __future__ import annotations

from collections.abc import Mapping

Entry = tuple[str, str, tuple[int, ...]]
DTypeSpec = str | Mapping[str, str]


def resolve_dtype(spec: DTypeSpec, component: str) -> str:
    """The dtype for one component: a single name, or a mapping with an optional "*" default."""
    if isinstance(spec, str):
        return spec
    return spec.get(component, spec.get("*", "F16"))


class Builder:
    """Collects rows under a key prefix; `sub()` shares the row list with a longer prefix."""

    def __init__(self, dtype: str = "F16", prefix: str = "", rows: list[Entry] | None = None):
        self.dtype = dtype
        self.prefix = prefix
        self.rows: list[Entry] = [] if rows is None else rows

    def sub(self, prefix: str, dtype: str | None = None) -> Builder:
        return Builder(dtype or self.dtype, self.prefix + prefix, self.rows)

    def t(self, key: str, shape: tuple[int, ...] | list[int], dtype: str | None = None) -> None:
        self.rows.append((self.prefix + key, dtype or self.dtype, tuple(int(s) for s in shape)))

    def linear(self, key: str, out: int, inp: int, bias: bool = True) -> None:
        self.t(f"{key}.weight", (out, inp))
        if bias:
            self.t(f"{key}.bias", (out,))

    def conv(self, key: str, out: int, inp: int, k: int = 3, bias: bool = True) -> None:
        self.t(f"{key}.weight", (out, inp, k, k))
        if bias:
            self.t(f"{key}.bias", (out,))

    def conv3d(self, key: str, out: int, inp: int, k: tuple[int, int, int], bias: bool = True) -> None:
        self.t(f"{key}.weight", (out, inp, *k))
        if bias:
            self.t(f"{key}.bias", (out,))

    def norm(self, key: str, ch: int, bias: bool = True) -> None:
        """GroupNorm / LayerNorm with affine parameters."""
        self.t(f"{key}.weight", (ch,))
        if bias:
            self.t(f"{key}.bias", (ch,))

    def embedding(self, key: str, n: int, dim: int) -> None:
        self.t(f"{key}.weight", (n, dim))


def strip_prefix(rows: list[Entry], prefix: str) -> list[Entry]:
    """Rows under `prefix`, with the prefix removed (a component saved on its own)."""
    return [(k[len(prefix) :], d, s) for k, d, s in rows if k.startswith(prefix)]
