"""AuraFlow's transformer (engine.denoise.auraflow) against diffusers' AuraFlowTransformer2DModel on the same
weights, in diffusers' naming and the release's (`double_layers`, ComfyUI's `model.diffusion_model.` prefix,
as Pony V7's files), reduced width (2 heads of 256) and depth, float32, CPU; its op order, a step fully and
partially resident, a GGUF of it, and what it refuses."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from denoise_files import (
    auraflow_release,
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    diffusers_auraflow,
    rel_l2,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def auraflow(tmp_path_factory):
    ref, sd = diffusers_auraflow()
    d = tmp_path_factory.mktemp("auraflow")
    release = {PREFIX + k: v for k, v in auraflow_release(sd).items()}
    return write(d / "auraflow_diffusers.safetensors", sd), write(d / "pony_v7.safetensors", release), ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "auraflow"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "auraflow")


def _diffusers(ref, inputs: dict) -> torch.Tensor:
    return ref(
        hidden_states=inputs["x"], encoder_hidden_states=inputs["context"], timestep=inputs["t"]
    ).sample


def test_auraflow_equals_diffusers_in_both_namings(auraflow):
    diff_path, release_path, ref, _ = auraflow
    den = _bound(diff_path)
    assert den.naming == "diffusers" and den.input_names == ("x", "t", "context")
    inputs = den.random_inputs(
        96, 160, batch=2, seed=1
    )  # a 6 x 10 patch grid, off the position grid's centre
    assert inputs["x"].shape == (2, 4, 20, 12) and inputs["context"].shape == (2, 256, 64)
    inputs["context"] = inputs["context"][:, :40]
    with torch.inference_mode():
        out, want = den(inputs), _diffusers(ref, inputs)
        release = _bound(release_path)
        assert release.naming == "release"
        same = release(inputs)
    err = rel_l2(out, want)
    print(f"auraflow: relative L2 {err:.2e}")
    assert out.shape == inputs["x"].shape and err <= TOL
    assert rel_l2(same, want) <= TOL


def test_auraflow_op_order_is_the_call_order(auraflow):
    check_op_order(auraflow[1], "auraflow", PREFIX, plain=1)  # the root: positions and register tokens


def test_auraflow_steps_fully_and_partially_alike(auraflow, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(auraflow[1], tmp_path, 0.004, "auraflow", (1, 4, 8, 8))


def test_a_gguf_auraflow_steps_like_its_dequantized_twin(tmp_path, auraflow):
    """ComfyUI-GGUF's `aura` files: the layers' weights Q8_0, the tables in float."""
    pytest.importorskip("gguf")
    weights = auraflow_release(auraflow[3])
    quantized = check_gguf_like_its_twin(tmp_path, weights, "aura", lambda k, t: t.dim() == 2, "auraflow")
    assert "double_layers.0.attn.w2q.weight" in quantized


def test_a_grid_beyond_the_positions_is_refused(auraflow):
    """In the forward and from the command line: a message with the largest size, no traceback."""
    den = _bound(auraflow[0])
    inputs = den.random_inputs(16 * 18, 64)  # 18 patches across a 16-wide position grid
    with pytest.raises(FormatError, match=r"288×64 px image .* larger than this model's positions .* 256 px"):
        den(inputs)
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(auraflow[1]), "--size", "512x512"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "256 px a side): choose a smaller size" in r.stderr


def test_a_layer_the_forward_does_not_compute_is_refused(auraflow, tmp_path):
    sd = dict(auraflow[3])
    sd["joint_transformer_blocks.0.attn.extra.weight"] = torch.zeros(512, 512)
    path = write(tmp_path / "edited.safetensors", sd)
    with pytest.raises(UnsupportedModel, match="not computed by Loadout's auraflow forward"):
        _bound(path)


def _step(model, lora_path, strength, inputs_path, out_path, budget):
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import StackItem, Step

    e = Engine()
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget))
    try:
        r = e.run(Step(str(model), loras=(StackItem(str(lora_path), strength),), inputs=str(inputs_path),
                       out=str(out_path)))  # fmt: skip
    finally:
        e.close()
    assert r.mode == ("full" if budget is None else "partial")
    assert r.loras and r.loras[0]["mapped"] > 0, r.loras
    return SafetensorsFile(out_path).tensor("out")


@pytest.mark.parametrize("budget", [None, 0.004])
def test_a_diffusers_named_lora_on_the_release_file_equals_diffusers_merged(auraflow, tmp_path, budget):
    """A PEFT-named LoRA as diffusers' and ai-toolkit's AuraFlow / Pony V7 trainers save it (`transformer.` +
    diffusers' module names, the final modulation `norm_out.linear` among them, whose halves the release
    holds the other way round) on the release's file, fully resident (baked) and partially (on the fly):
    equal to diffusers' model with the LoRA merged into its own weights by hand."""
    _, release_path, ref, sd = auraflow
    g = torch.Generator().manual_seed(11)
    lora, merged, rank, strength = {}, dict(sd), 4, 0.8
    names = [
        f"joint_transformer_blocks.{i}.{n}"
        for i in (0, 1)
        for n in ("attn.to_q", "attn.add_k_proj", "attn.to_add_out", "ff_context.linear_1", "norm1.linear")
    ]
    names += ["single_transformer_blocks.1.attn.to_v", "single_transformer_blocks.0.ff.out_projection",
              "norm_out.linear", "context_embedder"]  # fmt: skip
    for name in names:
        w = sd[f"{name}.weight"]
        a = torch.randn(rank, w.shape[1], generator=g) / w.shape[1] ** 0.5
        b = torch.randn(w.shape[0], rank, generator=g) * 0.1
        lora[f"transformer.{name}.lora_A.weight"] = a
        lora[f"transformer.{name}.lora_B.weight"] = b
        merged[f"{name}.weight"] = w + strength * (b @ a)  # no alpha: scale 1
    lora_path = write(tmp_path / "pony_lora.safetensors", lora)
    den = _bound(release_path)
    inputs = den.random_inputs(64, 96, seed=9)
    inputs["context"] = inputs["context"][:, :40]
    in_path = write(tmp_path / "in.safetensors", inputs)
    out = _step(release_path, lora_path, strength, in_path, tmp_path / "out.safetensors", budget)
    with torch.inference_mode():
        ref.load_state_dict(merged)
        want = _diffusers(ref, inputs)
        ref.load_state_dict(sd)
        unpatched = _diffusers(ref, inputs)
    assert rel_l2(out, want) <= TOL < rel_l2(out, unpatched)


