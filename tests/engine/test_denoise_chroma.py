"""Chroma's transformer (engine.denoise.flux.Chroma) against diffusers' ChromaTransformer2DModel on the
same weights, reduced width, depth and approximator, float32, CPU (the weights renamed by the facts of
diffusers' `convert_chroma_transformer_checkpoint_to_diffusers`, whose own code fixes the width at
3072); its op order, and a step through the Engine fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    FLUX_DEV_TINY,
    flux_rows,
    flux_to_diffusers,
    random_weights,
    recorded_order,
    rel_l2,
    step_full_and_partial,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

CHROMA_TINY = FLUX_DEV_TINY.with_(guidance_embed=False, chroma=True, approximator_hidden=96)
TOL = 1e-3


@pytest.fixture(scope="module")
def chroma(tmp_path_factory):
    from diffusers import ChromaTransformer2DModel

    c = CHROMA_TINY
    w = random_weights(flux_rows(c), seed=11)
    path = write(tmp_path_factory.mktemp("chroma") / "chroma.safetensors", w)
    ref = ChromaTransformer2DModel(
        patch_size=1, in_channels=c.in_channels, num_layers=c.depth, num_single_layers=c.depth_single_blocks,
        attention_head_dim=c.hidden_size // c.num_heads, num_attention_heads=c.num_heads,
        joint_attention_dim=c.context_in_dim, axes_dims_rope=(16, 56, 56),
        approximator_hidden_dim=c.approximator_hidden,
    )  # fmt: skip
    sd = flux_to_diffusers(w, c.hidden_size)
    ref.load_state_dict(sd, strict=True)
    write(path.with_name("chroma_diffusers.safetensors"), sd)
    return path, ref.eval()


def _inputs(den):
    inputs = den.random_inputs(128, 96, seed=5)
    assert set(inputs) == {"img", "img_ids", "txt", "txt_ids", "timesteps"}  # no pooled vector, no guidance
    inputs["txt"], inputs["txt_ids"] = inputs["txt"][:, :48], inputs["txt_ids"][:, :48]
    return inputs


@pytest.mark.parametrize("naming", ["bfl", "diffusers"])
def test_chroma_equals_diffusers(chroma, naming):
    path, ref = chroma
    if naming == "diffusers":
        path = path.with_name("chroma_diffusers.safetensors")
    det = detect_file(str(path))
    assert det.architecture == "chroma"
    den = denoise.bind(Component("transformer", path, ""), "chroma")
    assert den.naming == naming
    inputs = _inputs(den)
    with torch.inference_mode():
        out = den(inputs)
        want = ref(
            hidden_states=inputs["img"], encoder_hidden_states=inputs["txt"], timestep=inputs["timesteps"],
            img_ids=inputs["img_ids"][0], txt_ids=inputs["txt_ids"][0],
        ).sample  # fmt: skip
    err = rel_l2(out, want)
    print(f"chroma: relative L2 {err:.2e}")
    assert out.shape == want.shape == inputs["img"].shape and err <= TOL


def test_chroma_op_order_is_the_call_order(chroma):
    path, _ = chroma
    c = Component("transformer", path, "")
    den = denoise.bind(c, "chroma")
    seen = recorded_order(den, c, den.random_inputs(64, 64))
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == len(c.units)


def test_chroma_steps_fully_and_partially_alike(chroma, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    runs = step_full_and_partial(chroma[0], tmp_path, 0.004, size=(64, 64), steps=1)
    (full, a), (_, b) = runs["full"], runs["partial"]
    assert (full.architecture, full.output_shape) == ("chroma", (1, 16, 64))
    assert torch.equal(a, b)
