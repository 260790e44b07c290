"""Z-Image Omni (engine.denoise.z_image_omni) against diffusers' ZImageTransformer2DModel in its omni mode
on the same weights: condition images with their SigLIP2 grids, the prompt in pieces (lengths that need
padding, so the release's position quirks are exercised), in diffusers' naming and the release's, reduced
width and depth, float32, CPU; its op order, a step fully and partially resident, and its input errors."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_lora_step,
    check_op_order,
    check_steps_alike,
    rel_l2,
    well_scaled,
    write,
    z_image_original,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

TOL = 1e-3
PREFIX = "model.diffusion_model."
SIGLIP = 32


@pytest.fixture(scope="module")
def omni(tmp_path_factory):
    from diffusers import ZImageTransformer2DModel

    ref, sd = well_scaled(
        ZImageTransformer2DModel(
            dim=256, n_layers=2, n_heads=2, n_kv_heads=2, cap_feat_dim=64, siglip_feat_dim=SIGLIP
        ),
        11,
    )
    d = tmp_path_factory.mktemp("z_image_omni")
    original = {PREFIX + k: v for k, v in z_image_original(sd).items()}
    return (
        write(d / "omni_diffusers.safetensors", sd),
        write(d / "z_image_omni.safetensors", original),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "z_image"  # (variant "omni" at the release's width; this one is reduced)
    assert any("Z-Image Omni" in e.reason for e in det.evidence)
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "z_image")


def run_diffusers_omni(model, inputs: dict) -> torch.Tensor:
    """diffusers' omni mode on our batched inputs: per item, the condition latents then the target as
    [C, 1, h, w] frames, the prompt's pieces, the grids (None for the target), noise mask 0 … 0, 1."""
    b = inputs["x"].shape[0]
    conds = inputs.get("cond_latents")
    n = 0 if conds is None else conds.shape[1]
    lens = [int(v) for v in inputs["cap_lens"][0]] if "cap_lens" in inputs else [inputs["cap_feats"].shape[1]]
    xs = [[*(conds[i, j].unsqueeze(1) for j in range(n)), inputs["x"][i].unsqueeze(1)] for i in range(b)]
    caps = [list(inputs["cap_feats"][i].split(lens)) for i in range(b)]
    grids = (
        [[*inputs["siglip_feats"][i].unbind(0), None] for i in range(b)]
        if "siglip_feats" in inputs
        else [None] * b
    )
    with torch.inference_mode():
        out = model(
            xs, inputs["t"], caps, siglip_feats=grids, image_noise_mask=[[0] * n + [1]] * b, return_dict=False
        )
    return torch.stack([o.squeeze(1) for o in out[0]])


def test_an_edit_step_equals_diffusers_in_both_namings(omni):
    diff_path, orig_path, ref, _ = omni
    den = _bound(diff_path)
    assert den.naming == "diffusers" and den.input_names == ("x", "t", "cap_feats")
    inputs = den.random_inputs(96, 160, batch=2, seed=1)  # target 12 x 20 latent: 60 tokens, padded to 64
    assert inputs["cond_latents"].shape == (2, 1, 16, 20, 12) and inputs["siglip_feats"].shape == (
        2,
        1,
        16,
        16,
        SIGLIP,
    )
    assert inputs["cap_lens"][0].tolist() == [4, 122, 2]  # the pieces pad to 32, 128, 32: later pieces shift
    with torch.inference_mode():
        out = den(inputs)
        want = run_diffusers_omni(ref, inputs)
        original = _bound(orig_path)
        assert original.naming == "original"
        same = original(inputs)
    err = rel_l2(out, want)
    print(f"z_image omni: relative L2 {err:.2e}")
    assert out.shape == inputs["x"].shape and err <= TOL
    assert rel_l2(same, want) <= TOL


def test_two_conditions_of_another_size_and_an_oblong_grid_equal_diffusers(omni):
    """Two condition images of another size than the target, 12 x 20 grids (240 rows, padded to 256) whose
    positions scale onto their latents', four pieces, one batch item."""
    den = _bound(omni[0])
    g = torch.Generator().manual_seed(4)
    inputs = {
        "x": torch.randn(1, 16, 8, 12, generator=g),
        "t": torch.tensor([0.3]),
        "cap_feats": torch.randn(1, 50, 64, generator=g),
        "cap_lens": torch.tensor([[4, 3, 40, 3]], dtype=torch.float32),
        "cond_latents": torch.randn(1, 2, 16, 16, 10, generator=g),
        "siglip_feats": torch.randn(1, 2, 12, 20, SIGLIP, generator=g),
    }
    with torch.inference_mode():
        assert rel_l2(den(inputs), run_diffusers_omni(omni[2], inputs)) <= TOL


def test_text_to_image_on_omni_equals_diffusers(omni):
    """No condition image: one caption piece, [caption, image] in omni's order and positions."""
    den = _bound(omni[0])
    inputs = den.random_inputs(64, 96, seed=2)
    inputs = {k: inputs[k][:, :45] if k == "cap_feats" else inputs[k] for k in ("x", "t", "cap_feats")}
    with torch.inference_mode():
        assert rel_l2(den(inputs), run_diffusers_omni(omni[2], inputs)) <= TOL


def test_omni_op_order_is_the_call_order(omni):
    check_op_order(omni[1], "z_image", PREFIX, plain=3)  # the caption's and SigLIP's norms, the pad tokens


