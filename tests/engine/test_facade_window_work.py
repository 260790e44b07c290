"""The window's background work as engine requests (the bridge runs them off the GUI thread): finding
the user's libraries, writing the demo library, and a decode's or encode's memory estimate from headers."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.errors import EngineError, FormatError
from engine.facade import Engine
from engine.requests import DecodeEstimate, EstimateDecode, FindLibraries, WriteDemo
from engine.vae import estimate_decode_bytes, estimate_encode_bytes


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    import torch
    from PIL import Image

    from engine.formats.latent import write_latent
    from tests.support import synth

    d = tmp_path_factory.mktemp("window_work")
    latent = d / "small.latent"
    write_latent(latent, torch.zeros(2, 4, 16, 24))
    photo = d / "photo.png"
    Image.new("RGB", (96, 64)).save(photo)
    return {
        "vae": str(synth.write("sd_vae", d / "vae.safetensors")),  # header-faithful: the header is enough
        "taesd": str(synth.write("taesd_decoder", d / "taesd_decoder.safetensors", dense=True, seed=7)),
        "latent": str(latent),
        "photo": str(photo),
        "text": str(d / "notes.txt"),
    }


def test_find_libraries_asks_engine_discover(monkeypatch):
    from engine import discover

    monkeypatch.setattr(discover, "find_installs", lambda: ["comfyui-here"])
    assert Engine().run(FindLibraries()) == ("comfyui-here",)


def test_write_demo_writes_the_library_and_an_unwritable_folder_is_an_engine_error(tmp_path):
    from engine.catalog.demo import demo_is_current

    written = Engine().run(WriteDemo(str(tmp_path / "demo")))
    assert written and demo_is_current(tmp_path / "demo")
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(EngineError) as e:
        Engine().run(WriteDemo(str(blocker / "demo")))
    assert "a-file" in e.value.message


def test_estimate_decode_reads_the_latent_and_the_vae_headers(files):
    est = Engine().run(EstimateDecode(files["vae"], files["latent"], tile=128))
    assert isinstance(est, DecodeEstimate) and est.direction == "decode"
    assert (est.width, est.height, est.tile) == (192, 128, 128)
    kw = dict(kind="kl", latent_channels=4, batch=2)
    assert est.full_bytes > est.tiled_bytes > 0
    # the VAE's own weight bytes count: a full-size KL VAE header, not the estimate's default guess
    assert est.full_bytes == estimate_decode_bytes(192, 128, **kw, weight_bytes=_weights(files["vae"]))
    taesd = Engine().run(EstimateDecode(files["taesd"], files["latent"]))
    assert taesd.full_bytes < est.full_bytes  # a TAESD decoder is priced as one


def test_estimate_of_an_image_is_an_encode(files):
    est = Engine().run(EstimateDecode(files["vae"], files["photo"], tile=64))
    assert (est.direction, est.width, est.height) == ("encode", 96, 64)
    assert est.full_bytes == estimate_encode_bytes(96, 64, kind="kl", weight_bytes=_weights(files["vae"]))


@pytest.mark.parametrize("source", ["missing.latent", "text"])
def test_an_unreadable_input_is_a_format_error(files, source, tmp_path):
    path = files.get(source) or str(tmp_path / source)
    if source == "text":
        Path(path).write_text("not a latent")
    with pytest.raises(FormatError):
        Engine().run(EstimateDecode(files["vae"], path))


def _weights(path: str) -> int:
    from engine.detect import detect_file

    return sum(c.bytes for c in detect_file(path).components.values())
