"""Krea 2's transformer (engine.denoise.krea2) against diffusers' Krea2Transformer2DModel on the same weights, in
diffusers' naming and the release's (`first`, `blocks.N.attn.wq`, `mod.lin`, `txtfusion`, under ComfyUI's prefix —
checked against diffusers' own single-file converter), reduced width (2 query heads of 128 on 1 K/V head) and depth,
float32, CPU, with a padded prompt; its op order, a step fully and partially resident, and the release layout."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_op_order,
    check_steps_alike,
    lora_and_merged,
    lora_step,
    plain_and_merged,
    rel_l2,
    well_scaled,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
# the release's names <- diffusers' (the inverse of diffusers' convert_krea2_transformer_checkpoint_to_diffusers)
TOP = (("img_in.", "first."), ("time_embed.linear_1.", "tmlp.0."), ("time_embed.linear_2.", "tmlp.2."),
       ("time_mod_proj.", "tproj.1."), ("txt_in.norm.weight", "txtmlp.0.scale"), ("txt_in.linear_1.", "txtmlp.1."),
       ("txt_in.linear_2.", "txtmlp.3."), ("text_fusion.", "txtfusion."), ("transformer_blocks.", "blocks."),
       ("final_layer.linear.", "last.linear."), ("final_layer.norm.weight", "last.norm.scale"),
       ("final_layer.scale_shift_table", "last.modulation.lin"))  # fmt: skip
BLOCK = ((".attn.to_q.", ".attn.wq."), (".attn.to_k.", ".attn.wk."), (".attn.to_v.", ".attn.wv."),
         (".attn.to_out.0.", ".attn.wo."), (".attn.to_gate.", ".attn.gate."), (".attn.norm_q.weight", ".attn.qknorm.qnorm.scale"),
         (".attn.norm_k.weight", ".attn.qknorm.knorm.scale"), (".ff.", ".mlp."), (".norm1.weight", ".prenorm.scale"),
         (".norm2.weight", ".postnorm.scale"), (".scale_shift_table", ".mod.lin"))  # fmt: skip


def diffusers_krea2(seed: int = 17):
    """A reduced Krea 2 (width 256: 2 query heads of 128 on 1 K/V head, SwiGLU 512, 2 blocks; a text fusion over 3
    tapped layers 128 wide) in diffusers' class, well-scaled random weights (the zero-centred norm scales too):
    (model, its state dict)."""
    from diffusers import Krea2Transformer2DModel

    model = Krea2Transformer2DModel(
        num_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=512, text_hidden_dim=128,
        num_text_layers=3, text_num_attention_heads=1, text_num_key_value_heads=1, text_intermediate_size=256,
    )  # fmt: skip
    return well_scaled(model, seed)


def release(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        for a, b in TOP:
            if k.startswith(a):
                k = b + k[len(a) :]
                break
        for a, b in BLOCK:
            k = k.replace(a, b)
        if k.startswith("blocks.") and k.endswith(".mod.lin"):
            v = v.flatten()  # the release keeps a block's six rows as one vector
        out[k] = v
    return out


@pytest.fixture(scope="module")
def krea2(tmp_path_factory):
    ref, sd = diffusers_krea2()
    rel = release(sd)
    from diffusers.loaders.single_file_utils import convert_krea2_transformer_checkpoint_to_diffusers

    back = convert_krea2_transformer_checkpoint_to_diffusers({PREFIX + k: v for k, v in rel.items()})
    assert set(back) == set(sd) and all(
        torch.equal(back[k], sd[k]) for k in sd
    )  # the release's names are right
    d = tmp_path_factory.mktemp("krea2")
    files = {"diffusers": write(d / "krea2_diffusers.safetensors", sd),
             "release": write(d / "krea2.safetensors", {PREFIX + k: v for k, v in rel.items()})}  # fmt: skip
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "krea2"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "krea2")


def _diffusers(ref, x: dict) -> torch.Tensor:
    b, c, h, w = x["x"].shape
    packed = x["x"].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, 4 * c)
    t = x["context"].shape[1]
    ids = torch.zeros(t + (h // 2) * (w // 2), 3)
    grid = torch.stack(torch.meshgrid(torch.arange(h // 2), torch.arange(w // 2), indexing="ij"), dim=-1)
    ids[t:, 1:] = grid.reshape(-1, 2).float()
    mask = x.get("context_mask")
    out = ref(hidden_states=packed, encoder_hidden_states=x["context"], timestep=x["timesteps"], position_ids=ids,
              encoder_attention_mask=None if mask is None else mask.bool()).sample  # fmt: skip
    return out.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)


def test_both_namings_equal_diffusers_with_a_padded_prompt(krea2):
    files, ref, _ = krea2
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    assert dens["release"].input_names == ("x", "timesteps", "context")
    x = dens["release"].random_inputs(96, 64, batch=2, seed=1)
    assert x["x"].shape == (2, 16, 8, 12) and x["context"].shape == (2, 256, 3, 128)
    x["context"] = x["context"][:, :14]
    x["context_mask"] = torch.ones(2, 14)
    x["context_mask"][1, 9:] = 0
    x = dens["release"].check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"krea2 ({n}): relative L2 {err:.2e}")
            assert err <= TOL
        x["context"][1, 9:] = 25.0  # the padding does not reach the output
        assert rel_l2(dens["release"](x), want) <= TOL


def test_krea2_op_order_is_the_call_order(krea2):
    # plain holders: each block's and the final layer's tables, the release's `txtmlp.0` scale
    check_op_order(krea2[0]["release"], "krea2", PREFIX, plain=4)


def test_krea2_steps_fully_and_partially_alike(krea2, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(krea2[0]["diffusers"], tmp_path, 0.004, "krea2", (1, 16, 8, 8))


def test_the_release_layout_binds_whole(tmp_path):
    """Krea 2 as released (28 blocks at 6144: 48 heads of 128 on 12 K/V heads, SwiGLU 16384, a fusion of 12 Qwen3-VL
    layers), in the release's names (header-faithful, no data): every layer is one the forward computes with."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    meta = {
        k: torch.empty(s, device="meta") for k, s in meta_shapes(diffusers.Krea2Transformer2DModel).items()
    }
    rows = {PREFIX + k: tuple(v.shape) for k, v in release(meta).items()}
    path = write_sparse(tmp_path / "krea2.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.in_channels, m.context_dim, m.text_layers) == (28, 16, 2560, 12)


@pytest.mark.parametrize(("base", "naming"), [("release", "diffusers"), ("diffusers", "release")])
def test_a_lora_in_the_other_naming_equals_diffusers_merged(krea2, tmp_path, base, naming):
    """A PEFT LoRA in diffusers' names (ai-toolkit) on the release file, and one in the release's names (a trainer
    of the original code) on a diffusers file, baked: equal to diffusers' model with the ΔW merged by hand —
    text-fusion layers included."""
    files, ref, sd = krea2
    names = {"transformer_blocks.0.attn.to_q": "blocks.0.attn.wq", "transformer_blocks.1.attn.to_gate": "blocks.1.attn.gate",
             "transformer_blocks.1.ff.down": "blocks.1.mlp.down", "time_mod_proj": "tproj.1",
             "text_fusion.refiner_blocks.0.attn.to_v": "txtfusion.refiner_blocks.0.attn.wv", "img_in": "first"}  # fmt: skip
    strength = 0.7
    keys = {
        d: f"transformer.{d}" if naming == "diffusers" else f"diffusion_model.{o}" for d, o in names.items()
    }
    lora, merged = lora_and_merged(sd, keys, strength, seed=21)
    x = _bound(files[base]).random_inputs(32, 32, seed=9)
    x["context"] = x["context"][:, :10]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(files[base], lora, strength, x, tmp_path)
    assert r.loras and r.loras[0]["mapped"] == len(names), r.loras
    assert rel_l2(out, want) <= TOL
