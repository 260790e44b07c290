"""ggml's lattice types decoded in torch: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M, every block
of a tensor at once, on the tensor's own device (a GPU decodes its own bytes: no round trip through numpy).

Each type stores, per group of 8 (IQ2, IQ1) or 4 (IQ3) weights, an index into a codebook of lattice points
(256 to 2048 points; the `gguf` package holds them, `init_grid`, and they are read from it once per device)
with sign bits and a 4- or 3-bit scale per sub-block. Block layouts are ggml's (ggml/src/ggml-common.h,
`block_iq2_xxs` … `block_iq1_m`, QK_K = 256); element order, scale formulas and the order of the float
operations those of gguf-py's `quants.py` (`dequantize_blocks`, the tests' reference), each rounded to
float32 on its own: the results are bit-identical. Sign tables are facts of the format: IQ2_XXS / IQ2_XS /
IQ3_XXS give 7 sign bits of 8 and the eighth makes their count even (ggml's `ksigns_iq2xs`); IQ2_S and
IQ3_S store all 8.
"""

from __future__ import annotations

import torch

from .bits import halves as _half
from .bits import split_planes, table

F32 = torch.float32


def _grid(name: str, device: torch.device) -> torch.Tensor:
    """The codebook of `name`: (points, 8 or 4) float32 on `device`."""

    def build() -> torch.Tensor:
        import gguf

        cls = getattr(gguf.quants, "IQ1_S" if name == "IQ1_M" else name)
        cls.init_grid()
        return torch.from_numpy(cls.grid.reshape(cls.grid_shape).copy()).to(F32)

    return table(("grid", name), device, build)


def _signs(parity: bool, device: torch.device) -> torch.Tensor:
    """(128 or 256, 8) float32 of ±1: the signs of 8 weights from a byte's bits (bit i: weight i negative);
    with `parity`, from a 7-bit index whose eighth bit makes the count of negatives even."""

    def build() -> torch.Tensor:
        idx = torch.arange(128 if parity else 256)
        if parity:
            idx = idx | (torch.tensor([bin(i).count("1") & 1 for i in range(128)]) << 7)
        return (1 - 2 * ((idx[:, None] >> torch.arange(8)) & 1)).to(F32)

    return table(("signs", parity), device, build)


def _u32(b: torch.Tensor) -> torch.Tensor:
    """Little-endian uint32 words of `b` (..., 4k) -> (..., k) int64 (a copy first where a one-block slice
    starts mid-word)."""
    if not b.is_contiguous() or b.storage_offset() % 4 or any(s % 4 for s in b.stride()[:-1]):
        b = torch.empty(b.shape, dtype=b.dtype, device=b.device).copy_(b)
    return b.view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _u16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.int16).to(torch.int32) & 0xFFFF


def _nibbles(b: torch.Tensor) -> torch.Tensor:
    """(n, k) bytes -> (n, 2k) float32: each byte's low nibble, then its high one."""
    return split_planes(b, 4, axis=-1).reshape(b.shape[0], -1).to(F32)


def _bits(b: torch.Tensor, width: int, count: int) -> torch.Tensor:
    """(n, k) integers -> (n, k·count) int64: `count` fields of `width` bits each, lowest first."""
    b = b.to(torch.int64)
    return torch.stack([(b >> (i * width)) & ((1 << width) - 1) for i in range(count)], dim=-1).reshape(
        b.shape[0], -1
    )


def _lattice(db, grid, idx, signs, shape) -> torch.Tensor:
    """(db · grid[idx]) · signs, shaped (n, sub-blocks, groups, points' width)."""
    return (db * grid.index_select(0, idx.reshape(-1)).view(shape)) * signs.view(shape)


