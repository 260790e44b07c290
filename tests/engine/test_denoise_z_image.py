"""Z-Image's transformer (engine.denoise.nextdit) against diffusers' ZImageTransformer2DModel on the same
weights, in diffusers' naming and the release's (fused qkv, ComfyUI's `model.diffusion_model.` prefix),
reduced width (2 heads of 128) and depth, float32, CPU; its op order, a step fully and partially resident,
and what it refuses."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    diffusers_z_image,
    rel_l2,
    run_diffusers_z_image,
    write,
    z_image_original,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

TOL = 1e-3
PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def z_image(tmp_path_factory):
    ref, sd = diffusers_z_image()
    d = tmp_path_factory.mktemp("z_image")
    original = {PREFIX + k: v for k, v in z_image_original(sd).items()}
    return (
        write(d / "z_image_diffusers.safetensors", sd),
        write(d / "z_image_turbo.safetensors", original),
        ref,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "z_image"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "z_image")


def test_z_image_equals_diffusers_in_both_namings(z_image):
    diff_path, orig_path, ref = z_image
    den = _bound(diff_path)
    assert den.naming == "diffusers" and den.input_names == ("x", "t", "cap_feats")
    inputs = den.random_inputs(96, 160, batch=2, seed=1)  # a 6 x 10 patch grid: 60 tokens, padded to 64
    assert inputs["x"].shape == (2, 16, 20, 12) and inputs["cap_feats"].shape == (2, 128, 64)
    inputs["cap_feats"] = inputs["cap_feats"][:, :45]  # 45 caption tokens, padded to 64 inside
    with torch.inference_mode():
        out = den(inputs)
        want = run_diffusers_z_image(ref, inputs)
        original = _bound(orig_path)
        assert original.naming == "original"
        same = original(inputs)
    err = rel_l2(out, want)
    print(f"z_image: relative L2 {err:.2e}")
    assert out.shape == inputs["x"].shape and err <= TOL
    assert rel_l2(same, want) <= TOL


def test_z_image_unpadded_lengths_equal_diffusers(z_image):
    """Sequences already a multiple of 32 tokens take no pad rows (4 x 8 patches, 64 caption tokens)."""
    diff_path, _, ref = z_image
    den = _bound(diff_path)
    inputs = den.random_inputs(64, 128, seed=5)
    inputs["cap_feats"] = inputs["cap_feats"][:, :64]
    with torch.inference_mode():
        assert rel_l2(den(inputs), run_diffusers_z_image(ref, inputs)) <= TOL


def test_z_image_op_order_is_the_call_order(z_image):
    check_op_order(z_image[1], "z_image", PREFIX, plain=2)  # the caption norm and the pad tokens' holder


def test_z_image_steps_fully_and_partially_alike(z_image, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(z_image[1], tmp_path, 0.004, "z_image", (1, 16, 8, 8))


def test_z_image_inputs_say_what_they_expect(z_image):
    den = _bound(z_image[0])
    inputs = den.random_inputs(64, 64)
    inputs["cap_feats"] = torch.zeros(1, 10, 2560)
    with pytest.raises(
        FormatError, match=r"input cap_feats has shape \[1, 10, 2560\]; expected \[·, ·, 64\]"
    ):
        den.check_inputs(inputs, "in.safetensors")


def test_a_gguf_z_image_steps_like_its_dequantized_twin(tmp_path):
    """A Z-Image GGUF as ComfyUI-GGUF writes them (release naming, general.architecture lumina2): the
    blocks' Linears Q8_0, the embedders, norms and pad tokens as they are; the forward equals the
    dequantized twin's."""
    pytest.importorskip("gguf")

    _, sd = diffusers_z_image(seed=7)

    def blocks(k, t):
        return k.endswith(".weight") and t.dim() == 2 and k.startswith(("layers.", "noise_refiner."))

    assert check_gguf_like_its_twin(tmp_path, z_image_original(sd), "lumina2", blocks, "z_image")


