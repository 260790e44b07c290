"""OFT, BOFT, GLoRA and (IA)³ — the LyCORIS algorithms whose change depends on the weight they patch —
against an independent reference, the lycoris-lora package's own modules: the merged weight LyCORIS
computes for a module equals the one Loadout bakes (and patches on the fly), at several strengths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.errors import FormatError
from engine.lora.adapter import adapter_from_tensors
from engine.lora.coverage import coverage
from engine.lora.describe import describe_lora
from engine.lora.keymap import KeyMap
from engine.patcher import LoraEntry, ModelPatcher

lyc = pytest.importorskip("lycoris.modules", reason="lycoris-lora (test-only reference) is not installed")
from lycoris.modules.boft import ButterflyOFTModule  # noqa: E402
from lycoris.modules.diag_oft import DiagOFTModule  # noqa: E402
from lycoris.modules.glora import GLoRAModule, _glora_weight  # noqa: E402
from lycoris.modules.ia3 import IA3Module  # noqa: E402

ALGOS = {
    "oft": (DiagOFTModule, dict(lora_dim=16, constraint=1e-3, rescaled=True)),
    "oft_plain": (DiagOFTModule, dict(lora_dim=8)),
    "boft": (ButterflyOFTModule, dict(lora_dim=12, constraint=1e-4, rescaled=True)),
    "boft_plain": (ButterflyOFTModule, dict(lora_dim=4)),
    "glora": (GLoRAModule, dict(lora_dim=4, alpha=2)),
    "ia3_out": (IA3Module, {}),
    "ia3_in": (IA3Module, dict(train_on_input=True)),
}


def _lycoris_module(kind: str, org: nn.Module, seed: int):
    cls, kw = ALGOS[kind]
    mod = cls("lora_unet_x", org, 1.0, **kw)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in mod.named_parameters():
            if not n.startswith("org"):  # trained values: LyCORIS initialises them to no change
                p.copy_(torch.randn(p.shape, generator=g) * 0.1 + (1.0 if n == "rescale" else 0.0))
    return mod


def _state(mod, name: str) -> dict[str, torch.Tensor]:
    return {f"{name}.{k}": v.detach().clone() for k, v in mod.state_dict().items()}


def _merged(mod, strength: float):
    with torch.no_grad():
        return mod.get_merged_weight(multiplier=strength)[0].float()


def _rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("kind", sorted(ALGOS))
@pytest.mark.parametrize("layer", ["linear", "conv"])
def test_each_algorithm_bakes_what_lycoris_merges(kind, layer):
    torch.manual_seed(0)
    org = nn.Linear(64, 128) if layer == "linear" else nn.Conv2d(32, 64, 3, padding=1)
    mod = _lycoris_module(kind, org, seed=1)
    m = adapter_from_tensors(_state(mod, "lora_unet_x")).modules["lora_unet_x"]
    assert m.algo == kind.split("_")[0]
    w = org.weight.detach().clone()
    for s in (1.0, 0.5, -0.3):
        want = _merged(mod, s)
        got = m.patch_weight(w, s)
        assert got.shape == w.shape and _rel(got, want) < 1e-6, (kind, s)
    assert torch.equal(m.patch_weight(w, 0.0), w)
    assert torch.equal(w, org.weight)  # the weight handed in is not touched


def test_glora_with_a_tucker_core_and_the_lycoris_1_layout():
    g = torch.Generator().manual_seed(3)
    r = lambda *s: torch.randn(*s, generator=g) * 0.1  # noqa: E731
    w = r(64, 32, 3, 3)
    # Tucker (a 1x1 b2 and a 3x3 core): LyCORIS' own formula, gamma = alpha / rank = 2 / 4
    a1, a2, b1, b2, bm = r(32, 4, 1, 1), r(4, 32, 1, 1), r(64, 4, 1, 1), r(4, 32, 1, 1), r(4, 4, 3, 3)
    t = {"x.a1.weight": a1, "x.a2.weight": a2, "x.b1.weight": b1, "x.b2.weight": b2, "x.bm.weight": bm}
    m = adapter_from_tensors({**t, "x.alpha": torch.tensor(2.0)}).modules["x"]
    want = w + 0.7 * _glora_weight(w, a1, a2, b1, b2, bm, 0.5)
    assert _rel(m.patch_weight(w, 0.7), want) < 1e-6
    # LyCORIS 1 (a1 (r, in), a2 (in, r), b1 (r, in), b2 (out, r)): ΔW = W·a2·a1 + b2·b1
    w = r(48, 40)
    a1, a2, b1, b2 = r(4, 40), r(40, 4), r(4, 40), r(48, 4)
    t = {"x.a1.weight": a1, "x.a2.weight": a2, "x.b1.weight": b1, "x.b2.weight": b2}
    m = adapter_from_tensors({**t, "x.alpha": torch.tensor(8.0)}).modules["x"]
    want = w + 2.0 * (w @ a2 @ a1 + b2 @ b1)
    assert m.rank == 4 and _rel(m.patch_weight(w, 1.0), want) < 1e-6


# Real SD1.5 shapes (the original key names) and the kohya names LyCORIS gives those layers.
P = "model.diffusion_model."
LAYERS = {
    "lora_unet_down_blocks_0_attentions_0_proj_in": (P + "input_blocks.1.1.proj_in.weight", (320, 320, 1, 1)),
    "lora_unet_down_blocks_0_attentions_0_transformer_blocks_0_attn2_to_k": (
        P + "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",
        (320, 768),
    ),
    "lora_unet_down_blocks_0_resnets_0_conv1": (P + "input_blocks.1.0.in_layers.2.weight", (320, 320, 3, 3)),
    "lora_te_text_model_encoder_layers_0_mlp_fc1": (
        "cond_stage_model.transformer.text_model.encoder.layers.0.mlp.fc1.weight",
        (3072, 768),
    ),
}


def _layer(shape):
    if len(shape) == 2:
        return nn.Linear(shape[1], shape[0], bias=False)
    return nn.Conv2d(shape[1], shape[0], shape[2], padding=shape[2] // 2, bias=False)


def _file_and_references(kind: str):
    """A kohya-named LyCORIS file of one algorithm over LAYERS, the base weights (fp16, as files hold
    them) and LyCORIS' modules on those weights."""
    g = torch.Generator().manual_seed(11)
    base, tensors, refs = {}, {}, {}
    for i, (name, (key, shape)) in enumerate(LAYERS.items()):
        base[key] = (torch.randn(*shape, generator=g) * 0.05).half()
        org = _layer(shape)
        with torch.no_grad():
            org.weight.copy_(base[key].float())
        mod = _lycoris_module(kind, org, seed=20 + i)
        tensors.update(_state(mod, name))
        refs[key] = mod
    return base, tensors, refs


