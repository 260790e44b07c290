"""On-the-fly patches (engine.ops weight functions, as offloaded modules use them) equal baked weights,
per op type, on the SD1.5 layout with the real LoKr (and a norm-diff adapter for the norms)."""

from __future__ import annotations

import pytest
import torch
from lora_fixtures import manifest_entries

from engine import ops
from engine.lora.adapter import adapter_from_tensors, load_adapter
from engine.lora.keymap import KeyMap
from engine.patcher import LoraEntry, ModelPatcher

P = "model.diffusion_model."
CASES = {
    # key prefix -> op factory from the weight shape
    P + "input_blocks.4.1.transformer_blocks.0.attn2.to_k": "linear",  # 640x768, real LoKr
    P + "input_blocks.2.0.in_layers.2": "conv",  # 3x3 conv 320->320, real LoKr
    P + "input_blocks.2.1.proj_in": "conv",  # 1x1 conv, real LoKr
    P + "input_blocks.2.0.in_layers.0": "groupnorm",  # norm diff adapter
    P + "input_blocks.2.1.transformer_blocks.0.norm1": "layernorm",  # norm diff adapter
    "cond_stage_model.transformer.text_model.encoder.layers.3.mlp.fc1": "linear",  # real LoKr, clip strength
}


def _op(kind, w, bias):
    # Castable ops leave parameters uninitialised (weights come from files): every one is set below.
    if kind == "linear":
        return ops.Linear(w.shape[1], w.shape[0], bias=bias, dtype=w.dtype)
    if kind == "conv":
        return ops.Conv2d(
            w.shape[1], w.shape[0], w.shape[2], padding=w.shape[2] // 2, bias=bias, dtype=w.dtype
        )
    if kind == "groupnorm":
        return ops.GroupNorm(32, w.shape[0], dtype=w.dtype)
    return ops.LayerNorm(w.shape[0], dtype=w.dtype)


def _input(kind, w, g):
    if kind == "linear":
        return torch.randn(2, 5, w.shape[1], generator=g)
    if kind in ("conv", "groupnorm"):
        return torch.randn(1, w.shape[0] if kind == "groupnorm" else w.shape[1], 6, 6, generator=g)
    return torch.randn(2, 5, w.shape[0], generator=g)


def _norm_adapter():
    # LyCORIS norm diffs (w_norm / b_norm) in kohya names on a GroupNorm and a LayerNorm.
    g = torch.Generator().manual_seed(7)
    t = {}
    for name in (
        "lora_unet_down_blocks_0_resnets_1_norm1",
        "lora_unet_down_blocks_0_attentions_1_transformer_blocks_0_norm1",
    ):
        t[f"{name}.w_norm"] = (torch.randn(320, generator=g) * 0.1).half()
        t[f"{name}.b_norm"] = (torch.randn(320, generator=g) * 0.1).half()
    return adapter_from_tensors(t, path="norms")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_on_the_fly_equals_baked_per_op_type(shared_data, dtype):
    lokr_path = str(shared_data("weights/smart_falcon_8_lokr.safetensors"))
    adapters = {lokr_path: load_adapter(lokr_path), "norms": _norm_adapter()}
    shapes = {k: tuple(s) for k, _, s in manifest_entries("manifests/sd15_ldm_single_file.json")}
    g = torch.Generator().manual_seed(0)
    base = {}
    for k, s in shapes.items():
        dense = any(k.startswith(prefix + ".") for prefix in CASES)
        if dense and k.endswith((".weight", ".bias")):
            init = torch.randn(*s, generator=g) * 0.05 + (
                1.0 if "norm" in k and k.endswith(".weight") else 0.0
            )
            base[k] = init.to(dtype)
        else:
            base[k] = torch.empty(0, dtype=dtype)
    stack = [LoraEntry(lokr_path, 0.8, 0.6), LoraEntry("norms", 0.7, 1.0)]
    patcher = ModelPatcher(base, loader=adapters.__getitem__, keymap=KeyMap(shapes))
    for f in adapters:
        cov = patcher.coverage(f)
        for n in [n for n, t in cov.placements.items() if base[t.key].numel() == 0]:
            del cov.placements[n]
    # The on-the-fly functions are taken before baking: they see the original weights.
    fns = {k: patcher.weight_function(k, stack) for k in base}
    patcher.apply(stack)
    for prefix, kind in CASES.items():
        wkey, bkey = prefix + ".weight", prefix + ".bias"
        assert fns[wkey] is not None, f"{prefix} is not patched by the stack"
        w = base[wkey]
        has_bias = bkey in shapes
        assert kind in ("linear", "conv") or has_bias
        baked, live = _op(kind, w, has_bias), _op(kind, w, has_bias)
        for op, weights in ((baked, patcher.weights), (live, base)):
            op.weight = torch.nn.Parameter(weights[wkey], requires_grad=False)
            if has_bias:
                op.bias = torch.nn.Parameter(weights[bkey], requires_grad=False)
            op.compute_dtype = torch.float32
        live.weight_functions.append(fns[wkey])
        if fns.get(bkey) is not None:
            live.bias_functions.append(fns[bkey])
        assert not torch.equal(patcher.weights[wkey], base[wkey])  # the patch did something
        x = _input(kind, w, g)
        with torch.no_grad():
            out_baked, out_live = baked(x), live(x)
        assert torch.equal(out_baked, out_live), prefix
        # The function itself reproduces the baked tensor bit for bit.
        assert torch.equal(fns[wkey](base[wkey]), patcher.weights[wkey])
