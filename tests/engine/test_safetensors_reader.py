import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import FormatError
from engine.formats import SafetensorsFile, read_header, sniff
from engine.formats.safetensors import save_tensors, write_sparse


def test_reads_what_the_reference_writer_wrote(tmp_path):
    p = tmp_path / "a.safetensors"
    ts = {
        "a": torch.randn(3, 4),
        "b": torch.arange(5, dtype=torch.int64),
        "c": torch.randn(2).to(torch.bfloat16),
    }
    save_file(ts, str(p), metadata={"k": "v"})
    h = read_header(p)
    assert set(h.tensors) == {"a", "b", "c"}
    assert h.tensors["a"].shape == (3, 4) and h.tensors["a"].dtype == "F32"
    assert h.metadata == {"k": "v"}
    assert sniff(p) == "safetensors"
    with SafetensorsFile(p) as f:
        for k, v in ts.items():
            assert torch.equal(f.tensor(k), v)


def test_our_writer_round_trips_through_the_reference_reader(tmp_path):
    p = tmp_path / "b.safetensors"
    ts = {"x": torch.randn(7, 3).half(), "y": torch.tensor([True, False]), "z": torch.zeros(0, 4)}
    save_tensors(p, ts, {"m": "1"})
    back = load_file(str(p))
    for k, v in ts.items():
        assert torch.equal(back[k], v)
    assert list(p.parent.iterdir()) == [p]  # no temporary file left behind


def test_sparse_checkpoint_is_header_faithful_and_costs_no_disk(tmp_path):
    p = tmp_path / "big.safetensors"
    write_sparse(p, [("w", "F16", (50000, 20000)), ("b", "F32", (20000,))])
    h = read_header(p)
    assert h.file_size == h.data_start + 50000 * 20000 * 2 + 80000
    assert p.stat().st_blocks * 512 < 64 * 1024


def test_truncated_file_is_a_format_error(tmp_path):
    p = tmp_path / "t.safetensors"
    save_file({"a": torch.randn(100)}, str(p))
    data = p.read_bytes()
    p.write_bytes(data[:-10])
    with pytest.raises(FormatError, match="truncated"):
        read_header(p)


def test_huge_header_length_is_refused_without_allocating(tmp_path):
    p = tmp_path / "h.safetensors"
    p.write_bytes(struct.pack("<Q", 2**62) + b"{}")
    with pytest.raises(FormatError, match="claims"):
        read_header(p)


def test_overlapping_offsets(tmp_path):
    hdr = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    raw = json.dumps(hdr).encode()
    p = tmp_path / "o.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 12)
    with pytest.raises(FormatError, match="overlaps"):
        read_header(p)


def test_a_file_that_is_no_safetensors_is_named_for_what_it_is(tmp_path):
    """A text file or an image given where a .safetensors is expected (an --inputs file, a VAE) is
    refused as what it is; a huge length prefix before JSON stays a damaged safetensors header."""
    (tmp_path / "in.safetensors").write_text("x = latent, t = 500, prompt = a cat")
    with pytest.raises(FormatError, match="this is a text file, not a safetensors file"):
        read_header(tmp_path / "in.safetensors")
    (tmp_path / "img.safetensors").write_bytes(b"\xff\xd8\xff\xe0" + bytes(200))
    with pytest.raises(FormatError, match="this is a JPEG image, not a safetensors file"):
        read_header(tmp_path / "img.safetensors")
    (tmp_path / "big.safetensors").write_bytes(struct.pack("<Q", 1 << 40) + b'{"a": 1}')
    with pytest.raises(FormatError, match="the header claims 1,099,511,627,776 bytes"):
        read_header(tmp_path / "big.safetensors")