@pytest.mark.parametrize("budget", [None, 0.004])
def test_a_diffusers_named_lora_on_the_fused_release_file_equals_diffusers_merged(z_image, tmp_path, budget):
    """An AI-Toolkit-style Z-Image LoRA (diffusers' `attention.to_q/k/v`, `to_out.0`, `feed_forward.w1`)
    on the release's fused-qkv file, fully resident (baked) and partially (the streamed layers patched on
    the fly): the output equals diffusers' model with the LoRA merged into its own weights by hand."""
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import StackItem, Step

    ref, sd = diffusers_z_image()
    g = torch.Generator().manual_seed(11)
    lora, merged, rank, strength = {}, dict(sd), 4, 0.8
    for name in (
        "attention.to_q",
        "attention.to_k",
        "attention.to_v",
        "attention.to_out.0",
        "feed_forward.w1",
    ):
        for block in ("layers.0", "layers.1", "noise_refiner.1"):
            w = sd[f"{block}.{name}.weight"]
            a = torch.randn(rank, w.shape[1], generator=g) / w.shape[1] ** 0.5
            b = torch.randn(w.shape[0], rank, generator=g) * 0.1
            lora[f"diffusion_model.{block}.{name}.lora_A.weight"] = a
            lora[f"diffusion_model.{block}.{name}.lora_B.weight"] = b
            merged[f"{block}.{name}.weight"] = w + strength * (b @ a)  # alpha = rank: scale 1
    lora_path = write(tmp_path / "z_image_lora.safetensors", lora)
    ref.load_state_dict(merged)
    den = _bound(z_image[1])
    inputs = den.random_inputs(64, 96, seed=9)
    inputs["cap_feats"] = inputs["cap_feats"][:, :40]
    in_path = write(tmp_path / "in.safetensors", inputs)
    e = Engine()
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget))
    try:
        r = e.run(Step(str(z_image[1]), loras=(StackItem(str(lora_path), strength),), inputs=str(in_path),
                       out=str(tmp_path / "out.safetensors")))  # fmt: skip
    finally:
        e.close()
    assert r.mode == ("full" if budget is None else "partial")
    out = SafetensorsFile(tmp_path / "out.safetensors").tensor("out")
    with torch.inference_mode():
        want = run_diffusers_z_image(ref, inputs)
        ref.load_state_dict(sd)
        unpatched = run_diffusers_z_image(ref, inputs)
    assert rel_l2(out, want) <= TOL < rel_l2(out, unpatched)


def test_an_odd_latent_is_an_input_error_not_a_damaged_file(z_image):
    den = _bound(z_image[0])
    inputs = dict(den.random_inputs(64, 64), x=torch.zeros(1, 16, 7, 8))
    with pytest.raises(
        FormatError, match=r"input x has shape \[1, 16, 7, 8\]: its height and width must be even"
    ):
        den.check_inputs(inputs, "in.safetensors")


@pytest.mark.parametrize("short", [12, 40], ids=["padded-apart", "padded-alike"])
def test_z_image_captions_of_several_lengths_equal_diffusers(z_image, short):
    """A cond / uncond batch: 45 caption tokens and `short` (12: padded to 64 and 32, the second sequence
    masked in the layers, its image at another frame position; 40: both padded to 64, the second with more
    pad rows), as diffusers' list of unpadded captions."""
    diff_path, _, ref = z_image
    den = _bound(diff_path)
    inputs = den.random_inputs(96, 64, batch=2, seed=7)
    inputs["cap_feats"] = inputs["cap_feats"][:, :45]
    inputs["cap_mask"] = (torch.arange(45)[None] < torch.tensor([[45], [short]])).float()
    with torch.inference_mode():
        out = den(den.check_inputs(inputs, "in.safetensors"))
        frames = [x.unsqueeze(1) for x in inputs["x"]]
        caps = [inputs["cap_feats"][0], inputs["cap_feats"][1, :short]]
        want = torch.stack([o.squeeze(1) for o in ref(frames, inputs["t"], caps, return_dict=False)[0]])
        alone = den(
            {k: v[1:, :short] if k == "cap_feats" else v[1:] for k, v in inputs.items() if k != "cap_mask"}
        )
    assert rel_l2(out, want) <= TOL
    assert rel_l2(out[1:], alone) <= TOL  # the short caption's item as if run alone


def test_pad_tokens_stored_flat_run_the_same(z_image, tmp_path):
    """Some Z-Image GGUF conversions (stable-diffusion.cpp's) store x_pad_token / cap_pad_token as [dim]
    rather than [1, dim] (InvokeAI #8690, ComfyUI-GGUF #392): the same forward (to float32 round-off: the
    two files' tensors sit at other offsets, and the CPU's matrix kernels pick by alignment)."""
    _, sd = diffusers_z_image()
    flat = {k: v.reshape(-1) if k.endswith("pad_token") else v for k, v in z_image_original(sd).items()}
    path = write(tmp_path / "z_image_flat_pads.safetensors", flat)
    den, ref = _bound(path), _bound(z_image[1])
    inputs = den.random_inputs(96, 64, seed=4)
    inputs["cap_feats"] = inputs["cap_feats"][:, :45]  # both sequences padded
    with torch.inference_mode():
        assert rel_l2(den(inputs), ref(inputs)) <= 1e-6
