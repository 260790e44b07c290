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
