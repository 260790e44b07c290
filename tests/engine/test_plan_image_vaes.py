"""`loadout plan --decode` with the image VAEs that are not AutoencoderKLs (the DC-AE, HunyuanImage 2.1's): the
estimate is their own kind's, at their 32x, from the header alone (a sparse release layout: no data)."""

from __future__ import annotations

import json

import pytest
from layouts_2026.common import meta_shapes

from engine.cli import main
from engine.formats.safetensors import write_sparse
from engine.vae import estimate as est

diffusers = pytest.importorskip("diffusers")

from tests.engine.test_vae_dc_ae import RELEASE as DC_AE  # noqa: E402
from tests.engine.test_vae_hunyuan_image import RELEASE as HUNYUAN_IMAGE  # noqa: E402


@pytest.mark.parametrize(
    "cls, config, arch",
    [("AutoencoderDC", DC_AE, "sana"), ("AutoencoderKLHunyuanImage", HUNYUAN_IMAGE, "hunyuan_image21")],
)
def test_plan_estimates_an_image_vae_by_its_own_kind(cls, config, arch, tmp_path, capsys):
    rows = meta_shapes(getattr(diffusers, cls), **config)
    path = write_sparse(
        tmp_path / f"{arch}_vae.safetensors", [(k, "BF16", tuple(s)) for k, s in rows.items()]
    )
    assert main(["plan", "--model", str(path), "--decode", "1024x1024", "--json", "--vram", "80"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["steps"]
    d = step["detail"]
    spec = est.image_spec(arch, config["latent_channels"], d["vae_bytes"])
    assert spec.kind == {"sana": "dc_ae", "hunyuan_image21": "hunyuan_image21"}[arch] and spec.downscale == 32
    esize = est.DTYPE_BYTES[d["compute_dtype"]]
    assert step["peak_bytes"] == est.full_bytes(spec, "decode", 1024 * 1024, esize)  # fits whole: a full pass
    kl = est.VaeSpec("kl", config["latent_channels"], d["vae_bytes"])  # what it was estimated as before
    assert step["peak_bytes"] != est.full_bytes(kl, "decode", 1024 * 1024, esize)


@pytest.mark.parametrize(
    "cls, config, arch",
    [("AutoencoderDC", DC_AE, "sana"), ("AutoencoderKLHunyuanImage", HUNYUAN_IMAGE, "hunyuan_image21")],
)
def test_the_decode_panels_estimate_reads_the_latent_at_32x(cls, config, arch, tmp_path):
    """The window's preflight (engine.preflight) of such a VAE and a latent: 32x the latent's size (it read 8x), the
    VAE's own kind."""
    import torch
    from safetensors.torch import save_file

    from engine.preflight import estimate
    from engine.requests import EstimateDecode

    rows = meta_shapes(getattr(diffusers, cls), **config)
    vae = write_sparse(tmp_path / f"{arch}_vae.safetensors", [(k, "BF16", tuple(s)) for k, s in rows.items()])
    save_file({"latent": torch.zeros(1, config["latent_channels"], 24, 32)}, tmp_path / "z.safetensors")
    got = estimate(EstimateDecode(str(vae), str(tmp_path / "z.safetensors")))
    assert (got.direction, got.width, got.height) == ("decode", 1024, 768)
    spec = est.image_spec(arch, config["latent_channels"], 0)
    weights = sum(est.DTYPE_BYTES["bfloat16"] * __import__("math").prod(s) for s in rows.values())
    assert got.full_bytes == est.full_bytes(est.replace(spec, weight_bytes=weights), "decode", 1024 * 768, 4)