def iq2_xxs(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq2_xxs (66 bytes): d: half, qs: uint32[16] as 8 pairs: the first word 4 grid indices (bytes),
    # the second 4 7-bit sign indices and a 4-bit scale on top.  y = d·(0.5 + s)·0.25 · grid · signs
    n = b.shape[0]
    words = _u32(b[:, 2:66]).view(n, 8, 2)
    db = (_half(b[:, 0:2]) * (0.5 + (words[..., 1] >> 28).to(F32)) * 0.25).view(n, 8, 1, 1)
    idx = b[:, 2:66].reshape(n, 8, 8)[:, :, 0:4].long()
    sign = _signs(True, b.device).index_select(0, _bits(words[..., 1], 7, 4).reshape(-1))
    out.view(n, 8, 4, 8).copy_(_lattice(db, _grid("IQ2_XXS", b.device), idx, sign, (n, 8, 4, 8)))


def iq2_xs(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq2_xs (74 bytes): d: half, qs: uint16[32] (9-bit grid index, 7-bit sign index), scales:
    # uint8[8] (a nibble per 16 weights).  y = d·(0.5 + s)·0.25 · grid · signs
    n = b.shape[0]
    q = _u16(b[:, 2:66])
    db = (_half(b[:, 0:2]) * (0.5 + _nibbles(b[:, 66:74])) * 0.25).view(n, 16, 1, 1)
    sign = _signs(True, b.device).index_select(0, (q >> 9).reshape(-1).long())
    out.view(n, 16, 2, 8).copy_(
        _lattice(db, _grid("IQ2_XS", b.device), (q & 511).long(), sign, (n, 16, 2, 8))
    )


def iq2_s(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq2_s (82 bytes): d: half, qs: uint8[32] (grid index low bits), signs: uint8[32], qh: uint8[8]
    # (2 high index bits each), scales: uint8[8] (nibbles).  y = d·(0.5 + s)·0.25 · grid · signs
    n = b.shape[0]
    db = (_half(b[:, 0:2]) * (0.5 + _nibbles(b[:, 74:82])) * 0.25).view(n, 16, 1, 1)
    idx = b[:, 2:34].long() | (_bits(b[:, 66:74], 2, 4) << 8)
    sign = _signs(False, b.device).index_select(0, b[:, 34:66].reshape(-1).long())
    out.view(n, 16, 2, 8).copy_(_lattice(db, _grid("IQ2_S", b.device), idx, sign, (n, 16, 2, 8)))


def iq3_xxs(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq3_xxs (98 bytes): d: half, qs: uint8[64] (grid indices, 4 weights each), then uint32[8]:
    # 4 7-bit sign indices and a 4-bit scale on top, per 32 weights.  y = d·(0.5 + s)·0.5 · grid · signs
    n = b.shape[0]
    words = _u32(b[:, 66:98])
    db = (_half(b[:, 0:2]) * (0.5 + (words >> 28).to(F32)) * 0.5).view(n, 8, 1, 1)
    sign = _signs(True, b.device).index_select(0, _bits(words, 7, 4).reshape(-1))
    out.view(n, 8, 4, 8).copy_(
        _lattice(db, _grid("IQ3_XXS", b.device), b[:, 2:66].long(), sign, (n, 8, 4, 8))
    )


def iq3_s(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq3_s (110 bytes): d: half, qs: uint8[64] (index low bits), qh: uint8[8] (1 high bit each),
    # signs: uint8[32], scales: uint8[4] (nibbles).  y = d·(1 + 2s) · grid · signs
    n = b.shape[0]
    scale = _nibbles(b[:, 106:110]).to(torch.int32)
    db = (_half(b[:, 0:2]) * (1 + 2 * scale).to(F32)).view(n, 8, 1, 1)
    idx = b[:, 2:66].long() | (_bits(b[:, 66:74], 1, 8) << 8)
    sign = _signs(False, b.device).index_select(0, b[:, 74:106].reshape(-1).long())
    out.view(n, 8, 4, 8).copy_(_lattice(db, _grid("IQ3_S", b.device), idx, sign, (n, 8, 4, 8)))


IQ1_DELTA = 0.125  # ggml's IQ1S_DELTA: the shift of IQ1 grid points, its sign per group of 32 weights


def iq1_s(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq1_s (50 bytes): d: half, qs: uint8[32] (index low bits), qh: uint16[8] (per 32 weights:
    # 4 × 3 high index bits, a 3-bit scale, the delta's sign on top).  y = d·(2s + 1) · (grid ± 0.125)
    n = b.shape[0]
    qh = _u16(b[:, 34:50])
    dl = (_half(b[:, 0:2]) * (2 * ((qh >> 12) & 7) + 1).to(F32)).view(n, 8, 1, 1)
    delta = torch.where((qh & 0x8000) == 0, IQ1_DELTA, -IQ1_DELTA).to(F32).view(n, 8, 1, 1)
    idx = b[:, 2:34].long() | (_bits(qh, 3, 4) << 8)
    grid = _grid("IQ1_M", b.device).index_select(0, idx.reshape(-1)).view(n, 8, 4, 8)
    out.view(n, 8, 4, 8).copy_(dl * (grid + delta))


def iq1_m(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq1_m (56 bytes): qs: uint8[32] (index low bits), qh: uint8[16] (per 8 weights: 3 high index
    # bits and the delta's sign), scales: uint16[4] (3-bit scales, 4 a word; the half scale d is spread
    # over the words' top nibbles).  y = d·(2s + 1) · (grid ± 0.125)
    n = b.shape[0]
    sc = _u16(b[:, 48:56])
    top = sc & 0xF000
    d = ((top[:, 0] >> 12) | (top[:, 1] >> 8) | (top[:, 2] >> 4) | top[:, 3]).to(torch.int16)
    d = d.view(torch.float16).to(F32).view(n, 1)
    dl = (d * (2 * _bits(sc, 3, 4) + 1).to(F32)).view(n, 8, 2, 1, 1)
    h = _bits(b[:, 32:48], 4, 2)
    delta = torch.where((h & 8) == 0, IQ1_DELTA, -IQ1_DELTA).to(F32).view(n, 8, 2, 2, 1)
    idx = b[:, 0:32].long() | ((h & 7) << 8)
    grid = _grid("IQ1_M", b.device).index_select(0, idx.reshape(-1)).view(n, 8, 2, 2, 8)
    out.view(n, 8, 2, 2, 8).copy_(dl * (grid + delta))


DECODERS = {
    "IQ2_XXS": iq2_xxs,
    "IQ2_XS": iq2_xs,
    "IQ2_S": iq2_s,
    "IQ3_XXS": iq3_xxs,
    "IQ3_S": iq3_s,
    "IQ1_S": iq1_s,
    "IQ1_M": iq1_m,
}