def test_omni_steps_fully_and_partially_alike(omni, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(omni[1], tmp_path, 0.004, "z_image", (1, 16, 8, 8))


def test_omni_inputs_say_what_is_off(omni):
    den = _bound(omni[0])
    inputs = den.random_inputs(64, 64)
    with pytest.raises(FormatError, match=r"1 condition image\(s\) need cap_lens"):
        den({k: v for k, v in inputs.items() if k != "cap_lens"})
    with pytest.raises(FormatError, match=r"^in.safetensors: 1 condition image\(s\) need cap_lens"):
        den.check_inputs({k: v for k, v in inputs.items() if k != "cap_lens"}, "in.safetensors")
    with pytest.raises(FormatError, match=r"must be positive and add up to cap_feats' 128 tokens"):
        den(dict(inputs, cap_lens=torch.tensor([[4.0, 100.0, 2.0]])))
    with pytest.raises(FormatError, match=r"siglip_feats holds 2 grids for 1 condition images"):
        den(dict(inputs, siglip_feats=inputs["siglip_feats"].repeat(1, 2, 1, 1, 1)))
    with pytest.raises(
        FormatError, match=r"input siglip_feats has shape \[1, 1, 16, 16, 8\]; expected \[·, ·, ·, ·, 32\]"
    ):
        den.check_inputs(dict(inputs, siglip_feats=torch.zeros(1, 1, 16, 16, 8)), "in.safetensors")


def test_a_siglip_embedder_without_its_norm_is_refused(omni, tmp_path):
    sd = {k: v for k, v in omni[3].items() if not k.startswith("siglip_embedder.0")}
    path = write(tmp_path / "broken_omni.safetensors", sd)
    with pytest.raises(UnsupportedModel, match="a SigLIP embedder without its norm or pad token"):
        denoise.bind(Component("transformer", path, ""), "z_image")


def test_the_release_layout_binds_whole(tmp_path):
    from layouts_2026 import image as I

    from engine.formats.safetensors import write_sparse

    rows = I.nextdit_original(I.Z_IMAGE_OMNI).under(PREFIX)
    path = write_sparse(tmp_path / "z_image_omni_base.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    assert detect_file(str(path)).variant == "omni"
    m = _bound(path).model
    assert m.omni and (len(m.layers), len(m.siglip_refiner), m.in_channels, m.context_dim) == (
        30,
        2,
        16,
        2560,
    )


# diffusers' name -> the release's for the modules a Z-Image LoRA reaches (musubi-tuner, ai-toolkit, diffusion-pipe:
# the attentions and feed-forwards of every stack, Omni's SigLIP refiner too; the embedders), the release's fused
# qkv reached by diffusers' to_q / to_k / to_v as its row blocks (so diffusers' names only).
LORA_MODULES = {
    "layers.0.attention.to_out.0": "layers.0.attention.out", "layers.1.feed_forward.w2": "layers.1.feed_forward.w2",
    "layers.1.adaLN_modulation.0": "layers.1.adaLN_modulation.0",
    "noise_refiner.0.attention.to_out.0": "noise_refiner.0.attention.out",
    "context_refiner.1.feed_forward.w1": "context_refiner.1.feed_forward.w1",
    "siglip_refiner.0.attention.to_out.0": "siglip_refiner.0.attention.out",
    "siglip_refiner.1.feed_forward.w3": "siglip_refiner.1.feed_forward.w3", "siglip_embedder.1": "siglip_embedder.1",
    "all_x_embedder.2-1": "x_embedder", "cap_embedder.1": "cap_embedder.1",
}  # fmt: skip
FUSED_QKV = ("layers.0.attention.to_q", "layers.1.attention.to_v", "siglip_refiner.0.attention.to_k",
             "siglip_refiner.1.attention.to_q", "noise_refiner.1.attention.to_k")  # fmt: skip


@pytest.mark.parametrize("naming", ["diffusers", "original"])
def test_a_lora_in_either_naming_on_the_other_file_equals_diffusers_merged(omni, tmp_path, naming):
    """A PEFT LoRA in diffusers' names (`transformer.siglip_refiner.0.attention.to_k`: ai-toolkit, diffusers) on the
    release's file, baked (q / k / v reaching the fused qkv's thirds); a kohya one in the release's names
    (`lora_unet_siglip_refiner_0_attention_out`: musubi-tuner) on diffusers' file, on the fly: an edit step with a
    condition image and its SigLIP grid equal to diffusers' model with the ΔW merged by hand."""
    from denoise_files import lora_and_merged, plain_and_merged

    diff_path, orig_path, ref, sd = omni
    sd = {k: v.clone() for k, v in sd.items()}
    if naming == "diffusers":
        keys = {d: f"transformer.{d}" for d in (*LORA_MODULES, *FUSED_QKV)}
    else:
        keys = {d: "lora_unet_" + o.replace(".", "_") for d, o in LORA_MODULES.items()}
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=23, kohya=naming == "original")
    base = orig_path if naming == "diffusers" else diff_path
    inputs = _bound(base).random_inputs(64, 64, seed=3)
    plain, want = plain_and_merged(ref, sd, merged, lambda: run_diffusers_omni(ref, inputs))
    assert rel_l2(plain, want) > 1e-2
    budget = None if naming == "diffusers" else 0.0
    what = f"z_image omni LoRA in {naming}'s names"
    check_lora_step(base, lora, strength, inputs, tmp_path, budget, want, len(keys), what)
