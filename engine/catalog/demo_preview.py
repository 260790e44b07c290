"""The demo library's decodable pair: a TAESD-architecture decoder (and encoder) whose weights are set
by hand so that it *is* SD1's latent preview decoder, and a latent made from a drawn picture by
inverting it. No trained weights can ship in the repository; this keeps the Decode panel honest (the
file says what it is) and meaningful (the decode shows a picture, tiles and seams are visible).

The decoder (real TAESD keys and shapes, madebyollin/taesd `taesd.py`; loaded by engine.vae like any
TAESD file) computes, per latent pixel, ComfyUI's latent→RGB preview for SD1.5 (`comfy/latent_formats.py`
`SD15.latent_rgb_factors`, applied to the model-space latent, then mapped from [-1, 1] to [0, 1] as in
`latent_preview.py`), then upsamples ×8 smoothly:
* TAESD multiplies VAE latents by 0.18215 (engine.vae's `to_model`) and clamps them softly with
  tanh(x / 3) · 3; conv 1 maps the 4 clamped channels to R, G, B = 0.5 · factorsᵀ · c + 0.5 in
  channels 0-2 (the ReLU after it clips below 0, as the final clamp would);
* every Block's convs are zero, so a Block returns ReLU(x) = x (its input is non-negative);
* each nearest ×2 upsample is followed by its conv set to a per-channel [1 2 1]ᵀ[1 2 1] / 16 blur,
  which makes nearest ×2 exactly a bilinear ×2;
* the last conv copies channels 0-2 to the image (engine.vae's TAESD output is already in [0, 1]).
The encoder is the inverse map: an 8×8 box average (three stride-2 convs with 2×2 taps) and the
pseudo-inverse of the colour map; it does not undo the tanh clamp, so a round trip loses a little
contrast in saturated colours.
"""

from __future__ import annotations

import os

from . import demo_layouts

# ComfyUI comfy/latent_formats.py, class SD15: rows = latent channels, columns = R, G, B (no bias).
SD15_LATENT_RGB = (
    (0.3512, 0.2297, 0.3227),
    (0.3250, 0.4974, 0.2350),
    (-0.2829, 0.1762, 0.2721),
    (-0.2120, -0.2616, -0.7177),
)
SD1_SCALE = 0.18215  # model latent = VAE latent × 0.18215 (LDM configs' scale_factor)
C_MAX = 2.75  # largest clamped-latent magnitude the inversion uses (tanh(x / 3) · 3 stays below 3)
DTYPE = "F16"  # as the released TAESD files

DECODER_META = {
    "loadout.demo": "taesd_preview_decoder",
    "description": (
        "Not a trained model. TAESD decoder architecture with hand-set weights: SD1.5's latent->RGB preview "
        "factors (as in ComfyUI's latent_formats.py) and a bilinear x8 upsample. Written by `loadout demo`."
    ),
}
ENCODER_META = {
    "loadout.demo": "taesd_preview_encoder",
    "description": (
        "Not a trained model. TAESD encoder architecture with hand-set weights: an 8x8 box average and the "
        "pseudo-inverse of SD1.5's latent->RGB preview factors. Written by `loadout demo`."
    ),
}


def _colour_map():
    """(A, a0): conv 1's per-pixel map from the clamped model latent c to RGB, u = A c + a0, with A
    rounded to the stored dtype so the inversion matches what the file computes."""
    import torch

    f = torch.tensor(SD15_LATENT_RGB, dtype=torch.float32)
    a = (0.5 * f.T).to(torch.float16).float()
    return a, torch.full((3,), 0.5)


def _blur_kernel():
    import torch

    k = torch.tensor([1.0, 2.0, 1.0])
    return torch.outer(k, k) / 16


def decoder_tensors() -> dict:
    """State dict of the preview decoder, keys and shapes exactly those of `taesd_decoder.pth`."""
    import torch

    from ..formats.dtypes import torch_dtype

    a, a0 = _colour_map()
    sd = {}
    for name, dtype, shape in demo_layouts.rows("taesd_decoder"):
        sd[name] = torch.zeros(shape, dtype=torch_dtype(dtype))
    for k in range(3):
        sd["1.weight"][k, :, 1, 1] = a[k]
        sd["19.weight"][k, k, 1, 1] = 1.0
        for up in ("7", "12", "17"):  # the convs after each nn.Upsample
            sd[f"{up}.weight"][k, k] = _blur_kernel()
    sd["1.bias"][:3] = a0
    return sd


def encoder_tensors() -> dict:
    """State dict of the matching encoder (keys and shapes of `taesd_encoder.pth`)."""
    import torch

    from ..formats.dtypes import torch_dtype

    a, a0 = _colour_map()
    p = torch.linalg.pinv(a)  # (4, 3)
    sd = {}
    for name, dtype, shape in demo_layouts.rows("taesd_encoder"):
        sd[name] = torch.zeros(shape, dtype=torch_dtype(dtype))
    for k in range(3):
        sd["0.weight"][k, k, 1, 1] = 1.0
        for down in ("2", "6", "10"):  # stride-2 convs: taps 1 and 2 cover input rows 2i and 2i + 1
            sd[f"{down}.weight"][k, k, 1:, 1:] = 0.25
    sd["14.weight"][:4, :3, 1, 1] = p
    sd["14.bias"][:4] = -(p @ a0)
    return sd


def write_decoder(path: str | os.PathLike) -> None:
    from ..formats.safetensors import save_tensors

    save_tensors(path, decoder_tensors(), DECODER_META)


def write_encoder(path: str | os.PathLike) -> None:
    from ..formats.safetensors import save_tensors

    save_tensors(path, encoder_tensors(), ENCODER_META)


