"""The demo library: what it holds is detected as what it claims, it is small on disk, its dense files
are real formats (LoRAs detected as SD1 LoRAs; a TAESD decoder/encoder pair that decodes the demo latent
to the drawn picture, full and tiled, and round-trips the demo photo)."""

from __future__ import annotations

import gzip
import os
from importlib.resources import files

import pytest

from engine.catalog import LibraryCache, demo_layouts, scan
from engine.catalog.demo import SPARSE_MODELS, write_demo
from engine.detect import Detection
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
        again = scan([root], cache=cache)  # every detection read back from its cache row
    assert [e.detection for e in again.entries] == [e.detection for e in lib.entries]
    assert all(e.from_cache for e in again.entries)
    assert all(Detection.from_json(e.detection.to_json()) == e.detection for e in lib.entries)
    got = {os.path.relpath(e.path, root): (e.kind, e.architecture) for e in lib.entries}
    assert got == {
        "models/checkpoints/sd15_demo.safetensors": ("checkpoint", "sd1"),
        "models/checkpoints/sdxl_base_demo.safetensors": ("checkpoint", "sdxl"),
        "models/diffusion_models/flux1-dev_demo.safetensors": ("diffusion_model", "flux1_dev"),
        "models/text_encoders/clip_l.safetensors": ("text_encoder", None),
        "models/text_encoders/t5xxl_fp16.safetensors": ("text_encoder", None),
        "models/vae/ae_demo.safetensors": ("vae", None),
        "models/vae/sdxl_vae_demo.safetensors": ("vae", None),
        "models/vae_approx/taesd_preview_decoder_demo.safetensors": ("vae_approx", None),
        "models/vae_approx/taesd_preview_encoder_demo.safetensors": ("vae_approx", None),
        "models/loras/demo_style_sd1.safetensors": ("lora", "sd1"),
        "models/loras/demo_detail_sd1_loha.safetensors": ("lora", "sd1"),
        "models/embeddings/demo_embedding_sdxl.safetensors": ("embedding", "sdxl"),
    }
    assert lib.bad == [] and not any(e.kind_mismatch for e in lib.entries)
    e = {x.name: x for x in lib.entries}
    style = e["demo_style_sd1.safetensors"].detection.lora
    assert (style.algos, style.rank, sorted(style.targets)) == (("lora",), 2, ["clip_l", "unet"])
    assert e["demo_detail_sd1_loha.safetensors"].detection.lora.algos == ("loha",)
    assert e["demo_style_sd1.safetensors"].notes["trained_words"] == ["demo style", "soft light"]
    assert e["demo_detail_sd1_loha.safetensors"].notes["preferred_weight"] == 0.8
    assert all(e[n].preview for n in ("sd15_demo.safetensors", "sdxl_base_demo.safetensors"))
    assert (root / "README.md").read_text().count("models/") >= 10


def test_demo_layouts_are_the_fixture_layouts_and_only_those_the_demo_writes():
    """The committed layout data is what the fixtures' layout builder (checked against diffusers,
    transformers and real files) makes today. After a layout fix, write it again with
    `python -m tests.support.synth demo-layouts engine/catalog/demo_layouts.json.gz`."""
    from tests.support.synth.demo_data import encode

    committed = files("engine.catalog").joinpath(demo_layouts.DATA).read_bytes()
    assert gzip.decompress(committed) == gzip.decompress(encode()), "demo_layouts.json.gz is stale"
    used = {name for _, name, _ in SPARSE_MODELS} | {"taesd_decoder", "taesd_encoder", "embedding_sdxl"}
    assert set(demo_layouts.names()) == used
    assert len(committed) < 200_000


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


def _explained(img, ref) -> float:
    """Fraction of the reference's variance an image reproduces: 1 - mse / mse(flat mean colour)."""
    flat = ref.mean(dim=(-2, -1), keepdim=True)
    return 1.0 - float(((img - ref) ** 2).mean() / ((flat - ref) ** 2).mean())


def _png(path):
    import numpy as np
    import torch
    from PIL import Image

    return torch.from_numpy(np.asarray(Image.open(path).convert("RGB"), dtype=np.float32) / 255).permute(
        2, 0, 1
    )


def test_demo_taesd_decoder_is_the_sd1_preview_by_an_independent_forward(demo):
    """A minimal TAESD forward written from its definition (madebyollin/taesd): the file is a runnable
    TAESD decoder, and on a crop of the demo latent it reproduces the demo photo's crop."""
    import torch
    import torch.nn.functional as F

    root, _ = demo
    path = root / "models" / "vae_approx" / "taesd_preview_decoder_demo.safetensors"
    with SafetensorsFile(path) as f:
        w = {k: f.tensor(k).float() for k in f.header.tensors}
        assert f.header.metadata["loadout.demo"] == "taesd_preview_decoder"
    z = read_latent(root / "input" / "demo_sd1.latent")[:, :, 24:40, 24:40]

    def run(z):
        x = torch.tanh(z * 0.18215 / 3) * 3  # SD1 latent scale, then TAESD's Clamp

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
        return conv(block(x, 18), "19").clamp(0, 1)[0]

    ref = _png(root / "input" / "demo_photo.png")[:, 24 * 8 + 16 : 40 * 8 - 16, 24 * 8 + 16 : 40 * 8 - 16]
    got = run(z)[:, 16:-16, 16:-16]  # the crop's own borders see zero padding
    assert _explained(got, ref) > 0.9
    # ... and it is the latent that carries the picture: the same crop mirrored does not match it
    assert _explained(run(z.flip(-1))[:, 16:-16, 16:-16], ref) < 0.5


def test_demo_latent_decodes_to_the_photo_full_and_tiled_through_engine_vae(demo):
    from engine.vae import decode, load_vae

    root, _ = demo
    vae = load_vae(root / "models" / "vae_approx" / "taesd_preview_decoder_demo.safetensors")
    assert (vae.kind, vae.fmt.name, hasattr(vae, "encoder")) == ("vae_approx", "sd1", True)  # pair loaded
    z = read_latent(root / "input" / "demo_sd1.latent")[:, :, 16:48, 16:48]  # 256 px: keeps the test fast
    ref = _png(root / "input" / "demo_photo.png")[:, 128:384, 128:384]
    full = decode(vae, z, tiled=False)[0]
    tiled = decode(vae, z, tiled=True, tile=128, overlap=64)[0]
    inner = (slice(None), slice(16, -16), slice(16, -16))
    assert _explained(full[inner], ref[inner]) > 0.95
    assert full.shape == tiled.shape == ref.shape
    mse = float(((full - tiled) ** 2).mean())
    assert mse < 1e-3 * float(((full - full.mean()) ** 2).mean())  # no seams: tiles agree with the full pass


def test_demo_photo_round_trips_through_the_encoder(demo):
    from engine.vae import decode, encode, load_vae

    root, _ = demo
    vae = load_vae(root / "models" / "vae_approx" / "taesd_preview_encoder_demo.safetensors")
    photo = _png(root / "input" / "demo_photo.png")[None]
    lat = encode(vae, photo[:, :, 128:384, 128:384], tiled=False)
    assert tuple(lat.shape) == (1, 4, 32, 32)
    back = decode(vae, lat, tiled=False)[0][:, 16:-16, 16:-16]
    assert _explained(back, photo[0, :, 144:368, 144:368]) > 0.9
