"""LoRAs in the trainers' namings against an independent peer: diffusers' own converters load the same
file into diffusers' model through PEFT, and that model's output is what `step --lora` must give on
the original-format base (where the module names, fused layers and alpha scaling are Loadout's own
key map). Reduced-depth models, float32, the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="peft (diffusers' LoRA loader; test-only reference) is not installed")

import denoise_files as df  # noqa: E402

from engine import denoise  # noqa: E402
from engine.formats.safetensors import save_tensors  # noqa: E402
from engine.model import Component  # noqa: E402
from engine.requests import StackItem  # noqa: E402

STRENGTH = 0.7


def _kohya(weights: dict, names, seed: int, strip: str = "") -> dict:
    """A rank-4 kohya LoRA (alpha 2) over the 2-D weights and 3x3/1x1 convs `names` picks."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, t in weights.items():
        module = names(key[len(strip) :], t)
        if module is None:
            continue
        o, i, *k = t.shape
        out[f"{module}.lora_down.weight"] = torch.randn(4, i, *k, generator=g) * 0.05
        out[f"{module}.lora_up.weight"] = torch.randn(o, 4, *([1] * len(k)), generator=g) * 0.05
        out[f"{module}.alpha"] = torch.tensor(2.0)
    return out


def _run(base, prefix, component, arch, lora, tmp_path, size):
    runs = df.step_full_and_partial(
        base, tmp_path, 0.0005, loras=(StackItem(str(lora), STRENGTH, STRENGTH),), size=size
    )
    (full, out), (_, streamed) = runs["full"], runs["partial"]
    assert torch.equal(out, streamed)
    (placed,) = full.loras
    assert placed["mapped"] == placed["modules"], placed
    inputs = denoise.bind(Component(component, base, prefix), arch).random_inputs(*size, seed=0)
    return out, inputs


def test_a_kohya_flux_lora_and_its_diffusers_form_step_as_diffusers_loads_them(tmp_path):
    from diffusers.loaders.lora_conversion_utils import _convert_kohya_flux_lora_to_diffusers

    w = df.random_weights(df.flux_rows(df.FLUX_DEV_TINY), seed=4)
    base = df.write(tmp_path / "flux.safetensors", w)
    model, _ = df.diffusers_flux(df.FLUX_DEV_TINY, w)

    def names(key, t):
        # every linear of the blocks, fused q/k/v and the modulations included; not single blocks'
        # linear1, whose split diffusers' converter takes from the real model's widths (3072)
        if t.dim() != 2 or not key.startswith(("double_blocks.", "single_blocks.")) or "linear1" in key:
            return None
        return "lora_unet_" + key[: -len(".weight")].replace(".", "_")

    kohya = _kohya(w, names, seed=9)
    assert len(kohya) // 3 == 24
    diffusers_form = _convert_kohya_flux_lora_to_diffusers({k: v.clone() for k, v in kohya.items()})
    model.load_lora_adapter(dict(diffusers_form), prefix="transformer", adapter_name="k")
    model.set_adapters(["k"], weights=[STRENGTH])
    for form, tensors in (("kohya", kohya), ("diffusers", diffusers_form)):
        lora = tmp_path / f"{form}.safetensors"
        save_tensors(lora, tensors)
        out, inputs = _run(base, "", "transformer", "flux1_dev", lora, tmp_path, (128, 96))
        want = df.run_diffusers_flux(model, inputs)
        assert df.rel_l2(out, want) <= 1e-5, form
    model.set_adapters(["k"], weights=[0.0])
    assert df.rel_l2(df.run_diffusers_flux(model, inputs), want) > 1e-2  # the LoRA does change it


def test_a_kohya_sd1_lora_steps_as_diffusers_loads_it(tmp_path):
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_lora_to_diffusers

    w = df.random_weights(df.unet_rows(df.SD1_TINY), seed=3)
    base = df.write(tmp_path / "sd1.safetensors", w)
    model, dsd = df.diffusers_unet(df.SD1_TINY, "sd1", w)

    def names(key, t):
        # kohya sd-scripts names SD1 modules by their diffusers paths, underscored
        if t.dim() not in (2, 4) or not key.endswith(".weight"):
            return None
        if not any(s in key for s in ("attn", "proj_", "ff.net", "conv", "time_emb")):
            return None
        return "lora_unet_" + key[: -len(".weight")].replace(".", "_")

    kohya = _kohya(dsd, names, seed=11)
    assert len(kohya) // 3 > 60
    converted, alphas = _convert_non_diffusers_lora_to_diffusers({k: v.clone() for k, v in kohya.items()})
    model.load_lora_adapter(converted, prefix="unet", network_alphas=alphas, adapter_name="k")
    model.set_adapters(["k"], weights=[STRENGTH])
    lora = tmp_path / "kohya.safetensors"
    save_tensors(lora, kohya)
    out, inputs = _run(base, df.PREFIX, "unet", "sd1", lora, tmp_path, (96, 64))
    want = df.run_diffusers_unet(model, inputs, (96, 64))
    assert df.rel_l2(out, want) <= 1e-5
    model.set_adapters(["k"], weights=[0.0])
    assert df.rel_l2(df.run_diffusers_unet(model, inputs, (96, 64)), want) > 1e-2  # the LoRA does change it