@pytest.mark.parametrize("header_len", [640, 896, 1152, 1408])
def test_a_header_size_that_starts_like_a_pickle_is_still_safetensors(tmp_path, header_len):
    """A header of 0x280, 0x380, 0x480 or 0x580 bytes makes the file start 80 02..80 05, a pickle's
    PROTO opcode: such files (small LoRAs, embeddings) were indexed as damaged pickles. The size is
    the only thing odd about them; the reference reader opens them."""
    from safetensors import safe_open

    from engine.formats import open_index

    text = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    text += b" " * (header_len - len(text))
    p = tmp_path / "small.safetensors"
    p.write_bytes(struct.pack("<Q", header_len) + text + struct.pack("<4f", 1, 2, 3, 4))
    assert p.read_bytes()[:2] == bytes([0x80, header_len >> 8])
    with safe_open(str(p), "pt") as f:
        assert list(f.keys()) == ["w"]
    assert sniff(p) == "safetensors" and open_index(p).tensors["w"].shape == (2, 2)
    with SafetensorsFile(p) as f:
        assert f.tensor("w").tolist() == [[1, 2], [3, 4]]
    torch.save({"w": torch.ones(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    assert sniff(tmp_path / "old.pt") == "pickle"  # a real pickle is still one


def test_any_valid_file_reads_as_the_reference_reader_reads_it(tmp_path):
    """Valid files of every shape a writer can give them -- names in any script, empty and 0-d tensors,
    every torch dtype safetensors stores, metadata or none, headers padded to any length (the sizes
    that start like a pickle included) -- give the same keys, shapes and values through our sniffer,
    index, header reader and tensor reader as through the reference `safe_open`."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from safetensors import safe_open

    from engine.formats import open_index

    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
              torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2]  # fmt: skip
    names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(
        lambda k: k != "__metadata__"  # the format's own key
    )
    tensor = st.tuples(st.sampled_from(dtypes), st.lists(st.integers(0, 3), max_size=3))
    files = st.dictionaries(names, tensor, min_size=1, max_size=5)
    meta = st.none() | st.dictionaries(st.text(max_size=6), st.text(max_size=20), max_size=3)

    lengths = st.integers(0, 1500) | st.sampled_from([640, 896, 1152, 1408])  # those that start 80 0x

    @settings(max_examples=60, deadline=None)
    @given(files, meta, lengths)
    def check(spec, metadata, length):
        g = torch.Generator().manual_seed(len(spec))
        ts = {k: (torch.randn(shape, generator=g) * 50).to(dt) for k, (dt, shape) in spec.items()}
        p = tmp_path / "any.safetensors"
        save_file(ts, str(p), metadata=metadata)
        raw = p.read_bytes()  # re-pad the header: spaces after the JSON are valid
        n = int.from_bytes(raw[:8], "little")
        pad = max(0, length - n)
        p.write_bytes((n + pad).to_bytes(8, "little") + raw[8 : 8 + n] + b" " * pad + raw[8 + n :])
        assert sniff(p) == "safetensors"
        h, idx = read_header(p), open_index(p)
        with safe_open(str(p), "pt") as ref, SafetensorsFile(p) as ours:
            keys = ref.keys()  # a safe_open handle is not iterable itself
            assert set(h.tensors) == set(idx.tensors) == set(keys)
            for k in keys:
                want = ref.get_tensor(k)
                assert h.tensors[k].shape == idx.tensors[k].shape == tuple(want.shape)
                got = ours.tensor(k)
                bits = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731  (NaN == NaN, -0 != 0)
                assert (
                    got.shape == want.shape and got.dtype == want.dtype and torch.equal(bits(got), bits(want))
                )
            assert (ref.metadata() or {}) == (h.metadata or {})

    check()


def _overcommit() -> str | None:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip()
    except OSError:
        return None


@pytest.mark.skipif(_overcommit() not in ("0", "1"), reason="Linux with heuristic or unlimited overcommit")
def test_a_file_larger_than_ram_and_swap_maps_and_loads(tmp_path):
    """A model file bigger than the machine's RAM and swap together (a 26 GB HunyuanVideo, a 41 GB Qwen-Image
    on a 24 GB machine without swap) is what a partial load is for: its mapping reserves nothing, so the
    kernel maps it; the tensors read, and a component built on it binds its layers on the disk tier."""
    import psutil

    from engine.model import Component

    big = psutil.virtual_memory().total + psutil.swap_memory().total + (1 << 30)
    rows = int(big // (4 * 4096)) + 1
    p = write_sparse(
        tmp_path / "big.safetensors", [("a.weight", "F32", (16, 16)), ("b.weight", "F32", (rows, 4096))]
    )
    assert p.stat().st_size > big
    with SafetensorsFile(p) as f:
        assert not f.mm.closed and f.tensor("b.weight")[-1].abs().sum() == 0
    c = Component("transformer", p, "", device="cpu")
    assert c.tier_bytes()["disk"] >= big - (1 << 30)


def test_where_a_private_mapping_is_refused_the_file_maps_read_only(tmp_path, monkeypatch):
    """Strict overcommit (or Windows' commit limit) may refuse even an unreserved private mapping: the file
    is then mapped read-only and shared, and its tensors read the same, without torch's warning."""
    import mmap
    import warnings

    p = tmp_path / "a.safetensors"
    ts = {"a": torch.randn(3, 4), "b": torch.arange(6, dtype=torch.int16)}
    save_file(ts, str(p))
    real = mmap.mmap
    calls = []

    def refusing(fd, length, *args, **kw):
        calls.append(kw.get("access"))
        if kw.get("access") != mmap.ACCESS_READ:
            raise OSError(12, "Cannot allocate memory")
        return real(fd, length, *args, **kw)

    monkeypatch.setattr(mmap, "mmap", refusing)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with SafetensorsFile(p) as f:
            for k, v in ts.items():
                assert torch.equal(f.tensor(k), v)
    assert calls[-1] == mmap.ACCESS_READ and len(calls) == 2
