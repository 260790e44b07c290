"""Qwen-Image 2.1's transformer (engine.denoise.qwen_image21) against diffusers' QwenImage21Transformer2DModel on the
same weights, in diffusers' naming and ComfyUI's (`model.diffusion_model.`, `img_mlp.gate_up` fused — checked against
diffusers' own single-file converter), reduced (2 blocks of 2 heads of 128, 64-wide text, 16 latent channels),
float32, CPU: a padded prompt, and two adjacent condition images (separate blocks) with text around them; its op
order, a step fully and partially resident, and the 7.1B release layout."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_lora_step,
    check_op_order,
    check_steps_alike,
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


def diffusers_q21(seed: int = 11):
    from diffusers import QwenImage21Transformer2DModel

    model = QwenImage21Transformer2DModel(
        num_layers=2, num_attention_heads=2, context_in_dim=64, in_channels=16, out_channels=16
    )
    return well_scaled(model, seed)


def comfy(sd: dict) -> dict:
    """diffusers' names -> ComfyUI's: under model.diffusion_model., the SwiGLU's gate and up rows in one gate_up."""
    out = {}
    for k, v in sd.items():
        if k.endswith("img_mlp.proj.weight"):
            continue
        if k.endswith("img_mlp.gate_layer.weight"):
            k, v = k.replace("gate_layer", "gate_up"), torch.cat([v, sd[k.replace("gate_layer", "proj")]])
        out[PREFIX + k] = v
    return out


@pytest.fixture(scope="module")
def q21(tmp_path_factory):
    ref, sd = diffusers_q21()
    c = comfy(sd)
    from diffusers.loaders.single_file_utils import convert_qwen_image21_transformer_checkpoint_to_diffusers

    back = convert_qwen_image21_transformer_checkpoint_to_diffusers(dict(c))
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)  # ComfyUI's names are right
    d = tmp_path_factory.mktemp("q21")
    files = {
        "diffusers": write(d / "q21_diffusers.safetensors", sd),
        "comfyui": write(d / "q21_comfy.safetensors", c),
    }
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "qwen_image21"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "qwen_image21")