def test_a_release_named_lora_on_a_diffusers_file_lands_too(auraflow, tmp_path):
    """The other way round: a kohya-style LoRA in the release's names (`lora_unet_double_layers_0_attn_w1q`, and
    the final `modF.1`) on diffusers' file equals the release-named base with the same LoRA."""
    diff_path, release_path, _, sd = auraflow
    release = auraflow_release(sd)
    g = torch.Generator().manual_seed(12)
    lora = {}
    for name in (
        "double_layers.0.attn.w1q",
        "double_layers.1.mlpX.c_fc2",
        "single_layers.0.modCX.1",
        "modF.1",
    ):
        w = release[f"{name}.weight"]
        lora[f"lora_unet_{name.replace('.', '_')}.lora_down.weight"] = (
            torch.randn(4, w.shape[1], generator=g) * 0.1
        )
        lora[f"lora_unet_{name.replace('.', '_')}.lora_up.weight"] = (
            torch.randn(w.shape[0], 4, generator=g) * 0.1
        )
        lora[f"lora_unet_{name.replace('.', '_')}.alpha"] = torch.tensor(4.0)
    lora_path = write(tmp_path / "kohya.safetensors", lora)
    inputs = _bound(release_path).random_inputs(64, 64, seed=2)
    inputs["context"] = inputs["context"][:, :24]
    in_path = write(tmp_path / "in.safetensors", inputs)
    outs = [_step(p, lora_path, 1.0, in_path, tmp_path / f"out{i}.safetensors", None)
            for i, p in enumerate((diff_path, release_path))]  # fmt: skip
    with torch.inference_mode():
        plain = _bound(release_path)(inputs)
    assert rel_l2(outs[0], outs[1]) <= 1e-5 < rel_l2(outs[1], plain)
