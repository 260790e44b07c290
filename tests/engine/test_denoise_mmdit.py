"""SD3 / SD3.5's MMDiT (engine.denoise.mmdit) against diffusers' SD3Transformer2DModel on the same weights
(converted by diffusers' own single-file converter), reduced depth (2 or 3 joint blocks, so width 128 or
192) and positions, float32, CPU: SD3 (no q/k norm), SD3.5 Large (q/k RMSNorm) and SD3.5 Medium (MMDiT-X,
a second self-attention in the first blocks), each in Stability's and diffusers' naming; the op order; a
step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import random_weights, recorded_order, rel_l2, step_full_and_partial, write

from engine import denoise
from engine.errors import FormatError
from engine.model import Component
from tests.support.synth import mmdit as _mmdit
from tests.support.synth._build import Builder

TOL = 1e-3
CONFIGS = {
    "sd3": _mmdit.MMDiTConfig(depth=2, pos_embed_max_size=16),
    "sd3.5_large": _mmdit.MMDiTConfig(depth=2, pos_embed_max_size=16, qk_norm=True),
    "sd3.5_medium": _mmdit.MMDiTConfig(
        depth=3, pos_embed_max_size=16, qk_norm=True, dual_attention_layers=(0, 1)
    ),
}


def _rows(cfg):
    b = Builder("F32", "model.diffusion_model.")
    _mmdit.mmdit_native(b, cfg)
    return b.rows


@pytest.fixture(scope="module")
def mmdits(tmp_path_factory):
    from diffusers import SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    d = tmp_path_factory.mktemp("mmdit")
    out = {}
    for name, c in CONFIGS.items():
        w = random_weights(_rows(c), seed=len(name))
        native = write(d / f"{name}.safetensors", w)
        sd = convert_sd3_transformer_checkpoint_to_diffusers(dict(w))
        ref = SD3Transformer2DModel(
            sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=c.depth,
            attention_head_dim=64, num_attention_heads=c.depth, joint_attention_dim=4096,
            caption_projection_dim=c.hidden, pooled_projection_dim=2048, pos_embed_max_size=16,
            qk_norm="rms_norm" if c.qk_norm else None, dual_attention_layers=c.dual_attention_layers,
        )  # fmt: skip
        ref.load_state_dict(sd, strict=True)
        out[name] = ({"sai": native, "diffusers": write(d / f"{name}_diffusers.safetensors", sd)}, ref.eval())
    return out


def _bind(path, architecture="sd3"):
    prefix = "model.diffusion_model." if "diffusers" not in path.name else ""
    return denoise.bind(Component("transformer", path, prefix), architecture)


@pytest.mark.parametrize("naming", ["sai", "diffusers"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_mmdit_equals_diffusers(mmdits, name, naming):
    files, ref = mmdits[name]
    den = _bind(files[naming], name)
    assert den.naming == naming and den.model.heads == CONFIGS[name].depth
    inputs = den.random_inputs(96, 64, batch=2, seed=3)
    assert inputs["x"].shape == (2, 16, 8, 12) and inputs["context"].shape == (2, 154, 4096)
    inputs["context"] = inputs["context"][:, :40]  # fewer tokens: faster
    with torch.inference_mode():
        out = den(inputs)
        want = ref(
            hidden_states=inputs["x"], encoder_hidden_states=inputs["context"], pooled_projections=inputs["y"],
            timestep=inputs["t"],
        ).sample  # fmt: skip
    err = rel_l2(out, want)
    print(f"{name} {naming}: relative L2 {err:.2e}")
    assert out.shape == want.shape == inputs["x"].shape and err <= TOL


@pytest.mark.parametrize("naming", ["sai", "diffusers"])
def test_mmdit_op_order_is_the_call_order(mmdits, naming):
    from engine.ops import Castable

    path = mmdits["sd3.5_medium"][0][naming]
    c = Component("transformer", path, "model.diffusion_model." if naming == "sai" else "")
    den = denoise.bind(c, "sd3.5_medium")
    seen = recorded_order(den, c, den.random_inputs(64, 64))
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == sum(isinstance(u.module, Castable) for u in c.units)  # all but pos_embed's holder


def test_positions_are_the_centre_crop_and_sizes_beyond_them_are_refused(mmdits):
    den = _bind(mmdits["sd3"][0]["sai"])
    with pytest.raises(FormatError, match="larger than this model's positions"), torch.inference_mode():
        den(den.random_inputs(272, 64))  # 17 patches wide, 16 known


def test_mmdit_steps_fully_and_partially_alike(mmdits, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    runs = step_full_and_partial(mmdits["sd3.5_large"][0]["sai"], tmp_path, 0.002, size=(64, 64), steps=1)
    (full, a), (_, b) = runs["full"], runs["partial"]
    assert full.output_shape == (1, 16, 8, 8)
    assert torch.equal(a, b)
