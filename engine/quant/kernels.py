"""ggml block decoders in torch: every block of a tensor at once (no loop over blocks), on the tensor's
own device, in float32.

Block layouts are ggml's (ggml/src/ggml-common.h, `block_q4_0` … `block_q6_K`, `block_iq4_nl`,
`block_iq4_xs`; QK_K = 256) and the
element order and scale formulas those of `dequantize_row_*` in ggml/src/ggml-quants.c. The float
operations are done in the same order as there (and as in gguf-py's gguf/quants.py, the reference the
tests compare against), each rounded to float32 on its own — no fused multiply-add — so the results
are bit-identical. `ggml_half` scales are IEEE half floats; a half -> float conversion is exact.

Bit unpacking uses one idiom: `_split(b, step)` shifts every byte right by 0, step, 2*step, … and
masks `step` bits, giving a new axis of 8 // step planes (ahead of the byte axis, or after it where
a plane is one bit of a little-endian word, as Q5_0's qh). ggml packs its
quants so that reading those planes in order gives the elements in order (e.g. in Q4_0 the low
nibbles of qs[0..15] are elements 0..15 and the high nibbles elements 16..31).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..errors import FormatError
from . import block_layout, lattice
from .bits import halves as _half
from .bits import split_planes as _split
from .bits import table

F32 = torch.float32
# Elements decoded per pass: bounds the temporaries (a few bytes per element on top of the result)
# whatever the tensor's size. Larger passes change little on the CPU (the first write into the fresh
# result, page faults included, dominates) and cost more device memory on a GPU.
CHUNK_ELEMENTS = {"cpu": 1 << 20, "other": 1 << 22}


def _q8_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q8_0 (34 bytes): d: half, qs: int8[32].  y = qs * d
    torch.mul(b[:, 2:].contiguous().view(torch.int8).to(F32), _half(b[:, 0:2]), out=out)


def _q4_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q4_0 (18 bytes): d: half, qs: uint8[16], element j = low nibble of qs[j], j + 16 = high.
    # y = (q - 8) * d
    q = _split(b[:, 2:], 4).reshape(-1, 32).view(torch.int8) - 8
    torch.mul(q.to(F32), _half(b[:, 0:2]), out=out)


def _q4_1(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q4_1 (20 bytes): d: half, m: half, qs: uint8[16] (nibbles as in Q4_0).  y = q * d + m
    q = _split(b[:, 4:], 4).reshape(-1, 32).to(F32)
    torch.add(q * _half(b[:, 0:2]), _half(b[:, 2:4]), out=out)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    # qh: uint8[4] holding a little-endian uint32 whose bit j is element j's fifth bit, i.e. bit
    # j % 8 of byte j // 8: each byte's planes after it.
    return _split(qh, 1, axis=-1).reshape(-1, 32) << 4


def _q5_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q5_0 (22 bytes): d: half, qh: uint8[4], qs: uint8[16].  y = ((nibble | bit << 4) - 16) * d
    q = (_split(b[:, 6:], 4).reshape(-1, 32) | _fifth_bits(b[:, 2:6])).view(torch.int8) - 16
    torch.mul(q.to(F32), _half(b[:, 0:2]), out=out)


def _q5_1(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q5_1 (24 bytes): d: half, m: half, qh: uint8[4], qs: uint8[16].  y = q * d + m
    q = (_split(b[:, 8:], 4).reshape(-1, 32) | _fifth_bits(b[:, 4:8])).to(F32)
    torch.add(q * _half(b[:, 0:2]), _half(b[:, 2:4]), out=out)


def _q2_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q2_K (84 bytes): scales: uint8[16] (low nibble scale, high nibble min, one pair per 16
    # elements), qs: uint8[64], d: half, dmin: half. Each 128-element half reads 32 qs bytes four
    # times, 2 bits at shifts 0, 2, 4, 6.  y = (d * sc) * q - (dmin * m)
    n = b.shape[0]
    sc = b[:, 0:16]
    dl = (_half(b[:, 80:82]) * (sc & 0xF).to(F32)).view(n, 16, 1)
    ml = (_half(b[:, 82:84]) * (sc >> 4).to(F32)).view(n, 16, 1)
    q = _split(b[:, 16:80].reshape(n, 2, 32), 2).reshape(n, 16, 16).to(F32)
    torch.sub(dl * q, ml, out=out.view(n, 16, 16))


def _q3_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q3_K (110 bytes): hmask: uint8[32], qs: uint8[64], scales: uint8[12], d: half.
    # 16 six-bit scales: the low 4 bits of scale s are nibble s // 8 of scales[s % 8], the high 2
    # bits are bits 2 * (s // 4) of scales[8 + s % 4]; the scale is that minus 32.
    # Low 2 bits of the quants as in Q2_K; the third bit of element 32 * p + l (p = 0..7) is bit p
    # of hmask[l], and a *clear* bit subtracts 4.  y = (d * (scale - 32)) * q
    n = b.shape[0]
    s = b[:, 96:108]
    scale = _split(s[:, 0:8], 4).reshape(n, 16) | (_split(s[:, 8:12], 2).reshape(n, 16) << 4)
    dl = (_half(b[:, 108:110]) * (scale.to(F32) - 32)).view(n, 16, 1)
    low = _split(b[:, 32:96].reshape(n, 2, 32), 2).reshape(n, 256)
    high = _split(b[:, 0:32], 1).reshape(n, 256)
    q = (low | (high << 2)).view(torch.int8) - 4  # high bit set: low; clear: low - 4
    torch.mul(dl, q.view(n, 16, 16).to(F32), out=out.view(n, 16, 16))


def _k_scale_min(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K packed scales (uint8[12]) -> eight 6-bit scales and mins (ggml `get_scale_min_k4`):
    sub-block j < 4: scale = s[j] & 63, min = s[j + 4] & 63; j >= 4: scale = low nibble of s[j + 4]
    | (s[j - 4] >> 6) << 4, min = high nibble of s[j + 4] | (s[j] >> 6) << 4."""
    a, m, hi = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scale = torch.cat([a & 63, (hi & 0xF) | ((a >> 6) << 4)], dim=1)
    mins = torch.cat([m & 63, (hi >> 4) | ((m >> 6) << 4)], dim=1)
    return scale.to(F32), mins.to(F32)