@pytest.mark.parametrize("kind", ["oft", "boft", "glora", "ia3_in", "ia3_out"])
def test_a_lycoris_file_maps_bakes_restores_and_patches_on_the_fly(kind):
    base, tensors, refs = _file_and_references(kind)
    shapes = {k: tuple(v.shape) for k, v in base.items()}
    adapter = adapter_from_tensors(tensors, path="lyco")
    algo = kind.split("_")[0]
    assert adapter.info.algos == (algo,) and adapter.info.format == "kohya"
    patcher = ModelPatcher(dict(base), loader={"lyco": adapter}.__getitem__, keymap=KeyMap(shapes))
    cov = patcher.coverage("lyco")
    assert (cov.modules, cov.mapped) == (4, 4), cov.to_json()
    stack = [LoraEntry("lyco", 0.8, 0.6)]
    live = {k: patcher.weight_function(k, stack) for k in base}
    patcher.apply(stack)
    for key, mod in refs.items():
        s = 0.6 if key.startswith("cond_stage_model.") else 0.8
        want = _merged(mod, s)
        baked = patcher.weights[key]
        assert baked.dtype == torch.float16
        assert _rel(baked.float(), want) < 1e-3, key  # fp16 rounding of the merged weight
        assert torch.equal(live[key](base[key]), baked), key  # on the fly: the same bits
    patcher.restore()
    assert all(torch.equal(patcher.weights[k], base[k]) for k in base)


