"""GGUF headers: read what llama.cpp's gguf-py writes, refuse every broken or hostile header."""

import struct

import pytest

from engine.errors import FormatError, UnsupportedModel
from engine.formats import open_index
from engine.formats.gguf import MAX_STRING_BYTES, read_gguf, write_sparse_gguf

FLUX_LIKE = [
    ("double_blocks.0.img_attn.qkv.weight", "Q4_K", (9216, 3072)),
    ("double_blocks.0.img_attn.qkv.bias", "F32", (9216,)),
    ("img_in.weight", "Q8_0", (3072, 64)),
    ("final_layer.adaLN_modulation.1.weight", "BF16", (6144, 3072)),
    ("time_in.in_layer.weight", "F16", (3072, 256)),
]
META = {"general.architecture": "flux", "general.quantization_version": 2, "general.file_type": 15}


def _s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def _header(n_tensors, n_kv, version=3):
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv)


def test_sparse_flux_gguf_index(tmp_path):
    p = tmp_path / "flux1-dev-Q4_K.gguf"
    write_sparse_gguf(p, {**META, "tokens": ["a", "b"] * 100, "small": [1, 2, 3]}, FLUX_LIKE)
    idx = open_index(p)
    assert idx.format == "gguf" and idx.metadata["general.architecture"] == "flux"
    assert idx.metadata["tokens"] == "[array of 200 STRING]" and idx.metadata["small"] == "[1, 2, 3]"
    t = idx.tensors["double_blocks.0.img_attn.qkv.weight"]
    assert t.dtype == "Q4_K" and t.shape == (9216, 3072) and t.nbytes == 9216 * 3072 // 256 * 144
    assert idx.tensors["final_layer.adaLN_modulation.1.weight"].nbytes == 6144 * 3072 * 2
    assert idx.data_size == sum(x.nbytes for x in idx.tensors.values()) <= idx.file_size
    h = read_gguf(p)
    assert h.version == 3 and h.alignment == 32 and h.data_start % 32 == 0
    assert all(t.offset % 32 == 0 for t in h.tensors.values())


def test_reference_reader_agrees(tmp_path):
    gguf = pytest.importorskip("gguf")  # llama.cpp's gguf-py: a test-only reference
    p = tmp_path / "m.gguf"
    write_sparse_gguf(p, META, FLUX_LIKE, alignment=64)
    ref = gguf.GGUFReader(str(p))
    ours = read_gguf(p)
    assert ours.alignment == 64
    for t in ref.tensors:
        o = ours.tensors[t.name]
        assert o.ggml_type == t.tensor_type.name and list(o.dims) == [int(d) for d in t.shape]
        assert o.nbytes == t.n_bytes and o.offset == t.data_offset


