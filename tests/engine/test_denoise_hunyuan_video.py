"""HunyuanVideo 1.0's transformer (engine.denoise.hunyuan_video) against diffusers'
HunyuanVideoTransformer3DModel on the same weights, in its three namings — diffusers', Tencent's release
names (ComfyUI's `model.diffusion_model.` prefix, as the repackaged files) and ComfyUI's FLUX-style ones —,
reduced width (2 heads of 128) and depth, float32, CPU: a video of two latent frames, a padded prompt; its
op order, a step fully and partially resident, a LoRA in musubi-tuner's names, and what it refuses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    lora_step,
    recorded_order,
    rel_l2,
    write,
)
from hunyuan_files import comfyui, diffusers_hunyuan, tencent

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."


@pytest.fixture(scope="module")
def hunyuan(tmp_path_factory):
    ref, sd = diffusers_hunyuan()
    d = tmp_path_factory.mktemp("hunyuan_video")
    release = tencent(sd)
    files = {
        "diffusers": write(d / "hunyuan_video_diffusers.safetensors", sd),
        "tencent": write(
            d / "hunyuan_video_t2v_720p.safetensors", {PREFIX + k: v for k, v in release.items()}
        ),
        "comfyui": write(d / "hunyuan_video_comfy.safetensors", comfyui(release)),
    }
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "hunyuan_video"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "hunyuan_video")


def _diffusers(ref, inputs: dict) -> torch.Tensor:
    mask = inputs.get("text_mask", torch.ones(inputs["text_states"].shape[:2]))
    return ref(hidden_states=inputs["x"], timestep=inputs["t"], encoder_hidden_states=inputs["text_states"],
               encoder_attention_mask=mask, pooled_projections=inputs["text_states_2"],
               guidance=inputs["guidance"]).sample  # fmt: skip


def test_the_three_namings_equal_diffusers_on_a_video_with_a_padded_prompt(hunyuan):
    files, ref, _ = hunyuan
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    den = dens["diffusers"]
    assert den.input_names == ("x", "t", "text_states", "text_states_2", "guidance")
    inputs = den.random_inputs(96, 64, batch=2, seed=1)
    assert inputs["x"].shape == (2, 4, 1, 8, 12) and inputs["text_states"].shape == (2, 256, 64)
    g = torch.Generator().manual_seed(2)
    inputs["x"] = torch.randn(2, 4, 2, 8, 12, generator=g)  # two latent frames: RoPE's frame axis
    inputs["text_states"] = inputs["text_states"][:, :24]
    inputs["text_mask"] = torch.ones(2, 24)
    inputs["text_mask"][1, 17:] = 0  # the second prompt is 17 tokens, then padding
    inputs = den.check_inputs(inputs, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, inputs)
        outs = {n: d(inputs) for n, d in dens.items()}
    for n, out in outs.items():
        err = rel_l2(out, want)
        print(f"hunyuan_video ({n}): relative L2 {err:.2e}")
        assert out.shape == inputs["x"].shape and err <= TOL
    # the padding is left out: what the padded tokens hold does not reach the output
    inputs["text_states"][1, 17:] = 50.0
    with torch.inference_mode():
        assert rel_l2(dens["tencent"](inputs), want) <= TOL


def test_without_a_mask_every_token_counts(hunyuan):
    files, ref, _ = hunyuan
    den = _bound(files["tencent"])
    inputs = den.random_inputs(64, 32, seed=4)
    inputs["text_states"] = inputs["text_states"][:, :12]
    with torch.inference_mode():
        assert rel_l2(den(inputs), _diffusers(ref, inputs)) <= TOL


def test_hunyuan_op_order_is_the_call_order(hunyuan):
    check_op_order(hunyuan[0]["tencent"], "hunyuan_video", PREFIX)


def test_hunyuan_steps_fully_and_partially_alike(hunyuan, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(hunyuan[0]["tencent"], tmp_path, 0.004, "hunyuan_video", (1, 4, 1, 8, 8))


def test_step_from_the_command_line_in_diffusers_naming(hunyuan, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(hunyuan[0]["diffusers"]), "--size",
                        "64x32", "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["architecture"] == "hunyuan_video" and got["mode"] == "full" and got["steps"] == 1


def test_the_token_replace_i2v_equals_diffusers_with_its_guiding_frame(hunyuan):
    """HunyuanVideo-I2V's token-replace release (t2v's layout: the same file) with `guiding_frame_index`: its first
    latent frame's image tokens modulated at t = 0 without the guidance term, in every double block's image stream and
    every single block — equal to diffusers' model built with image_condition_type="token_replace" on the same weights,
    in both namings, and away from the t2v run (which still equals diffusers' t2v model)."""
    from diffusers import HunyuanVideoTransformer3DModel

    files, ref, sd = hunyuan
    tr = HunyuanVideoTransformer3DModel(**{**ref.config, "image_condition_type": "token_replace"}).eval()
    assert not set(tr.load_state_dict(sd, strict=True).missing_keys)  # key for key the t2v layout
    dens = [_bound(files[n]) for n in ("tencent", "diffusers")]
    inputs = dens[0].random_inputs(96, 64, batch=2, seed=6)
    inputs["x"] = torch.randn(2, 4, 3, 8, 12, generator=torch.Generator().manual_seed(7))
    inputs["text_states"] = inputs["text_states"][:, :20]
    inputs["guiding_frame_index"] = torch.zeros(2)
    inputs = dens[0].check_inputs(inputs, "inputs")
    t2v = {k: v for k, v in inputs.items() if k != "guiding_frame_index"}
    with torch.inference_mode():
        want = _diffusers(tr, inputs)
        outs = [d(inputs) for d in dens]
        plain, want_t2v = dens[0](t2v), _diffusers(ref, t2v)
    for out in outs:
        err = rel_l2(out, want)
        print(f"hunyuan_video token replace: relative L2 {err:.2e}")
        assert err <= TOL
    assert rel_l2(plain, want) > 1e-2 and rel_l2(plain, want_t2v) <= TOL
    # the first frame's modulation reaches every frame through attention, but differs most in the first
    diff = (plain - outs[0]).abs().mean(dim=(0, 1, 3, 4))
    assert diff[0] > diff[1:].max()
    c = Component("transformer", files["tencent"], PREFIX)  # each modulation still fetched once, in op order
    den = denoise.bind(c, "hunyuan_video")
    assert [id(o) for o in recorded_order(den, c, inputs)] == [id(o) for o in den.op_order()]
    bad = {**inputs, "guiding_frame_index": torch.ones(2)}
    with pytest.raises(FormatError, match="guiding_frame_index holds values other than 0"):
        dens[0].check_inputs(bad, "inputs")


def test_a_model_without_guidance_takes_none(tmp_path):
    ref, sd = diffusers_hunyuan(seed=9, guidance=False)
    den = _bound(write(tmp_path / "no_guidance.safetensors", tencent(sd)))
    assert den.input_names == ("x", "t", "text_states", "text_states_2")
    inputs = den.random_inputs(32, 32, seed=5)
    with torch.inference_mode():
        out = den(inputs)
        want = ref(hidden_states=inputs["x"], timestep=inputs["t"], encoder_hidden_states=inputs["text_states"],
                   encoder_attention_mask=torch.ones(1, 256), pooled_projections=inputs["text_states_2"]).sample  # fmt: skip
    assert rel_l2(out, want) <= TOL


def test_a_gguf_hunyuan_video_steps_like_its_dequantized_twin(tmp_path, hunyuan):
    """ComfyUI-GGUF's `hyvid` files (Tencent's names): the Linears' weights Q8_0, the rest as they are."""
    pytest.importorskip("gguf")
    weights = tencent(hunyuan[2])
    quantized = check_gguf_like_its_twin(tmp_path, weights, "hyvid", lambda k, t: t.dim() == 2, "hunyuan_video",
                                         size=(32, 32))  # fmt: skip
    assert "double_blocks.0.img_attn_qkv.weight" in quantized


def test_a_layer_the_forward_does_not_compute_is_refused(hunyuan, tmp_path):
    sd = tencent(hunyuan[2])
    sd["double_blocks.0.img_attn_extra.weight"] = torch.zeros(256, 256)
    with pytest.raises(UnsupportedModel, match="not computed by Loadout's hunyuan_video forward"):
        _bound(write(tmp_path / "edited.safetensors", sd))


def test_the_lora_in_musubi_tuner_names_equals_diffusers_merged(hunyuan, tmp_path):
    """A LoRA as musubi-tuner saves one for HunyuanVideo (`lora_unet_` + Tencent's module path, dots as
    underscores, `alpha`), fully resident (baked) and partially (on the fly), on the release file: equal to
    diffusers' model with the same ΔW merged into its split q / k / v rows by hand."""

    files, ref, sd = hunyuan
    g = torch.Generator().manual_seed(12)
    release, merged, lora, rank, strength = tencent(sd), dict(sd), {}, 4, 0.7
    targets = {  # Tencent path -> the diffusers rows it is
        "double_blocks.0.img_attn_qkv": [f"transformer_blocks.0.attn.to_{n}" for n in "qkv"],
        "double_blocks.1.txt_mlp.fc2": ["transformer_blocks.1.ff_context.net.2"],
        "single_blocks.1.linear2": ["single_transformer_blocks.1.proj_out"],
        "txt_in.individual_token_refiner.blocks.0.self_attn_proj": [
            "context_embedder.token_refiner.refiner_blocks.0.attn.to_out.0"
        ],
    }
    for path, rows in targets.items():
        w = release[f"{path}.weight"]
        a = torch.randn(rank, w.shape[1], generator=g) / w.shape[1] ** 0.5
        b = torch.randn(w.shape[0], rank, generator=g) * 0.1
        name = "lora_unet_" + path.replace(".", "_")
        lora |= {
            f"{name}.lora_down.weight": a,
            f"{name}.lora_up.weight": b,
            f"{name}.alpha": torch.tensor(2.0),
        }
        delta = strength * (2.0 / rank) * (b @ a)
        for row, part in zip(rows, delta.chunk(len(rows)), strict=True):
            merged[f"{row}.weight"] = sd[f"{row}.weight"] + part
    den = _bound(files["tencent"])
    inputs = den.random_inputs(32, 32, seed=6)
    with torch.inference_mode():
        plain = _diffusers(ref, inputs)
    ref.load_state_dict(merged)
    try:
        with torch.inference_mode():
            want = _diffusers(ref, inputs)
        assert rel_l2(plain, want) > 100 * TOL  # the LoRA changes the output well beyond the tolerance
        for budget in (None, 0.004):
            r, out = lora_step(files["tencent"], lora, strength, inputs, tmp_path, budget)
            assert r.loras and r.loras[0]["mapped"] == len(targets), r.loras
            assert rel_l2(out, want) <= TOL
    finally:
        ref.load_state_dict(sd)


@pytest.mark.parametrize(
    ("config", "naming", "channels"), [("HUNYUAN_VIDEO", "tencent", 16), ("HUNYUAN_VIDEO_I2V", "comfy", 33)]
)
def test_the_release_layouts_bind_whole(tmp_path, config, naming, channels):
    """The 13B release's layout (20 double and 40 single blocks at width 3072: header-faithful, no data) in
    Tencent's names under ComfyUI's prefix and in ComfyUI's own: every layer is one the forward computes
    with, in 24 heads of 128; the image-to-video release takes its 33 channels."""
    from layouts_2026 import video as V

    from engine.formats.safetensors import write_sparse

    rows = V.hunyuan(getattr(V, config), naming).under(PREFIX)
    path = write_sparse(tmp_path / "hunyuan_video.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    den = _bound(path)
    m = den.model
    assert den.naming == ("tencent" if naming == "tencent" else "comfyui")
    assert (m.heads, m.in_channels, m.context_dim, m.vec_dim) == (24, channels, 4096, 768)
    assert (len(m.doubles), len(m.singles), len(m.refiner)) == (20, 40, 2) and m.guidance_in is not None
