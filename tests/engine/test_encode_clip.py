"""`loadout encode` of a clip with a video VAE, as a user runs it: a folder of frames, an animated WebP or an
MP4 in, a 5-D .latent out, the frames cut to a count the encoder takes (1 + 4k for Wan) with a note, and the
same latent as encoding those frames directly; an image VAE, a folder of mixed sizes and a long clip without
--frames are refused with a message that says what to do."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from engine.cli import main
from engine.errors import FormatError
from engine.vae import clips

pytest.importorskip("diffusers")

W, H = 48, 32


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from PIL import Image

    from engine.formats.video_out import write_mp4, write_webp
    from tests.support.wan_vae import write_wan_vae

    d = tmp_path_factory.mktemp("clip_in")
    vae = write_wan_vae(d / "wan_2.1_vae_small.safetensors")
    rng = np.random.default_rng(0)
    # smooth frames (a moving gradient plus a little noise): what a codec keeps close
    yy, xx = np.mgrid[0:H, 0:W]
    frames = []
    for t in range(7):
        base = np.stack([(xx * 5 + t * 37) % 256, (yy * 7 + t * 61) % 256, (xx + yy + t * 97) % 256], axis=-1)
        frames.append(np.clip(base + rng.integers(-8, 8, base.shape), 0, 255).astype(np.uint8))
    folder = d / "frames"
    folder.mkdir()
    for i, a in enumerate(frames):  # names out of lexical order: frame_10 sorts after frame_9 naturally
        Image.fromarray(a).save(folder / f"frame_{i * 5}.png")
    (folder / "notes.txt").write_text("not a frame")
    rgb = [a.tobytes() for a in frames]
    write_webp(str(d / "clip.webp"), rgb, W, H, 16)
    write_mp4(str(d / "clip.mp4"), rgb, W, H, 16)
    return {"vae": vae, "dir": d, "folder": str(folder) + "/", "frames": np.stack(frames)}


def _encode(capsys, *args) -> dict:
    assert main(["encode", "--json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


def _direct(vae_path, frames: np.ndarray) -> torch.Tensor:
    """The same frames through the VAE's own encode, no CLI, no reader."""
    from engine.vae import encode, load_vae

    vae = load_vae(vae_path)
    x = torch.from_numpy(frames).permute(3, 0, 1, 2)[None].float() / 255
    return encode(vae, x)


