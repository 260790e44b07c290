"""Torch zip checkpoints (.ckpt / .pt / .pth / .bin from torch.save) load like safetensors files: each
tensor a byte range of the file, viewed zero-copy through the mmap, read by offset into RAM, stepped
fully or partially; what cannot be one byte range is refused with what to do instead."""

from __future__ import annotations

import zipfile

import pytest
import torch
from denoise_files import SD1_TINY, random_weights, rel_l2, unet_rows, write

from engine.errors import UnsupportedModel
from engine.formats import open_weights
from engine.formats.torchzip import TorchZipFile


def test_every_tensor_is_its_bytes_in_the_file(tmp_path):
    """Views at an offset into a shared storage, 0-d and empty tensors, Parameters and every weight
    dtype read as torch.load reads them, zero-copy."""
    big = torch.arange(40, dtype=torch.float32)
    obj = {
        "state_dict": {
            "a.weight": torch.randn(3, 4).half(),
            "a.bias": torch.nn.Parameter(torch.randn(3)),
            "row": big[10:20].view(2, 5),  # a view 10 elements into a storage it shares
            "head": big[:4],
            "n": torch.tensor(7, dtype=torch.int64),
            "empty": torch.zeros(0, 8, dtype=torch.bfloat16),
            "flags": torch.tensor([True, False]),
        },
        "global_step": 12,
    }
    p = tmp_path / "m.ckpt"
    torch.save(obj, p)
    want = torch.load(p, weights_only=True)["state_dict"]
    f = open_weights(p)
    assert isinstance(f, TorchZipFile) and f.header.metadata["global_step"] == "12"
    for k, t in want.items():
        got = f.tensor(k)
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t), k
    assert f.tensor("row").data_ptr() - f.tensor("head").data_ptr() == 10 * 4  # one storage in the file
    assert set(f.index().tensors) == set(want)


def test_what_is_not_one_byte_range_is_refused_with_what_to_do(tmp_path):
    torch.save({"w": torch.randn(4, 3).t()}, tmp_path / "strided.pt")  # a transposed view
    with pytest.raises(UnsupportedModel, match="'w' is a strided view.*convert it to .safetensors"):
        open_weights(tmp_path / "strided.pt")
    torch.save({"w": torch.randn(2)}, tmp_path / "old.pt", _use_new_zipfile_serialization=False)
    with pytest.raises(UnsupportedModel, match="legacy torch file.*zip format only"):
        open_weights(tmp_path / "old.pt")
    torch.save({"w": torch.randn(64)}, tmp_path / "ok.pt")
    with zipfile.ZipFile(tmp_path / "ok.pt") as src, zipfile.ZipFile(tmp_path / "re.pt", "w") as dst:
        for i in src.infolist():  # re-zipped with compression, as an archiver might
            dst.writestr(i.filename, src.read(i), compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(UnsupportedModel, match="compressed in the zip"):
        open_weights(tmp_path / "re.pt")


def test_a_ckpt_steps_like_its_safetensors_twin_and_keeps_the_ledger_true(tmp_path, monkeypatch):
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import DetectDevices, Load, Step, Unload

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    w = random_weights(unet_rows(SD1_TINY), seed=3)
    twin = write(tmp_path / "sd1.safetensors", w)
    ckpt = tmp_path / "sd1.ckpt"
    torch.save({"state_dict": w, "global_step": 1}, ckpt)
    e = Engine()
    e.run(DetectDevices(DeviceOptions(cpu=True)))
    outs = {}
    try:
        for name, path, budget in (("twin", twin, None), ("full", ckpt, None), ("partial", ckpt, 0.0)):
            if budget is not None:
                e.run(DetectDevices(DeviceOptions(cpu=True, vram_budget_gb=budget)))
            out = str(tmp_path / f"{name}.safetensors")
            r = e.run(Step(str(path), size=(64, 64), steps=1, out=out))
            assert r.mode == ("partial" if budget is not None else "full"), name
            outs[name] = SafetensorsFile(out).tensor("out").clone()
        e.run(DetectDevices(DeviceOptions(cpu=True)))
        e.run(Load(str(ckpt), ("unet",)))
        c = e.components[(str(ckpt), "unet")]
        assert c.tier_bytes() == c.measured_tiers() and c.tier_bytes()["disk"] == 0
        e.run(Unload(str(ckpt), "unet"))
    finally:
        e.close()
    assert torch.equal(outs["full"], outs["partial"])  # bit for bit
    assert rel_l2(outs["full"], outs["twin"]) <= 1e-5  # the same weights, other alignments


def test_a_local_header_that_pushes_a_storage_past_the_end_is_corruption(tmp_path):
    """The zip directory says where a member's header starts; its own header says how long it is. One
    that claims a long extra field would put the storage's bytes past the end of the file."""
    import struct

    from engine.errors import FormatError

    p = tmp_path / "m.ckpt"
    torch.save({"w": torch.randn(16)}, p)
    raw = bytearray(p.read_bytes())
    with zipfile.ZipFile(p) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("data/0"))
    raw[info.header_offset + 28 : info.header_offset + 30] = struct.pack("<H", 65535)  # extra length
    p.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="runs past the end of the file"):
        open_weights(p)


def test_damaged_bytes_anywhere_are_format_errors(tmp_path):
    """Seeded byte flips and cuts across a small .ckpt, opened and every tensor read: a FormatError or
    UnsupportedModel, never zipfile's BadZipFile / NotImplementedError or a UnicodeDecodeError out of
    the members' own headers (a fuzz of 11,000 such files found those before the loader caught them)."""
    import random

    from engine.errors import FormatError

    sd = {"a.weight": torch.randn(8, 4), "a.bias": torch.randn(8), "b": torch.arange(10)[2:6]}
    torch.save({"state_dict": sd, "step": 3}, tmp_path / "ok.ckpt")
    raw = (tmp_path / "ok.ckpt").read_bytes()
    rng = random.Random(2026)
    p = tmp_path / "m.ckpt"
    for _ in range(600):
        b = bytearray(raw)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        if rng.random() < 0.15:
            del b[rng.randrange(len(b)) :]
        p.write_bytes(bytes(b))
        try:
            f = open_weights(p)
            for k in f.header.tensors:
                f.tensor(k).sum()
        except (FormatError, UnsupportedModel):
            pass
    # the flip that zipfile itself refuses: a member's own header naming another file
    name = b"ok/byteorder"
    at = raw.index(name)
    p.write_bytes(raw[:at] + b"ok/Xyteorder" + raw[at + len(name) :])
    with pytest.raises(FormatError, match="zip entries are damaged"):
        open_weights(p)
