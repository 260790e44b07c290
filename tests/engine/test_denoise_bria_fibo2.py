"""Bria FIBO 2's transformer (engine.denoise.bria_fibo2) against diffusers' BriaFibo2Transformer2DModel on the same
weights, bare and under `model.diffusion_model.`; 2 layers (one an injection block), 1 refiner, 1 Perceiver layer, 1
head of 128, float32, CPU; prompts of two lengths (padded gist), a context image; its op order, a step fully and
partially resident, the default-size layout binding whole, a PEFT LoRA and `loadout step` from the command line."""

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
from diffusers.models.transformers.transformer_bria_fibo2 import BriaFibo2Transformer2DModel  # noqa: E402

TOL = 1e-5
PREFIX = "model.diffusion_model."
CONFIG = dict(in_channels=8, dim=128, n_layers=2, n_refiner_layers=1, n_heads=1, cap_feat_dim=64, injection_layer_ids=(1,),
              perceiver_num_layers=1)  # fmt: skip


@pytest.fixture(scope="module")
def fibo2(tmp_path_factory):
    ref, sd = well_scaled(BriaFibo2Transformer2DModel(**CONFIG), 71)
    d = tmp_path_factory.mktemp("bria_fibo2")
    return (
        write(d / "fibo2_diffusers.safetensors", sd),
        write(d / "fibo2_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "bria_fibo2"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "bria_fibo2")


def _diffusers(ref, x: dict) -> torch.Tensor:
    mask = x.get("encoder_attention_mask")
    ctx = x.get("context_latents")
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"], encoder_attention_mask=None if mask is None else mask.bool(),
                   context_latents=None if ctx is None else [ctx], return_dict=False)[0]  # fmt: skip


def _inputs(seed: int, batch: int = 2, lens=(1400, 300)) -> dict:
    """A 6 x 4 latent, prompts of 1400 and 300 tokens (gist 384 and 256: the gist padded, last)."""
    g = torch.Generator().manual_seed(seed)
    t_len = max(lens)
    mask = (torch.arange(t_len)[None] < torch.tensor(lens[:batch])[:, None]).float()
    return {
        "hidden_states": torch.randn(batch, 8, 6, 4, generator=g),
        "timestep": torch.rand(batch, generator=g),
        "encoder_hidden_states": torch.randn(batch, 2, t_len, 64, generator=g) * mask[:, None, :, None],
        "encoder_attention_mask": mask,
    }


def test_bria_fibo2_equals_diffusers_in_both_namings(fibo2):
    diff_path, prefixed_path, ref, _ = fibo2
    dens = [_bound(diff_path), _bound(prefixed_path)]
    padded = _inputs(1)
    left = {k: v.flip(-1) if k == "encoder_attention_mask" else v.flip(-2) if k == "encoder_hidden_states" else v
            for k, v in padded.items()}  # fmt: skip
    one = {k: v for k, v in _inputs(2, 1, (700,)).items() if k != "encoder_attention_mask"}
    g = torch.Generator().manual_seed(3)
    edit = dict(one, context_latents=torch.randn(1, 8, 4, 2, generator=g))
    with torch.inference_mode():
        for x, what in (
            (padded, "two prompts, gist padded"),
            (one, "one prompt"),
            (edit, "a context image"),
            (left, "left-padded"),
        ):
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(ref, x)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                err = rel_l2(den(x), want)
                print(f"bria_fibo2 ({n}, {what}): relative L2 {err:.2e}")
                assert err <= TOL


def test_gist_count_follows_the_prompt_length_as_released():
    from diffusers.models.transformers.transformer_bria_fibo2 import compute_gist_count

    from engine.denoise.bria_fibo2 import gist_count

    lens = [0, 255, 256, 257, 700, 1000, 1400, 2047, 2048, 5000]
    assert [gist_count(n, 512) for n in lens] == compute_gist_count(lens, 256, 512, 64, 256, 2048)


def test_time_scale_and_rope_theta_are_read_as_released(fibo2, monkeypatch):
    """Fails with t not scaled by 1000 (Lumina 2's), or Lumina 2's rotary theta."""
    from engine.denoise import bria_fibo2 as B

    den = _bound(fibo2[0])
    x = den.check_inputs(_inputs(4), "inputs")
    with torch.inference_mode():
        want = _diffusers(fibo2[2], x)
        assert rel_l2(den(x), want) <= TOL
        with monkeypatch.context() as mp:
            mp.setattr(B, "T_SCALE", 1.0)
            assert rel_l2(den(x), want) > 100 * TOL
        with monkeypatch.context() as mp:
            mp.setattr(B, "THETA", 10000.0)
            assert rel_l2(den(x), want) > 100 * TOL


def test_bad_inputs_are_refused(fibo2):
    from engine.errors import FormatError

    den = _bound(fibo2[0])
    x = _inputs(5)
    bad = x["encoder_attention_mask"].clone()
    bad[0, 0] = 0.5
    with pytest.raises(FormatError, match="encoder_attention_mask"):
        den.check_inputs(dict(x, encoder_attention_mask=bad), "in.safetensors")
    with pytest.raises(FormatError, match="2×2 patches"):
        den.check_inputs(dict(x, hidden_states=x["hidden_states"][..., :3]), "in.safetensors")
    with pytest.raises(FormatError):
        den.check_inputs(dict(x, encoder_hidden_states=x["encoder_hidden_states"][:, :1]), "in.safetensors")


def test_bria_fibo2_op_order_is_the_call_order(fibo2):
    # plain holders: the injection block (cross_attn_gate) and the perceiver (latent_queries)
    check_op_order(fibo2[1], "bria_fibo2", PREFIX, plain=2)


def test_bria_fibo2_steps_fully_and_partially_alike(fibo2, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(fibo2[0], tmp_path, 0.001, "bria_fibo2", (1, 8, 8, 8))


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (44 layers, 5 injection blocks, 28 heads of 128, 7680-wide text), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(BriaFibo2Transformer2DModel)
    path = write_sparse(tmp_path / "fibo2.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.layers), m.bundles, m.in_channels, m.context_dim, m.most_gist) == (44, 6, 32, 7680, 512)
    assert [i for i, layer in enumerate(m.layers) if layer.cross is not None] == [6, 14, 22, 30, 38]


def test_step_from_the_command_line(fibo2, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(fibo2[1]), "--size", "64x32",
                        "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["architecture"] == "bria_fibo2" and got["output_shape"] == [1, 8, 4, 8]


LORA_MODULES = ("layers.0.attention.to_q", "layers.1.attention.to_k", "layers.0.attention.to_v",
                "layers.1.attention.to_out.0", "layers.0.adaLN_modulation.0", "layers.1.feed_forward.w1",
                "layers.0.feed_forward.w2", "layers.1.cross_attention.to_k", "layers.1.cross_attention.to_q",
                "noise_refiner.0.feed_forward.w3", "perceiver.layers.0.cross_attention.to_v",
                "perceiver.layers.0.ffn.w1", "x_embedder", "t_embedder.mlp.0", "final_layer.linear")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("bare", None), ("prefixed", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(fibo2, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, prefixed_path, ref, sd = fibo2
    path = prefixed_path if base == "prefixed" else diff_path
    strength = 0.8
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, {d: "transformer." + d for d in LORA_MODULES},
                                   strength, seed=7)  # fmt: skip
    x = {k: v[:1] for k, v in _inputs(9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"bria_fibo2 LoRA (peft on {base}, budget {budget})"
    check_lora_step(path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, None, 1e-4)


def test_heads_other_than_128_wide_are_refused_by_name(tmp_path):
    from engine.errors import UnsupportedModel

    _, sd = well_scaled(BriaFibo2Transformer2DModel(**dict(CONFIG, n_heads=2)), 5)
    with pytest.raises(UnsupportedModel, match="heads 64 wide"):
        _bound(write(tmp_path / "fibo2_64.safetensors", sd))
