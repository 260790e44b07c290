"""Images as encode reads them (engine.vae.images.read_rgb): every mode a user's image comes in ends as
the 8-bit RGB picture it shows, upright."""

from __future__ import annotations

import numpy as np
from PIL import Image

from engine.vae.images import image_size, read_rgb


def test_sixteen_bit_and_float_greyscale_keep_their_tones(tmp_path):
    """Pillow's own convert("RGB") clips 16-bit samples at 255 and float ones at 1: a 16-bit PNG came out
    white and a float TIFF black, and was encoded so."""
    ramp8 = np.tile(np.arange(256, dtype=np.uint8), (4, 1))
    Image.fromarray(ramp8.astype(np.uint16) * 257).save(tmp_path / "g16.png")
    Image.fromarray(ramp8.astype(np.float32) / 255, "F").save(tmp_path / "f.tiff")
    Image.fromarray(ramp8, "L").save(tmp_path / "g8.png")
    want = np.asarray(read_rgb(tmp_path / "g8.png"))
    assert want.shape == (4, 256, 3) and np.array_equal(want[..., 0], ramp8)
    for name in ("g16.png", "f.tiff"):
        assert np.array_equal(np.asarray(read_rgb(tmp_path / name)), want), name


def test_a_camera_jpeg_is_read_upright(tmp_path):
    """EXIF orientation 6 (shot rotated a quarter turn): the pixels are stored 64 wide, the picture is
    32 wide, as every viewer and ComfyUI's LoadImage show it."""
    exif = Image.Exif()
    exif[0x0112] = 6
    im = Image.new("RGB", (64, 32), (200, 30, 30))
    im.paste((10, 10, 250), (0, 0, 8, 8))  # a blue corner, top left as stored
    im.save(tmp_path / "photo.jpg", exif=exif, quality=95)
    rgb = read_rgb(tmp_path / "photo.jpg")
    assert rgb.size == (32, 64)
    assert np.asarray(rgb)[2, -3, 2] > 200  # the corner is now top right (rotated 90° clockwise)
    assert image_size(tmp_path / "photo.jpg") == (64, 32)  # the header's size: what the estimate uses
