"""`loadout decode` / `loadout encode` as a user runs them: real files in, PNG/.latent out, exit codes."""

from __future__ import annotations

import gc
import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from vae_fixtures import small_kl  # noqa: E402

from engine.formats.latent import MARKER, read_latent, write_latent  # noqa: E402
from engine.formats.safetensors import read_header, save_tensors  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("vae_cli")
    m = small_kl(seed=4)
    save_tensors(d / "model.safetensors", {f"first_stage_model.{k}": v for k, v in m.state_dict().items()})
    write_latent(d / "z.latent", torch.randn(1, 4, 8, 12, generator=torch.Generator().manual_seed(0)))
    save_tensors(d / "z16.safetensors", {"latent": torch.randn(1, 16, 8, 8)})
    return d


def test_decode_full_and_tiled_to_png(cli, files):
    from PIL import Image

    r = cli(
        "decode",
        "--vae",
        str(files / "model.safetensors"),
        "--latent",
        str(files / "z.latent"),
        "--out",
        str(files / "full.png"),
        "--no-tile",
        "--cpu",
    )
    assert r.returncode == 0, r.stderr
    assert "full" in r.stdout and "wrote" in r.stdout
    r = cli(
        "decode",
        "--vae",
        str(files / "model.safetensors"),
        "--latent",
        str(files / "z.latent"),
        "--out",
        str(files / "tiled.png"),
        "--tile",
        "128",
        "--overlap",
        "64",
        "--json",
        "--cpu",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["mode"] == "tiled" and out["tiles"] == 2 and out["size"] == [96, 64]
    a = torch.from_numpy(np.asarray(Image.open(files / "full.png"), dtype=np.float32))
    b = torch.from_numpy(np.asarray(Image.open(files / "tiled.png"), dtype=np.float32))
    assert Image.open(files / "tiled.png").size == (96, 64)
    assert (a - b).abs().mean() < 1.0  # 8-bit images of tiled and full decodes agree


def test_decode_errors_have_exit_codes(cli, files):
    r = cli(
        "decode",
        "--vae",
        str(files / "model.safetensors"),
        "--latent",
        str(files / "z16.safetensors"),
        "--out",
        str(files / "x.png"),
    )
    assert r.returncode == 3 and "16 channels but this VAE decodes 4-channel" in r.stderr
    assert not (files / "x.png").exists()
    r = cli(
        "decode",
        "--vae",
        str(files / "z.latent"),
        "--latent",
        str(files / "z.latent"),
        "--out",
        str(files / "y.png"),
    )
    assert r.returncode == 3 and "not a VAE" in r.stderr
    r = cli(
        "decode",
        "--vae",
        str(files / "model.safetensors"),
        "--latent",
        str(files / "z.latent"),
        "--out",
        str(files / "y.png"),
        "--tile",
        "60",
    )
    assert r.returncode == 2


def test_encode_then_decode(cli, files):
    from PIL import Image

    Image.new("RGB", (70, 50), (200, 30, 90)).save(files / "in.png")
    r = cli(
        "encode",
        "--vae",
        str(files / "model.safetensors"),
        "--image",
        str(files / "in.png"),
        "--out",
        str(files / "e.latent"),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["latent_shape"] == [1, 4, 6, 8]
    assert json.loads(r.stdout)["encoded_size"] == [64, 48]  # 70x50 cropped to whole latent pixels
    assert MARKER in read_header(files / "e.latent").tensors
    assert read_latent(files / "e.latent").shape == (1, 4, 6, 8)
    r = cli(
        "decode",
        "--vae",
        str(files / "model.safetensors"),
        "--latent",
        str(files / "e.latent"),
        "--out",
        str(files / "e.png"),
    )
    assert r.returncode == 0 and Image.open(files / "e.png").size == (64, 48)
    r = cli("encode", "--vae", str(files / "model.safetensors"), "--image", str(files / "in.png"),
            "--out", str(files / "e2.latent"))  # fmt: skip
    assert r.returncode == 0 and "encoded 70x50 (cropped to 64x48) -> latent (1, 4, 6, 8)" in r.stdout


def test_taef2_round_trip_via_cli(cli, files, shared_data):
    from PIL import Image

    enc, dec = shared_data("weights/taef2_encoder.pth"), shared_data("weights/taef2_decoder.pth")
    Image.open(shared_data("images/reconstruction_example.jpg")).crop((0, 0, 128, 128)).save(
        files / "crop.png"
    )
    r = cli("encode", "--vae", str(enc), "--image", str(files / "crop.png"), "--out", str(files / "t.latent"))
    assert r.returncode == 0, r.stderr
    r = cli("decode", "--vae", str(dec), "--latent", str(files / "t.latent"), "--out", str(files / "t.png"))
    assert r.returncode == 0, r.stderr
    a = torch.from_numpy(np.asarray(Image.open(files / "crop.png"), dtype=np.float64)) / 255
    b = torch.from_numpy(np.asarray(Image.open(files / "t.png"), dtype=np.float64)) / 255
    assert 10 * torch.log10(1 / ((a - b) ** 2).mean()) > 28


def test_the_cli_writes_what_the_engine_decodes(files, tmp_path, capsys):
    """`loadout decode` is a client of the window's Decode request: same pixels, same run facts."""
    from PIL import Image

    from engine.cli import main
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.requests import Decode

    out = tmp_path / "cli.png"
    args = ["--vae", str(files / "model.safetensors"), "--latent", str(files / "z.latent"), "--out", str(out)]
    assert main(["decode", *args, "--tile", "64", "--overlap", "16", "--json", "--cpu"]) == 0
    cli = json.loads(capsys.readouterr().out)
    engine = Engine()
    engine.detect(DeviceOptions(cpu=True))
    res = engine.run(Decode(str(files / "model.safetensors"), str(files / "z.latent"), "tiled", 64, 16))
    engine.close()
    assert Image.open(out).tobytes() == res.rgb and cli["size"] == [res.width, res.height]
    for k in ("mode", "tiles", "tile_px", "overlap_px", "dtype", "estimate_bytes", "device"):
        assert cli[k] == res.info[k], k


def test_a_batch_latent_decodes_to_one_png_per_image(cli, files):
    from PIL import Image

    write_latent(files / "batch.latent", torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(1)))
    r = cli(
        "decode", "--vae", str(files / "model.safetensors"), "--latent", str(files / "batch.latent"),
        "--out", str(files / "batch.png"), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["outputs"] == [str(files / "batch_0.png"), str(files / "batch_1.png")]
    assert Image.open(files / "batch_1.png").size == (64, 64)


def test_an_image_and_a_latent_swapped_are_named_for_what_they_are(files, tmp_path, capsys):
    """decode given a photo as the latent says how to make a latent of it; encode given a latent or a
    text file as the image says what the file is; a missing image is a read error."""
    from PIL import Image

    from engine.cli import main

    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (32, 32), (10, 200, 30)).save(photo)
    (tmp_path / "notes.png").write_text("not really a picture")
    vae = str(files / "model.safetensors")
    assert main(["decode", "--vae", vae, "--latent", str(photo), "--out", str(tmp_path / "o.png")]) == 3
    err = capsys.readouterr().err
    assert "this is a JPEG image" in err and f"loadout encode --vae VAE --image {photo}" in err
    for image, what in (
        (files / "z.latent", "this is a safetensors file, not an image"),
        (tmp_path / "notes.png", "this is a text file, not an image"),
        (tmp_path / "gone.png", "cannot read the image (No such file or directory)"),
        (_png_claiming(tmp_path / "bomb.png", 100_000, 100_000), "bomb.png: too large to decode safely"),
        (_cut_short(tmp_path / "cut.png"), "cut.png: cannot read the image (image file is truncated"),
    ):
        argv = ["encode", "--vae", vae, "--image", str(image), "--out", str(tmp_path / "o.latent")]
        with warnings.catch_warnings(record=True) as caught:  # and each image file is closed, read or not
            warnings.simplefilter("always", ResourceWarning)
            assert main(argv) == 3
            gc.collect()
        assert what in capsys.readouterr().err, image
        assert not [w for w in caught if issubclass(w.category, ResourceWarning)], image
    assert not (tmp_path / "o.png").exists() and not (tmp_path / "o.latent").exists()


def _png_claiming(path, width: int, height: int):
    """A PNG whose header claims width x height pixels, with almost no data (a decompression bomb):
    Pillow refuses it before decoding; Loadout says so (it was a DecompressionBombError traceback)."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)))
    return path


def _cut_short(path):
    from PIL import Image

    Image.new("RGB", (64, 64), (1, 2, 3)).save(path)
    path.write_bytes(path.read_bytes()[:70])
    return path
