"""PRX's transformer (engine.denoise.prx) against diffusers' PRXTransformer2DModel on the same weights (its files hold
diffusers' names: bare and under `model.diffusion_model.`); 2 blocks, 2 heads of 64, float32, CPU; the FLUX.1-VAE
latent layout (16 channels, 2×2 patches) and PRXPixel's (RGB, a bottleneck img_in, the resolution embedder); prompts
with padding masked; its op order, a step fully and partially resident, the default-size layout binding whole, a
PEFT LoRA baked and on the fly, and `loadout step` from the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
CONFIG = dict(in_channels=16, patch_size=2, context_in_dim=96, hidden_size=128, mlp_ratio=3.5, num_heads=2, depth=2,
              axes_dim=[32, 32])  # fmt: skip
PIXEL = dict(CONFIG, in_channels=3, patch_size=4, bottleneck_size=32, resolution_embeds=True)


@pytest.fixture(scope="module")
def prx(tmp_path_factory):
    d = tmp_path_factory.mktemp("prx")
    ref, sd = well_scaled(diffusers.PRXTransformer2DModel(**CONFIG), 41)
    pix, pix_sd = well_scaled(diffusers.PRXTransformer2DModel(**PIXEL), 42)
    return {
        "bare": write(d / "prx.safetensors", sd),
        "prefixed": write(d / "prx_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        "pixel": write(d / "prx_pixel.safetensors", pix_sd),
        "ref": ref,
        "sd": sd,
        "pixel_ref": pix,
    }


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "prx"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "prx")


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"], attention_mask=x.get("attention_mask"),
                   return_dict=False)[0]  # fmt: skip


def _inputs(den, width=96, height=64, seed=1, tokens=10):
    x = den.random_inputs(width, height, batch=2, seed=seed)
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :tokens]
    return x


def test_prx_equals_diffusers_in_both_placements_with_padded_prompts(prx):
    dens = [_bound(prx["bare"]), _bound(prx["prefixed"])]
    assert dens[0].input_names == ("hidden_states", "timestep", "encoder_hidden_states")
    full = _inputs(dens[0])
    mask = torch.ones(2, 10)
    mask[1, 6:] = 0
    padded = dict(full, attention_mask=mask)
    with torch.inference_mode():
        for x, what in ((full, "every token"), (padded, "padded")):
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(prx["ref"], x)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"prx ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 16, 8, 12) and err <= TOL
        assert rel_l2(dens[0](padded), dens[0](full)) > 1e-3  # the mask reaches the output
    from engine.stepping import _units

    assert _units(dens[0], full) == 2 * 4 * 6  # the activation estimate counts image tokens, not channels


def test_the_pixel_space_layout_equals_diffusers(prx):
    """PRXPixel's: RGB in 4×4 patches through a two-Linear bottleneck, the latent's size embedded into vec."""
    den = _bound(prx["pixel"])
    assert (den.model.in_channels, den.model.patch, den.model.resolution is not None) == (3, 4, True)
    x = den.check_inputs(_inputs(den, 32, 24, seed=2), "inputs")
    assert x["hidden_states"].shape == (2, 3, 24, 32)  # pixels: no VAE
    with torch.inference_mode():
        want = _diffusers(prx["pixel_ref"], x)
        err = rel_l2(den(x), want)
    print(f"prx (pixel): relative L2 {err:.2e}")
    assert err <= TOL


def test_rope_axes_and_the_mlp_are_read_as_released(prx, monkeypatch):
    """Fails with the rows' and columns' positions swapped or the MLP's gate and up projections swapped."""
    from engine.denoise import prx as P

    den = _bound(prx["bare"])
    x = den.check_inputs(_inputs(den, seed=4), "inputs")
    with torch.inference_mode():
        want = _diffusers(prx["ref"], x)
        assert rel_l2(den(x), want) <= TOL
        table = P.rope_table
        monkeypatch.setattr(P, "rope_table", lambda ids, *a: table(ids[..., [1, 0]], *a))
        assert rel_l2(den(x), want) > 10 * TOL
        monkeypatch.undo()
        b = den.model.blocks[0]
        b.gate, b.up = b.up, b.gate
        try:
            assert rel_l2(den(x), want) > 10 * TOL
        finally:
            b.gate, b.up = b.up, b.gate


def test_prx_op_order_is_the_call_order(prx):
    check_op_order(prx["prefixed"], "prx", PREFIX)
    check_op_order(prx["pixel"], "prx")


def test_prx_steps_fully_and_partially_alike(prx, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(prx["bare"], tmp_path, 0.0005, "prx", (1, 16, 8, 8))


def test_loadout_step_runs_prx_from_the_command_line(prx, tmp_path):
    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(prx["prefixed"]), "--size", "64x64",
                        "--steps", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    from engine.formats.safetensors import SafetensorsFile

    assert SafetensorsFile(out).tensor("out").shape == (1, 16, 8, 8)


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (16 blocks, 28 heads of 64, hidden 1792, T5Gemma's 2304-wide text), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.PRXTransformer2DModel)
    path = write_sparse(tmp_path / "prx.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.heads, m.in_channels, m.patch, m.context_dim) == (16, 28, 16, 2, 2304)


def test_a_patch_width_of_no_known_latent_is_refused(prx, tmp_path):
    sd = {k: v for k, v in prx["sd"].items()}
    sd["img_in.weight"], sd["final_layer.linear.weight"] = torch.zeros(128, 48), torch.zeros(48, 128)
    sd["final_layer.linear.bias"] = torch.zeros(48)
    with pytest.raises(UnsupportedModel, match="48-wide patches"):
        _bound(write(tmp_path / "odd.safetensors", sd))


# Every Linear a PEFT LoRA (diffusers' names under `transformer.`) adapts: a block's, the stem's and the head's.
LORA_MODULES = ("blocks.0.attention.img_qkv_proj", "blocks.1.attention.txt_kv_proj", "blocks.0.attention.to_out.0",
                "blocks.1.gate_proj", "blocks.0.up_proj", "blocks.1.down_proj", "blocks.0.modulation.lin", "txt_in",
                "img_in", "time_in.in_layer", "final_layer.linear")  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_baked_and_on_the_fly(prx, tmp_path, budget):
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    ref, sd = prx["ref"], prx["sd"]
    names = {d: "transformer." + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, 0.8, seed=7)
    x = {k: v[:1] for k, v in _inputs(_bound(prx["bare"]), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(prx["prefixed"], lora, 0.8, x, tmp_path, budget, want, len(LORA_MODULES),
                    f"prx LoRA (budget {budget})", "prx", TOL)  # fmt: skip
