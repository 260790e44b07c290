"""LTX-Video's transformer (engine.denoise.ltxv) against diffusers' LTXVideoTransformer3DModel on the same
weights, in diffusers' naming and the release's (`patchify_proj`, `adaln_single`, `q_norm`, under ComfyUI's
prefix), reduced width (32 heads of 8: a width with leading unrotated dimensions) and depth, float32, CPU: a
video of three latent frames, a padded prompt, per-token timesteps; its op order, a step fully and partially
resident, a GGUF of it, and the release layouts binding whole."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    lora_step,
    rel_l2,
    well_scaled,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
RELEASE = (("proj_in.", "patchify_proj."), ("time_embed.", "adaln_single."), (".norm_q.", ".q_norm."),
           (".norm_k.", ".k_norm."))  # fmt: skip


def diffusers_ltxv(seed: int = 12):
    """A reduced LTX-Video (width 256: 32 heads of 8, 2 blocks, 8 latent channels, 64-wide text states) in
    diffusers' class, well-scaled random weights: (model, its state dict)."""
    from diffusers import LTXVideoTransformer3DModel

    model = LTXVideoTransformer3DModel(in_channels=8, out_channels=8, num_attention_heads=32, attention_head_dim=8,
                                       cross_attention_dim=256, num_layers=2, caption_channels=64)  # fmt: skip
    return well_scaled(model, seed)


def release(sd: dict) -> dict:
    """diffusers' names back in the release's (the inverse of `convert_ltx_transformer_checkpoint_to_diffusers`)."""
    out = {}
    for k, v in sd.items():
        for a, b in RELEASE:
            k = b + k[len(a) :] if a.endswith(".") and not a.startswith(".") and k.startswith(a) else k
            k = k.replace(a, b) if a.startswith(".") else k
        out[k] = v
    return out


@pytest.fixture(scope="module")
def ltxv(tmp_path_factory):
    ref, sd = diffusers_ltxv()
    d = tmp_path_factory.mktemp("ltxv")
    files = {
        "diffusers": write(d / "ltxv_diffusers.safetensors", sd),
        "release": write(
            d / "ltxv-2b-0.9.8-dev.safetensors", {PREFIX + k: v for k, v in release(sd).items()}
        ),
    }
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "ltxv"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "ltxv")


def _diffusers(ref, x: dict) -> torch.Tensor:
    """diffusers' forward on packed tokens and the original pipeline's pixel coordinates (computed here on
    their own: frame 8f + 1 - 8 clamped at 0 over the frame rate, 32 pixels a latent row or column)."""
    b, c, f, h, w = x["x"].shape
    rate = x.get("frame_rate", torch.full((b,), 25.0))
    fi, hi, wi = torch.meshgrid(torch.arange(f), torch.arange(h), torch.arange(w), indexing="ij")
    frames = (fi.flatten().float() * 8 + 1 - 8).clamp(min=0)
    coords = torch.stack([frames[None] / rate[:, None], (hi.flatten().float() * 32).expand(b, -1),
                          (wi.flatten().float() * 32).expand(b, -1)], dim=1)  # fmt: skip
    mask = x.get("attention_mask", torch.ones(x["context"].shape[:2]))
    out = ref(hidden_states=x["x"].flatten(2).transpose(1, 2), encoder_hidden_states=x["context"],
              timestep=x["timestep"] * 1000, encoder_attention_mask=mask, video_coords=coords).sample  # fmt: skip
    return out.transpose(1, 2).reshape(b, c, f, h, w)


def test_both_namings_equal_diffusers_on_a_video_with_a_padded_prompt(ltxv):
    files, ref, _ = ltxv
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    den = dens["release"]
    assert den.input_names == ("x", "timestep", "context")
    x = den.random_inputs(96, 64, batch=2, seed=1)
    assert x["x"].shape == (2, 8, 1, 2, 3) and x["context"].shape == (2, 128, 64)
    g = torch.Generator().manual_seed(2)
    x["x"] = torch.randn(2, 8, 3, 2, 3, generator=g)
    x["context"] = x["context"][:, :16]
    x["attention_mask"] = torch.ones(2, 16)
    x["attention_mask"][1, 9:] = 0
    x["frame_rate"] = torch.tensor([25.0, 30.0])
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"ltxv ({n}): relative L2 {err:.2e}")
            assert err <= TOL
        x["context"][1, 9:] = 30.0  # the padding does not reach the output
        assert rel_l2(den(x), want) <= TOL


def test_a_timestep_per_token_conditions_frames(ltxv):
    """LTX-Video's image-to-video: the conditioning frame's tokens at t = 0, the others at the step's t."""
    files, ref, _ = ltxv
    den = _bound(files["diffusers"])
    x = den.random_inputs(64, 64, seed=3)
    x["x"] = torch.randn(1, 8, 2, 2, 2, generator=torch.Generator().manual_seed(4))
    x["timestep"] = torch.tensor([[0.0] * 4 + [0.6] * 4])
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        out = den(x)
        assert rel_l2(out, _diffusers(ref, x)) <= TOL
        assert rel_l2(out, den({**x, "timestep": torch.tensor([0.6])})) > 100 * TOL


