"""Broken and hostile safetensors headers: every one a FormatError, none a crash or big allocation."""

import json
import struct
import tracemalloc

import pytest
import torch
from safetensors.torch import save_file

from engine.errors import FormatError
from engine.formats import open_index, read_header
from engine.formats.safetensors import MAX_HEADER_BYTES


def _file(tmp_path, header, data_len=None, raw_header: bytes | None = None, pad=True):
    raw = raw_header if raw_header is not None else json.dumps(header).encode()
    if data_len is None:
        data_len = max(
            (e["data_offsets"][1] for k, e in header.items() if k != "__metadata__" and _has_end(e)),
            default=0,
        )
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data_len))
    return p


def _has_end(e):
    try:
        return isinstance(e["data_offsets"][1], int)
    except Exception:
        return False


def _t(dtype="F32", shape=(2,), offsets=(0, 8)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


BAD_HEADERS = {
    "unknown dtype": ({"a": _t(dtype="F17")}, "unknown dtype"),
    "dtype not a string": ({"a": _t(dtype=["F32"])}, "unknown dtype"),
    "negative shape": ({"a": _t(shape=(-2,), offsets=(0, 8))}, "non-negative"),
    "float shape": ({"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}, "non-negative"),
    "bool shape": ({"a": {"dtype": "F32", "shape": [True], "data_offsets": [0, 4]}}, "non-negative"),
    "string shape": ({"a": {"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}}, "non-negative"),
    "too many dims": ({"a": _t(shape=(1,) * 17, offsets=(0, 4))}, "non-negative"),
    "size mismatch": ({"a": _t(shape=(3,), offsets=(0, 8))}, "needs 12 bytes"),
    "reversed offsets": ({"a": _t(offsets=(8, 0))}, "begin <= end"),
    "negative offset": ({"a": _t(offsets=(-8, 0))}, "begin <= end"),
    "float offsets": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0.0, 8.0]}}, "begin <= end"),
    "three offsets": ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8, 9]}}, "begin <= end"),
    "overlap": ({"a": _t(offsets=(0, 8)), "b": _t(offsets=(4, 12))}, "overlaps"),
    "gap": ({"a": _t(offsets=(0, 8)), "b": _t(offsets=(12, 20))}, "gap"),
    "gap at start": ({"a": _t(offsets=(4, 12))}, "gap"),
    "entry not an object": ({"a": [1, 2]}, "not a JSON object"),
    "metadata not an object": ({"__metadata__": ["x"], "a": _t()}, "__metadata__"),
    "2^60 elements": ({"a": _t(dtype="U8", shape=(2**30, 2**30), offsets=(0, 2**60))}, "truncated"),
    "out of range": ({"a": _t(offsets=(0, 8))}, "truncated"),
}


@pytest.mark.parametrize("name", list(BAD_HEADERS))
def test_bad_header(tmp_path, name):
    header, match = BAD_HEADERS[name]
    data_len = 4 if name in ("out of range", "2^60 elements") else None
    p = _file(tmp_path, header, data_len=data_len)
    tracemalloc.start()
    try:
        with pytest.raises(FormatError, match=match):
            open_index(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024 * 1024  # nothing allocated in proportion to a claimed size


@pytest.mark.parametrize(
    "raw, match",
    [
        (b'{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}', "not valid JSON"),
        (b"\xff\xfe{}", "UTF-8"),
        (b"[]", "JSON object"),
        (b'"x"', "JSON object"),
        (b"", "JSON object"),
        (b'{"a": 1, "a": 2}', "twice"),
        (b'{"__metadata__": {"k": "1", "k": "2"}}', "twice"),
        (b"{" + b'"x": [' * 100_000 + b"]" * 100_000 + b"}", "JSON"),  # nesting bomb
        (b'{"a": {"dtype": "F32", "shape": [1' + b"0" * 5000 + b'], "data_offsets": [0, 4]}}', "JSON"),
        (b'{"a": NaN}', "not a JSON object"),
    ],
)
def test_bad_json(tmp_path, raw, match):
    p = _file(tmp_path, {}, data_len=0, raw_header=raw)
    with pytest.raises(FormatError, match=match):
        open_index(p)


def test_header_length_huge_or_past_eof(tmp_path):
    p = tmp_path / "x.safetensors"
    for n in (2**63, MAX_HEADER_BYTES + 1):
        p.write_bytes(struct.pack("<Q", n) + b"{}")
        with pytest.raises(FormatError, match="claims"):
            read_header(p)
    p.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(FormatError, match="truncated"):
        read_header(p)


def test_trailing_bytes_are_refused_like_the_reference(tmp_path):
    p = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(4)}, str(p))
    with open(p, "ab") as f:
        f.write(b"junk")
    with pytest.raises(FormatError, match="follow the last tensor"):
        read_header(p)


def test_truncated_at_every_region(tmp_path):
    p = tmp_path / "t.safetensors"
    save_file({"a": torch.zeros(4), "b": torch.ones(3, dtype=torch.float16)}, str(p), metadata={"k": "v"})
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    q = tmp_path / "cut.safetensors"
    # inside the length prefix, inside the header, at its end, inside the data, one byte short
    for cut in [0, 1, 4, 7, 8, 9, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 3, len(raw) - 1]:
        q.write_bytes(raw[:cut])
        with pytest.raises(FormatError):
            open_index(q)


@pytest.mark.parametrize(
    ("value", "kind"), [(3, "a number"), ([1], "a list"), ({"a": "b"}, "a JSON object"), (None, "null")]
)
def test_non_string_metadata_is_refused_like_the_reference(tmp_path, value, kind):
    from safetensors import SafetensorError, safe_open

    p = _file(tmp_path, {"__metadata__": {"s": "x", "n": value}, "a": _t()})
    with pytest.raises(SafetensorError):  # the reference library refuses it too
        safe_open(str(p), "pt")
    with pytest.raises(FormatError, match=f"'n' is {kind}, not a string.*reference safetensors library"):
        read_header(p)
    with pytest.raises(FormatError, match="not a string"):
        open_index(p)
