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


def test_a_vae_whose_header_was_edited_is_a_format_error(tmp_path):
    """Sizes kept consistent, shapes or dtypes edited: a weight stored as int32, an input conv whose
    axes were swapped (read as a base width of 3, which no GroupNorm of 32 groups divides). Both were a
    RuntimeError / ValueError out of `loadout decode` (a fuzz of such edits on the KL and Wan VAEs)."""
    import torch
    from safetensors.torch import save_file
    from vae_fixtures import small_kl

    from engine.errors import FormatError

    sd = {k: v.contiguous() for k, v in small_kl(ch=32, seed=1).state_dict().items()}
    key = next(k for k in sd if k.endswith(".bias") and k.startswith("decoder."))
    cases = {
        "int": ({key: sd[key].to(torch.int32)}, "stored as int32"),
        "swap": (
            {"encoder.conv_in.weight": sd["encoder.conv_in.weight"].permute(3, 2, 1, 0).contiguous()},
            "describe no VAE",
        ),  # fmt: skip
    }
    for name, (edit, says) in cases.items():
        path = tmp_path / f"{name}.safetensors"
        save_file({**sd, **edit}, str(path))
        with pytest.raises(FormatError, match=says):
            load_vae(path)


def test_a_wan_vae_whose_convolution_was_stored_flat_is_a_format_error(tmp_path):
    """The configuration is read from the causal 3-D convolutions' shapes: one stored flat (a header
    edit, sizes consistent) was an IndexError out of `loadout decode` (found by `make fuzz`)."""
    from safetensors.torch import load_file, save_file

    from engine.errors import FormatError
    from tests.support.wan_vae import write_wan_vae

    sd = load_file(write_wan_vae(tmp_path / "wan.safetensors"))
    for key in ("decoder.conv1.weight", "encoder.conv1.weight", "decoder.head.2.weight"):
        save_file({**sd, key: sd[key].reshape(-1)}, str(tmp_path / "flat.safetensors"))
        with pytest.raises(FormatError, match=rf"{key} has shape \[\d+\]; a Wan VAE's convolutions are 3-D"):
            load_vae(tmp_path / "flat.safetensors")