def test_the_header_describes_them_and_coverage_checks_their_shapes():
    _, tensors, _ = _file_and_references("oft")
    info = describe_lora(_Index(tensors))
    assert info.algos == ("oft",) and info.targets == ("unet", "clip_l")
    # rows that no OFT block division covers: a shape mismatch, named, not a patch that fails later
    shapes = {
        P + "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (320, 768),
        P + "input_blocks.1.1.proj_in.weight": (640, 320, 1, 1),
    }
    cov = coverage(_Index(tensors), shapes)
    unet = cov.targets["unet"]
    assert unet.mapped == 1 and [m["module"] for m in unet.shape_mismatch] == [
        "lora_unet_down_blocks_0_attentions_0_proj_in"
    ]


def test_an_ia3_vector_on_the_side_its_flag_does_not_name_is_a_format_error():
    t = {"x.weight": torch.ones(64) * 0.1, "x.on_input": torch.tensor(1)}
    m = adapter_from_tensors(t).modules["x"]
    assert m.algo == "ia3"
    assert m.patch_weight(torch.ones(10, 64), 1.0).sum() == pytest.approx(10 * 64 * 1.1)
    with pytest.raises(FormatError, match=r"x: an \(IA\)³ vector of 64 values for 32 input channels"):
        m.patch_weight(torch.ones(64, 32), 1.0)


@pytest.mark.parametrize(
    ("parts", "why"),
    [
        ({"x.oft_blocks": torch.zeros(4, 8, 6)}, "are not n square blocks"),
        ({"x.oft_blocks": torch.zeros(3, 10, 4, 4)}, "butterfly stages of 4-wide blocks do not divide 40"),
        ({"x.oft_blocks": torch.zeros(4, 8, 8), "x.rescale": torch.ones(31, 1)}, "rescale .* 32 rows"),
        (
            {k: torch.zeros(4, 4) for k in ("x.a1.weight", "x.a2.weight", "x.b1.weight")}
            | {"x.b2.weight": torch.zeros(5, 3)},
            "do not share a rank",
        ),
        ({"x.weight": torch.ones(8), "x.on_input": torch.ones(2)}, "on_input holds 2 values"),
    ],
)
def test_broken_parts_are_refused_when_the_file_is_read(parts, why):
    with pytest.raises(FormatError, match=why):
        adapter_from_tensors(parts, path="bad.safetensors")


class _Index:
    def __init__(self, tensors):
        self.tensors, self.metadata = tensors, {}


NETWORKS = [
    ("sd1", "diag-oft", {"linear_dim": 4}, 0.7),
    ("sd1", "boft", {"linear_dim": 4}, 0.7),
    ("sd1", "glora", {"linear_dim": 4, "linear_alpha": 2}, 0.7),
    ("sd1", "ia3", {}, 0.7),
    # LoKr with LyCORIS' norm modules (w_norm / b_norm on every GroupNorm and LayerNorm)
    ("sd1", "lokr", {"linear_dim": 4, "linear_alpha": 2, "factor": 8, "train_norm": True}, 0.8),
    # FLUX.1 in diffusers' names (SimpleTuner trains so) onto a BFL file: q/k/v land on fused rows
    ("flux1_dev", "diag-oft", {"linear_dim": 8}, 0.7),
    ("flux1_dev", "boft", {"linear_dim": 8}, 0.7),
    ("flux1_dev", "loha", {"linear_dim": 4, "linear_alpha": 2}, 0.7),
    # DoRA at strength 1 (below 1 LyCORIS' forward keeps ΔW whole and scales only the magnitude's
    # step; Loadout moves W toward the decomposed weight, as ComfyUI and A1111 do: strength 0 = W)
    ("flux1_dev", "lokr", {"linear_dim": 4, "linear_alpha": 2, "factor": 8, "dora_wd": True}, 1.0),
]


