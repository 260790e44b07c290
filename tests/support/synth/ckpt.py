"""Header-faithful sparse pickled checkpoints (.ckpt / .pt / .pth): a real torch zip whose data.pkl holds
the whole state dict, and whose tensor records are holes, so a 2 GB SD1 .ckpt costs a few hundred KB.

Format (torch/serialization.py _save with the zip container; read back by torch.load and by any
header-only reader): a stored (uncompressed) zip with one top folder holding data.pkl (pickle protocol 2;
each tensor is torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad, hooks) and
each storage a persistent id ('storage', torch.<Type>Storage, key, 'cpu', numel)), byteorder, version,
and one data/<key> record of raw bytes per storage, 64-byte aligned (torch pads with an extra field).
Record CRCs are those of the zero bytes the holes read as, computed arithmetically (no 4 GB pass).
The pickle opcodes are written directly, so no torch import is needed and nothing is ever executed.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from collections.abc import Mapping
from pathlib import Path

from ._build import Entry

_POLY = 0xEDB88320


def _gf2_times(mat: list[int], vec: int) -> int:
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec >>= 1
        i += 1
    return out


def _gf2_square(mat: list[int]) -> list[int]:
    return [_gf2_times(mat, mat[n]) for n in range(32)]


def _zero_byte_powers() -> list[list[int]]:
    mat = [_POLY] + [1 << i for i in range(31)]  # the register update for one zero bit
    for _ in range(3):  # 2, 4, 8 bits: one zero byte
        mat = _gf2_square(mat)
    powers = [mat]  # powers[k]: the update for 2**k zero bytes
    for _ in range(63):
        powers.append(_gf2_square(powers[-1]))
    return powers


_POWERS: list[list[int]] = []


def crc32_zeros(n: int, crc: int = 0) -> int:
    """zlib.crc32(bytes(n), crc) without touching n bytes: the CRC register update for a zero byte is
    linear over GF(2), so n bytes are a product of cached matrix powers (the idea behind zlib's
    crc32_combine)."""
    if not _POWERS:
        _POWERS.extend(_zero_byte_powers())
    reg = crc ^ 0xFFFFFFFF
    k = 0
    while n:
        if n & 1:
            reg = _gf2_times(_POWERS[k], reg)
        n >>= 1
        k += 1
    return reg ^ 0xFFFFFFFF


# safetensors dtype -> (torch legacy storage class, bytes per element)
STORAGE = {
    "F16": ("HalfStorage", 2),
    "BF16": ("BFloat16Storage", 2),
    "F32": ("FloatStorage", 4),
    "F64": ("DoubleStorage", 8),
    "I64": ("LongStorage", 8),
    "I32": ("IntStorage", 4),
    "I16": ("ShortStorage", 2),
    "I8": ("CharStorage", 1),
    "U8": ("ByteStorage", 1),
    "BOOL": ("BoolStorage", 1),
}


class _Pickle:
    """Just the protocol-2 opcodes torch.save's pickler emits for a dict of tensors."""

    def __init__(self) -> None:
        self.out = bytearray(b"\x80\x02")

    def op(self, code: bytes) -> None:
        self.out += code

    def str(self, s: str) -> None:
        b = s.encode()
        self.out += b"X" + struct.pack("<I", len(b)) + b

    def int(self, v: int) -> None:
        if 0 <= v < 256:
            self.out += b"K" + bytes([v])
        elif 0 <= v < 65536:
            self.out += b"M" + struct.pack("<H", v)
        elif -(2**31) <= v < 2**31:
            self.out += b"J" + struct.pack("<i", v)
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            self.out += b"\x8a" + bytes([len(raw)]) + raw

    def glob(self, module: str, name: str) -> None:
        self.out += b"c" + f"{module}\n{name}\n".encode()

    def tuple_(self, items) -> None:
        self.op(b"(")
        for it in items:
            self.int(it)
        self.op(b"t")

    def ordered_dict(self) -> None:
        self.glob("collections", "OrderedDict")
        self.op(b")R")  # EMPTY_TUPLE, REDUCE

    def tensor(self, key: str, dtype: str, shape: tuple[int, ...]) -> None:
        stride = tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))
        self.glob("torch._utils", "_rebuild_tensor_v2")
        self.op(b"(")  # args
        self.op(b"(")  # persistent id tuple
        self.str("storage")
        self.glob("torch", STORAGE[dtype][0])
        self.str(key)
        self.str("cpu")
        self.int(math.prod(shape))
        self.op(b"tQ")  # TUPLE, BINPERSID
        self.int(0)
        self.tuple_(shape)
        self.tuple_(stride)
        self.op(b"\x89")  # NEWFALSE: requires_grad
        self.ordered_dict()  # backward hooks
        self.op(b"tR")


