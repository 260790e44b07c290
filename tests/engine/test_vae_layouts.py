"""Real-size VAE layouts (the synth package's key tables: SD, SD3/FLUX.1, FLUX.2 in LDM and diffusers
naming) load strictly into AutoencoderKL from header-faithful sparse files — no tensor data is read."""

from __future__ import annotations

import pytest

from engine.formats.safetensors import write_sparse
from engine.vae import load_vae
from engine.vae.autoencoder_kl import KLConfig

synth = pytest.importorskip("tests.support.synth.vae")
from tests.support.synth._build import Builder  # noqa: E402


@pytest.mark.parametrize("arch", ["SD", "SD3", "FLUX2"])
@pytest.mark.parametrize("naming", ["vae_ldm", "vae_diffusers"])
def test_synth_layouts_load_strictly(tmp_path, arch, naming):
    cfg = getattr(synth, arch)
    b = Builder("F16")
    getattr(synth, naming)(b, cfg)
    path = write_sparse(tmp_path / f"{arch}_{naming}.safetensors", b.rows)
    vae = load_vae(path)
    assert vae.cfg == KLConfig(128, (1, 2, 4, 4), 2, cfg.z_channels, 3, True, True, cfg.quant_conv)
    assert sum(p.numel() for p in vae.parameters()) > 80_000_000
    keys = {r[0] for r in b.rows}
    assert set(vae.latent_norm) == {k for k in keys if k.startswith("bn.")}  # FLUX.2's latent statistics
