"""A GGUF diffusion model as ComfyUI-GGUF stores it (a FLUX.1 transformer at reduced width, its block
weights Q8_0): planned from its quantized bytes, patched by a LoRA on the fly after dequantization,
and stepped like its dequantized safetensors twin."""

from __future__ import annotations

import gguf
import pytest
import torch
from denoise_files import FLUX_DEV_TINY, flux_rows, random_weights, rel_l2, write

from engine import denoise
from engine.devices import DeviceOptions
from engine.facade import Engine
from engine.model import Component
from engine.plan import component_facts
from engine.requests import DetectDevices, Load, SetLoras, StackItem
from tests.support.gguf_files import write_gguf_twin


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(gguf path, dequantized twin path, LoRA path, quantized keys)."""
    d = tmp_path_factory.mktemp("gguf_flux")
    weights = random_weights(flux_rows(FLUX_DEV_TINY), seed=4)
    twin, quantized = write_gguf_twin(
        d / "flux.gguf", weights, "flux",
        lambda k, t: k.endswith(".weight") and t.dim() == 2 and "_blocks." in k and t.shape[1] % 32 == 0,
    )  # fmt: skip
    g = torch.Generator().manual_seed(9)
    lora = {}
    for key in ("double_blocks.0.img_attn.qkv", "single_blocks.1.linear2"):
        out, inp = weights[key + ".weight"].shape
        lora[f"diffusion_model.{key}.lora_down.weight"] = torch.randn(4, inp, generator=g) * 0.1
        lora[f"diffusion_model.{key}.lora_up.weight"] = torch.randn(out, 4, generator=g) * 0.1
    return (
        str(d / "flux.gguf"),
        str(write(d / "twin.safetensors", twin)),
        str(write(d / "lora.safetensors", lora)),
        quantized,
    )


def test_the_plan_counts_the_quantized_bytes(files):
    path, twin, _, quantized = files
    facts, twin_facts = (
        component_facts(path, "", "transformer", None),
        component_facts(twin, "", "transformer", None),
    )
    file_bytes = sum(t.n_bytes for t in gguf.GGUFReader(path).tensors)
    assert sum(facts.unit_sizes) == file_bytes < sum(twin_facts.unit_sizes) / 2
    # Stored in fp16 on a GPU, the float tensors halve; the Q8_0 blocks stay as they are.
    half = component_facts(path, "", "transformer", "float16")
    assert sum(facts.unit_sizes) - sum(half.unit_sizes) == sum(
        t.n_bytes // 2 for t in gguf.GGUFReader(path).tensors if t.name not in quantized
    )


def test_a_lora_patches_a_gguf_model_on_the_fly_like_its_twin(files):
    path, twin, lora, _ = files
    e = Engine()
    e.run(DetectDevices(DeviceOptions()))
    try:
        e.run(Load(path, ("transformer",)))
        e.run(Load(twin, ("transformer",)))
        stack = (StackItem(lora, 0.8, 1.0),)
        got = [e.run(SetLoras(p, stack)) for p in (path, twin)]
        assert [r.patched for r in got] == [2, 2]
        comps = [e.components[(p, "transformer")] for p in (path, twin)]
        q = comps[0].module.get_submodule("double_blocks.0.img_attn.qkv")
        assert q.weight.dtype == torch.uint8  # still the Q8_0 blocks: the patch is computed per op
        x = torch.zeros(1, 1)
        for name in ("double_blocks.0.img_attn.qkv", "single_blocks.1.linear2", "double_blocks.1.img_mlp.0"):
            a, b = (c.module.get_submodule(name).cast_params(x)[0] for c in comps)
            assert torch.equal(a, b), name
        dens = [denoise.bind(c, "flux1_dev") for c in comps]
        inputs = dens[0].random_inputs(64, 64, seed=2)
        inputs["txt"], inputs["txt_ids"] = inputs["txt"][:, :16], inputs["txt_ids"][:, :16]
        with torch.inference_mode():
            out, want = (d(inputs) for d in dens)
        assert rel_l2(out, want) <= 1e-6
        e.run(SetLoras(path, ()))  # revert: the blocks were never touched
        assert not q.weight_functions and q.weight.dtype == torch.uint8
    finally:
        e.close()


def test_a_gguf_component_steps_like_its_twin(files):
    path, twin, _, _ = files
    dens = [
        denoise.bind(Component("transformer", p, "", compute_dtype="float32"), "flux1_dev")
        for p in (path, twin)
    ]
    inputs = dens[0].random_inputs(64, 64, seed=3)
    inputs["txt"], inputs["txt_ids"] = inputs["txt"][:, :16], inputs["txt_ids"][:, :16]
    with torch.inference_mode():
        out, want = (d(inputs) for d in dens)
    assert rel_l2(out, want) <= 1e-6


def test_loadout_step_and_plan_run_on_a_gguf_file(files, cli):
    import json

    path, _, lora, _ = files
    r = cli("step", "--model", path, "--size", "64x64", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert (out["architecture"], out["mode"]) == ("flux1_dev", "full")
    r = cli("plan", "--model", path, "--lora", lora, "--json")
    assert r.returncode == 0, r.stderr
    steps = {s["step"]: s for s in json.loads(r.stdout)["steps"]}
    assert steps["patch"]["detail"]["warnings"] == []  # both modules land on the GGUF's weights


def test_a_step_with_a_lora_on_a_gguf_model_equals_its_twin(files, tmp_path, monkeypatch):
    """Through the Engine's Step, fully resident: the resident modules' patches are baked for the run —
    except a quantized weight's, which is patched per op after dequantizing (never on the blocks)."""
    from engine.formats.safetensors import SafetensorsFile
    from engine.requests import Step

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    path, twin, lora, _ = files
    e = Engine()
    e.run(DetectDevices(DeviceOptions(cpu=True)))
    outs = []
    try:
        for i, p in enumerate((path, twin)):
            out = str(tmp_path / f"{i}.safetensors")
            r = e.run(Step(p, loras=(StackItem(lora, 0.8, 1.0),), size=(64, 64), steps=1, out=out))
            assert r.mode == "full"
            outs.append(SafetensorsFile(out).tensor("out").clone())
    finally:
        e.close()
    assert rel_l2(outs[0], outs[1]) <= 1e-6
