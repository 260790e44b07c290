"""Mutated files for every reader: a result consistent with the file's size, or a FormatError. Nothing else."""

import io
import json
import math
import struct
import zipfile

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.errors import FormatError, UnsupportedModel
from engine.formats import IndexedTensor, ModelIndex, open_index
from engine.formats.dtypes import DTYPES
from engine.formats.gguf import write_sparse_gguf
from engine.formats.latent import read_latent, write_latent
from engine.formats.pickles import load_pickle

SETTINGS = settings(
    deadline=None,
    max_examples=120,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _weights():
    g = torch.Generator().manual_seed(0)
    return {
        "model.w": torch.randn(4, 3, generator=g).half(),
        "model.b": torch.randn(4, generator=g),
        "step": torch.tensor([3]),
    }


def _safetensors_bytes():
    buf = io.BytesIO()
    from safetensors.torch import save

    buf.write(save(_weights(), metadata={"ss_network_dim": "8"}))
    return buf.getvalue()


def _torch_bytes(zip_format=True):
    buf = io.BytesIO()
    torch.save({"state_dict": _weights(), "global_step": 5}, buf, _use_new_zipfile_serialization=zip_format)
    return buf.getvalue()


def _gguf_bytes(tmp_dir):
    p = tmp_dir / "seed.gguf"
    write_sparse_gguf(
        p,
        {"general.architecture": "sd1", "general.name": "x", "v": [1, 2, 3], "f": 0.5},
        [("a.weight", "Q8_0", (2, 64)), ("a.bias", "F32", (2,)), ("e", "F16", (3, 4))],
    )
    return p.read_bytes()


def _latent_bytes(tmp_dir):
    p = tmp_dir / "seed.latent"
    write_latent(p, torch.ones(1, 4, 2, 3))
    return p.read_bytes()


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    d = tmp_path_factory.mktemp("seeds")
    return {
        "safetensors": _safetensors_bytes(),
        "torch-zip": _torch_bytes(True),
        "pickle": _torch_bytes(False),
        "gguf": _gguf_bytes(d),
        "latent": _latent_bytes(d),
    }


SUFFIX = {
    "safetensors": ".safetensors",
    "torch-zip": ".ckpt",
    "pickle": ".pt",
    "gguf": ".gguf",
    "latent": ".latent",
}


@st.composite
def mutations(draw, size: int):
    """A few byte flips, an optional cut, an optional inserted run."""
    ops = []
    for _ in range(draw(st.integers(0, 4))):
        ops.append(("flip", draw(st.integers(0, size - 1)), draw(st.integers(0, 255))))
    if draw(st.booleans()):
        ops.append(("cut", draw(st.integers(0, size)), 0))
    if draw(st.integers(0, 4)) == 0:
        ops.append(("insert", draw(st.integers(0, size)), draw(st.binary(min_size=1, max_size=16))))
    return ops


def _apply(raw: bytes, ops) -> bytes:
    b = bytearray(raw)
    for op, i, v in ops:
        if op == "flip" and i < len(b):
            b[i] = v
        elif op == "cut":
            del b[i:]
        elif op == "insert":
            b[i:i] = v
    return bytes(b)


def check_index(idx: ModelIndex, size: int):
    """What any index must satisfy: it describes bytes the file really has."""
    assert idx.file_size == size
    assert 0 <= idx.data_size <= size
    for t in idx.tensors.values():
        assert t.nbytes >= 0 and all(isinstance(s, int) and s >= 0 for s in t.shape)
        if t.offset is not None:
            assert t.offset >= 0 and t.offset + t.nbytes <= size
        if t.dtype in DTYPES and DTYPES[t.dtype][0] % 8 == 0:
            assert t.nbytes == math.prod(t.shape) * DTYPES[t.dtype][0] // 8
    if idx.format == "safetensors":
        assert sum(t.nbytes for t in idx.tensors.values()) == idx.data_size


def _index_or_error(path, size):
    try:
        idx = open_index(path)
    except (FormatError, UnsupportedModel) as e:
        assert e.message  # a message for the user
        return None
    check_index(idx, size)
    return idx


@pytest.mark.parametrize("kind", list(SUFFIX))
def test_seeds_are_valid(seeds, tmp_path, kind):
    p = tmp_path / f"x{SUFFIX[kind]}"
    p.write_bytes(seeds[kind])
    assert _index_or_error(p, p.stat().st_size) is not None


@pytest.mark.parametrize("kind", list(SUFFIX))
@SETTINGS
@given(data=st.data())
def test_mutated_files_index_or_fail_cleanly(seeds, tmp_path, kind, data):
    raw = _apply(seeds[kind], data.draw(mutations(len(seeds[kind]))))
    p = tmp_path / f"m{SUFFIX[kind]}"
    p.write_bytes(raw)
    _index_or_error(p, len(raw))


@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_latents_read_or_fail_cleanly(seeds, tmp_path, data):
    raw = _apply(seeds["latent"], data.draw(mutations(len(seeds["latent"]))))
    p = tmp_path / "m.latent"
    p.write_bytes(raw)
    try:
        t = read_latent(p)
    except FormatError:
        return
    assert t.dim() in (4, 5) and t.dtype == torch.float32


@pytest.mark.parametrize("kind", ["torch-zip", "pickle"])
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")  # torch, on mutated protocols
@settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_checkpoints_load_or_fail_cleanly(seeds, tmp_path, kind, data):
    raw = _apply(seeds[kind], data.draw(mutations(len(seeds[kind]))))
    p = tmp_path / f"m{SUFFIX[kind]}"
    p.write_bytes(raw)
    try:
        obj = load_pickle(p)
    except (FormatError, UnsupportedModel):
        return
    assert isinstance(obj, dict)


_ST_SEED = _safetensors_bytes()
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=4),
    max_leaves=12,
)


