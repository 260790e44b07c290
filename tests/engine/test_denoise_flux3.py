"""FLUX.3's transformer (engine.denoise.flux3) against diffusers' Flux3Transformer2DModel on the same weights, in
diffusers' naming and BFL's (the converter's inverse: tests/engine/flux3_files.py), base and step-distilled (flow
map), with and without a reference image; 1 per-mode block of each mode, 2 single blocks, 2 heads of 128, float32,
CPU; its op order, a step fully and partially resident, the default-size release layout binding whole, and LoRAs in
either naming on a base in either naming."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    rel_l2,
    well_scaled,
    write,
)
from flux3_files import config, to_bfl

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4


@pytest.fixture(scope="module", params=[False, True], ids=["base", "distilled"])
def flux3(request, tmp_path_factory):
    ref, sd = well_scaled(
        diffusers.Flux3Transformer2DModel(**config(flow_map=request.param)), 41 + request.param
    )
    d = tmp_path_factory.mktemp("flux3")
    return (
        write(d / "flux3_diffusers.safetensors", sd),
        write(d / "flux3_bfl.safetensors", to_bfl(sd)),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "flux3"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "flux3")


def _diffusers(ref, x: dict) -> torch.Tensor:
    cond = x.get("image_cond_hidden_states")
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                   timestep=x["timestep"], img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0],
                   image_cond_hidden_states=cond, image_cond_ids=None if cond is None else x["image_cond_ids"][0],
                   target_timestep=x.get("target_timestep"), return_dict=False)[0]  # fmt: skip


def _inputs(den, seed=1, tokens=12):
    x = den.random_inputs(64, 96, batch=2, seed=seed)  # a 6 x 4 grid of tokens
    x["encoder_hidden_states"], x["txt_ids"] = (
        x["encoder_hidden_states"][:, :tokens],
        x["txt_ids"][:, :tokens],
    )
    return x


def test_flux3_equals_diffusers_in_both_namings_with_and_without_a_reference(flux3):
    diff_path, bfl_path, ref, _ = flux3
    dens = {"diffusers": _bound(diff_path), "bfl": _bound(bfl_path)}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in dens}
    flow_map = ref.config.flow_map
    assert dens["bfl"].input_names[-1] == ("target_timestep" if flow_map else "txt_ids")
    x = _inputs(dens["bfl"])
    assert x["img_ids"].shape == (2, 24, 4) and x["img_ids"][0, 5].tolist() == [0, 0.5, 0.5, 0]
    assert x["image_cond_ids"][0, 0, 3] == -1 and x["txt_ids"][0, 5].tolist() == [0, 0, 0, 5]
    plain = {k: v for k, v in x.items() if not k.startswith("image_cond")}
    x, plain = (dens["bfl"].check_inputs(i, "inputs") for i in (x, plain))
    with torch.inference_mode():
        for inputs, what in ((x, "with a reference"), (plain, "text to image")):
            want = _diffusers(ref, inputs)
            for n, d in dens.items():
                out = d(inputs)
                err = rel_l2(out, want)
                print(f"flux3 {'distilled' if flow_map else 'base'} ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 24, 32) and err <= TOL
        # the reference image and (for a flow map) the target time reach the output
        assert rel_l2(dens["bfl"](plain), _diffusers(ref, x)) > 1e-2
        if flow_map:
            other = dict(x, target_timestep=x["timestep"] * 0.1)
            assert rel_l2(dens["bfl"](other), dens["bfl"](x)) > 1e-3
            assert rel_l2(dens["bfl"](other), _diffusers(ref, other)) <= TOL


def test_each_mode_reads_its_own_modulation_and_positions(flux3):
    """Fails with the image and text modulations swapped, or with the RoPE axes of the image reordered."""
    diff_path, _, ref, _ = flux3
    den = _bound(diff_path)
    x = _inputs(den, seed=4)
    with torch.inference_mode():
        want = _diffusers(ref, x)
        m = den.model
        m.early["image"], m.early["txt"] = m.early["txt"], m.early["image"]
        try:
            assert rel_l2(den(x), want) > 1e-2
        finally:
            m.early["image"], m.early["txt"] = m.early["txt"], m.early["image"]
        hw = [0, 2, 1, 3]  # the h and w axes swapped
        swapped = {**x, "img_ids": x["img_ids"][..., hw], "image_cond_ids": x["image_cond_ids"][..., hw]}
        assert rel_l2(den(swapped), want) > 1e-2
        assert rel_l2(den(x), want) <= TOL


def test_a_reference_needs_its_ids_and_a_flow_map_its_target(flux3):
    from engine.errors import FormatError

    _, bfl_path, ref, _ = flux3
    den = _bound(bfl_path)
    x = _inputs(den)
    with pytest.raises(FormatError, match="come together"):
        den.check_inputs({k: v for k, v in x.items() if k != "image_cond_ids"}, "in.safetensors")
    if ref.config.flow_map:
        with pytest.raises(FormatError, match="missing input"):
            den.check_inputs({k: v for k, v in x.items() if k != "target_timestep"}, "in.safetensors")


def test_a_release_file_with_its_training_only_repa_heads_steps_as_without(flux3, tmp_path):
    """BFL's training checkpoints may keep REPA projection heads (`repa_projectors.`, dropped by diffusers' converter):
    not part of the inference model, taken as unread rather than refusing the file."""
    from safetensors.torch import load_file

    _, bfl_path, ref, _ = flux3
    sd = load_file(str(bfl_path))
    sd |= {
        "repa_projectors.0.0.weight": torch.randn(64, 256),
        "repa_projectors.0.2.weight": torch.randn(32, 64),
    }
    den, plain = _bound(write(tmp_path / "with_repa.safetensors", sd)), _bound(bfl_path)
    x = _inputs(plain, seed=2)
    with torch.inference_mode():
        assert torch.equal(den(x), plain(x))


def test_flux3_op_order_is_the_call_order(flux3):
    check_op_order(flux3[1], "flux3")


def test_flux3_steps_fully_and_partially_alike(flux3, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(flux3[1], tmp_path, 0.004, "flux3", (1, 16, 32))


@pytest.mark.parametrize("flow_map", [False, True])
def test_the_default_size_release_layout_binds_whole(tmp_path, flow_map):
    """diffusers' default config (5 per-mode blocks of each mode, 28 single, 24 heads of 128, text 20480), in BFL's
    names under model.diffusion_model., header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = to_bfl(meta_shapes(diffusers.Flux3Transformer2DModel, flow_map=flow_map))
    path = write_sparse(
        tmp_path / "flux3.safetensors", [("model.diffusion_model." + k, "BF16", s) for k, s in rows.items()]
    )
    m = _bound(path).model
    blocks = tuple(len(m.mode_blocks[k]) for k in ("image", "image_cond", "txt"))
    assert (blocks, len(m.singles), m.heads, m.in_channels, m.context_dim) == ((5, 5, 5), 28, 24, 128, 20480)
    assert m.flow_map == flow_map


