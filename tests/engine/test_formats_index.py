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
        "import sys; from engine.formats import open_index; i = open_index(sys.argv[1]); "
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