def test_ltxv_op_order_is_the_call_order(ltxv):
    check_op_order(ltxv[0]["release"], "ltxv", PREFIX, plain=3)  # the blocks' and the root's tables


def test_ltxv_steps_fully_and_partially_alike(ltxv, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(ltxv[0]["release"], tmp_path, 0.002, "ltxv", (1, 8, 1, 2, 2))


def test_a_gguf_ltxv_steps_like_its_dequantized_twin(tmp_path, ltxv):
    """ComfyUI-GGUF's `ltxv` files: the Linears' weights Q8_0, the tables and norms as they are."""
    pytest.importorskip("gguf")
    quantized = check_gguf_like_its_twin(tmp_path, release(ltxv[2]), "ltxv", lambda k, t: t.dim() == 2 and "table" not in k,
                                         "ltxv")  # fmt: skip
    assert "transformer_blocks.0.attn1.to_q.weight" in quantized


def test_a_layer_the_forward_does_not_compute_is_refused(ltxv, tmp_path):
    sd = dict(ltxv[2])
    sd["transformer_blocks.0.attn1.extra.weight"] = torch.zeros(256, 256)
    with pytest.raises(UnsupportedModel, match="not computed by Loadout's ltxv forward"):
        _bound(write(tmp_path / "edited.safetensors", sd))


@pytest.mark.parametrize(("layers", "heads_dim"), [(28, 64), (48, 128)], ids=["2b", "13b"])
def test_the_release_layouts_bind_whole(tmp_path, layers, heads_dim):
    """LTX-Video 2B (28 blocks at 2048) and 13B (48 at 4096), the release's names (header-faithful, no data):
    every layer is one the forward computes with."""
    from layouts_2026.common import meta_shapes
    from layouts_2026.video import ltx_original

    from engine.formats.safetensors import write_sparse

    rows = ltx_original(meta_shapes(diffusers.LTXVideoTransformer3DModel, num_layers=layers, attention_head_dim=heads_dim,
                                    cross_attention_dim=32 * heads_dim))  # fmt: skip
    path = write_sparse(tmp_path / "ltxv.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.in_channels, m.context_dim) == (layers, 128, 4096)


@pytest.mark.parametrize("budget", [None, 0.002])
def test_a_diffusers_named_lora_on_the_release_file_equals_diffusers_merged(ltxv, tmp_path, budget):
    """A PEFT LoRA as diffusers' and musubi-tuner's LTX-Video trainers save it (`transformer.` + diffusers' names,
    `proj_in` and `time_embed.linear` among them, which the release calls otherwise), fully resident (baked)
    and partially (on the fly), on the release file: equal to diffusers' model with the LoRA merged by hand."""

    files, ref, sd = ltxv
    g = torch.Generator().manual_seed(13)
    lora, merged, rank, strength = {}, dict(sd), 4, 0.9
    names = ["proj_in", "time_embed.linear", "transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn2.to_v",
             "transformer_blocks.1.ff.net.2", "caption_projection.linear_1"]  # fmt: skip
    for name in names:
        w = sd[f"{name}.weight"]
        a = torch.randn(rank, w.shape[1], generator=g) / w.shape[1] ** 0.5
        b = torch.randn(w.shape[0], rank, generator=g) * 0.1
        lora[f"transformer.{name}.lora_A.weight"], lora[f"transformer.{name}.lora_B.weight"] = a, b
        merged[f"{name}.weight"] = w + strength * (b @ a)
    den = _bound(files["release"])
    x = den.random_inputs(64, 64, seed=6)
    with torch.inference_mode():
        plain = _diffusers(ref, x)
    ref.load_state_dict(merged)
    try:
        with torch.inference_mode():
            want = _diffusers(ref, x)
    finally:
        ref.load_state_dict(sd)
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(files["release"], lora, strength, x, tmp_path, budget)
    assert r.loras and r.loras[0]["mapped"] == len(names), r.loras
    assert rel_l2(out, want) <= TOL


def test_a_step_records_its_tokens_and_pixel_size_for_the_plan(ltxv, tmp_path, monkeypatch):
    """What the plan calibrates from: a video family's step counts its tokens (frames x latent pixels, LTX's
    1x1 patches of a 32x VAE) and records the pixel size they stand for."""
    import json

    from engine.catalog import measured
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.requests import Step

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    e = Engine()
    e.detect(DeviceOptions(cpu=True))
    try:
        e.run(Step(str(ltxv[0]["release"]), size=(64, 96), steps=1))
    finally:
        e.close()
    rec = json.loads(measured._path().read_text().splitlines()[-1])
    assert (rec["kind"], rec["width"], rec["height"], rec["units"]) == ("ltxv", 64, 96, 6)
