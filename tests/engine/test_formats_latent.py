"""ComfyUI .latent files: both formats read, the marker always written, bad files refused."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.errors import FormatError
from engine.formats.latent import MARKER, OLD_FORMAT_SCALE, latent_info, read_latent, write_latent


def _latent(shape=(1, 4, 16, 24), dtype=torch.float32):
    torch.manual_seed(0)
    return torch.randn(shape).to(dtype)


@pytest.mark.parametrize("shape", [(1, 4, 16, 24), (2, 16, 8, 8), (1, 16, 3, 8, 8)])
def test_round_trip_writes_the_marker(tmp_path, shape):
    p = tmp_path / "a.latent"
    x = _latent(shape)
    write_latent(p, x, {"prompt": "{}"})
    raw = load_file(str(p))  # the reference reader sees exactly what ComfyUI's SaveLatent writes
    assert set(raw) == {"latent_tensor", MARKER} and raw[MARKER].numel() == 0
    assert torch.equal(raw["latent_tensor"], x)
    back = read_latent(p)
    assert back.dtype == torch.float32 and torch.equal(back, x)
    assert latent_info(p).scale == 1.0
    assert list(tmp_path.iterdir()) == [p]  # written atomically, nothing left behind


def test_comfyui_file_with_marker_is_in_vae_space(tmp_path):
    p = tmp_path / "c.latent"
    x = _latent(dtype=torch.float16)
    save_file({"latent_tensor": x, MARKER: torch.tensor([])}, str(p), metadata={"prompt": "{}"})
    assert torch.equal(read_latent(p), x.float())


def test_old_format_without_marker_is_rescaled_as_comfyui_does(tmp_path):
    p = tmp_path / "old.latent"
    x = _latent()
    save_file({"latent_tensor": x}, str(p))
    info = latent_info(p)
    assert info.scale == pytest.approx(1 / 0.18215) and info.scale == OLD_FORMAT_SCALE
    assert torch.allclose(read_latent(p), x / 0.18215)


@pytest.mark.parametrize("key", ["latent", "samples", "anything"])
def test_other_tools_layouts(tmp_path, key):
    p = tmp_path / "o.safetensors"
    x = _latent()
    save_file({key: x, "note": torch.zeros(3)}, str(p))
    assert torch.equal(read_latent(p), x)


def test_rewrite_replaces_atomically(tmp_path):
    p = tmp_path / "r.latent"
    write_latent(p, _latent())
    y = torch.ones(1, 4, 2, 2)
    write_latent(p, y)
    assert torch.equal(read_latent(p), y)


@pytest.mark.parametrize(
    "tensors, match",
    [
        ({"a": torch.zeros(3), "b": torch.zeros(2)}, "no latent"),
        ({"latent_tensor": torch.zeros(4, 8, 8)}, "shape"),
        ({"latent_tensor": torch.zeros(1, 4, 0, 8)}, "shape"),
        ({"latent_tensor": torch.zeros(1, 4, 8, 8, dtype=torch.int32)}, "I32"),
        ({"x": torch.zeros(1, 4, 8, 8), "y": torch.zeros(1, 4, 8, 8)}, "no latent"),
    ],
)
def test_not_a_latent(tmp_path, tensors, match):
    p = tmp_path / "bad.latent"
    save_file(tensors, str(p))
    with pytest.raises(FormatError, match=match):
        read_latent(p)


def test_truncated_latent(tmp_path):
    p = tmp_path / "t.latent"
    write_latent(p, _latent())
    raw = p.read_bytes()
    for cut in (0, 4, 8, 20, len(raw) // 2, len(raw) - 1):
        p.write_bytes(raw[:cut])
        with pytest.raises(FormatError):
            read_latent(p)


def test_write_refuses_what_is_no_latent(tmp_path):
    for bad in (torch.zeros(4, 8, 8), torch.zeros(1, 4, 8, 8, dtype=torch.int64), [1, 2]):
        with pytest.raises(ValueError):
            write_latent(tmp_path / "x.latent", bad)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_latent_of_nan_or_inf_is_refused_not_decoded_to_a_black_picture(tmp_path, bad):
    z = torch.zeros(1, 4, 8, 8)
    z[0, 1, 2, 3] = bad
    write_latent(tmp_path / "diverged.latent", z)
    assert latent_info(tmp_path / "diverged.latent").shape == (1, 4, 8, 8)  # the header is fine
    with pytest.raises(FormatError, match="NaN or infinite values"):
        read_latent(tmp_path / "diverged.latent")
