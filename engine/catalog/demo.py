"""`write_demo(dir)`: a small library a new user (and the window's tests and screenshots) can open at
once, laid out as a ComfyUI install. Big models are header-faithful sparse files (real keys and shapes,
a hole for the data: gigabytes that cost a few hundred KB of disk); the files that must really run are
small dense ones: LoRAs with random deterministic weights, and a TAESD-architecture decoder/encoder pair
with hand-set weights (SD1's latent preview, see demo_preview) plus a latent and a photo it decodes and
encodes meaningfully. See DEMO_README for the list.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..formats.atomic import atomic_output
from ..formats.safetensors import write_sparse
from ..jobs import CancelToken, Progress, Report, no_report
from . import demo_layouts
from . import demo_preview as PV
from . import demo_weights as W

DEMO_LATENT = "input/demo_sd1.latent"  # what the window puts in Decode when it opens the demo
# A demo written before this file existed decoded to black: one without it is written again.
DEMO_CURRENT = "models/vae_approx/taesd_preview_decoder_demo.safetensors"


def demo_is_current(root: str | os.PathLike) -> bool:
    """Whether `root` holds a demo library of this version (reused rather than written again)."""
    r = Path(root)
    return (r / "README.md").is_file() and (r / DEMO_CURRENT).is_file() and (r / DEMO_LATENT).is_file()


# (relative path, layout name in demo_layouts, what it is)
SPARSE_MODELS = [
    ("models/checkpoints/sd15_demo.safetensors", "sd1_checkpoint", "SD 1.5 single-file checkpoint"),
    ("models/checkpoints/sdxl_base_demo.safetensors", "sdxl_checkpoint", "SDXL base single-file checkpoint"),
    ("models/diffusion_models/flux1-dev_demo.safetensors", "flux1_dev_transformer",
     "FLUX.1-dev transformer (BF16)"),
    ("models/text_encoders/clip_l.safetensors", "clip_l", "CLIP-L text encoder"),
    ("models/text_encoders/t5xxl_fp16.safetensors", "t5xxl", "T5-XXL text encoder"),
    ("models/vae/ae_demo.safetensors", "flux1_vae", "FLUX.1 VAE (16-channel latent)"),
    ("models/vae/sdxl_vae_demo.safetensors", "sd_vae", "SD/SDXL VAE (4-channel latent)"),
]  # fmt: skip

DEMO_README = """\
# Loadout demo library

Written by `loadout demo`. Open this folder in Loadout (or `loadout scan {dir}`).
Nothing here is a trained model: the big files are *header-faithful sparse* files (every real key and
shape, zeros on read, a few hundred KB on disk); the LoRAs and the embedding hold random deterministic
weights in real formats, so loading, patching and decoding run for real and show real memory costs.
The TAESD pair has the real TAESD architecture (same keys and shapes) with weights set by hand so that
it computes SD1's *latent preview*: each latent pixel mapped to RGB with the SD1.5 latent→RGB factors
(the ones ComfyUI uses for its fast "latent2rgb" previews), upsampled ×8 bilinearly; the encoder is
its inverse (8×8 average, pseudo-inverse of the colour map). `input/demo_sd1.latent` was made from a
drawn landscape by inverting that decoder, so decoding it shows the landscape — blurry, as a preview is.

| file | what it is |
|---|---|
{rows}
| models/vae_approx/taesd_preview_decoder_demo.safetensors | TAESD decoder architecture, hand-set weights: SD1 latent preview (latent→RGB factors, bilinear ×8), dense |
| models/vae_approx/taesd_preview_encoder_demo.safetensors | its encoder (8×8 average, inverse colour map), dense; loaded with the decoder |
| models/loras/demo_style_sd1.safetensors | kohya LoRA for SD1, rank 2, UNet + CLIP-L (264 modules), dense |
| models/loras/demo_detail_sd1_loha.safetensors | LyCORIS LoHa for SD1, rank 2, attention only, dense |
| models/embeddings/demo_embedding_sdxl.safetensors | textual-inversion embedding for SDXL (`clip_l`/`clip_g`, 4 vectors), dense |
| input/demo_sd1.latent | a 64×64 4-channel SD1 latent (512×512 image) in ComfyUI's .latent format: a drawn landscape, inverted through the preview decoder |
| input/demo_photo.png | the landscape itself (512×512), to try encoding |

Previews (`NAME.preview.png`, `NAME.png`) and notes (`NAME.civitai.info`, `NAME.json`) sit beside
some files, as Civitai helpers and A1111 write them. Try:

    loadout decode --vae models/vae_approx/taesd_preview_decoder_demo.safetensors --latent input/demo_sd1.latent --out demo.png
    loadout encode --vae models/vae_approx/taesd_preview_encoder_demo.safetensors --image input/demo_photo.png --out photo.latent
    loadout lora inspect models/loras/demo_style_sd1.safetensors --base models/checkpoints/sd15_demo.safetensors