def _q4_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q4_K (144 bytes): d: half, dmin: half, scales: uint8[12], qs: uint8[128]. Eight
    # sub-blocks of 32; each 32 qs bytes hold two of them (low nibbles, then high nibbles).
    # y = (d * scale) * q - (dmin * min)
    n = b.shape[0]
    scale, mins = _k_scale_min(b[:, 4:16])
    d = (_half(b[:, 0:2]) * scale).view(n, 8, 1)
    dm = (_half(b[:, 2:4]) * mins).view(n, 8, 1)
    q = _split(b[:, 16:144].reshape(n, 4, 32), 4).reshape(n, 8, 32).to(F32)
    torch.sub(d * q, dm, out=out.view(n, 8, 32))


def _q5_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q5_K (176 bytes): d, dmin: half, scales: uint8[12], qh: uint8[32], qs: uint8[128].
    # As Q4_K, plus a fifth bit: element 32 * j + l has bit j of qh[l].
    n = b.shape[0]
    scale, mins = _k_scale_min(b[:, 4:16])
    d = (_half(b[:, 0:2]) * scale).view(n, 8, 1)
    dm = (_half(b[:, 2:4]) * mins).view(n, 8, 1)
    low = _split(b[:, 48:176].reshape(n, 4, 32), 4).reshape(n, 8, 32)
    high = _split(b[:, 16:48], 1).reshape(n, 8, 32)
    q = (low | (high << 4)).to(F32)
    torch.sub(d * q, dm, out=out.view(n, 8, 32))


