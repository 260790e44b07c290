"""`loadout decode` on a video latent, as a user runs it: MP4, animated WebP and PNG frames written
atomically, the frame count 1 + 4 (T - 1), the flags for chunks and tiles; `loadout plan --decode WxHxF`."""

from __future__ import annotations

import json

import pytest

from engine.cli import main

pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def clip_files(tmp_path_factory):
    import torch

    from engine.formats.latent import write_latent
    from tests.support.wan_vae import write_wan_vae

    d = tmp_path_factory.mktemp("clip")
    vae = write_wan_vae(d / "wan_2.1_vae_small.safetensors", dtype=torch.float16)
    g = torch.Generator().manual_seed(0)
    write_latent(d / "clip.latent", torch.randn(1, 16, 3, 6, 8, generator=g))
    write_latent(d / "still.latent", torch.randn(1, 16, 6, 8, generator=g))
    return {"vae": vae, "clip": str(d / "clip.latent"), "still": str(d / "still.latent"), "dir": d}


def _decode(capsys, *args) -> dict:
    assert main(["decode", "--json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_clip_decodes_to_mp4_webp_and_png_frames(clip_files, tmp_path, capsys):
    import av
    from PIL import Image

    base = ["--vae", clip_files["vae"], "--latent", clip_files["clip"]]
    mp4 = _decode(capsys, *base, "--out", str(tmp_path / "c.mp4"))
    assert mp4["frames"] == 9 and mp4["size"] == [64, 48] and mp4["fps"] == 16
    with av.open(str(tmp_path / "c.mp4")) as box:
        got = sum(1 for _ in box.decode(video=0))
    assert got == 9
    _decode(capsys, *base, "--out", str(tmp_path / "c.webp"), "--tile-frames", "1")
    with Image.open(tmp_path / "c.webp") as im:
        assert im.n_frames == 9 and im.size == (64, 48)
    res = _decode(capsys, *base, "--out", str(tmp_path / "frames") + "/", "--tile", "64", "--overlap", "32")
    assert res["mode"] == "tiled" and res["tiles"] > 1
    names = sorted(p.name for p in (tmp_path / "frames").iterdir())
    assert names == [f"{i:06d}.png" for i in range(9)]  # nothing else: written whole, then renamed
    with Image.open(tmp_path / "frames" / "000004.png") as im:
        assert im.mode == "RGB" and im.size == (64, 48)
    # the PNG frames and the WebP's (lossless) frames are the same pixels
    with Image.open(tmp_path / "c.webp") as im:
        im.seek(4)
        webp4 = im.convert("RGB").tobytes()
    with Image.open(tmp_path / "frames" / "000004.png") as im:
        png4 = im.tobytes()
    diff = max(abs(a - b) for a, b in zip(webp4, png4, strict=True))
    assert diff <= 3  # tiled against full frames: seams below 8-bit visibility (PSNR >= 35 dB in tests)


def test_a_still_latent_into_a_folder_writes_one_frame(clip_files, tmp_path, capsys):
    res = _decode(
        capsys, "--vae", clip_files["vae"], "--latent", clip_files["still"], "--out", f"{tmp_path}/s/"
    )
    assert res["outputs"] == [f"{tmp_path}/s/000000.png"]


def test_wrong_outputs_are_refused_before_decoding(clip_files, tmp_path, capsys):
    base = ["--vae", clip_files["vae"], "--latent", clip_files["still"]]
    assert main(["decode", *base, "--out", str(tmp_path / "x.mp4")]) != 0
    assert "image latent" in capsys.readouterr().err
    assert main(["decode", *base, "--out", str(tmp_path / "x.gif")]) != 0
    assert not list(tmp_path.iterdir())


def test_plan_a_video_decode(clip_files, capsys):
    assert (
        main(["plan", "--model", clip_files["vae"], "--decode", "832x480x81", "--vram", "2", "--json"]) == 0
    )
    plan = json.loads(capsys.readouterr().out)
    (step,) = plan["steps"]
    d = step["detail"]
    assert step["step"] == "decode" and d["frames"] == 81 and d["latent_frames"] == 21
    assert step["mode"] == "tiled" and d["tile_frames"] >= 1 and step["peak_bytes"] <= plan["budget_bytes"]
    assert main(["plan", "--model", clip_files["vae"], "--decode", "832x480x81", "--vram", "80"]) == 0
    assert "81 frames in chunks of" in capsys.readouterr().out