"""


@dataclass(frozen=True)
class DemoFile:
    path: str
    what: str
    logical_bytes: int
    disk_bytes: int | None  # allocated blocks where the OS says (sparse files use little)


def _preview(path: Path, title: str, subtitle: str, hue: int) -> None:
    """A small PNG thumbnail: a colour gradient with the model's name."""
    from PIL import Image, ImageDraw

    w = h = 192
    img = Image.new("RGB", (w, h))
    px = img.load()
    for y in range(h):
        for x in range(w):
            px[x, y] = ((hue + x // 3) % 256, (80 + y) % 256, (200 - x // 2 + y // 3) % 256)
    d = ImageDraw.Draw(img)
    d.rectangle((0, h - 44, w, h), fill=(20, 20, 28))
    d.text((8, h - 40), title[:28], fill=(240, 240, 240))
    d.text((8, h - 22), subtitle[:28], fill=(170, 200, 255))
    with atomic_output(path) as f:
        img.save(f, format="PNG")


def _json(path: Path, obj: dict) -> None:
    with atomic_output(path) as f:
        f.write(json.dumps(obj, indent=2).encode())


def write_demo(
    dest: str | os.PathLike, *, token: CancelToken | None = None, report: Report = no_report
) -> list[DemoFile]:
    """Write the demo library into `dest` (created if needed; existing demo files are replaced)."""
    token = token or CancelToken()
    root = Path(dest)
    root.mkdir(parents=True, exist_ok=True)
    steps: list[tuple[str, str, object]] = []
    for rel, name, what in SPARSE_MODELS:
        steps.append((rel, what, lambda p, n=name: write_sparse(p, demo_layouts.rows(n))))
    steps += [
        ("models/vae_approx/taesd_preview_decoder_demo.safetensors",
         "TAESD decoder, hand-set weights: SD1 latent preview", PV.write_decoder),
        ("models/vae_approx/taesd_preview_encoder_demo.safetensors",
         "TAESD encoder, hand-set weights: inverse of the preview", PV.write_encoder),
        ("models/loras/demo_style_sd1.safetensors", "kohya LoRA, SD1, dense", lambda p: W.write_kohya_lora(p)),
        ("models/loras/demo_detail_sd1_loha.safetensors", "LyCORIS LoHa, SD1, dense", lambda p: W.write_loha(p)),
        ("models/embeddings/demo_embedding_sdxl.safetensors", "textual-inversion embedding, SDXL, dense",
         lambda p: W.write_embedding(p)),
        ("input/demo_photo.png", "a drawn landscape 512×512", PV.write_photo),
        ("input/demo_sd1.latent", "SD1 latent 64×64 of the landscape", PV.write_latent),
    ]  # fmt: skip
    out = []
    for i, (rel, what, make) in enumerate(steps):
        token.raise_if_cancelled()
        report(Progress("Writing the demo library", i, len(steps), rel))
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        make(p)
        st = os.stat(p)
        disk = st.st_blocks * 512 if hasattr(st, "st_blocks") else None
        out.append(DemoFile(str(p), what, st.st_size, disk))
    _sidecars(root)
    rows = "\n".join(f"| {rel} | {what}, sparse |" for rel, _, what in SPARSE_MODELS)
    with atomic_output(root / "README.md") as f:
        f.write(DEMO_README.replace("{rows}", rows).replace("{dir}", str(root)).encode())
    report(Progress("Writing the demo library", len(steps), len(steps), "done"))
    return out


def _sidecars(root: Path) -> None:
    m = root / "models"
    _preview(m / "checkpoints/sd15_demo.preview.png", "sd15_demo", "SD 1.5 · checkpoint", 30)
    _preview(m / "checkpoints/sdxl_base_demo.png", "sdxl_base_demo", "SDXL · checkpoint", 120)
    _preview(m / "diffusion_models/flux1-dev_demo.preview.png", "flux1-dev_demo", "FLUX.1-dev", 200)
    _preview(m / "loras/demo_style_sd1.preview.png", "demo_style_sd1", "LoRA · SD1", 60)
    _preview(m / "loras/demo_detail_sd1_loha.png", "demo_detail_sd1_loha", "LoHa · SD1", 90)
    _json(m / "checkpoints/sd15_demo.civitai.info", {
        "id": 1, "modelId": 1, "name": "demo v1", "baseModel": "SD 1.5",
        "trainedWords": [], "description": "<p>Loadout demo checkpoint (sparse, no real weights).</p>",
        "model": {"name": "Loadout demo SD 1.5", "type": "Checkpoint", "nsfw": False},
    })  # fmt: skip
    _json(m / "loras/demo_style_sd1.civitai.info", {
        "id": 2, "modelId": 2, "name": "v1.0", "baseModel": "SD 1.5",
        "trainedWords": ["demo style", "soft light"],
        "description": "<p>A random-weight LoRA in kohya format, for trying Loadout.</p>",
        "model": {"name": "Loadout demo style", "type": "LORA", "nsfw": False},
    })  # fmt: skip
    _json(m / "loras/demo_detail_sd1_loha.json", {
        "description": "LoHa demo (A1111 user metadata format)", "sd version": "SD1",
        "activation text": "fine detail", "preferred weight": 0.8, "notes": "random weights",
    })  # fmt: skip
