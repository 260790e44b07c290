"""The denoisers' forward passes against diffusers' own models on the same weights and inputs (float32,
CPU, reduced-depth models): SD1.5 (and its 9-channel inpainting form), SD2, SDXL, FLUX.1 dev and
schnell, each in the original and in diffusers' key naming."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    FLUX_DEV_TINY,
    FLUX_SCHNELL_TINY,
    PREFIX,
    SD1_INPAINT_TINY,
    SD1_TINY,
    SD2_TINY,
    SDXL_TINY,
    diffusers_flux,
    diffusers_unet,
    flux_rows,
    random_weights,
    recorded_order,
    rel_l2,
    run_diffusers_flux,
    run_diffusers_unet,
    unet_rows,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

TOL = 1e-3
UNETS = {"sd1": (SD1_TINY, "sd1"), "sd1_inpaint": (SD1_INPAINT_TINY, "sd1"), "sd2": (SD2_TINY, "sd2"),
         "sdxl": (SDXL_TINY, "sdxl")}  # fmt: skip
FLUXES = {"flux1_dev": FLUX_DEV_TINY, "flux1_schnell": FLUX_SCHNELL_TINY}


@pytest.fixture(scope="module")
def unet_files(tmp_path_factory):
    """name -> (cfg, architecture, {naming: (path, prefix)}, diffusers model)."""
    d = tmp_path_factory.mktemp("unets")
    out = {}
    for name, (cfg, arch) in UNETS.items():
        w = random_weights(unet_rows(cfg), seed=len(name))
        model, dsd = diffusers_unet(cfg, arch, w)
        files = {
            "ldm": (write(d / f"{name}.safetensors", w), PREFIX),
            "ldm_bare": (
                write(d / f"{name}_bare.safetensors", {k[len(PREFIX) :]: v for k, v in w.items()}),
                "",
            ),
            "diffusers": (write(d / f"{name}_diffusers.safetensors", dsd), ""),
        }
        out[name] = (cfg, arch, files, model)
    return out


@pytest.fixture(scope="module")
def flux_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("flux")
    out = {}
    for arch, cfg in FLUXES.items():
        w = random_weights(flux_rows(cfg), seed=len(arch))
        model, dsd = diffusers_flux(cfg, w)
        files = {
            "bfl": write(d / f"{arch}.safetensors", w),
            "diffusers": write(d / f"{arch}_d.safetensors", dsd),
        }
        out[arch] = (cfg, files, model)
    return out


@pytest.mark.parametrize("naming", ["ldm", "ldm_bare", "diffusers"])
@pytest.mark.parametrize("name", list(UNETS))
def test_unet_equals_diffusers(unet_files, name, naming):
    cfg, arch, files, ref = unet_files[name]
    path, prefix = files[naming]
    det = detect_file(str(path))
    assert det.architecture == arch and det.components["unet"].prefix == prefix
    den = denoise.bind(Component("unet", path, prefix), det.architecture)
    assert den.naming == ("diffusers" if naming == "diffusers" else "ldm")
    size = (96, 64)
    inputs = den.random_inputs(*size, batch=2, seed=3)
    assert inputs["x"].shape == (2, cfg.in_channels, 8, 12)
    with torch.inference_mode():
        out = den(inputs)
    want = run_diffusers_unet(ref, inputs, size)
    err = rel_l2(out, want)
    print(f"{name} {naming}: relative L2 {err:.2e}")
    assert out.shape == want.shape and err <= TOL


@pytest.mark.parametrize("naming", ["bfl", "diffusers"])
@pytest.mark.parametrize("arch", list(FLUXES))
def test_flux_equals_diffusers(flux_files, arch, naming):
    cfg, files, ref = flux_files[arch]
    path = files[naming]
    det = detect_file(str(path))
    assert det.architecture == arch
    den = denoise.bind(Component("transformer", path, ""), arch)
    assert den.naming == naming and den.model.heads == 2
    inputs = den.random_inputs(128, 96, seed=5)
    assert inputs["txt"].shape[1] == (512 if arch == "flux1_dev" else 256)
    inputs["txt"], inputs["txt_ids"] = (
        inputs["txt"][:, :64],
        inputs["txt_ids"][:, :64],
    )  # fewer tokens: faster
    assert inputs["img"].shape == (1, 48, 64) and inputs["img_ids"][0, 47].tolist() == [0, 5, 7]
    assert ("guidance" in inputs) == (arch == "flux1_dev")
    with torch.inference_mode():
        out = den(inputs)
    want = run_diffusers_flux(ref, inputs)
    err = rel_l2(out, want)
    print(f"{arch} {naming}: relative L2 {err:.2e}")
    assert out.shape == want.shape and err <= TOL


@pytest.mark.parametrize("which", ["sdxl:ldm", "sd1:diffusers", "flux1_dev:bfl", "flux1_schnell:diffusers"])
def test_op_order_is_the_order_a_forward_calls_the_ops(unet_files, flux_files, which):
    """The streamer reads ahead in `op_order()`: it must be exactly the order of the calls."""
    name, naming = which.split(":")
    if name in UNETS:
        path, prefix = unet_files[name][2][naming]
        c = Component("unet", path, prefix)
        den = denoise.bind(c, UNETS[name][1])
    else:
        c = Component("transformer", flux_files[name][1][naming], "")
        den = denoise.bind(c, name)
    seen = recorded_order(den, c, den.random_inputs(64, 64))
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == len(c.units)  # every module of the file runs, once


def test_inputs_are_checked_by_name_and_shape(unet_files, flux_files):
    path, prefix = unet_files["sdxl"][2]["ldm"]
    den = denoise.bind(Component("unet", path, prefix), "sdxl")
    good = den.random_inputs(64, 64)
    assert set(den.check_inputs(good, "in.safetensors")) == {"x", "timesteps", "context", "y"}
    with pytest.raises(FormatError, match="missing input.*y"):
        den.check_inputs({k: v for k, v in good.items() if k != "y"}, "in.safetensors")
    with pytest.raises(FormatError, match=r"context has shape \[1, 77, 768\]"):
        den.check_inputs({**good, "context": torch.zeros(1, 77, 768)}, "in.safetensors")
    with pytest.raises(FormatError, match="multiples of 8"):
        den.random_inputs(100, 64)
    empty = {k: v[:0] for k, v in good.items()}  # a batch of none: refused, not a crash in a reshape
    with pytest.raises(FormatError, match=r"x has shape \[0, 4, 8, 8\]: it holds no values"):
        den.check_inputs(empty, "in.safetensors")
    with pytest.raises(FormatError, match="x holds NaN or infinite values"):
        den.check_inputs({**good, "x": torch.full_like(good["x"], float("nan"))}, "in.safetensors")
    fden = denoise.bind(Component("transformer", flux_files["flux1_schnell"][1]["bfl"], ""), "flux1_schnell")
    with pytest.raises(FormatError, match="multiples of 16"):
        fden.random_inputs(72, 64)
    bad = fden.random_inputs(64, 64)
    bad["img_ids"] = bad["img_ids"][:, :3]
    with pytest.raises(FormatError, match="img_ids"):
        fden.check_inputs(bad, "in.safetensors")
    # a bare number, or an image of packed patches saved flat: said, not an IndexError
    with pytest.raises(FormatError, match=r"input x is a single number; it needs a batch axis"):
        den.check_inputs({**good, "x": torch.tensor(0.5)}, "in.safetensors")
    flat = fden.random_inputs(64, 64)
    flat["img"] = flat["img"].reshape(-1)
    with pytest.raises(FormatError, match=r"input img has shape \[1024\]; expected \[·, ·, 64\]"):
        fden.check_inputs(flat, "in.safetensors")


def test_an_architecture_without_a_forward_is_refused_by_name(unet_files):
    path, prefix = unet_files["sd1"][2]["ldm"]
    with pytest.raises(UnsupportedModel, match="no forward pass for svd"):
        denoise.bind(Component("unet", path, prefix), "svd")


@pytest.mark.parametrize("naming", ["ldm", "diffusers"])
def test_a_file_with_layers_the_forward_does_not_compute_is_refused(unet_files, tmp_path, naming):
    """Temporal layers beside SD1's blocks (AnimateDiff's motion modules in diffusers UNetMotionModel's
    names; a temporal attention inside an LDM transformer block, as Tune-A-Video adds): an SD1 forward
    that skipped them would run another model than the file's, without a word."""
    from safetensors.torch import load_file

    path, prefix = unet_files["sd1"][2][naming]
    tensors = load_file(str(path))
    width = tensors[prefix + ("input_blocks.0.0.bias" if naming == "ldm" else "conv_in.bias")].shape[0]
    layer = (
        "down_blocks.0.motion_modules.0.proj_in"
        if naming == "diffusers"
        else "input_blocks.1.1.transformer_blocks.0.attn_temp.to_q"
    )
    extra = {
        f"{prefix}{layer}.weight": torch.randn(width, width),
        f"{prefix}{layer}.bias": torch.randn(width),
    }
    moved = write(tmp_path / f"motion_{naming}.safetensors", {**tensors, **extra})
    comp = Component("unet", moved, prefix)
    with pytest.raises(
        UnsupportedModel, match=rf"1 of its layers are not computed by Loadout's sd1 forward \({layer}\)"
    ):
        denoise.bind(comp, "sd1")
    den = denoise.bind(Component("unet", path, prefix), "sd1")  # the file without them binds
    assert den.naming == ("ldm" if naming == "ldm" else "diffusers")
