"""A LoRA trained on a fused release module (musubi-tuner / kohya / diffusion-pipe names: Z-Image's `attention.qkv`,
Hunyuan-DiT's `Wqkv` and `kv_proj`, Mochi's `qkv_x` / `qkv_y`, Wan Animate's `linear1_kv`, MiniMax-H3's `qkv_proj`,
Qwen-Image 2.1's ComfyUI `gate_up`) on a diffusers-named base, whose weights are the fused one's row blocks: mapped once, placed on every
split weight, each baked as the fused merge cut by rows (the reference fuses the base's weights, adds the fused ΔW
and splits again), restored bit-exactly; a step with it equals the release-named file's step with the same LoRA."""

from __future__ import annotations

import json

import pytest
import torch
from denoise_files import diffusers_z_image, lora_step, rel_l2, write, z_image_original

from engine.jobs import CancelToken
from engine.lora.adapter import adapter_from_tensors
from engine.lora.keymap import KeyMap
from engine.patcher import LoraEntry, ModelPatcher

_Q = tuple("qkv")


def _z_image():
    ref, sd = diffusers_z_image()
    return sd, z_image_original(sd), "z_image"


def _hunyuan_dit():
    from test_denoise_hunyuan_dit import diffusers_hunyuan, release

    _, sd = diffusers_hunyuan(False, 41)
    return sd, release(sd), "hunyuan_dit"


def _mochi():
    from test_denoise_mochi import diffusers_mochi, release

    _, sd = diffusers_mochi()
    return sd, release(sd), "mochi"


def _wan_animate():
    import diffusers
    from test_denoise_wan_animate import (
        APP,
        FACE,
        TINY,
        _converted,
        _diffusers_config,
        _load,
        _release_weights,
    )

    w = _release_weights(TINY, FACE, seed=1)
    ref = diffusers.WanAnimateTransformer3DModel(**_diffusers_config(TINY, **FACE)).eval()
    _load(ref, _converted(w, conv_out=f"{APP}.4.weight"))
    return {k: v.contiguous() for k, v in ref.state_dict().items()}, w, "wan22"


def _qwen_image21():
    from test_denoise_qwen_image21 import comfy, diffusers_q21

    _, sd = diffusers_q21()
    return sd, comfy(sd), "qwen_image21"


def _minimax_h3():
    from test_denoise_minimax_h3 import diffusers_minimax, release

    ref, sd = diffusers_minimax()
    return sd, release(ref, sd), "minimax_h3"


# family -> (its builder, fused release module -> the diffusers modules its rows are, in order)
FAMILIES = {
    "z_image": (_z_image, {"layers.1.attention.qkv": tuple(f"layers.1.attention.to_{c}" for c in _Q),
                           "noise_refiner.0.attention.qkv": tuple(f"noise_refiner.0.attention.to_{c}" for c in _Q)}),
    "hunyuan_dit": (_hunyuan_dit, {"blocks.0.attn1.Wqkv": tuple(f"blocks.0.attn1.to_{c}" for c in _Q),
                                   "blocks.3.attn2.kv_proj": ("blocks.3.attn2.to_k", "blocks.3.attn2.to_v")}),
    "mochi": (_mochi, {"blocks.0.attn.qkv_x": tuple(f"transformer_blocks.0.attn1.to_{c}" for c in _Q),
                       "blocks.1.attn.qkv_y": tuple(f"transformer_blocks.1.attn1.add_{c}_proj" for c in _Q)}),
    "wan_animate": (_wan_animate, {"face_adapter.fuser_blocks.1.linear1_kv": ("face_adapter.1.to_k",
                                                                              "face_adapter.1.to_v")}),
    "minimax_h3": (_minimax_h3, {"blocks.1.attn.qkv_proj": tuple(f"transformer_blocks.1.attn.to_{c}" for c in _Q),
                                 "token_refiner.blocks.0.attn.qkv_proj": tuple(f"token_refiner.refiner_blocks.0.attn.to_{c}" for c in _Q)}),
    "qwen_image21": (_qwen_image21, {"transformer_blocks.1.img_mlp.gate_up": ("transformer_blocks.1.img_mlp.gate_layer",
                                                                              "transformer_blocks.1.img_mlp.proj")}),
}  # fmt: skip
_BUILT: dict = {}


