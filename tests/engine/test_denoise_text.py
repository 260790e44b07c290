"""Text encoders stepped on the ledger's ops (engine.denoise.text): transformers' CLIP and T5 encoder
classes built from the file's shapes, their layers the component's castable ops, against an independent
transformers model of the release's configuration on the same weights (float32, reduced sizes); a step
of a text encoder fully and partially resident."""

from __future__ import annotations

import math

import pytest
import torch
from denoise_files import recorded_order, rel_l2, step_full_and_partial, write

from engine import denoise
from engine.devices import DeviceOptions
from engine.facade import Engine
from engine.model import Component
from engine.ops import Embedding
from engine.requests import Step

TOL = 1e-3


def _random(model, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for k, p in model.state_dict().items():
        r = torch.randn(p.shape, generator=g)
        if p.dim() == 2:
            sd[k] = r / math.sqrt(p.shape[1]) if "embed" not in k and "shared" not in k else r * 0.5
        else:
            sd[k] = 1 + 0.1 * r if "norm" in k else 0.1 * r
    if "shared.weight" in sd and "encoder.embed_tokens.weight" in sd:  # one tied embedding, as files hold it
        sd["encoder.embed_tokens.weight"] = sd["shared.weight"]
    model.load_state_dict(sd, strict=False)
    return sd


def _clip(hidden: int, act: str, projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    cfg = CLIPTextConfig(vocab_size=1000, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=2,
                         num_attention_heads=hidden // 64, max_position_embeddings=77, hidden_act=act,
                         projection_dim=hidden)  # fmt: skip
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(cfg).eval()


def _t5(umt5: bool):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    kw = dict(vocab_size=500, d_model=128, d_kv=32, d_ff=256, num_layers=2, num_heads=4,
              feed_forward_proj="gated-gelu", is_encoder_decoder=False)  # fmt: skip
    return (UMT5EncoderModel(UMT5Config(**kw)) if umt5 else T5EncoderModel(T5Config(**kw))).eval()


CASES = {
    # name: (component, make the reference, key prefix in the file)
    "clip_l": ("clip_l", lambda: _clip(768, "quick_gelu", False), "cond_stage_model.transformer."),
    "clip_g": ("clip_g", lambda: _clip(128, "gelu", True), ""),
    "t5xxl": ("t5xxl", lambda: _t5(False), ""),
    "umt5_xxl": ("umt5_xxl", lambda: _t5(True), ""),
}


@pytest.mark.parametrize("name", list(CASES))
def test_text_encoder_equals_transformers(tmp_path, name):
    comp_name, make, prefix = CASES[name]
    ref = make()
    sd = _random(ref, seed=len(name))
    if name == "clip_l":  # transformers 5's CLIPTextModel drops the `text_model.` the files keep
        sd = {k if k.startswith("text_model.") else f"text_model.{k}": v for k, v in sd.items()}
    path = write(
        tmp_path / f"{name}.safetensors", {prefix + k: v for k, v in sd.items() if "position_ids" not in k}
    )
    den = denoise.bind(Component(comp_name, path, prefix), None)
    assert den.kind == "text" and den.input_names == ("input_ids",)
    ids = den.random_inputs(512, 512, batch=2, seed=1)["input_ids"][:, :40]
    with torch.inference_mode():
        out = den({"input_ids": ids})
        want = ref(input_ids=ids).last_hidden_state
    err = rel_l2(out, want)
    print(f"{name}: relative L2 {err:.2e}")
    assert out.shape == want.shape and err <= TOL
    c = Component(comp_name, path, prefix)
    den = denoise.bind(c, None)
    seen = recorded_order(den, c, {"input_ids": ids})
    # embeddings are read where they lie (a lookup, never streamed): every other op in call order
    order = [o for o in den.op_order() if not isinstance(o, Embedding)]
    assert [id(o) for o in seen] == [id(o) for o in order]
    paths = {u.path for u in c.units}
    twin = {"shared", "encoder.embed_tokens"} <= paths  # T5's tied embedding, stored twice: one is used
    assert len(order) + sum(isinstance(o, Embedding) for o in den.op_order()) == len(c.units) - twin


def test_a_text_encoder_steps_fully_and_partially_alike(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    ref = _clip(768, "quick_gelu", False)  # CLIP-L's width: a text encoder detection names (clip_l)
    sd = {k if k.startswith("text_model.") else f"text_model.{k}": v for k, v in _random(ref, 3).items()}
    path = write(tmp_path / "clip_l.safetensors", {k: v for k, v in sd.items() if "position_ids" not in k})
    runs = step_full_and_partial(path, tmp_path, 0.004, steps=2)
    (full, a), (_, b) = runs["full"], runs["partial"]
    assert (full.component, full.output_shape) == ("clip_l", (1, 77, 768))
    assert torch.equal(a, b)


def test_an_openclip_named_clip_g_is_refused_saying_what_runs(tmp_path):
    from engine.errors import UnsupportedModel
    from tests.support import synth

    path = synth.write("sdxl_checkpoint", tmp_path / "sdxl.safetensors")
    e = Engine()
    e.detect(DeviceOptions(cpu=True))
    try:
        with pytest.raises(UnsupportedModel, match="OpenCLIP-named"):
            e.run(Step(str(path), component="clip_g"))
    finally:
        e.close()


@pytest.mark.parametrize("name", ["clip_l", "t5xxl"])
def test_a_stable_diffusion_cpp_text_encoder_computes_like_its_twin(tmp_path, name):
    """stable-diffusion.cpp's converter quantizes the embeddings, the position table and the LayerNorms' /
    T5's RMSNorms' 1-dim weights too (every tensor but biases whose rows fill whole blocks): the encoder
    read from such a GGUF equals its dequantized float32 twin."""
    pytest.importorskip("gguf")
    from tests.support.gguf_files import sdcpp_pick, write_gguf_twin

    comp_name, make, prefix = CASES[name]
    sd = _random(make(), seed=7)
    if name == "clip_l":
        sd = {k if k.startswith("text_model.") else f"text_model.{k}": v for k, v in sd.items()}
    sd = {
        prefix + k: v for k, v in sd.items() if "position_ids" not in k and k != "encoder.embed_tokens.weight"
    }
    twin, quantized = write_gguf_twin(tmp_path / "te.gguf", sd, "sdcpp", sdcpp_pick(32), ggml_dims=True)
    assert any(sd[k].dim() == 1 for k in quantized) and any("embed" in k or "shared" in k for k in quantized)
    dens = [denoise.bind(Component(comp_name, p, prefix), None)
            for p in (tmp_path / "te.gguf", write(tmp_path / "twin.safetensors", twin))]  # fmt: skip
    ids = dens[0].random_inputs(512, 512, seed=2)["input_ids"][:, :24]
    with torch.inference_mode():
        out, want = (d({"input_ids": ids}) for d in dens)
    assert rel_l2(out, want) <= 1e-6


def test_a_scaled_fp8_t5_computes_like_its_twin(tmp_path):
    """ComfyUI's t5xxl_fp8_e4m3fn_scaled (the T5 most FLUX.1 and SD3 users have): the activations reach `wo` in
    float32, not rounded to the weight's fp8 first (transformers' T5 casts them to `wo.weight`'s dtype)."""
    from tests.support.scaled_files import scaled_fp8_twin

    _, make, _ = CASES["t5xxl"]
    sd = {k: v for k, v in _random(make(), seed=8).items() if k != "encoder.embed_tokens.weight"}
    q, twin = scaled_fp8_twin(sd, lambda k, t: t.dim() == 2 and k != "shared.weight" and "relative" not in k)
    q["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    dens = [denoise.bind(Component("t5xxl", write(tmp_path / f"{n}.safetensors", t), ""), None)
            for n, t in (("fp8", q), ("twin", twin))]  # fmt: skip
    ids = dens[0].random_inputs(512, 512, seed=4)["input_ids"][:, :24]
    with torch.inference_mode():
        out, want = (d({"input_ids": ids}) for d in dens)
    assert rel_l2(out, want) <= 1e-6


@pytest.mark.parametrize("name", ["t5xxl", "umt5_xxl"])
def test_a_t5_in_float16_keeps_its_feed_forward_out_of_overflow(tmp_path, name):
    """T5 v1.1 / umT5 computed in float16 (a card's text encoder): feed-forward outputs past float16's 65504
    (the released weights have them; here `wo` is scaled up to make them) stay finite and match transformers'
    float16 model as from_pretrained builds it (`wo` kept in float32) and the float32 model; computing `wo` in
    float16 turns them into inf, clamped to ±64504 by T5's blocks — a different encoding."""
    comp_name, make, _ = CASES[name]
    ref = make()
    sd = _random(ref, seed=9)
    # outputs ~1.5e5 from weights float16 still holds (|w| < 4e4); the file's values on both sides
    for k in sd:
        sd[k] = (sd[k] * (1.5e5 if k.endswith("DenseReluDense.wo.weight") else 1)).half()
    ref.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    path = write(tmp_path / f"{name}.safetensors", sd)
    den = denoise.bind(Component(comp_name, path, "", compute_dtype="float16"), None)
    ids = den.random_inputs(512, 512, seed=2)["input_ids"][:, :24]
    with torch.inference_mode():
        full = ref.float()(input_ids=ids).last_hidden_state
        ref.half()
        for m in ref.modules():  # what `_keep_in_fp32_modules = ["wo"]` leaves in float32
            if hasattr(m, "wo") and hasattr(m, "wi_0"):
                m.wo.float()
        half = ref(input_ids=ids).last_hidden_state
        out = den({"input_ids": ids})
        enc = den.model.model.encoder
        inner = enc.block[0].layer[1]
        overflow = inner.DenseReluDense(inner.layer_norm(enc.embed_tokens(ids))).abs().max()
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert overflow > 65504  # the case this is about: a feed-forward output float16 cannot hold
    print(f"{name}: vs transformers' float16 {rel_l2(out, half):.2e}, vs float32 {rel_l2(out, full):.2e}")
    assert rel_l2(out, half) <= 5e-3 and rel_l2(out, full) <= 5e-3