def _data_pkl(rows: list[Entry], wrap: str | None, extra: Mapping[str, int | str]) -> bytes:
    p = _Pickle()
    if wrap:
        p.op(b"}(")  # EMPTY_DICT, MARK
        for k, v in extra.items():
            p.str(k)
            p.str(v) if isinstance(v, str) else p.int(v)
        p.str(wrap)
    p.ordered_dict()
    p.op(b"(")
    for i, (key, dtype, shape) in enumerate(rows):
        p.str(key)
        p.tensor(str(i), dtype, tuple(shape))
    p.op(b"u")  # SETITEMS
    if wrap:
        p.op(b"u")
    p.op(b".")
    return bytes(p.out)


class _ZipWriter:
    """A stored zip with zip64 where needed and 64-byte aligned record data; data may be a hole."""

    def __init__(self, f):
        self.f, self.entries = f, []

    def add(self, name: str, data: bytes | None = None, size: int = 0) -> None:
        raw = name.encode()
        if data is not None:
            size, crc = len(data), zlib.crc32(data)
        else:
            crc = crc32_zeros(size)
        offset = self.f.tell()
        big = size >= 0xFFFFFFFF
        z64 = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
        pad = -(offset + 30 + len(raw) + len(z64) + 4) % 64
        extra = z64 + struct.pack("<HH", 0x4246, pad) + b"Z" * pad  # torch's "FB" padding field
        sz32 = 0xFFFFFFFF if big else size
        self.f.write(
            struct.pack(
                "<IHHHHHIIIHH",
                0x04034B50,
                45 if big else 20,
                0,
                0,
                0,
                0x21,
                crc,
                sz32,
                sz32,
                len(raw),
                len(extra),
            )
            + raw
            + extra
        )
        if data is not None:
            self.f.write(data)
        else:
            self.f.seek(size, os.SEEK_CUR)  # the hole
        self.entries.append((raw, crc, size, offset))

    def close(self) -> None:
        cd_start = self.f.tell()
        for raw, crc, size, offset in self.entries:
            vals = [v for v in (size, size) if v >= 0xFFFFFFFF] + ([offset] if offset >= 0xFFFFFFFF else [])
            z64 = struct.pack(f"<HH{len(vals)}Q", 1, 8 * len(vals), *vals) if vals else b""
            sz32 = 0xFFFFFFFF if size >= 0xFFFFFFFF else size
            off32 = 0xFFFFFFFF if offset >= 0xFFFFFFFF else offset
            self.f.write(
                struct.pack(
                    "<IHHHHHHIIIHHHHHII",
                    0x02014B50,
                    45,
                    45 if vals else 20,
                    0,
                    0,
                    0,
                    0x21,
                    crc,
                    sz32,
                    sz32,
                    len(raw),
                    len(z64),
                    0,
                    0,
                    0,
                    0,
                    off32,
                )
                + raw
                + z64
            )
        cd_end = self.f.tell()
        n, cd_size = len(self.entries), cd_end - cd_start
        if cd_start >= 0xFFFFFFFF or n >= 0xFFFF:
            self.f.write(struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, cd_size, cd_start))
            self.f.write(struct.pack("<IIQI", 0x07064B50, 0, cd_end, 1))
        self.f.write(
            struct.pack(
                "<IHHHHIIH",
                0x06054B50,
                0,
                0,
                min(n, 0xFFFF),
                min(n, 0xFFFF),
                min(cd_size, 0xFFFFFFFF),
                min(cd_start, 0xFFFFFFFF),
                0,
            )
        )
        self.f.truncate()


def write_ckpt(
    rows: list[Entry],
    path: str | os.PathLike,
    *,
    wrap: str | None = "state_dict",
    extra: Mapping[str, int | str] | None = None,
) -> Path:
    """Write rows as a sparse torch-zip checkpoint. wrap="state_dict" nests the tensors as LDM/A1111
    .ckpt files do ({"global_step": …, "state_dict": {…}}); wrap=None writes a bare state dict (.pth)."""
    from engine.formats.atomic import atomic_output

    bad = sorted({d for _, d, _ in rows} - set(STORAGE))
    if bad:
        raise ValueError(f"dtypes {bad} have no torch storage type for a pickled checkpoint")
    target = Path(path)
    folder = target.stem or "archive"
    pkl = _data_pkl(rows, wrap, {"global_step": 0} if extra is None else dict(extra))
    with atomic_output(target) as f:
        z = _ZipWriter(f)
        z.add(f"{folder}/data.pkl", pkl)
        z.add(f"{folder}/byteorder", b"little")
        for i, (_, dtype, shape) in enumerate(rows):
            z.add(f"{folder}/data/{i}", size=math.prod(shape) * STORAGE[dtype][1])
        z.add(f"{folder}/version", b"3\n")
        z.close()
    return target
