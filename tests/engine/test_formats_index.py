"""open_index: one header-only view of safetensors, torch zip and legacy torch files."""

import sys

import pytest
import torch

from engine.errors import FormatError
from engine.formats import ModelIndex, open_index
from engine.formats.pickles import load_state_dict
from engine.formats.safetensors import save_tensors, write_sparse


def _sd():
    torch.manual_seed(0)
    sd = {
        "a.weight": torch.randn(3, 4).half(),
        "b": torch.arange(5),
        "c": torch.nn.Parameter(torch.randn(2, 2)),
    }
    sd["view"] = sd["a.weight"][1]  # shares a storage: counted once in data_size
    return sd


def test_safetensors_index_matches_the_header(tmp_path):
    p = tmp_path / "m.safetensors"
    save_tensors(p, {"x": torch.zeros(2, 3, dtype=torch.bfloat16), "y": torch.zeros(4)}, {"k": "v"})
    idx = open_index(p)
    assert isinstance(idx, ModelIndex) and idx.format == "safetensors"
    assert (
        idx.tensors["x"].dtype == "BF16"
        and idx.tensors["x"].shape == (2, 3)
        and idx.tensors["x"].nbytes == 12
    )
    assert idx.data_size == 12 + 16 and idx.file_size == p.stat().st_size
    assert idx.metadata == {"k": "v"} and idx.params == 10
    # offsets point at the real bytes
    raw = p.read_bytes()
    t = idx.tensors["y"]
    assert raw[t.offset : t.offset + t.nbytes] == bytes(16)


@pytest.mark.parametrize("zip_format", [True, False], ids=["zip", "legacy"])
def test_torch_checkpoint_index_without_reading_data(tmp_path, zip_format):
    p = tmp_path / "m.ckpt"
    torch.save({"state_dict": _sd(), "global_step": 7}, p, _use_new_zipfile_serialization=zip_format)
    idx = open_index(p)
    assert idx.format == ("torch-zip" if zip_format else "pickle")
    assert set(idx.tensors) == {"a.weight", "b", "c", "view"}
    assert idx.tensors["a.weight"].dtype == "F16" and idx.tensors["a.weight"].shape == (3, 4)
    assert idx.tensors["b"].dtype == "I64" and idx.tensors["c"].dtype == "F32"
    assert idx.tensors["view"].shape == (4,) and idx.tensors["view"].nbytes == 8
    assert idx.data_size == 24 + 40 + 16
    assert idx.metadata == {"global_step": "7"}
    assert "torch._utils._rebuild_tensor_v2" in idx.pickle_globals
    loaded = load_state_dict(p)
    for k, v in _sd().items():
        assert torch.equal(loaded[k], v)


def test_index_agrees_with_torch_on_a_real_checkpoint(shared_data):
    p = shared_data("weights/taef2_decoder.pth")
    idx = open_index(p)
    ref = torch.load(p, weights_only=True, mmap=True)
    assert set(idx.tensors) == set(ref)
    for k, v in ref.items():
        assert idx.tensors[k].shape == tuple(v.shape) and idx.tensors[k].nbytes == v.nbytes


def test_sparse_layout_index_costs_nothing(tmp_path):
    p = tmp_path / "big.safetensors"
    write_sparse(p, [("w", "F16", (2**20, 2**14))])
    idx = open_index(p)
    assert idx.data_size == 2**35 and idx.tensors["w"].numel == 2**34


def test_index_does_not_import_torch(tmp_path):
    import subprocess

    p = tmp_path / "m.pt"
    torch.save(_sd(), p)
    code = (
        "import sys; from engine.formats import open_index; import engine.formats.latent, "
        "engine.formats.gguf, engine.formats.pickles; i = open_index(sys.argv[1]); "
        "assert 'torch' not in sys.modules, 'torch imported'; print(len(i.tensors))"
    )
    out = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "4"


@pytest.mark.parametrize("content", [b"", b"hello world, not a model", b"\x89PNG\r\n\x1a\n" + bytes(40)])
def test_not_a_model(tmp_path, content):
    p = tmp_path / "x.bin"
    p.write_bytes(content)
    with pytest.raises(FormatError):
        open_index(p)


class _CountingFile:
    """Wraps a binary file and counts the bytes read through it."""

    def __init__(self, f, counter):
        self._f, self._counter = f, counter

    def read(self, n=-1):
        b = self._f.read(n)
        self._counter[0] += len(b)
        return b

    def readinto(self, buf):
        n = self._f.readinto(buf)
        self._counter[0] += n or 0
        return n

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()

    def __iter__(self):
        return iter(self._f)


def _write_gguf(p):
    from engine.formats.gguf import write_sparse_gguf

    write_sparse_gguf(p, {"general.architecture": "sdxl"}, [("w", "F32", (1024, 2048))])


@pytest.mark.parametrize("kind", ["safetensors", "zip", "legacy", "gguf"])
def test_index_never_reads_tensor_data(tmp_path, monkeypatch, kind):
    """Every byte read through open() is counted: far fewer than the 8 MiB of tensor data."""
    import builtins
    import io

    p = tmp_path / f"m.{kind}"
    w = torch.ones(1024, 2048)  # 8 MiB
    if kind == "safetensors":
        save_tensors(p, {"w": w})
    elif kind == "gguf":
        _write_gguf(p)
        with open(p, "r+b") as f:  # fill the data region for real
            f.seek(p.stat().st_size - w.nbytes)
            f.write(w.numpy().tobytes())
    else:
        torch.save({"w": w}, p, _use_new_zipfile_serialization=kind == "zip")
    counter = [0]
    real_open = builtins.open

    def counting_open(file, mode="r", *a, **kw):
        f = real_open(file, mode, *a, **kw)
        return _CountingFile(f, counter) if "b" in mode else f

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(io, "open", counting_open)
    idx = open_index(p)
    monkeypatch.undo()
    assert idx.tensors["w"].nbytes == w.nbytes and idx.data_size == w.nbytes
    assert 0 < counter[0] < 64 * 1024, f"{counter[0]} bytes read"