@pytest.mark.parametrize(("arch", "algo", "kw", "strength"), NETWORKS)
def test_a_whole_network_steps_as_lycoris_runs_it(arch, algo, kw, strength, tmp_path):
    """LyCORIS' own network over every layer of a (reduced) model's blocks, saved as LyCORIS saves it
    (`lycoris_` names over diffusers' modules), running in diffusers' model: `step
    --lora` on the original-format file gives that output, fully resident and streamed alike (bit for
    bit). (LyCORIS' forward, not its merge helper: lycoris-lora 4.1's LohaModule.get_merged_weight
    applies alpha/rank twice, its forward once, as ComfyUI does.)"""
    import denoise_files as df
    from lycoris import LycorisNetwork, create_lycoris

    from engine import denoise
    from engine.formats.safetensors import save_tensors
    from engine.model import Component
    from engine.requests import StackItem

    if arch == "sd1":
        w = df.random_weights(df.unet_rows(df.SD1_TINY), seed=3)
        model, _ = df.diffusers_unet(df.SD1_TINY, "sd1", w)
        blocks, comp, prefix, size = ["Transformer2DModel", "ResnetBlock2D"], "unet", df.PREFIX, (96, 64)
    else:
        w = df.random_weights(df.flux_rows(df.FLUX_DEV_TINY), seed=4)
        model, _ = df.diffusers_flux(df.FLUX_DEV_TINY, w)
        blocks, comp, prefix, size = (
            ["FluxTransformerBlock", "FluxSingleTransformerBlock"],
            "transformer",
            "",
            (128, 96),
        )
    base = df.write(tmp_path / "base.safetensors", w)
    LycorisNetwork.apply_preset(
        {"target_module": blocks, "target_name": [], "module_algo_map": {}, "name_algo_map": {}}
    )
    net = create_lycoris(model, strength, algo=algo, **kw)
    net.apply_to()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "org" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (1.0 if name.endswith("rescale") else 0.0))
    lora = tmp_path / f"{algo}.safetensors"
    save_tensors(lora, {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()})
    runs = df.step_full_and_partial(
        base, tmp_path, 0.0005, loras=(StackItem(str(lora), strength, strength),), size=size
    )
    (full, out), (_, streamed) = runs["full"], runs["partial"]
    inputs = denoise.bind(Component(comp, base, prefix), arch).random_inputs(*size, seed=0)
    if arch == "sd1":
        want = df.run_diffusers_unet(model, inputs, size)
    else:
        want = df.run_diffusers_flux(model, inputs)
    assert df.rel_l2(out, want) <= 1e-5 and torch.equal(out, streamed)
    (placed,) = full.loras
    assert placed["mapped"] == placed["modules"] >= 40, placed


def test_a_t_lora_is_named_and_refused_with_the_reason():
    """T-LoRA masks its ranks by each step's timestep: no fixed weight exists to bake, so it is
    described (algorithm, rank, targets) and refused by name, not taken for "no adapter"."""
    from lycoris.modules.tlora import TLoraModule

    from engine.errors import UnsupportedModel

    mod = TLoraModule("x", nn.Linear(64, 96), 1.0, lora_dim=4, alpha=2)
    t = _state(mod, "lora_unet_down_blocks_0_attentions_0_proj_in")
    info = describe_lora(_Index(t))
    assert info.algos == ("tlora",) and info.rank == 4 and info.targets == ("unet",)
    with pytest.raises(UnsupportedModel, match="T-LoRA .* timestep"):
        adapter_from_tensors(t, path="t.safetensors")
    # its modules land, but coverage says it will not be applied
    cov = coverage(_Index(t), {P + "input_blocks.1.1.proj_in.weight": (96, 64)})
    assert cov.mapped == 1 and "T-LoRA" in cov.warning