def _q6_k(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_q6_K (210 bytes): ql: uint8[128], qh: uint8[64], scales: int8[16], d: half.
    # Per 128-element half h: element 32 * p + l (p = 0..3) takes nibble p // 2 of
    # ql[64 h + 32 (p % 2) + l] and bits 2p of qh[32 h + l] as its top two bits; minus 32.
    # y = (d * scale) * q, one int8 scale per 16 elements.
    n = b.shape[0]
    d = (_half(b[:, 208:210]) * b[:, 192:208].view(torch.int8).to(F32)).view(n, 16, 1)
    low = _split(b[:, 0:128].reshape(n, 2, 64), 4).reshape(n, 256)
    high = _split(b[:, 128:192].reshape(n, 2, 32), 2).reshape(n, 256)
    q = (low | (high << 4)).view(torch.int8) - 32
    torch.mul(d, q.view(n, 16, 16).to(F32), out=out.view(n, 16, 16))


# kvalues_iq4nl (ggml-common.h): the 16 levels a 4-bit IQ4 index stands for, non-uniformly spaced.
_IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _nibble_levels(b: torch.Tensor, out: torch.Tensor, levels: tuple[int, ...]) -> None:
    """Bytes of 4-bit index pairs (..., 16) -> out (..., 2, 16): the `levels` of the low nibbles, then
    of the high ones (Q4_0's order). One lookup per byte in two 256-entry tables (a byte's low and its
    high level), not a split into nibbles and a lookup per nibble: half the gathers, no stacked planes;
    index_select into fresh rows then one interleaving write is twice as fast as indexing straight into
    out's strided halves (IQ4_NL 1.6x faster in all, measured on the CPU)."""

    def build() -> torch.Tensor:
        lv, byte = torch.tensor(levels, dtype=F32), torch.arange(256)
        return torch.stack([lv[byte & 15], lv[byte >> 4]])

    tables = table(levels, b.device, build)
    q = b.reshape(-1).long()
    lo = torch.index_select(tables[0], 0, q).view(b.shape)
    hi = torch.index_select(tables[1], 0, q).view(b.shape)
    torch.stack((lo, hi), dim=-2, out=out)


def _iq4_nl(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq4_nl (18 bytes): d: half, qs: uint8[16] with Q4_0's nibble order.  y = d * level[q]
    o = out.view(-1, 2, 16)
    _nibble_levels(b[:, 2:], o, _IQ4_LEVELS)
    o.mul_(_half(b[:, 0:2]).view(-1, 1, 1))


def _iq4_xs(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_iq4_xs (136 bytes): d: half, scales_h: uint16 (bits 2i..2i+1: sub-block i's high bits),
    # scales_l: uint8[4] (nibble i % 2 of byte i // 2: its low bits), qs: uint8[128] (16 bytes per
    # 32-element sub-block, Q4_0's nibble order).  y = (d * (ls - 32)) * level[q]
    n = b.shape[0]
    low = _split(b[:, 4:8], 4, axis=-1).reshape(n, 8)
    high = _split(b[:, 2:4], 2, axis=-1).reshape(n, 8)
    ls = ((low | (high << 4)).view(torch.int8) - 32).to(F32)
    dl = (_half(b[:, 0:2]) * ls).view(n, 8, 1, 1)
    o = out.view(n, 8, 2, 16)
    _nibble_levels(b[:, 8:].reshape(n, 8, 16), o, _IQ4_LEVELS)
    o.mul_(dl)


def _trits(b: torch.Tensor, powers: tuple[int, ...]) -> torch.Tensor:
    """TQ1_0's base-3 packing: each byte holds len(powers) trits as a fixed-point fraction of 243. The
    k-th is read by multiplying the byte by 3^k modulo 256 (uint8 arithmetic, as ggml does) and taking
    the top of (that * 3): values 0, 1, 2 -> -1, 0, +1. (n, L) -> (n, len(powers), L) int16."""
    w = b.contiguous().to(torch.int16)
    planes = [((w * p) & 0xFF) * 3 >> 8 for p in powers]
    return torch.stack(planes, dim=-2) - 1


def _tq1_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_tq1_0 (54 bytes): qs: uint8[48] (5 trits a byte: bytes 0..31 give elements 0..159 as 5
    # planes of 32, bytes 32..47 elements 160..239 as 5 planes of 16), qh: uint8[4] (4 trits a byte:
    # elements 240..255 as 4 planes of 4), d: half.  y = d * t, t in {-1, 0, 1}
    n = b.shape[0]
    t = torch.cat(
        [
            _trits(b[:, 0:32], (1, 3, 9, 27, 81)).reshape(n, 160),
            _trits(b[:, 32:48], (1, 3, 9, 27, 81)).reshape(n, 80),
            _trits(b[:, 48:52], (1, 3, 9, 27)).reshape(n, 16),
        ],
        dim=1,
    )
    torch.mul(_half(b[:, 52:54]), t.to(F32), out=out)


def _tq2_0(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_tq2_0 (66 bytes): qs: uint8[64] (2 bits an element, four planes of 32 per 32 bytes),
    # d: half.  y = d * (q - 1)
    n = b.shape[0]
    q = _split(b[:, 0:64].reshape(n, 2, 32), 2).reshape(n, 256)
    torch.mul(_half(b[:, 64:66]), (q.to(torch.int16) - 1).to(F32), out=out)


# kvalues_mxfp4 (ggml-common.h): the E2M1 values, doubled (the scale below is halved to match).
_MXFP4_LEVELS = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def _mxfp4(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_mxfp4 (17 bytes): e: E8M0 exponent, qs: uint8[16] (Q4_0's nibble order).  y = d * level[q],
    # d = 2^(e - 128) as ggml_e8m0_to_fp32_half builds it: for e < 2 a subnormal (0x00200000 << e).
    e = b[:, 0:1].to(torch.int32)
    bits = torch.where(
        e < 2, torch.tensor(0x00200000, dtype=torch.int32, device=e.device) << e, (e - 1) << 23
    )
    o = out.view(-1, 2, 16)
    _nibble_levels(b[:, 1:17], o, _MXFP4_LEVELS)
    o.mul_(bits.view(F32).view(-1, 1, 1))


def _ue4m3(x: float) -> float:
    """An unsigned E4M3 byte (bias 7; 0 and 0x7F read as zero) as ggml_ue4m3_to_fp32 reads it, halved to
    match the doubled E2M1 levels: exact in float32 (at most 4 significant bits times a power of two)."""
    exp, man = (x >> 3) & 0xF, x & 7
    if x in (0, 0x7F):
        return 0.0
    return 0.5 * (man * 2.0**-9 if exp == 0 else (1 + man / 8) * 2.0 ** (exp - 7))


_UE4M3 = tuple(_ue4m3(x) for x in range(256))


def _nvfp4(b: torch.Tensor, out: torch.Tensor) -> None:
    # block_nvfp4 (36 bytes, 64 elements): d: uint8[4] unsigned E4M3 scales (one per 16 elements), qs:
    # uint8[32] (per 16 elements, 8 bytes in Q4_0's nibble order).  y = d_s * level[q] (MXFP4's levels)
    n = b.shape[0]
    scales = table("ue4m3", b.device, lambda: torch.tensor(_UE4M3, dtype=F32))
    d = torch.index_select(scales, 0, b[:, 0:4].reshape(-1).long()).view(n, 4, 1, 1)
    o = out.view(n, 4, 2, 8)
    _nibble_levels(b[:, 4:36].reshape(n, 4, 8), o, _MXFP4_LEVELS)
    o.mul_(d)


_DECODERS: dict[str, Callable[[torch.Tensor, torch.Tensor], None]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q2_K": _q2_k,
    "Q3_K": _q3_k,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
    "IQ4_NL": _iq4_nl,
    "IQ4_XS": _iq4_xs,
    "TQ1_0": _tq1_0,
    "TQ2_0": _tq2_0,
    "MXFP4": _mxfp4,
    "NVFP4": _nvfp4,
    **lattice.DECODERS,
}
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dequantize(raw: torch.Tensor, ggml_type: str, shape: tuple[int, ...], dtype=None) -> torch.Tensor:
    """See engine.quant.dequantize (this is its torch side; `ggml_type` is a supported name)."""
    dtype = dtype or F32
    block, size = block_layout(ggml_type)
    numel = math.prod(shape)
    if raw.dtype != torch.uint8:
        raise TypeError(f"quantized blocks are uint8 bytes, not {raw.dtype}")
    if numel % block or raw.numel() != numel // block * size:
        raise FormatError(
            f"{raw.numel():,} bytes of {ggml_type} blocks do not hold a tensor of shape {shape}: corrupt file"
        )
    flat = raw.reshape(-1)
    if ggml_type in _FLOATS:
        # A float -> float conversion is exact where it widens (F16 / BF16 to F32) and rounds once
        # otherwise; reinterpreting the bytes is free (a copy first where they start mid-element).
        src = _FLOATS[ggml_type]
        if flat.storage_offset() % torch.empty((), dtype=src).element_size():
            flat = flat.clone()
        return flat.view(src).view(shape).to(dtype)
    decode = _DECODERS[ggml_type]
    blocks = flat.view(-1, size)
    out = torch.empty(numel // block, block, dtype=dtype, device=raw.device)
    step = max(1, CHUNK_ELEMENTS["cpu" if raw.device.type == "cpu" else "other"] // block)
    for i in range(0, blocks.shape[0], step):  # chunks of thousands of blocks, not one per block
        decode(blocks[i : i + step], out[i : i + step])
    return out.view(shape)