def run_diffusers(ref, x: dict) -> torch.Tensor:
    """diffusers' model on our inputs: the latents flattened (condition images first), the target's slots appended to
    img_mask, the output's target tokens back to [B, C, h, w]."""
    b, c, h, w = x["x"].shape
    refs = x.get("ref_latents")
    refs = [] if refs is None else (list(refs.unbind(1)) if refs.dim() == 5 else [refs])
    latents = torch.cat([r.flatten(2).transpose(1, 2) for r in [*refs, x["x"]]], 1)
    t = x["context"].shape[1]
    slots = x["img_mask"].bool() if "img_mask" in x else torch.zeros(b, t, dtype=torch.bool)
    img_mask = torch.cat([slots, torch.ones(b, h * w // 4, dtype=torch.bool)], 1)
    mask = x.get("context_mask")
    shapes = [[*((1, *r.shape[-2:]) for r in refs), (1, h, w)]] * b
    out = ref(hidden_states=latents, encoder_hidden_states=x["context"], timestep=x["timesteps"], img_shapes=shapes,
              img_mask=img_mask, encoder_hidden_states_mask=None if mask is None else mask.bool()).sample  # fmt: skip
    return out[:, -h * w :].transpose(1, 2).reshape(b, c, h, w)


def _padded(den):
    x = den.random_inputs(128, 96, batch=2, seed=1)
    assert x["x"].shape == (2, 16, 6, 8) and x["context"].shape == (2, 256, 64)
    x["context"] = x["context"][:, :13]
    x["context_mask"] = torch.ones(2, 13)
    x["context_mask"][1, 8:] = 0
    return den.check_inputs(x, "inputs")


def test_both_namings_equal_diffusers_text_only_with_a_padded_prompt(q21):
    files, ref, _ = q21
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    assert dens["comfyui"].input_names == ("x", "timesteps", "context")
    x = _padded(dens["comfyui"])
    with torch.inference_mode():
        want = run_diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"qwen_image21 ({n}), text only: relative L2 {err:.2e}")
            assert err <= TOL
        x["context"][1, 8:] = 25.0  # the padding is never a key
        assert rel_l2(dens["comfyui"](x), want) <= TOL


def _with_condition_images(den):
    """Two 4 × 6 condition images (6 slots each, adjacent: two blocks all the same) after 3 text tokens, 5 after."""
    x = den.random_inputs(128, 64, batch=2, seed=4)
    g = torch.Generator().manual_seed(5)
    x["context"] = x["context"][:, :20]
    x["img_mask"] = torch.zeros(2, 20)
    x["img_mask"][:, 3:15] = 1
    x["ref_latents"] = torch.randn(2, 2, 16, 4, 6, generator=g)
    x["context_mask"] = torch.ones(2, 20)
    x["context_mask"][0, 18:] = 0
    return den.check_inputs(x, "inputs")


def test_with_condition_images_equal_diffusers(q21, monkeypatch):
    files, ref, _ = q21
    den = _bound(files["diffusers"])
    x = _with_condition_images(den)
    with torch.inference_mode():
        want = run_diffusers(ref, x)
        err = rel_l2(den(x), want)
        print(f"qwen_image21, two condition images: relative L2 {err:.2e}")
        assert err <= TOL
        one = dict(x, ref_latents=x["ref_latents"][:, 0], img_mask=x["img_mask"].clone())
        one["img_mask"][:, 9:15] = 0
        assert rel_l2(den(one), run_diffusers(ref, one)) <= TOL  # one [B, C, h', w'] image
        # what the comparison tells: the condition modulated at t (not 0), attention over every key
        ref.register_to_config(causal_condition=False)
        try:
            assert rel_l2(run_diffusers(ref, x), want) > 100 * TOL
        finally:
            ref.register_to_config(causal_condition=True)
        from engine.denoise import qwen_image21

        def every_key(q, k, v, segments, prefix, keys):  # the padding still masked
            return qwen_image21.F.scaled_dot_product_attention(q, k, v, attn_mask=keys)

        monkeypatch.setattr(qwen_image21, "block_causal", every_key)
        err = rel_l2(den(x), want)
        print(f"qwen_image21, two condition images, attention not block-causal: relative L2 {err:.2e}")
        assert err > 10 * TOL  # the target's queries see every key either way: only the prefix's keys change


def test_condition_inputs_are_checked(q21):
    den = _bound(q21[0]["diffusers"])
    x = _with_condition_images(den)
    for bad, words in (({"img_mask": x["img_mask"][:, :19].clone()}, "img_mask has shape"),
                       ({"ref_latents": x["ref_latents"][..., :5]}, "must be even"),
                       ({"img_mask": torch.zeros(2, 20)}, "marks 0 image slots")):  # fmt: skip
        with pytest.raises(Exception, match=words):
            den.check_inputs({**x, **bad}, "inputs")


def test_qwen_image21_op_order_is_the_call_order(q21):
    for path in q21[0].values():
        check_op_order(path, "qwen_image21", "" if "diffusers" in path.name else PREFIX)


def test_qwen_image21_steps_fully_and_partially_alike(q21, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(q21[0]["comfyui"], tmp_path, 0.002, "qwen_image21", (1, 16, 4, 4))


@pytest.mark.parametrize("naming", ["diffusers", "comfyui"])
def test_the_release_layout_binds_whole(tmp_path, naming):
    """Qwen-Image 2.1 as released (32 blocks at 4096, SwiGLU 12288, Qwen3-VL 8B states, 64 latent channels),
    header-faithful (no data): every layer is one the forward computes with."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.QwenImage21Transformer2DModel)
    if naming == "comfyui":
        meta = {k: torch.empty(s, device="meta") for k, s in rows.items()}
        rows = {k: tuple(v.shape) for k, v in comfy(meta).items()}
    path = write_sparse(tmp_path / "q21.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    den = _bound(path)
    m = den.model
    assert (den.naming, len(m.blocks), m.in_channels, m.context_dim) == (naming, 32, 64, 4096)
    x = den.random_inputs(1024, 768)
    assert x["x"].shape == (1, 64, 48, 64)


LORA_MODULES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.to_out.0",
                "transformer_blocks.0.img_mlp.gate_layer", "transformer_blocks.0.img_mlp.proj",
                "transformer_blocks.1.img_mlp.out", "modulation.1", "txt_in.in_layer", "img_in", "norm_out.linear",
                "time_text_embed.timestep_embedder.linear_1")  # fmt: skip
TRAINERS = {  # a module's name as each kind of trainer writes it, and whether kohya's tensor names
    "peft": (lambda d: f"transformer.{d}", False),
    "kohya": (lambda d: "lora_unet_" + d.replace(".", "_"), True),
    "diffusion_model": (lambda d: f"diffusion_model.{d}", False),
}


@pytest.mark.parametrize(("base", "trainer", "budget"), [("diffusers", "kohya", None), ("comfyui", "peft", None),
                         ("comfyui", "kohya", 0.002), ("comfyui", "diffusion_model", None),
                         ("diffusers", "peft", 0.002)])  # fmt: skip
def test_a_lora_equals_diffusers_merged(q21, tmp_path, base, trainer, budget):
    """A LoRA in diffusers' module names (PEFT / ai-toolkit, kohya / musubi-tuner `lora_unet_`, diffusion-pipe
    `diffusion_model.`) on either file, baked (resident) and on the fly (streamed): every module lands — on ComfyUI's
    file the SwiGLU's gate_layer and proj as the row halves of gate_up — equal to diffusers' model with the ΔW merged
    by hand."""
    from denoise_files import lora_and_merged, plain_and_merged

    files, ref, sd = q21
    name, kohya = TRAINERS[trainer]
    strength = 0.8
    lora, merged = lora_and_merged(sd, {d: name(d) for d in LORA_MODULES}, strength, seed=21, kohya=kohya)
    x = _with_condition_images(_bound(files[base]))
    plain, want = plain_and_merged(ref, sd, merged, lambda: run_diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"qwen_image21 LoRA ({trainer} on {base}, budget {budget})"
    check_lora_step(files[base], lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, tol=TOL)


def test_a_qwen_image21_lora_says_its_base(q21, tmp_path):
    """The base a Qwen-Image 2.1 LoRA is for, from its module names alone: qwen_image21, not Qwen-Image 1's."""
    from denoise_files import lora_and_merged

    from engine.detect import detect_file as detect

    _, _, sd = q21
    for trainer, (name, kohya) in TRAINERS.items():
        lora, _ = lora_and_merged(sd, {d: name(d) for d in LORA_MODULES}, 1.0, seed=2, kohya=kohya)
        d = detect(str(write(tmp_path / f"{trainer}.safetensors", lora)))
        assert d.lora is not None and d.lora.base == "qwen_image21", (trainer, d.lora)


def test_a_gguf_qwen_image21_steps_like_its_dequantized_twin(tmp_path):
    """A GGUF in ComfyUI's names (fused img_mlp.gate_up; the Linears' weights Q8_0, the rest as they are): the same
    output as its dequantized safetensors twin."""
    pytest.importorskip("gguf")
    _, sd = diffusers_q21()
    weights = {k.removeprefix("model.diffusion_model."): v for k, v in comfy(sd).items()}
    quantized = check_gguf_like_its_twin(
        tmp_path, weights, "qwen_image21", lambda k, t: t.dim() == 2 and t.shape[-1] % 32 == 0, "qwen_image21"
    )
    assert "transformer_blocks.0.img_mlp.gate_up.weight" in quantized