def test_reads_what_the_reference_writer_wrote(tmp_path):
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    p = tmp_path / "w.gguf"
    w = gguf.GGUFWriter(str(p), "sdxl")
    w.add_string("general.name", "test")
    w.add_array("floats", [1.0, 2.0])
    w.add_bool("flag", True)
    w.add_tensor("a", np.zeros((4, 32), dtype=np.float16))
    w.add_tensor("b", np.ones((5,), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    idx = open_index(p)
    assert idx.metadata["general.architecture"] == "sdxl" and idx.metadata["flag"] == "true"
    assert idx.tensors["a"].shape == (4, 32) and idx.tensors["a"].dtype == "F16"
    raw = p.read_bytes()
    b = idx.tensors["b"]
    assert raw[b.offset : b.offset + b.nbytes] == np.ones(5, dtype=np.float32).tobytes()


def test_truncated_at_every_byte_of_the_header(tmp_path):
    p = tmp_path / "t.gguf"
    write_sparse_gguf(p, {**META, "arr": [1, 2, 3], "name": "x"}, FLUX_LIKE[:3])
    raw = p.read_bytes()
    head_len = read_gguf(p).data_start
    q = tmp_path / "cut.gguf"
    for cut in list(range(0, head_len)) + [head_len + 10, len(raw) - 1]:
        q.write_bytes(raw[:cut])
        with pytest.raises(FormatError):
            open_index(q)


@pytest.mark.parametrize(
    "body, match",
    [
        (_header(2**40, 0), "more than the file can hold"),
        (_header(0, 2**40), "more than the file can hold"),
        (_header(0, 1) + _s(b"k") + struct.pack("<I", 8) + struct.pack("<Q", 2**62), "claims"),
        (_header(0, 1) + struct.pack("<Q", 2**62) + b"k" * 20, "claims"),
        (_header(0, 1) + _s(b"\xff\xfe") + struct.pack("<IB", 0, 1) + bytes(30), "UTF-8"),
        (_header(0, 1) + _s(b"k") + struct.pack("<IB", 7, 2) + bytes(30), "boolean"),
        (_header(0, 1) + _s(b"k") + struct.pack("<I", 99) + bytes(30), "unknown value type"),
        (_header(0, 1) + _s(b"k") + struct.pack("<IIQ", 9, 4, 2**40) + bytes(30), "claims"),
        (_header(0, 1) + _s(b"k") + struct.pack("<IIQ", 9, 8, 10**6) + bytes(300), "too short"),
        (_header(0, 1) + _s(b"k") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 6 + bytes(40), "nests"),
        (_header(0, 2) + (_s(b"k") + struct.pack("<IB", 0, 1)) * 2 + bytes(30), "twice"),
        (_header(0, 1) + _s(b"general.alignment") + struct.pack("<II", 4, 3) + bytes(30), "power of two"),
        (_header(0, 1) + _s(b"general.alignment") + struct.pack("<II", 4, 0) + bytes(30), "positive"),
        (_header(1, 0) + _s(b"t") + struct.pack("<I", 99) + bytes(60), "dimensions"),
        (b"GGUF" + struct.pack("<I", 7) + bytes(40), "version 7"),
        (b"GGUX" + bytes(40), "not a model file"),
    ],
)
def test_hostile_headers(tmp_path, body, match):
    p = tmp_path / "h.gguf"
    p.write_bytes(body)
    with pytest.raises(FormatError, match=match):
        open_index(p)


def _one_tensor(dims, tid, offset, extra=b""):
    info = _s(b"t") + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
    body = _header(1, 0) + info + struct.pack("<IQ", tid, offset)
    return body + bytes(-len(body) % 32) + extra


@pytest.mark.parametrize(
    "body, match",
    [
        (_one_tensor((2**31, 2**31, 2**31), 0, 0), "elements"),
        (_one_tensor((2**20, 2**20), 0, 0), "truncated"),  # 2^40 floats claimed, none present
        (_one_tensor((10,), 2, 0, bytes(64)), "multiple of its block"),
        (_one_tensor((4,), 0, 3, bytes(64)), "not aligned"),
    ],
)
def test_hostile_tensor_infos(tmp_path, body, match):
    p = tmp_path / "t.gguf"
    p.write_bytes(body)
    with pytest.raises(FormatError, match=match):
        read_gguf(p)


def test_overlapping_and_duplicate_tensors(tmp_path):
    p = tmp_path / "o.gguf"
    infos = b""
    for name in (b"a", b"b"):
        infos += _s(name) + struct.pack("<IQ", 1, 16) + struct.pack("<IQ", 0, 0)  # both at offset 0
    body = _header(2, 0) + infos
    p.write_bytes(body + bytes(-len(body) % 32) + bytes(64))
    with pytest.raises(FormatError, match="overlaps"):
        read_gguf(p)
    p.write_bytes(body.replace(_s(b"b"), _s(b"a")) + bytes(96))
    with pytest.raises(FormatError, match="twice"):
        read_gguf(p)


def test_real_but_unsupported_variants_are_not_called_corrupt(tmp_path):
    p = tmp_path / "u.gguf"
    p.write_bytes(_one_tensor((32,), 77, 0, bytes(256)))
    with pytest.raises(UnsupportedModel, match="ggml type 77"):
        open_index(p)
    p.write_bytes(b"GGUF" + struct.pack("<I", 1) + bytes(40))
    with pytest.raises(UnsupportedModel, match="version 1"):
        open_index(p)
    p.write_bytes(b"GGUF" + struct.pack(">IQQ", 3, 0, 0))
    with pytest.raises(UnsupportedModel, match="big-endian"):
        open_index(p)


def test_string_cap_is_enforced_before_reading(tmp_path):
    p = tmp_path / "s.gguf"
    p.write_bytes(_header(0, 1) + _s(b"k") + struct.pack("<IQ", 8, MAX_STRING_BYTES + 1) + bytes(64))
    with pytest.raises(FormatError, match="limit"):
        open_index(p)


def test_any_file_the_reference_writer_writes_reads_as_the_reference_reader_reads_it(tmp_path):
    """Valid GGUFs of every shape gguf-py writes them -- names in any script, metadata of every value
    type (strings, ints, floats, bools, arrays), any alignment, float / integer / block-quantized
    tensors of 1 to 4 dims -- give the same tensors (type, dims, offset, bytes) and the same metadata
    through our reader as through gguf-py's GGUFReader."""
    gguf = pytest.importorskip("gguf")
    np = pytest.importorskip("numpy")
    import torch
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from engine.formats.gguf import GGUFFile

    T = gguf.GGMLQuantizationType
    types = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.I8, T.I16, T.I32]
    text = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=10)
    value = st.one_of(text, st.integers(-(2**31), 2**31 - 1), st.floats(allow_nan=False, width=32),
                      st.booleans(), st.lists(st.integers(0, 1000), min_size=1, max_size=4),
                      st.lists(text, min_size=1, max_size=3))  # fmt: skip
    tensor = st.tuples(st.sampled_from(types), st.lists(st.integers(1, 3), min_size=0, max_size=3))
    files = st.tuples(
        st.dictionaries(text.map(lambda k: "t." + k), tensor, min_size=1, max_size=4),
        st.dictionaries(text.map(lambda k: "kv." + k), value, max_size=4),
        st.sampled_from([None, 8, 16, 64, 256]),
    )

    @settings(max_examples=40, deadline=None)
    @given(files)
    def check(spec):
        tensors, kvs, alignment = spec
        p = tmp_path / "any.gguf"
        w = gguf.GGUFWriter(str(p), "loadout-test")
        if alignment:
            w.add_custom_alignment(alignment)
        for k, v in kvs.items():
            if isinstance(v, str):
                w.add_string(k, v)
            elif isinstance(v, bool):
                w.add_bool(k, v)
            elif isinstance(v, int):
                w.add_int32(k, v)
            elif isinstance(v, float):
                w.add_float32(k, v)
            else:
                w.add_array(k, v)
        rng = np.random.default_rng(len(tensors))
        for name, (qt, dims) in tensors.items():
            block, size = gguf.GGML_QUANT_SIZES[qt]
            shape = (*dims, block * 2)  # rows of whole blocks
            if qt in (T.I8, T.I16, T.I32):
                w.add_tensor(name, rng.integers(-100, 100, shape).astype({T.I8: np.int8, T.I16: np.int16,
                                                                         T.I32: np.int32}[qt]))  # fmt: skip
            elif qt in (T.F32, T.F16):
                w.add_tensor(
                    name, rng.standard_normal(shape).astype(np.float32 if qt == T.F32 else np.float16)
                )
            else:  # random bytes in the type's layout: the reader never interprets them
                nbytes = int(np.prod(shape)) // block * size
                raw = rng.integers(0, 256, nbytes, dtype=np.uint8).reshape(*shape[:-1], -1)
                w.add_tensor(name, raw, raw_dtype=qt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        ref, ours = gguf.GGUFReader(str(p)), read_gguf(p)
        assert set(ours.tensors) == {t.name for t in ref.tensors}
        with GGUFFile(p) as f:
            for t in ref.tensors:
                o = ours.tensors[t.name]
                assert o.ggml_type == t.tensor_type.name and list(o.dims) == [int(d) for d in t.shape]
                assert o.nbytes == t.n_bytes and o.offset == t.data_offset
                got = f.tensor(t.name).reshape(-1).view(torch.uint8).numpy()
                assert got.tobytes() == np.asarray(t.data).tobytes()
        for k, v in kvs.items():
            field = ref.fields[k]
            want = field.contents()
            got = ours.metadata[k]
            assert got == want or (isinstance(v, float) and np.float32(got) == np.float32(want)), k

    check()