def test_a_folder_of_frames_encodes_to_a_5d_latent(files, tmp_path, capsys):
    from engine.formats.latent import read_latent

    out = tmp_path / "c.latent"
    res = _encode(capsys, "--vae", files["vae"], "--image", files["folder"], "--out", str(out))
    assert res["frames"] == 5 and res["latent_shape"] == [1, 16, 2, H // 8, W // 8]
    assert any("first 5 of 7 frames" in n and "1 + 4k" in n for n in res["notes"])
    got = read_latent(str(out))
    want = _direct(files["vae"], files["frames"][:5])  # natural order: frame_0, frame_5, ..., frame_20
    assert torch.allclose(got, want, atol=1e-5)
    wrong = _direct(files["vae"], files["frames"][[0, 2, 3, 4, 5]])  # frame_10 sorted before frame_5
    assert (got - wrong).abs().max() > 100 * (got - want).abs().max()


def test_an_animated_webp_is_the_same_clip_and_frames_limits_it(files, tmp_path, capsys):
    from engine.formats.latent import read_latent

    a, b = tmp_path / "a.latent", tmp_path / "b.latent"
    _encode(capsys, "--vae", files["vae"], "--image", str(files["dir"] / "clip.webp"), "--out", str(a))
    assert torch.allclose(
        read_latent(str(a)), _direct(files["vae"], files["frames"][:5]), atol=1e-5
    )  # lossless
    res = _encode(capsys, "--vae", files["vae"], "--image", str(files["dir"] / "clip.webp"), "--out", str(b),
                  "--frames", "1")  # fmt: skip
    assert res["latent_shape"] == [1, 16, 1, H // 8, W // 8] and not res["notes"]


def test_an_mp4_encodes_and_decodes_back(files, tmp_path, capsys):
    out = tmp_path / "m.latent"
    res = _encode(capsys, "--vae", files["vae"], "--image", str(files["dir"] / "clip.mp4"), "--out", str(out))
    assert res["frames"] == 5 and res["latent_shape"][2] == 2
    assert main(["decode", "--json", "--quiet", "--vae", files["vae"], "--latent", str(out),
                 "--out", str(tmp_path / "back") + "/"]) == 0  # fmt: skip
    back = json.loads(capsys.readouterr().out)
    assert back["frames"] == 5 and back["size"] == [W, H]


def test_a_clip_with_an_image_vae_says_it_needs_a_video_vae(files, tmp_path, capsys):
    kl = _write_kl_vae(tmp_path / "kl.safetensors")
    assert main(["encode", "--vae", kl, "--image", files["folder"], "--out", str(tmp_path / "x.latent")]) != 0
    err = capsys.readouterr().err
    assert "needs a video VAE" in err
    assert not (tmp_path / "x.latent").exists()


def _write_kl_vae(path) -> str:
    from diffusers import AutoencoderKL
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = AutoencoderKL(block_out_channels=(32, 32), down_block_types=("DownEncoderBlock2D",) * 2,
                        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1,
                        latent_channels=4)  # fmt: skip
    save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    return str(path)


def test_frames_of_mixed_sizes_are_refused_by_name(tmp_path):
    from PIL import Image

    d = tmp_path / "mixed"
    d.mkdir()
    Image.new("RGB", (16, 16)).save(d / "a.png")
    Image.new("RGB", (16, 24)).save(d / "b.png")
    with pytest.raises(FormatError, match="frame 1 is 16x24, the first 16x16"):
        clips.read_clip(str(d))
    assert clips.clip_info(str(d)).frames == 2  # the header view does not decode frames


def test_what_is_a_clip(files, tmp_path):
    from PIL import Image

    Image.new("RGB", (8, 8)).save(tmp_path / "one.webp")
    assert clips.is_clip(files["folder"]) and clips.is_clip(str(files["dir"] / "clip.mp4"))
    assert clips.is_clip(str(files["dir"] / "clip.webp"))
    assert not clips.is_clip(str(tmp_path / "one.webp"))  # a still WebP is an image
    info = clips.clip_info(str(files["dir"] / "clip.mp4"))
    assert (info.width, info.height, info.frames) == (W, H, 7) and info.fps == pytest.approx(16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="no frames in the folder"):
        clips.read_clip(str(tmp_path / "empty"))
    (tmp_path / "bad.mp4").write_bytes(b"\0" * 100)
    with pytest.raises(FormatError, match="bad.mp4: cannot open the video"):
        clips.read_clip(str(tmp_path / "bad.mp4"))


def test_a_clip_too_long_for_memory_asks_for_frames(files, tmp_path, monkeypatch):
    import psutil

    from engine.decoding import _clip
    from engine.requests import Encode
    from engine.vae import load_vae

    class Small:
        available = W * H * 3 * 5 * 4 * 3  # room for 3 frames in a quarter

    monkeypatch.setattr(psutil, "virtual_memory", lambda: Small)
    vae = load_vae(files["vae"])
    with pytest.raises(FormatError, match=r"7 frames of 48x32 .* --frames \(e\.g\. --frames 1\)"):
        _clip(vae, Encode(files["vae"], files["folder"], str(tmp_path / "x.latent")), [])
    x, size = _clip(vae, Encode(files["vae"], files["folder"], str(tmp_path / "x.latent"), frames=2), [])
    assert x.shape == (1, 3, 1, H, W) and size == (W, H)  # 2 asked, 1 taken (1 + 4k)


def test_the_estimate_of_a_clip_is_an_encode_of_its_frames(files):
    """The window's 'will it fit?' for a clip, from headers: an encode of 5 frames (7 cut to 1 + 4k), more
    than one frame's; a clip with an image VAE is refused before anything runs."""
    from engine.preflight import estimate
    from engine.requests import EstimateDecode

    clip = estimate(EstimateDecode(files["vae"], str(files["dir"] / "clip.mp4"), 512))
    folder = estimate(EstimateDecode(files["vae"], files["folder"], 512))
    assert clip.direction == "encode" and (clip.width, clip.height, clip.frames) == (W, H, 5)
    assert folder.frames == 5 and folder.full_bytes == clip.full_bytes
    one = files["dir"] / "one.png"
    from PIL import Image

    Image.fromarray(files["frames"][0]).save(one)
    still = estimate(EstimateDecode(files["vae"], str(one), 512))
    assert still.direction == "encode" and not still.frames and still.full_bytes < clip.full_bytes


def test_a_clip_encode_reports_an_estimate_of_its_frames(files):
    from engine.vae import encode, load_vae
    from engine.vae.run import RunInfo

    vae = load_vae(files["vae"])
    x = torch.from_numpy(files["frames"][:5]).permute(3, 0, 1, 2)[None].float() / 255
    one, five = RunInfo(), RunInfo()
    encode(vae, x[:, :, 0], info=one)
    encode(vae, x, info=five)
    assert five.estimate_bytes > one.estimate_bytes  # the clip and its chunk's frames, not one frame's


def test_the_plain_output_says_the_frames_and_the_note(files, tmp_path, capsys):
    out = tmp_path / "p.latent"
    assert (
        main(["encode", "--quiet", "--vae", files["vae"], "--image", files["folder"], "--out", str(out)]) == 0
    )
    text = capsys.readouterr().out
    assert f"encoded {W}x{H}, 5 frames -> latent (1, 16, 2, 4, 6)" in text
    assert "note: encoded the first 5 of 7 frames" in text.splitlines()[-1]
