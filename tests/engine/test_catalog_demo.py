"""The demo library: what it holds is detected as what it claims, it is small on disk, its dense files
are real formats (a TAESD decoder that runs, LoRAs detected as SD1 LoRAs)."""

from __future__ import annotations

import os

import pytest

from engine.catalog import LibraryCache, scan
from engine.catalog.demo import write_demo
from engine.formats.latent import read_latent
from engine.formats.safetensors import SafetensorsFile


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo")
    files = write_demo(root)
    return root, files


def test_demo_library_is_detected_as_described(demo, tmp_path):
    root, files = demo
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        lib = scan([root], cache=cache)
    got = {os.path.relpath(e.path, root): (e.kind, e.architecture) for e in lib.entries}
    assert got == {
        "models/checkpoints/sd15_demo.safetensors": ("checkpoint", "sd1"),
        "models/checkpoints/sdxl_base_demo.safetensors": ("checkpoint", "sdxl"),
        "models/diffusion_models/flux1-dev_demo.safetensors": ("diffusion_model", "flux1_dev"),
        "models/text_encoders/clip_l.safetensors": ("text_encoder", None),
        "models/text_encoders/t5xxl_fp16.safetensors": ("text_encoder", None),
        "models/vae/ae_demo.safetensors": ("vae", None),
        "models/vae/sdxl_vae_demo.safetensors": ("vae", None),
        "models/vae_approx/taesd_decoder.safetensors": ("vae_approx", None),
        "models/loras/demo_style_sd1.safetensors": ("lora", "sd1"),
        "models/loras/demo_detail_sd1_loha.safetensors": ("lora", "sd1"),
        "models/embeddings/demo_embedding_sdxl.safetensors": ("embedding", "sdxl"),
    }
    assert lib.bad == [] and not any(e.kind_mismatch for e in lib.entries)
    e = {x.name: x for x in lib.entries}
    style = e["demo_style_sd1.safetensors"].detection["lora"]
    assert (style["algos"], style["rank"], sorted(style["targets"])) == (["lora"], 2, ["clip_l", "unet"])
    assert e["demo_detail_sd1_loha.safetensors"].detection["lora"]["algos"] == ["loha"]
    assert e["demo_style_sd1.safetensors"].notes["trained_words"] == ["demo style", "soft light"]
    assert e["demo_detail_sd1_loha.safetensors"].notes["preferred_weight"] == 0.8
    assert all(e[n].preview for n in ("sd15_demo.safetensors", "sdxl_base_demo.safetensors"))
    assert (root / "README.md").read_text().count("models/") >= 10


def test_demo_library_is_a_few_mb_on_disk(demo):
    root, files = demo
    allocated = sum(os.stat(os.path.join(d, f)).st_blocks * 512 for d, _, fs in os.walk(root) for f in fs)
    logical = sum(f.logical_bytes for f in files)
    assert logical > 30 * 2**30  # the models it describes weigh tens of GB ...
    assert allocated < 16 * 2**20  # ... and the folder a few MB


def test_demo_latent_is_a_comfyui_latent(demo):
    root, _ = demo
    t = read_latent(root / "input" / "demo_sd1.latent")
    assert tuple(t.shape) == (1, 4, 64, 64) and t.abs().max() > 0.5


def test_demo_taesd_decoder_runs_a_decode(demo):
    """A minimal TAESD forward written from its definition: the demo weights are a runnable decoder."""
    import torch
    import torch.nn.functional as F

    root, _ = demo
    with SafetensorsFile(root / "models" / "vae_approx" / "taesd_decoder.safetensors") as f:
        w = {k: f.tensor(k).float() for k in f.header.tensors}
    x = torch.tanh(read_latent(root / "input" / "demo_sd1.latent")[:, :, :16, :16] / 3) * 3  # Clamp

    def conv(x, k):
        return F.conv2d(x, w[f"{k}.weight"], w.get(f"{k}.bias"), padding=1)

    def block(x, i):
        h = F.relu(conv(x, f"{i}.conv.0"))
        h = F.relu(conv(h, f"{i}.conv.2"))
        return F.relu(conv(h, f"{i}.conv.4") + x)

    x = F.relu(conv(x, "1"))
    for blocks, up in (((3, 4, 5), 7), ((8, 9, 10), 12), ((13, 14, 15), 17)):
        for i in blocks:
            x = block(x, i)
        x = conv(F.interpolate(x, scale_factor=2), str(up))
    x = conv(block(x, 18), "19")
    assert tuple(x.shape) == (1, 3, 128, 128) and torch.isfinite(x).all() and x.std() > 0
