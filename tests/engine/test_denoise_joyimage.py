"""JoyImage's transformer (engine.denoise.joyimage) against diffusers' JoyImageEditTransformer3DModel and
JoyImageEditPlusTransformer3DModel on the same weights (the two build the same modules; the files hold diffusers'
names, bare and under `model.diffusion_model.`); 2 blocks, 2 heads of 128, float32, CPU; a text-to-image step, an edit
with a reference image, Edit Plus's padded prompts; its op order, a step fully and partially resident, the default-size
layout binding whole, a PEFT LoRA baked and on the fly, and `loadout step` from the command line."""

from __future__ import annotations

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
CONFIG = dict(hidden_size=256, num_attention_heads=2, text_dim=96, num_layers=2)


@pytest.fixture(scope="module")
def joy(tmp_path_factory):
    d = tmp_path_factory.mktemp("joyimage")
    ref, sd = well_scaled(diffusers.JoyImageEditTransformer3DModel(**CONFIG), 45)
    plus = diffusers.JoyImageEditPlusTransformer3DModel(**CONFIG).eval()
    plus.load_state_dict(sd, strict=True)  # the same modules key for key
    return {
        "bare": write(d / "joyimage.safetensors", sd),
        "prefixed": write(d / "joyimage_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        "ref": ref,
        "plus": plus,
        "sd": sd,
    }


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "joyimage"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "joyimage")


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"], return_dict=False)[0]  # fmt: skip


