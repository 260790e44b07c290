"""Ideogram 4's transformer (engine.denoise.ideogram4) against diffusers' Ideogram4Transformer2DModel on the same
weights, bare and under `model.diffusion_model.`; 2 layers, 1 head of 256, float32, CPU; its packed layout with left
padding, prompts of two lengths and a per-row time; its op order, a step fully and partially resident, the default-size
layout binding whole, a PEFT LoRA and `loadout step` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
CONFIG = dict(num_layers=2, attention_head_dim=256, num_attention_heads=1, intermediate_size=384, adaln_dim=64,
              llm_features_dim=96)  # fmt: skip


@pytest.fixture(scope="module")
def ideogram(tmp_path_factory):
    ref, sd = well_scaled(diffusers.Ideogram4Transformer2DModel(**CONFIG), 61)
    d = tmp_path_factory.mktemp("ideogram4")
    return (
        write(d / "ideogram4_diffusers.safetensors", sd),
        write(d / "ideogram4_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "ideogram4"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "ideogram4")


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"], position_ids=x["position_ids"].long(),
                   segment_ids=x["segment_ids"].long(), indicator=x["indicator"].long(), return_dict=False)[0]  # fmt: skip


def _padded(den, seed=1):
    """The pipeline's layout for two prompts of 10 and 6 tokens, left-padded to 10, and a 6 x 4 grid (64 x 96 px)."""
    x = den.random_inputs(64, 96, batch=2, seed=seed)
    text = 256  # the random step's tokens, then 24 image rows
    keep = list(range(text - 10, text + 24))
    x = {k: v[:, keep] for k, v in x.items() if k != "timestep"} | {"timestep": x["timestep"]}
    pos = torch.arange(10.0)[:, None].expand(-1, 3)
    x["position_ids"][:, :10] = pos
    x["position_ids"][1, :4] = 0
    x["position_ids"][1, 4:10] = pos[:6]
    for name, value in (("indicator", 0.0), ("segment_ids", -1.0), ("encoder_hidden_states", 0.0)):
        x[name][1, :4] = value
    return x


def test_ideogram4_equals_diffusers_in_both_namings_with_padded_prompts_and_per_row_time(ideogram):
    diff_path, prefixed_path, ref, _ = ideogram
    dens = [_bound(diff_path), _bound(prefixed_path)]
    padded = _padded(dens[0])
    per_row = dict(padded, timestep=torch.rand(2, 34, generator=torch.Generator().manual_seed(3)))
    with torch.inference_mode():
        for x, what in ((padded, "padded"), (per_row, "per-row t")):
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(ref, x)
            image = x["indicator"] == 2
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(x)
                err = rel_l2(out[image], want[image])
                print(f"ideogram4 ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 34, 128) and err <= TOL
                assert rel_l2(out, want) <= TOL  # the text and padding rows too
        # a 1024 x 1024 step's own random layout (256 text rows): no padding
        x = dens[0].random_inputs(64, 64, seed=5)
        assert rel_l2(dens[0](x), _diffusers(ref, x)) <= TOL


def test_rope_axes_and_their_interleaving_are_read_as_released(ideogram, monkeypatch):
    """Fails with the rows' and columns' positions swapped, or the h and w frequencies not interleaved into t's."""
    from engine.denoise import ideogram4 as I

    den = _bound(ideogram[0])
    x = den.check_inputs(_padded(den, seed=4), "inputs")
    with torch.inference_mode():
        want = _diffusers(ideogram[2], x)
        assert rel_l2(den(x), want) <= TOL
        assert rel_l2(den(dict(x, position_ids=x["position_ids"][..., [0, 2, 1]])), want) > 10 * TOL
        with monkeypatch.context() as mp:
            mp.setattr(I, "SECTIONS", (24, 0, 0))
            assert rel_l2(den(x), want) > 10 * TOL


def test_bad_layouts_are_refused(ideogram):
    from engine.errors import FormatError

    den = _bound(ideogram[0])
    x = _padded(den)
    with pytest.raises(FormatError, match="not whole numbers"):
        den.check_inputs(dict(x, indicator=x["indicator"] + 0.5), "in.safetensors")
    with pytest.raises(FormatError, match="no image row"):
        den.check_inputs(dict(x, indicator=torch.full_like(x["indicator"], 3.0)), "in.safetensors")
    with pytest.raises(FormatError, match="segment_ids has shape"):
        den.check_inputs(dict(x, segment_ids=x["segment_ids"][:, 1:]), "in.safetensors")


def test_ideogram4_op_order_is_the_call_order(ideogram):
    check_op_order(ideogram[1], "ideogram4", PREFIX)


def test_ideogram4_steps_fully_and_partially_alike(ideogram, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(ideogram[0], tmp_path, 0.001, "ideogram4", (1, 256 + 16, 128))


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (34 layers, 18 heads of 256, SwiGLU 12288, 53248-wide text features), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.Ideogram4Transformer2DModel)
    path = write_sparse(tmp_path / "ideogram4.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.layers), m.heads, m.in_channels, m.context_dim) == (34, 18, 128, 53248)


def test_step_from_the_command_line(ideogram, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(ideogram[1]), "--size", "64x32",
                        "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (
        got["architecture"] == "ideogram4"
        and got["mode"] == "full"
        and got["output_shape"] == [1, 256 + 8, 128]
    )


# Every Linear of a layer (its modulation, q / k / v / out, the SwiGLU), the stems and the head.
LORA_MODULES = ("layers.0.attention.to_q", "layers.1.attention.to_k", "layers.0.attention.to_v",
                "layers.1.attention.to_out.0", "layers.0.adaln_modulation", "layers.1.feed_forward.w1",
                "layers.0.feed_forward.w2", "layers.1.feed_forward.w3", "input_proj", "llm_cond_proj",
                "t_embedding.mlp_in", "adaln_proj", "final_layer.adaln_modulation", "final_layer.linear")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("bare", None), ("prefixed", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(ideogram, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, prefixed_path, ref, sd = ideogram
    path = prefixed_path if base == "prefixed" else diff_path
    strength = 0.8
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, {d: "transformer." + d for d in LORA_MODULES},
                                   strength, seed=7)  # fmt: skip
    x = {k: v[:1] for k, v in _padded(_bound(path), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"ideogram4 LoRA (peft on {base}, budget {budget})"
    check_lora_step(path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, None, TOL)
