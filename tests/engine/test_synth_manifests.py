"""The generator reproduces the three real manifests exactly, before we trust it for anything else."""

from __future__ import annotations

import pytest

from tests.support import synth

# Optional keys in the manifests are switches of the layout; with every switch on the generator must
# give the whole manifest, with every switch off exactly the keys the manifest requires.
CASES = [
    (
        "sd1_checkpoint",
        "manifests/sd15_ldm_single_file.json",
        "F32",
        {"position_ids": True, "schedule": True},
        {"position_ids": False, "schedule": False},
    ),
    (
        "sdxl_checkpoint",
        "manifests/sdxl_base_sgm_single_file.json",
        "F32",
        {
            "position_ids": True,
            "clip_l_full": True,
            "clip_g_full": True,
            "schedule": True,
            "v_pred": True,
            "ztsnr": True,
            "edm_vpred": True,
        },
        {
            "position_ids": False,
            "clip_l_full": False,
            "clip_g_full": False,
            "schedule": False,
            "v_pred": False,
            "ztsnr": False,
            "edm_vpred": False,
        },
    ),
    (
        "flux1_dev",
        "manifests/flux1_dev_bfl_all_in_one.json",
        {"transformer": "BF16", "*": "F32"},
        {},
        {},
    ),
]


def _as_dict(rows):
    d = {k: (dt, tuple(s)) for k, dt, s in rows}
    assert len(d) == len(rows), "duplicate keys in a layout"
    return d


def _diff(mine: dict, ref: dict) -> str:
    missing = sorted(set(ref) - set(mine))
    extra = sorted(set(mine) - set(ref))
    wrong = sorted((k, mine[k], ref[k]) for k in set(mine) & set(ref) if mine[k] != ref[k])
    return f"missing {missing[:5]} ({len(missing)}), extra {extra[:5]} ({len(extra)}), wrong {wrong[:5]} ({len(wrong)})"


@pytest.mark.parametrize("name,manifest,dtype,full,required", CASES, ids=[c[0] for c in CASES])
def test_layout_equals_manifest(shared_data, name, manifest, dtype, full, required):
    path = shared_data(manifest)
    mine = _as_dict(synth.layout(name, dtype=dtype, **full))
    ref = _as_dict(synth.from_manifest(path))
    assert mine == ref, _diff(mine, ref)
    mine_req = _as_dict(synth.layout(name, dtype=dtype, **required))
    ref_req = _as_dict(synth.from_manifest(path, optional=False))
    assert mine_req == ref_req, _diff(mine_req, ref_req)


def test_defaults_are_the_official_release_layouts(shared_data):
    """Defaults: SD1.5 with the DDPM buffers and position_ids; SDXL base 1.0 without schedule or
    v-pred markers (2515 tensors); FLUX.1-dev all-in-one with guidance_in."""
    sd1 = synth.from_manifest(shared_data("manifests/sd15_ldm_single_file.json"))
    assert len(synth.layout("sd1_checkpoint")) == len(sd1)
    sdxl = synth.layout("sdxl_checkpoint")
    assert len(sdxl) == 2515
    assert not any(k in ("v_pred", "ztsnr", "betas") for k, _, _ in sdxl)
    keys = {k for k, _, _ in synth.layout("flux1_dev")}
    assert "model.diffusion_model.guidance_in.in_layer.weight" in keys


def test_schnell_is_dev_without_guidance():
    dev = {k: s for k, _, s in synth.layout("flux1_dev")}
    schnell = {k: s for k, _, s in synth.layout("flux1_schnell")}
    assert set(dev) - set(schnell) == {k for k in dev if ".guidance_in." in k}
    assert len(set(dev) - set(schnell)) == 4
    assert all(dev[k] == s for k, s in schnell.items())


def test_dtype_override_and_integer_buffers_keep_their_dtype():
    rows = synth.layout("sd1_checkpoint", dtype="BF16")
    dts = {k: d for k, d, _ in rows}
    assert dts["cond_stage_model.transformer.text_model.embeddings.position_ids"] == "I64"
    assert dts["model.diffusion_model.out.2.weight"] == "BF16"


def test_prefix_and_diffusion_model_only_files_match_the_checkpoint():
    ckpt = {k: s for k, _, s in synth.layout("sdxl_checkpoint") if k.startswith("model.diffusion_model.")}
    bare = {k: s for k, _, s in synth.layout("sdxl_unet")}
    pref = {k: s for k, _, s in synth.layout("sdxl_unet", prefix="model.diffusion_model.")}
    assert pref == ckpt
    assert {"model.diffusion_model." + k: s for k, s in bare.items()} == ckpt
    flux = {k: s for k, _, s in synth.layout("flux1_dev") if k.startswith("model.diffusion_model.")}
    assert {"model.diffusion_model." + k: s for k, _, s in synth.layout("flux1_dev_transformer")} == flux


@pytest.mark.parametrize(
    "name,params",
    [
        ("sd1_unet", 859_520_964),  # SD1.5 UNet, as diffusers / the SD model card count it
        ("sdxl_unet", 2_567_463_684),  # SDXL base UNet (DESIGN.md's detection example)
        ("clip_l", 123_060_480),  # openai/clip-vit-large-patch14 text tower
        ("sd_vae", 83_653_863),  # the SD/SDXL AutoencoderKL
        ("flux1_dev_transformer", 11_901_408_320),  # FLUX.1 [dev] "12B" transformer
        ("t5xxl", 4_762_310_656),  # T5-v1.1-XXL encoder
    ],
)
def test_parameter_counts_match_the_published_ones(name, params):
    import math

    assert sum(math.prod(s) for _, d, s in synth.layout(name) if d != "I64") == params
