"""HunyuanVideo 1.5's transformer (engine.denoise.hunyuan_video15) against diffusers'
HunyuanVideo15Transformer3DModel on the same weights, in diffusers' naming, Tencent's (under ComfyUI's prefix) and
ComfyUI's, reduced width and depth, float32, CPU: text-to-video (a zero image) and image-to-video with padded
text and glyph prompts, the MeanFlow variant's second time; its op order, a step fully and partially resident,
and the release layout binding whole."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_steps_alike, recorded_order, rel_l2, write
from hunyuan_files import comfyui, diffusers_hunyuan15, tencent15

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def hunyuan15(tmp_path_factory):
    ref, sd = diffusers_hunyuan15()
    d = tmp_path_factory.mktemp("hunyuan_video15")
    release = tencent15(sd)
    files = {
        "diffusers": write(d / "hunyuanvideo15_diffusers.safetensors", sd),
        "tencent": write(
            d / "hunyuanvideo1.5_720p_i2v.safetensors", {PREFIX + k: v for k, v in release.items()}
        ),
        "comfyui": write(d / "hunyuanvideo1.5_comfy.safetensors", comfyui(release)),
    }
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "hunyuan_video15"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "hunyuan_video15")


def _diffusers(ref, x: dict, image_tokens: int = 729) -> torch.Tensor:
    b = x["x"].shape[0]
    glyph = x.get("byt5_text_states", torch.zeros(b, 4, ref.config.text_embed_2_dim))
    glyph_mask = x.get(
        "byt5_text_mask", torch.zeros(glyph.shape[:2]) if "byt5_text_states" not in x else None
    )
    if glyph_mask is None:
        glyph_mask = torch.ones(glyph.shape[:2])
    image = x.get("vision_states", torch.zeros(b, image_tokens, ref.config.image_embed_dim))
    return ref(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["text_states"],
               encoder_attention_mask=x.get("text_mask", torch.ones(x["text_states"].shape[:2])),
               timestep_r=x.get("timestep_r"), encoder_hidden_states_2=glyph, encoder_attention_mask_2=glyph_mask,
               image_embeds=image).sample  # fmt: skip


def _inputs(den, i2v: bool) -> dict:
    x = den.random_inputs(96, 64, batch=2, seed=1)
    assert x["x"].shape == (2, 9, 1, 4, 6) and x["text_states"].shape == (2, 256, 64)
    g = torch.Generator().manual_seed(2)
    x["x"] = torch.randn(2, 9, 3, 4, 6, generator=g)  # three latent frames
    x["text_states"] = x["text_states"][:, :20]
    x["text_mask"] = torch.ones(2, 20)
    x["text_mask"][0, 13:] = 0
    x["byt5_text_states"] = torch.randn(2, 6, 48, generator=g)
    x["byt5_text_mask"] = torch.tensor([[1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    if i2v:
        x["vision_states"] = torch.randn(2, 9, 40, generator=g)
    return den.check_inputs(x, "inputs")


@pytest.mark.parametrize("i2v", [False, True], ids=["t2v", "i2v"])
def test_the_three_namings_equal_diffusers(hunyuan15, i2v):
    files, ref, _ = hunyuan15
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    x = _inputs(dens["diffusers"], i2v)
    with torch.inference_mode():
        want = _diffusers(ref, x, image_tokens=9)
        for n, den in dens.items():
            err = rel_l2(den(x), want)
            print(f"hunyuan_video15 {'i2v' if i2v else 't2v'} ({n}): relative L2 {err:.2e}")
            assert err <= TOL
        # padding is left out: what the padded text and glyph tokens hold does not reach the output
        x["text_states"][0, 13:] = 40.0
        x["byt5_text_states"][1] = -40.0
        assert rel_l2(dens["tencent"](x), want) <= TOL


def test_without_glyph_text_or_image_it_is_plain_t2v(hunyuan15):
    files, ref, _ = hunyuan15
    den = _bound(files["comfyui"])
    assert den.input_names == ("x", "t", "text_states")
    x = den.random_inputs(32, 48, seed=3)
    with torch.inference_mode():
        assert rel_l2(den(x), _diffusers(ref, x)) <= TOL


def test_the_meanflow_model_takes_its_second_time(tmp_path):
    ref, sd = diffusers_hunyuan15(seed=11, meanflow=True)
    den = _bound(write(tmp_path / "hunyuanvideo15_sr_meanflow.safetensors", tencent15(sd)))
    assert den.model.time_r is not None
    x = den.random_inputs(32, 32, seed=4)
    x["timestep_r"] = torch.tensor([250.0])
    with torch.inference_mode():
        out = den(x)
        assert rel_l2(out, _diffusers(ref, x)) <= TOL
        assert rel_l2(out, den({k: v for k, v in x.items() if k != "timestep_r"})) > 100 * TOL


def test_op_order_is_the_call_order_for_an_image_prompt(hunyuan15):
    """Every unit is fetched once, in op_order()'s order (the image projection too, before the blocks)."""
    c = Component("transformer", hunyuan15[0]["tencent"], PREFIX)
    den = denoise.bind(c, "hunyuan_video15")
    x = den.random_inputs(32, 32)
    x["byt5_text_states"] = torch.randn(1, 4, 48)
    x["vision_states"] = torch.randn(1, 9, 40)
    seen = recorded_order(den, c, x)
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == len(c.units)


def test_steps_fully_and_partially_alike(hunyuan15, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(hunyuan15[0]["tencent"], tmp_path, 0.004, "hunyuan_video15", (1, 4, 1, 4, 4))


def test_the_release_layout_binds_whole(tmp_path):
    """The 8.3B release's layout (54 double blocks at width 2048, ComfyUI's names: header-faithful, no data):
    every layer is one the forward computes with, in 16 heads of 128."""
    from layouts_2026 import video as V

    from engine.formats.safetensors import write_sparse

    rows = V.hunyuan(V.HUNYUAN_VIDEO15).under(PREFIX)
    path = write_sparse(
        tmp_path / "hunyuanvideo1.5_720p_t2v.safetensors", [(k, "BF16", s) for k, s in rows.items()]
    )
    m = _bound(path).model
    assert (m.heads, m.in_channels, m.context_dim, m.byt5_dim, m.image_dim) == (16, 65, 3584, 1472, 1152)
    assert (len(m.doubles), len(m.singles), len(m.refiner)) == (54, 0, 2)
