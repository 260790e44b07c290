"""HunyuanImage 2.1's transformer (engine.denoise.hunyuan_image) against diffusers' HunyuanImageTransformer2DModel on
the same weights, in its three namings, reduced width and depth, float32, CPU: padded text and glyph prompts, the
guidance-distilled and MeanFlow variants; its op order, a step fully and partially resident, and the release layout."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_steps_alike, rel_l2, write
from hunyuan_files import comfyui, diffusers_hunyuan_image, tencent_image

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def hunyuan_image(tmp_path_factory):
    ref, sd = diffusers_hunyuan_image()
    d = tmp_path_factory.mktemp("hunyuan_image")
    release = tencent_image(sd)
    files = {
        "diffusers": write(d / "hunyuanimage21_diffusers.safetensors", sd),
        "tencent": write(d / "hunyuanimage2.1.safetensors", {PREFIX + k: v for k, v in release.items()}),
        "comfyui": write(d / "hunyuanimage2.1_comfy.safetensors", comfyui(release)),
    }
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "hunyuan_image21"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "hunyuan_image21")


def _diffusers(ref, x: dict) -> torch.Tensor:
    b = x["x"].shape[0]
    glyph = x.get("byt5_text_states")
    return ref(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["text_states"],
               encoder_attention_mask=x.get("text_mask", torch.ones(x["text_states"].shape[:2])),
               timestep_r=x.get("timestep_r"), encoder_hidden_states_2=glyph,
               encoder_attention_mask_2=x.get("byt5_text_mask", None if glyph is None else torch.ones(b, glyph.shape[1])),
               guidance=x.get("guidance")).sample  # fmt: skip


def test_the_three_namings_equal_diffusers_with_padded_text_and_glyph_prompts(hunyuan_image):
    files, ref, _ = hunyuan_image
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    assert dens["tencent"].input_names == ("x", "t", "text_states")
    x = dens["tencent"].random_inputs(192, 128, batch=2, seed=1)
    assert x["x"].shape == (2, 8, 4, 6) and x["text_states"].shape == (2, 256, 64)
    g = torch.Generator().manual_seed(2)
    x["text_states"] = x["text_states"][:, :18]
    x["text_mask"] = torch.ones(2, 18)
    x["text_mask"][1, 11:] = 0
    x["byt5_text_states"] = torch.randn(2, 5, 48, generator=g)
    x["byt5_text_mask"] = torch.tensor([[1.0, 1, 1, 0, 0], [0, 0, 0, 0, 0]])
    x = dens["tencent"].check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"hunyuan_image21 ({n}): relative L2 {err:.2e}")
            assert err <= TOL
        x["text_states"][1, 11:] = 30.0
        x["byt5_text_states"][0, 3:] = -30.0  # the padding does not reach the output
        assert rel_l2(dens["comfyui"](x), want) <= TOL


@pytest.mark.parametrize(
    ("guidance", "meanflow"), [(True, False), (False, True)], ids=["distilled", "meanflow"]
)
def test_the_distilled_variants_take_their_inputs(tmp_path, guidance, meanflow):
    ref, sd = diffusers_hunyuan_image(seed=23, guidance=guidance, meanflow=meanflow)
    den = _bound(write(tmp_path / "hunyuanimage2.1_distilled.safetensors", tencent_image(sd)))
    assert den.input_names == ("x", "t", "text_states") + (("guidance",) if guidance else ())
    x = den.random_inputs(64, 96, seed=3)
    x["text_states"] = x["text_states"][:, :12]
    if meanflow:
        x["timestep_r"] = torch.tensor([300.0])
    with torch.inference_mode():
        out = den(x)
        assert rel_l2(out, _diffusers(ref, x)) <= TOL
        if meanflow:  # the second time reaches the output
            assert rel_l2(out, den({k: v for k, v in x.items() if k != "timestep_r"})) > 100 * TOL


def test_op_order_is_the_call_order_with_glyph_text(hunyuan_image):
    from denoise_files import recorded_order

    c = Component("transformer", hunyuan_image[0]["tencent"], PREFIX)
    den = denoise.bind(c, "hunyuan_image21")
    x = den.random_inputs(64, 64)
    x["byt5_text_states"] = torch.randn(1, 4, 48)
    seen = recorded_order(den, c, x)
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()] and len(seen) == len(c.units)


def test_steps_fully_and_partially_alike(hunyuan_image, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(hunyuan_image[0]["tencent"], tmp_path, 0.004, "hunyuan_image21", (1, 8, 2, 2))


def test_the_release_layout_binds_whole(tmp_path):
    """HunyuanImage 2.1 as released (20 double and 40 single blocks at 3584, byT5, ComfyUI's names: header-faithful,
    no data): every layer is one the forward computes with, in 28 heads of 128."""
    from layouts_2026 import video as V

    from engine.formats.safetensors import write_sparse

    rows = V.hunyuan(V.HUNYUAN_IMAGE21).under(PREFIX)
    path = write_sparse(tmp_path / "hunyuanimage2.1.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (m.heads, m.in_channels, m.context_dim, m.byt5_dim, len(m.doubles), len(m.singles)) == (
        28,
        64,
        3584,
        1472,
        20,
        40,
    )