@SETTINGS
@given(
    tensor=st.sampled_from(["model.w", "model.b", "step", "__metadata__"]),
    field=st.sampled_from(["dtype", "shape", "data_offsets", "extra", None]),
    value=JSON,
    keep_size=st.booleans(),
)
def test_json_field_edits(tmp_path, tensor, field, value, keep_size):
    p = tmp_path / "j.safetensors"
    raw = _ST_SEED
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    if field is None:
        header[tensor] = value
    elif isinstance(header[tensor], dict):
        header[tensor][field] = value
    new = json.dumps(header, allow_nan=True).encode()
    data = raw[8 + n :]
    out = struct.pack("<Q", len(new)) + new + (data if keep_size else data[: len(data) // 2])
    p.write_bytes(out)
    _index_or_error(p, len(out))


def test_zip_members_shuffled_or_renamed(tmp_path):
    """Structural zip edits: a renamed data.pkl or storage is a clean error."""
    src = io.BytesIO(_torch_bytes(True))
    with zipfile.ZipFile(src) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    for rename in [lambda n: n.replace("data.pkl", "data.pk"), lambda n: n.replace("/data/0", "/data/9")]:
        p = tmp_path / "r.ckpt"
        with zipfile.ZipFile(p, "w") as zf:
            for name, b in members.items():
                zf.writestr(rename(name), b)
        with pytest.raises(FormatError):
            open_index(p)


def _header_cases():
    """Headers that are valid, and the edge cases the fast path must send to the exact reader."""
    t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    u = {"dtype": "F16", "shape": [2, 1], "data_offsets": [8, 12]}
    z = {"dtype": "F16", "shape": [0], "data_offsets": [12, 12]}
    ts = json.dumps(t)
    return [
        json.dumps({"a": t, "b": u}),
        json.dumps({"__metadata__": {"k": "v"}, "a": t, "b": u, "z": z}),
        json.dumps({"a": t, "b": {**u, "data_offsets": [4, 8]}}),  # overlap
        json.dumps({"a": t, "b": {**u, "data_offsets": [10, 14]}}),  # gap
        json.dumps({"a": t, "z": {**z, "data_offsets": [5, 5]}}),  # zero-size inside a tensor
        '{"a": ' + ts + ', "a": ' + ts + "}",  # the same tensor twice
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "data_offsets": [0, 8]}}',
        '{"__metadata__": {"k": "1", "k": "2"}, "a": ' + ts + "}",
        '{"__metadata__": {"k": 1}, "a": ' + ts + "}",
        '{"__metadata__": null, "a": ' + ts + "}",
        '{"a": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}',
        '{"a": {"dtype": "F32", "shape": [true, 2], "data_offsets": [0, 8]}}',
        '{"a": {"dtype": "F32", "shape": [2]}}',
        '{"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}',
        '{"a": {"dtype": "X9", "shape": [2], "data_offsets": [0, 8]}}',
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}',
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "k": "data_offsets"}}',
        json.dumps({"b": u, "z": z, "a": t}),  # the header's order is not the data's (the sorted test)
        json.dumps({"z": {**z, "data_offsets": [0, 0]}, "a": t, "b": u}),  # zero bytes at the start
        json.dumps({"a": t, "b": u, "f": {"dtype": "F4", "shape": [8], "data_offsets": [12, 16]}}),  # 4 bits
        json.dumps({"a": t, "b": u, "f": {"dtype": "F4", "shape": [7], "data_offsets": [12, 16]}}),
        json.dumps({"a": t, "b": {**u, "shape": [2, 2]}}),  # a shape that needs more than its span
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "name": "b", "nbytes": 1, "offset": 3}}',
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8], "nbytes": "x"}}',
        '{"a": {"shape": [2], "data_offsets": [0, 8]}}',
        '{"a": {"dtype": "F32", "shape": null, "data_offsets": [0, 8]}}',
        '{"a": {"dtype": "F32", "shape": [2], "data_offsets": 8}}',
    ]