def built(family: str):
    if family not in _BUILT:
        _BUILT[family] = FAMILIES[family][0]()
    return _BUILT[family]


def fused_lora(sd: dict, fused: dict, prefix: str, seed: int, rank: int = 4, alpha: float = 2.0) -> dict:
    """A kohya-style LoRA (lora_down / lora_up / alpha) on each fused module, named `prefix` + its release path."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, pieces in fused.items():
        rows = sum(sd[f"{p}.weight"].shape[0] for p in pieces)
        cols = sd[f"{pieces[0]}.weight"].shape[1]
        k = prefix + (name.replace(".", "_") if prefix.endswith("_") else name)
        out[f"{k}.lora_down.weight"] = torch.randn(rank, cols, generator=g) / cols**0.5
        out[f"{k}.lora_up.weight"] = torch.randn(rows, rank, generator=g) * 0.1
        out[f"{k}.alpha"] = torch.tensor(alpha)
    return out


def reference(sd: dict, pieces: tuple[str, ...], patch) -> dict:
    """The split weights after `patch` (fused weight -> patched fused weight): fuse, patch, split again."""
    ws = [sd[f"{p}.weight"].double() for p in pieces]
    merged = patch(torch.cat(ws)).split([w.shape[0] for w in ws])
    return {f"{p}.weight": m for p, m in zip(pieces, merged, strict=True)}


def _patcher(sd: dict, tensors: dict) -> ModelPatcher:
    adapter = adapter_from_tensors(tensors, path="fused")
    return ModelPatcher({k: v.clone() for k, v in sd.items()}, loader=lambda f: adapter)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_fused_release_lora_bakes_onto_the_split_weights(family):
    sd, _, _ = built(family)
    fused = FAMILIES[family][1]
    strength, tensors = 0.7, fused_lora(sd, fused, "lora_unet_", seed=3)
    p = _patcher(sd, tensors)
    cov = p.coverage("fused")
    assert (cov.modules, cov.mapped) == (len(fused), len(fused)), cov.to_json()
    keys = {f"{q}.weight" for pieces in fused.values() for q in pieces}
    assert {t.key for ts in cov.split.values() for t in ts} == keys
    j = cov.to_json()
    assert j["weights"] == len(keys) and sum(
        len(v) for t in j["targets"].values() for v in t["split"].values()
    ) == len(keys)
    originals = dict(p.weights)
    p.apply([LoraEntry("fused", strength)])
    assert set(p.patched_keys) == keys
    for name, pieces in fused.items():
        k = "lora_unet_" + name.replace(".", "_")
        up, down = tensors[f"{k}.lora_up.weight"].double(), tensors[f"{k}.lora_down.weight"].double()
        want = reference(sd, pieces, lambda w, u=up, d=down: w + strength * 0.5 * (u @ d))
        for key, w in want.items():
            torch.testing.assert_close(p.weights[key].double(), w, rtol=0, atol=1e-6)
    p.restore()
    assert all(p.weights[k] is originals[k] for k in originals)


def _more_tables():
    """The tables with fused modules the other tests leave out (PixArt, Sana, Lumina 2's grouped-query qkv), built
    on the meta device (shapes only): (diffusers' state dict, the release's, fused module -> its pieces)."""
    from denoise_files import lumina2_original
    from diffusers import Lumina2Transformer2DModel, PixArtTransformer2DModel, SanaTransformer2DModel
    from test_denoise_pixart import release as pixart_release
    from test_denoise_sana import release as sana_release

    with torch.device("meta"):
        px = PixArtTransformer2DModel(
            num_attention_heads=2,
            attention_head_dim=72,
            in_channels=4,
            out_channels=8,
            num_layers=1,
            cross_attention_dim=144,
            caption_channels=64,
            sample_size=128,
        )
        sa = SanaTransformer2DModel(
            in_channels=8,
            out_channels=8,
            num_attention_heads=2,
            attention_head_dim=32,
            num_layers=1,
            num_cross_attention_heads=2,
            cross_attention_head_dim=32,
            cross_attention_dim=64,
            caption_channels=64,
        )
        lu = Lumina2Transformer2DModel(hidden_size=192, num_layers=2, num_attention_heads=2, num_kv_heads=1,
                                       cap_feat_dim=64)  # fmt: skip
    px, sa, lu = (m.state_dict() for m in (px, sa, lu))
    cross = {"blocks.0.attn.qkv": tuple(f"transformer_blocks.0.attn1.to_{c}" for c in _Q),
             "blocks.0.cross_attn.kv_linear": ("transformer_blocks.0.attn2.to_k", "transformer_blocks.0.attn2.to_v")}  # fmt: skip
    lumina = {"layers.0.attention.qkv": tuple(f"layers.0.attn.to_{c}" for c in _Q),
              "context_refiner.1.attention.qkv": tuple(f"context_refiner.1.attn.to_{c}" for c in _Q)}  # fmt: skip
    return [
        (px, pixart_release(px), cross),
        (sa, sana_release(sa), cross),
        (lu, lumina2_original(lu), lumina),
    ]


def test_the_split_keymap_agrees_with_the_fused_one():
    """Both directions of one table: on the release-named base each diffusers name reaches the rows of the fused
    weight that, on the diffusers-named base, the fused name places on that diffusers weight."""
    cases = [(*built(f)[:2], FAMILIES[f][1]) for f in FAMILIES] + _more_tables()
    for sd, rel, fused in cases:
        family = next(iter(fused))
        split = KeyMap({k: tuple(v.shape) for k, v in sd.items()})
        whole = KeyMap({k: tuple(v.shape) for k, v in rel.items()})
        for name in fused:
            pieces = split.resolve_split(f"diffusion_model.{name}")
            assert pieces and split.resolve(f"diffusion_model.{name}") is None, (family, name)
            for t in pieces:
                other = whole.resolve("transformer." + t.key.removesuffix(".weight"))
                assert other is not None and other.view == ("rows", *t.change_rows), (family, t)
            assert whole.resolve_split(f"diffusion_model.{name}") is None


def _hdit_module(sd: dict, parts: dict) -> dict:
    return {f"lycoris_blocks_0_attn1_Wqkv.{k}": v for k, v in parts.items()}


PIECES = tuple(f"blocks.0.attn1.to_{c}" for c in _Q)


def _lycoris_case(parts: dict, strength: float = 0.6):
    """(the patcher over Hunyuan-DiT's diffusers weights, the module placed on its split q / k / v, the reference:
    our own one-to-one patch of the fused weight, split)."""
    sd, _, _ = built("hunyuan_dit")
    p = _patcher(sd, _hdit_module(sd, parts))
    cov = p.coverage("fused")
    module = p.adapter("fused").modules["lycoris_blocks_0_attn1_Wqkv"]
    want = reference(sd, PIECES, lambda w: module.patch_weight(w.float(), strength).double())
    return p, cov, want


def _rand(*shape, seed: int, scale: float = 0.1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("algo", ["loha", "ia3", "ia3_input", "oft", "lokr", "dora", "glora"])
def test_lycoris_modules_on_a_fused_module_split_by_rows(algo):
    rows, cols = 3 * 176, 176
    parts = {
        "loha": {"hada_w1_a": _rand(rows, 2, seed=1), "hada_w1_b": _rand(2, cols, seed=2),
                 "hada_w2_a": _rand(rows, 2, seed=3), "hada_w2_b": _rand(2, cols, seed=4), "alpha": torch.tensor(2.0)},
        "ia3": {"weight": _rand(rows, seed=5), "on_input": torch.tensor(False)},
        "ia3_input": {"weight": _rand(cols, seed=5), "on_input": torch.tensor(True)},
        "oft": {"oft_blocks": _rand(rows // 16, 16, 16, seed=6), "alpha": torch.tensor(0.0)},
        "lokr": {"lokr_w1": _rand(4, 4, seed=7), "lokr_w2": _rand(rows // 4, cols // 4, seed=8)},
        "dora": {"lora_up.weight": _rand(rows, 4, seed=9), "lora_down.weight": _rand(4, cols, seed=10),
                 "dora_scale": 1 + _rand(rows, 1, seed=11)},
        "glora": {"a1.weight": _rand(cols, 2, seed=12), "a2.weight": _rand(2, cols, seed=13),
                  "b1.weight": _rand(rows, 2, seed=14), "b2.weight": _rand(2, cols, seed=15), "alpha": torch.tensor(2.0)},
    }[algo]  # fmt: skip
    p, cov, want = _lycoris_case(parts)
    assert cov.mapped == 1 and [t.key for t in cov.split["lycoris_blocks_0_attn1_Wqkv"]] == [
        f"{q}.weight" for q in PIECES
    ]
    originals = dict(p.weights)
    p.apply([LoraEntry("fused", 0.6)])
    for key, w in want.items():
        assert not torch.equal(p.weights[key], originals[key])
        torch.testing.assert_close(p.weights[key].double(), w, rtol=0, atol=2e-6)
    p.restore()
    assert all(p.weights[k] is originals[k] for k in originals)


@pytest.mark.parametrize("algo", ["oft_straddling", "boft", "dora_input"])
def test_what_mixes_rows_across_the_fused_weight_is_refused_with_a_reason(algo):
    rows, cols = 3 * 176, 176
    parts = {
        "oft_straddling": {"oft_blocks": _rand(rows // 48, 48, 48, seed=1)},  # 176 is no multiple of 48
        "boft": {"oft_blocks": _rand(2, rows // 8, 8, 8, seed=2)},
        "dora_input": {"lora_up.weight": _rand(rows, 4, seed=3), "lora_down.weight": _rand(4, cols, seed=4),
                       "dora_scale": 1 + _rand(1, cols, seed=5)},
    }[algo]  # fmt: skip
    sd, _, _ = built("hunyuan_dit")
    p = _patcher(sd, _hdit_module(sd, parts))
    cov = p.coverage("fused")
    (bad,) = cov.targets["transformer"].shape_mismatch
    assert (
        cov.mapped == 0 and not cov.split and bad["keys"] == [f"{q}.weight" for q in PIECES] and bad["reason"]
    )
    assert p.apply([LoraEntry("fused")]).patched == []


def test_a_full_diff_with_its_bias_splits_and_a_cancel_leaves_the_weights():
    """A LyCORIS full diff of kv_proj with diff_b: each of to_k / to_v gets its rows of both; an apply cancelled
    after its first key leaves every weight the tensor it was."""
    sd, _, _ = built("hunyuan_dit")
    d = _rand(2 * 176, sd["blocks.3.attn2.to_k.weight"].shape[1], seed=1)
    b = _rand(2 * 176, seed=2)
    p = _patcher(sd, {"lycoris_blocks_3_attn2_kv_proj.diff": d, "lycoris_blocks_3_attn2_kv_proj.diff_b": b})
    before = dict(p.weights)
    token = CancelToken()
    with pytest.raises(Exception, match="ancel"):
        p.apply([LoraEntry("fused")], token=token, report=lambda _: token.cancel())
    assert all(p.weights[k] is before[k] for k in before)
    p.apply([LoraEntry("fused")])
    for i, c in enumerate("kv"):
        rows = slice(i * 176, (i + 1) * 176)
        torch.testing.assert_close(
            p.weights[f"blocks.3.attn2.to_{c}.weight"], sd[f"blocks.3.attn2.to_{c}.weight"] + d[rows]
        )
        torch.testing.assert_close(
            p.weights[f"blocks.3.attn2.to_{c}.bias"], sd[f"blocks.3.attn2.to_{c}.bias"] + b[rows]
        )


STEP_SIZES = {"z_image": (64, 64), "hunyuan_dit": (96, 96), "mochi": (64, 64), "qwen_image21": (64, 64),
              "wan_animate": None, "minimax_h3": (64, 64)}  # fmt: skip


def _inputs(family: str, den) -> dict:
    if family == "wan_animate":  # a clip with its pose latents and face video
        from test_denoise_wan_animate import _clip

        return _clip(den, frames=4, seed=5)
    return den.random_inputs(*STEP_SIZES[family], seed=5)


@pytest.mark.parametrize("family", list(STEP_SIZES))
@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_step_on_the_diffusers_file_equals_the_release_files(family, budget, tmp_path):
    """The same fused-module LoRA (diffusion-pipe's `diffusion_model.` names) on the diffusers-named file and on the
    release-named one, baked (resident) and on the fly (streamed): the same output, the LoRA's change well above
    the two namings' rounding."""
    from engine import denoise
    from engine.model import Component

    sd, rel, arch = built(family)
    files = {n: write(tmp_path / f"{n}.safetensors", w) for n, w in (("diffusers", sd), ("release", rel))}
    prefix = "model.diffusion_model." if family == "qwen_image21" else ""
    den = denoise.bind(Component("transformer", str(files["release"]), prefix, compute_dtype="float32"), arch)
    x = {k: v.contiguous() for k, v in _inputs(family, den).items()}
    lora = fused_lora(sd, FAMILIES[family][1], "diffusion_model.", seed=9, alpha=4.0)
    outs = {}
    for n, path in files.items():
        (tmp_path / n).mkdir()
        r, outs[n] = lora_step(path, lora, 1.0, x, tmp_path / n, budget)
        assert r.loras[0]["mapped"] == len(FAMILIES[family][1]), r.loras
    with torch.inference_mode():
        plain = den(x)
    err = rel_l2(outs["diffusers"], outs["release"])
    print(
        f"{family} (budget {budget}): relative L2 {err:.2e}, the LoRA's change {rel_l2(outs['release'], plain):.2e}"
    )
    assert err <= 1e-5 and rel_l2(outs["release"], plain) > 1e-3


def test_a_split_weight_held_with_its_halves_swapped_gets_its_rows_swapped():
    """A piece reached through a ("swap",) view (a split weight whose halves diffusers holds the other way round;
    no table lists one yet): its rows of the change land swapped, baked as on the fly (weight_function)."""
    from dataclasses import replace

    sd, _, _ = built("hunyuan_dit")
    tensors = fused_lora(
        sd, {"blocks.3.attn2.kv_proj": ("blocks.3.attn2.to_k", "blocks.3.attn2.to_v")}, "lycoris_", 4
    )
    km = KeyMap({k: tuple(v.shape) for k, v in sd.items()})
    k, v = km.splits["lycoris_blocks_3_attn2_kv_proj"]
    km.splits["lycoris_blocks_3_attn2_kv_proj"] = (k, replace(v, view=("swap",)))
    adapter = adapter_from_tensors(tensors, path="fused")
    p = ModelPatcher({n: t.clone() for n, t in sd.items()}, loader=lambda f: adapter, keymap=km)
    up, down = (
        tensors["lycoris_blocks_3_attn2_kv_proj.lora_up.weight"],
        tensors["lycoris_blocks_3_attn2_kv_proj.lora_down.weight"],
    )
    delta = 0.5 * (up @ down)[176:]
    key = "blocks.3.attn2.to_v.weight"
    on_the_fly = p.weight_function(key, [LoraEntry("fused")])(sd[key])
    p.apply([LoraEntry("fused")])
    torch.testing.assert_close(p.weights[key], sd[key] + torch.cat([delta[88:], delta[:88]]))
    assert torch.equal(on_the_fly, p.weights[key])


def test_lora_inspect_says_a_fused_module_is_split(cli, tmp_path):
    """`loadout lora inspect`: the JSON counts the fused module mapped once, with its weights; the text says so."""
    sd, _, _ = built("hunyuan_dit")
    fused = {"blocks.0.attn1.Wqkv": PIECES}
    base = write(tmp_path / "hunyuan_dit_diffusers.safetensors", sd)
    lora = write(tmp_path / "fused.safetensors", fused_lora(sd, fused, "lora_unet_", seed=2))
    j = json.loads(cli("lora", "inspect", str(lora), "--base", str(base), "--json").stdout)
    assert (j["modules"], j["mapped"], j["weights"]) == (1, 1, 3)
    assert j["targets"]["transformer"]["split"] == {
        "lora_unet_blocks_0_attn1_Wqkv": [f"{q}.weight" for q in PIECES]
    }
    text = cli("lora", "inspect", str(lora), "--base", str(base)).stdout
    assert "1/1 modules mapped" in text and "(1 fused, placed on 3 weights)" in text