def _patches(lat: torch.Tensor) -> torch.Tensor:
    """[B, C, T, h, w] -> Edit Plus's [B, T·h/2·w/2, C, 1, 2, 2]."""
    b, c, t, h, w = lat.shape
    return lat.reshape(b, c, t, h // 2, 2, w // 2, 2).permute(0, 2, 3, 5, 1, 4, 6).reshape(b, -1, c, 1, 2, 2)


def _plus(plus, x: dict) -> torch.Tensor:
    """Edit Plus on the target then the references (its order), padded prompts masked: the target's prediction."""
    items = x["hidden_states"]
    b, n, c, t, h, w = items.shape
    seq = torch.cat([_patches(items[:, -1])] + [_patches(items[:, i]) for i in range(n - 1)], dim=1)
    with torch.inference_mode():
        out = plus(hidden_states=seq, timestep=x["timestep"], encoder_hidden_states=x["encoder_hidden_states"],
                   encoder_hidden_states_mask=x.get("encoder_hidden_states_mask"),
                   shape_list=[[(t, h // 2, w // 2)] * n] * b, return_dict=False)[0]  # fmt: skip
    per = t * (h // 2) * (w // 2)
    return (
        out[:, :per]
        .reshape(b, t, h // 2, w // 2, c, 1, 2, 2)
        .permute(0, 4, 1, 5, 2, 6, 3, 7)
        .reshape(b, c, t, h, w)
    )


def _inputs(den, seed=1, tokens=10):
    x = den.random_inputs(64, 96, batch=2, seed=seed)  # an 8 x 12 latent per item
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :tokens]
    return x


def test_joyimage_equals_diffusers_edit_and_text_to_image_in_both_placements(joy):
    dens = [_bound(joy["bare"]), _bound(joy["prefixed"])]
    assert dens[0].input_names == ("hidden_states", "timestep", "encoder_hidden_states")
    edit = _inputs(dens[0])
    assert edit["hidden_states"].shape == (2, 2, 16, 1, 12, 8)  # a reference image and the target
    t2i = dict(edit, hidden_states=edit["hidden_states"][:, -1])
    with torch.inference_mode():
        for x, what in ((edit, "edit"), (t2i, "text to image")):
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(joy["ref"], x)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"joyimage ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == x["hidden_states"].shape and err <= TOL
        # the reference reaches the target's prediction
        assert rel_l2(dens[0](edit)[:, -1], dens[0](t2i)) > 1e-3
    from engine.stepping import _units

    assert _units(dens[0], edit) == 2 * 2 * 6 * 4  # every item's tokens, not its channels


def test_joyimage_equals_edit_plus_with_padded_prompts(joy):
    den = _bound(joy["bare"])
    mask = torch.ones(2, 10)
    mask[1, 6:] = 0
    x = den.check_inputs(dict(_inputs(den, seed=3), encoder_hidden_states_mask=mask), "inputs")
    with torch.inference_mode():
        out = den(x)[:, -1]
        want = _plus(joy["plus"], x)
        err = rel_l2(out, want)
        print(f"joyimage (Edit Plus, padded): relative L2 {err:.2e}")
        assert err <= TOL
        unmasked = {k: v for k, v in x.items() if k != "encoder_hidden_states_mask"}
        assert rel_l2(den(unmasked)[:, -1], want) > 1e-3  # the mask reaches the output


def test_rope_axes_and_the_streams_are_read_as_released(joy, monkeypatch):
    """Fails with the rows' and columns' positions swapped or the two streams' MLPs swapped."""
    from engine.denoise import joyimage as J

    den = _bound(joy["bare"])
    x = den.check_inputs(_inputs(den, seed=4), "inputs")
    with torch.inference_mode():
        want = _diffusers(joy["ref"], x)
        assert rel_l2(den(x), want) <= TOL
        rope = J._rope
        monkeypatch.setattr(J, "_rope", lambda tt, th, tw, d: tuple(
            a.reshape(tt, th, tw, -1).transpose(1, 2).reshape(a.shape) for a in rope(tt, tw, th, d)))  # fmt: skip
        assert rel_l2(den(x), want) > 10 * TOL
        monkeypatch.undo()
        si, st = den.model.blocks[0]
        si.mlp, st.mlp = st.mlp, si.mlp
        try:
            assert rel_l2(den(x), want) > 10 * TOL
        finally:
            si.mlp, st.mlp = st.mlp, si.mlp


def test_joyimage_op_order_is_the_call_order(joy):
    check_op_order(joy["prefixed"], "joyimage", PREFIX, plain=2 * CONFIG["num_layers"])


def test_joyimage_steps_fully_and_partially_alike(joy, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(joy["bare"], tmp_path, 0.001, "joyimage", (1, 2, 16, 1, 8, 8))


def test_loadout_step_runs_joyimage_from_the_command_line(joy, tmp_path):
    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(joy["prefixed"]), "--size", "64x64",
                        "--steps", "1", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    from engine.formats.safetensors import SafetensorsFile

    assert SafetensorsFile(out).tensor("out").shape == (1, 2, 16, 1, 8, 8)


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (20 blocks, 24 heads of 128, Qwen3-VL's 4096-wide text), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.JoyImageEditTransformer3DModel)
    path = write_sparse(tmp_path / "joyimage.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.heads, m.in_channels, m.patch, m.context_dim) == (20, 24, 16, (1, 2, 2), 4096)


# Every Linear a PEFT LoRA (diffusers' names under `transformer.`) adapts: both streams' attention and MLPs, the
# condition embedder's and the head.
LORA_MODULES = ("double_blocks.0.attn.img_attn_qkv", "double_blocks.1.attn.txt_attn_qkv",
                "double_blocks.0.attn.img_attn_proj", "double_blocks.1.attn.txt_attn_proj",
                "double_blocks.0.img_mlp.net.0.proj", "double_blocks.1.txt_mlp.net.2",
                "condition_embedder.time_proj", "condition_embedder.text_embedder.linear_1",
                "condition_embedder.time_embedder.linear_2", "proj_out")  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_baked_and_on_the_fly(joy, tmp_path, budget):
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    ref, sd = joy["ref"], joy["sd"]
    names = {d: "transformer." + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, 0.8, seed=7)
    x = {k: v[:1] for k, v in _inputs(_bound(joy["bare"]), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(joy["prefixed"], lora, 0.8, x, tmp_path, budget, want, len(LORA_MODULES),
                    f"joyimage LoRA (budget {budget})", "joyimage", TOL)  # fmt: skip
