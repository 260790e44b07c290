"""Qwen-Image's transformer (engine.denoise.qwen_image) against diffusers' QwenImageTransformer2DModel on
the same weights (its own state dict: Qwen-Image's one naming), reduced width (2 heads of 128) and
depth, float32, CPU; its positions, op order, and a step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, diffusers_qwen_image, rel_l2, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

TOL = 1e-3


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    ref, sd = diffusers_qwen_image()
    path = write(tmp_path_factory.mktemp("qwen") / "qwen_image.safetensors", sd)
    return path, ref


def test_qwen_image_equals_diffusers(qwen):
    path, ref = qwen
    assert detect_file(str(path)).architecture == "qwen_image"
    den = denoise.bind(Component("transformer", path, ""), "qwen_image")
    inputs = den.random_inputs(96, 160, batch=2, seed=2)  # a 6 x 10 patch grid (odd halves: 3, 5)
    assert inputs["x"].shape == (2, 16, 20, 12) and inputs["context"].shape == (2, 256, 96)
    inputs["context"] = inputs["context"][:, :40]
    b, c, h, w = inputs["x"].shape
    packed = inputs["x"].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)
    with torch.inference_mode():
        out = den(inputs)
        want = ref(
            hidden_states=packed, encoder_hidden_states=inputs["context"], timestep=inputs["timesteps"],
            img_shapes=[(1, h // 2, w // 2)] * b,
        ).sample  # fmt: skip
    want = want.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    err = rel_l2(out, want)
    print(f"qwen_image: relative L2 {err:.2e}")
    assert out.shape == inputs["x"].shape and err <= TOL


def test_qwen_image_op_order_is_the_call_order(qwen):
    check_op_order(qwen[0], "qwen_image")


def test_qwen_image_steps_fully_and_partially_alike(qwen, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(qwen[0], tmp_path, 0.004, "qwen_image", (1, 16, 8, 8))


def _pack(x):
    b, c, h, w = x.shape
    return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)


@pytest.mark.parametrize("zero_cond", [False, True], ids=["edit-2509", "edit-2511"])
def test_qwen_image_edit_with_a_reference_image_equals_diffusers(tmp_path, zero_cond):
    """Qwen-Image-Edit: the reference image's latents (another size than the output's) appended as frame
    1; Edit 2511 (ComfyUI's `__index_timestep_zero__` marker, diffusers' zero_cond_t) modulates them by
    t = 0. Against diffusers' model on the same weights, given both frames' shapes."""
    from diffusers import QwenImageTransformer2DModel

    _, sd = diffusers_qwen_image()
    ref = QwenImageTransformer2DModel(
        num_layers=2, num_attention_heads=2, joint_attention_dim=96, zero_cond_t=zero_cond
    )
    ref.load_state_dict(sd, strict=True)
    ref.eval()
    marker = {"__index_timestep_zero__": torch.zeros(0)} if zero_cond else {}
    path = write(tmp_path / "qwen_image_edit.safetensors", {**sd, **marker})
    den = denoise.bind(Component("transformer", path, ""), "qwen_image")
    inputs = den.random_inputs(96, 160, batch=2, seed=3)
    inputs["context"] = inputs["context"][:, :30]
    inputs["ref_latents"] = torch.randn(2, 16, 16, 8, generator=torch.Generator().manual_seed(5))
    b, c, h, w = inputs["x"].shape
    with torch.inference_mode():
        out = den(den.check_inputs(inputs, "in.safetensors"))
        want = ref(
            hidden_states=torch.cat([_pack(inputs["x"]), _pack(inputs["ref_latents"])], 1),
            encoder_hidden_states=inputs["context"], timestep=inputs["timesteps"],
            img_shapes=[[(1, h // 2, w // 2), (1, 8, 4)]] * b,
        ).sample[:, : (h // 2) * (w // 2)]  # fmt: skip
        plain = den({k: v for k, v in inputs.items() if k != "ref_latents"})
    want = want.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    assert rel_l2(out, want) <= TOL
    assert rel_l2(plain, want) > 10 * TOL  # the reference image changes the output
