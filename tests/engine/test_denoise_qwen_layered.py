"""Qwen-Image-Layered (engine.denoise.qwen_image) against diffusers' QwenImageTransformer2DModel with its layered 3-D
RoPE and additional time condition, on the same weights, reduced width and depth, float32, CPU: three layer latents and
an input image of another size; its op order and a step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4


@pytest.fixture(scope="module")
def layered(tmp_path_factory):
    from diffusers import QwenImageTransformer2DModel

    ref, sd = well_scaled(QwenImageTransformer2DModel(num_layers=2, num_attention_heads=2, joint_attention_dim=96,
                                                      use_additional_t_cond=True, use_layer3d_rope=True), 27)  # fmt: skip
    return write(tmp_path_factory.mktemp("layered") / "qwen_image_layered.safetensors", sd), ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "qwen_image"
    return denoise.bind(Component("transformer", path, ""), "qwen_image")


def _diffusers(ref, x: dict) -> torch.Tensor:
    """The layered pipeline's call: the layers packed frame after frame, then the input image; img_shapes of each,
    the input image's last; `additional_t_cond` 0 (is_rgb)."""
    b, c, f, height, width = x["x"].shape

    def pack(t):
        return (
            t.reshape(b, c, t.shape[-2] // 2, 2, t.shape[-1] // 2, 2)
            .permute(0, 2, 4, 1, 3, 5)
            .reshape(b, -1, 4 * c)
        )

    img = torch.cat([*(pack(x["x"][:, :, i]) for i in range(f)), pack(x["ref_latents"])], dim=1)
    rh, rw = x["ref_latents"].shape[-2:]
    shapes = [[*[(1, height // 2, width // 2)] * f, (1, rh // 2, rw // 2)]] * b
    out = ref(hidden_states=img, encoder_hidden_states=x["context"], timestep=x["timesteps"], img_shapes=shapes,
              additional_t_cond=torch.zeros(b, dtype=torch.long)).sample[:, : f * (height // 2) * (width // 2)]  # fmt: skip
    h, w = height // 2, width // 2
    return out.reshape(b, f, h, w, c, 2, 2).permute(0, 4, 1, 2, 5, 3, 6).reshape(b, c, f, height, width)


def test_layered_equals_diffusers(layered):
    path, ref, _ = layered
    den = _bound(path)
    assert den.model.layered
    x = den.random_inputs(64, 96, batch=2, seed=1)
    assert x["x"].shape == (2, 16, 5, 12, 8) and x["ref_latents"].shape == (2, 16, 12, 8)
    g = torch.Generator().manual_seed(2)
    x["x"] = x["x"][:, :, :3]
    x["ref_latents"] = torch.randn(2, 16, 8, 10, generator=g)  # the input image at its own size
    x["context"] = x["context"][:, :20]
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        err = rel_l2(den(x), want)
        print(f"qwen_image layered: relative L2 {err:.2e}")
        assert err <= TOL


def test_layered_op_order_is_the_call_order(layered):
    check_op_order(layered[0], "qwen_image")


def test_layered_steps_fully_and_partially_alike(layered, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(layered[0], tmp_path, 0.004, "qwen_image", (1, 16, 5, 8, 8))