def _upsample8(u):
    """What the decoder does after conv 1 (on RGB only): three times nearest ×2 then the blur."""
    import torch.nn.functional as F

    k = _blur_kernel().to(u.dtype)[None, None].repeat(u.shape[1], 1, 1, 1)
    for _ in range(3):
        u = F.conv2d(F.interpolate(u, scale_factor=2.0, mode="nearest"), k, padding=1, groups=u.shape[1])
    return u


def latent_for_picture(picture, steps: int = 20):
    """VAE-space SD1 latent (1, 4, h/8, w/8) that the preview decoder decodes to `picture` (3, h, w) in
    [0, 1]: least squares over the clamped latent c (|c| <= C_MAX, projected gradient from the
    per-pixel pseudo-inverse of an 8×8 average), then the tanh clamp and the 0.18215 scale undone."""
    import torch
    import torch.nn.functional as F

    a, a0 = _colour_map()
    p = torch.linalg.pinv(a)
    target = picture[None].float()
    u0 = F.avg_pool2d(target, 8)
    c = torch.einsum("ck,nkhw->nchw", p, u0 - a0[None, :, None, None]).clamp(-C_MAX, C_MAX)
    lr = 1.0 / (64 * float(torch.linalg.matrix_norm(a, 2)) ** 2)  # 1 / Lipschitz constant
    for _ in range(steps):
        c = c.detach().requires_grad_(True)
        u = torch.einsum("kc,nchw->nkhw", a, c) + a0[None, :, None, None]
        loss = 0.5 * ((_upsample8(torch.relu(u)) - target) ** 2).sum()
        (g,) = torch.autograd.grad(loss, c)
        c = (c - 0.9 * lr * g).clamp(-C_MAX, C_MAX)
    m = 3 * torch.atanh(c.detach() / 3)
    return (m / SD1_SCALE).contiguous()


def picture(size: int = 512):
    """The demo's drawn picture, (3, size, size) float in [0, 1]: a landscape at dusk (sky gradient,
    sun, clouds, two rows of hills, a lake, a house and a tree) in colours the preview decoder can show
    (its colour map reaches only moderately saturated colours within the tanh clamp)."""
    import numpy as np
    import torch
    from PIL import Image, ImageDraw, ImageFilter

    s = 2 * size  # drawn at twice the size, then downsampled: smooth edges
    y = np.linspace(0.0, 1.0, s, dtype=np.float32)[:, None, None]
    top, horizon = np.array([0.30, 0.42, 0.70]), np.array([0.92, 0.72, 0.55])
    sky = (top * (1 - y) + horizon * y) * np.ones((1, s, 1), dtype=np.float32)
    img = Image.fromarray((sky * 255).astype(np.uint8), "RGB")
    glow = Image.new("L", (s, s), 0)
    ImageDraw.Draw(glow).ellipse(_box(0.70, 0.36, 0.16, s), fill=150)
    img.paste(Image.new("RGB", (s, s), (250, 215, 150)), mask=glow.filter(ImageFilter.GaussianBlur(s / 30)))
    d = ImageDraw.Draw(img)
    d.ellipse(_box(0.70, 0.36, 0.075, s), fill=(252, 236, 190))
    for cx, cy, r in ((0.22, 0.16, 0.06), (0.30, 0.14, 0.075), (0.38, 0.17, 0.055), (0.80, 0.12, 0.045)):
        d.ellipse(_box(cx, cy, r, s, squash=0.55), fill=(235, 232, 236))
    far = [(0, 0.58 * s)] + [(x, (0.52 + 0.05 * np.sin(x / s * 9.0)) * s) for x in range(0, s + 1, 8)]
    d.polygon(far + [(s, s), (0, s)], fill=(110, 130, 160))
    near = [(x, (0.66 + 0.06 * np.sin(x / s * 5.0 + 1.3)) * s) for x in range(0, s + 1, 8)]
    d.polygon(near + [(s, s), (0, s)], fill=(90, 150, 80))
    d.ellipse((0.50 * s, 0.80 * s, 1.05 * s, 0.98 * s), fill=(90, 130, 175))  # the lake
    d.rectangle((0.16 * s, 0.60 * s, 0.32 * s, 0.74 * s), fill=(205, 120, 95))  # the house
    d.polygon([(0.13 * s, 0.61 * s), (0.24 * s, 0.50 * s), (0.35 * s, 0.61 * s)], fill=(95, 60, 60))
    d.rectangle((0.22 * s, 0.66 * s, 0.26 * s, 0.74 * s), fill=(70, 50, 45))  # the door
    d.rectangle((0.415 * s, 0.62 * s, 0.44 * s, 0.76 * s), fill=(105, 75, 55))  # the tree
    d.ellipse(_box(0.43, 0.57, 0.075, s), fill=(60, 115, 65))
    img = img.resize((size, size), Image.LANCZOS)
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


def _box(cx: float, cy: float, r: float, s: int, squash: float = 1.0) -> tuple[float, float, float, float]:
    return ((cx - r) * s, (cy - r * squash) * s, (cx + r) * s, (cy + r * squash) * s)


def write_latent(path: str | os.PathLike) -> None:
    """The demo latent: the picture, inverted through the preview decoder."""
    from ..formats.latent import write_latent as write

    write(path, latent_for_picture(picture()))


def write_photo(path: str | os.PathLike) -> None:
    """The picture itself as a PNG, for the Decode panel's encode path."""
    import numpy as np
    from PIL import Image

    from ..formats.atomic import atomic_output

    arr = (picture().permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
    with atomic_output(path) as f:
        Image.fromarray(arr, "RGB").save(f, format="PNG")