@pytest.mark.parametrize("data_len", [8, 12, 16])
@pytest.mark.parametrize("text", _header_cases())
def test_fast_header_path_agrees_with_the_exact_reader(text, data_len):
    """engine.formats.safetensors reads a header through msgspec first, and only a header it cannot
    vouch for through the stdlib reader that names the fault: both must accept exactly the same
    headers, with the same tensors and metadata."""
    from engine.formats import safetensors as sf

    raw = text.encode()
    _fast_agrees(sf, raw, 8 + len(raw) + data_len)


def _fast_agrees(sf, raw: bytes, size: int):
    try:
        exact = sf._parse_header(raw, "", size)
    except FormatError:
        exact = None
    fast = sf._parse_fast(raw, size, index=False)
    if fast is not None:  # the fast path vouches only for what the exact reader accepts, identically
        assert exact is not None, raw
        assert fast[0] == exact.tensors and fast[1] == exact.metadata and fast[2] == exact.data_size
    # and so does its index form (the entries decoded straight into IndexedTensor), on the same headers
    indexed = sf._parse_fast(raw, size, index=True)
    assert (indexed is None) == (fast is None), raw
    if indexed is not None:
        start = exact.data_start
        want = {
            n: IndexedTensor(n, t.dtype, t.shape, t.nbytes, start + t.begin) for n, t in exact.tensors.items()
        }
        assert indexed[0] == want and list(indexed[0]) == list(want), raw
        assert indexed[1] == exact.metadata and indexed[2] == exact.data_size
    # and the public reader gives the exact reader's answer either way
    try:
        public = sf.parse_header(raw, file_size=size)
    except FormatError:
        public = None
    assert (public is None) == (exact is None)
    if public is not None:
        assert public.tensors == exact.tensors and public.metadata == exact.metadata


@SETTINGS
@given(data=st.data())
def test_fast_header_path_agrees_on_mutated_headers(seeds, data):
    from engine.formats import safetensors as sf

    raw = seeds["safetensors"]
    (n,) = struct.unpack("<Q", raw[:8])
    head = _apply(raw[8 : 8 + n], data.draw(mutations(n)))
    _fast_agrees(sf, head, 8 + len(head) + len(raw) - 8 - n)


def test_well_formed_headers_take_the_fast_path():
    from engine.formats import safetensors as sf

    for text in _header_cases()[:2]:
        raw = text.encode()
        fast = sf._parse_fast(raw, 8 + len(raw) + 12, index=False)
        assert fast is not None and sorted(fast[0]) == sorted(
            k for k in json.loads(text) if k != "__metadata__"
        )
    raw = _safetensors_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert sf._parse_fast(raw[8 : 8 + n], len(raw), index=False) is not None