# The modules a LoRA adapts, by diffusers' path: every kind of block and stem Linear, and the final adaLN, whose
# halves BFL's naming holds the other way round.
LORA_MODULES = ("mode_blocks.image.0.attn.to_q", "mode_blocks.image_cond.0.attn.to_k", "txt_mode_blocks.0.ff.linear_in",
                "single_transformer_blocks.1.attn.to_out.0", "single_transformer_blocks.0.ff.linear_out",
                "single_transformer_blocks.0.attn.to_v", "early_stream_modulations.image.linear", "context_embedder",
                "timestep_embedder.linear_1", "proj_out", "norm_out.linear")  # fmt: skip


def _bfl_module(d: str) -> str:
    from flux3_files import bfl_key

    return bfl_key(d + ".weight")[: -len(".weight")]


def _flux3_lora(sd: dict, fmt: str, strength: float):
    """(the LoRA in `fmt` — PEFT `transformer.` + diffusers' names, BFL's `diffusion_model.` + lora_down / up + alpha,
    or kohya's `lora_unet_` + BFL's names underscored —, diffusers' weights with it merged by hand)."""
    from denoise_files import lora_and_merged

    if fmt == "peft":
        names = {d: f"transformer.{d}" for d in LORA_MODULES}
    elif fmt == "bfl":
        names = {d: f"diffusion_model.{_bfl_module(d)}" for d in LORA_MODULES}
    else:
        names = {d: "lora_unet_" + _bfl_module(d).replace(".", "_") for d in LORA_MODULES}
    lora, merged = lora_and_merged(sd, names, strength, seed=7, kohya=fmt != "peft")
    if fmt != "peft":  # BFL's final adaLN rows are (shift, scale): diffusers' (scale, shift) swapped
        up = f"{names['norm_out.linear']}.lora_up.weight"
        lora[up] = torch.cat(lora[up].chunk(2, dim=0)[::-1])
    return lora, merged


@pytest.mark.parametrize(
    "fmt, base, budget",
    [("peft", "bfl", None), ("peft", "bfl", 0.0), ("bfl", "diffusers", None), ("bfl", "diffusers", 0.0),
     ("kohya", "diffusers", None), ("kohya", "bfl", 0.0)],
)  # fmt: skip
def test_a_lora_in_either_naming_lands_on_a_base_in_either_naming(flux3, tmp_path, fmt, base, budget):
    """Baked (resident) and on the fly (streamed): equal to diffusers' model with the LoRA merged by hand; every module
    of the LoRA maps; its base is told from its names."""
    from denoise_files import lora_step, plain_and_merged

    diff_path, bfl_path, ref, sd = flux3
    path = bfl_path if base == "bfl" else diff_path
    strength = 0.8
    lora, merged = _flux3_lora({k: v.clone() for k, v in sd.items()}, fmt, strength)
    x = _inputs(_bound(path), seed=9)
    x = {k: v[:1] for k, v in x.items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(path, lora, strength, x, tmp_path, budget)
    assert r.loras and r.loras[0]["mapped"] == len(LORA_MODULES), r.loras
    assert rel_l2(out, want) <= TOL
    det = detect_file(str(tmp_path / "lora.safetensors"))
    assert (det.kind, det.lora.base) == ("lora", "flux3")


def test_a_gguf_flux3_steps_like_its_dequantized_twin(tmp_path):
    """A GGUF in BFL's names (the Linears' weights Q8_0, the rest as they are: how ComfyUI-GGUF's converter writes a
    FLUX file), step-distilled: the same output as its dequantized safetensors twin."""
    pytest.importorskip("gguf")
    _, sd = well_scaled(diffusers.Flux3Transformer2DModel(**config(flow_map=True)), 42)
    quantized = check_gguf_like_its_twin(
        tmp_path, to_bfl(sd), "flux3", lambda k, t: t.dim() == 2 and t.shape[-1] % 32 == 0, "flux3"
    )
    assert (
        "single_blocks.0.q_proj.weight" in quantized
        and "content_mode_blocks.image_cond.0.mlp_in.weight" in quantized
    )
