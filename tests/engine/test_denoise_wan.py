"""Wan 2.x's text-to-video transformer (engine.denoise.wan) against diffusers' WanTransformer3DModel on the
same weights (converted by diffusers' own single-file converter), reduced width and depth, float32, CPU;
its op order, its inputs, and a step through the Engine fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_gguf_like_its_twin, random_weights, rel_l2, write
from layouts_2026.video import WanConfig, wan_original

from engine import denoise
from engine.devices import DeviceOptions
from engine.errors import FormatError
from engine.facade import Engine
from engine.formats.safetensors import SafetensorsFile
from engine.model import Component
from engine.requests import Step
from tests.support.scaled_files import scaled_fp8_twin

diffusers = pytest.importorskip("diffusers")

TINY = WanConfig(dim=256, ffn=512, layers=2, text_dim=64)  # two 128-wide heads, as Wan's
TOL = 1e-3


def _weights(c: WanConfig, seed: int = 1) -> dict[str, torch.Tensor]:
    return random_weights([(k, "F32", shape) for k, shape in wan_original(c).items()], seed=seed)


@pytest.fixture(scope="module")
def wan_file(tmp_path_factory):
    w = _weights(TINY)
    path = write(tmp_path_factory.mktemp("wan") / "wan2.1_t2v_tiny.safetensors", w)
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    ref = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=TINY.dim // 128, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=TINY.text_dim, freq_dim=256, ffn_dim=TINY.ffn, num_layers=TINY.layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
    ).eval()  # fmt: skip
    missing, unexpected = ref.load_state_dict(convert_wan_transformer_to_diffusers(dict(w)), strict=False)
    assert not missing and not unexpected
    return path, ref


def _bind(path):
    c = Component("transformer", str(path), "")
    return c, denoise.bind(c, "wan21")


def test_forward_equals_diffusers(wan_file):
    path, ref = wan_file
    _, den = _bind(path)
    assert den.kind == "wan" and den.naming == "original" and den.input_names == ("x", "t", "context")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 3, 8, 12, generator=g)  # 3 latent frames of 64x96 px
    t = torch.tensor([640.0])
    context = torch.randn(1, 512, TINY.text_dim, generator=g)
    with torch.inference_mode():
        got = den({"x": x, "t": t, "context": context})
        want = ref(hidden_states=x, timestep=t, encoder_hidden_states=context, return_dict=False)[0]
    assert got.shape == want.shape == x.shape
    assert rel_l2(got, want) <= TOL
    # a shorter prompt is padded with zeros to 512 tokens inside the model, as the original does
    with torch.inference_mode():
        short = den({"x": x, "t": t, "context": context[:, :20]})
        padded = den({"x": x, "t": t, "context": torch.cat([context[:, :20], torch.zeros(1, 492, 64)], 1)})
    assert torch.equal(short, padded)


def _assert_ops_run_in_op_order(c, den) -> None:
    """Every castable op of the component runs once, in den.op_order() (what the streamer reads ahead)."""
    from engine import ops

    seen = []

    def record(op):
        seen.append(op)
        return {a: getattr(op, a) for a in (op.weight_attr, "bias") if getattr(op, a, None) is not None}

    castable = [u.module for u in c.units if isinstance(u.module, ops.Castable)]
    for m in castable:
        m.fetch = record
    try:
        with torch.inference_mode():
            den(den.random_inputs(64, 64))
    finally:
        for m in castable:
            m.__dict__.pop("fetch", None)
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == len(castable)


def test_op_order_is_the_call_order_and_inputs_are_checked(wan_file):
    path, _ = wan_file
    c, den = _bind(path)
    _assert_ops_run_in_op_order(c, den)
    with pytest.raises(FormatError, match="context"):
        den.check_inputs({"x": torch.zeros(1, 16, 1, 8, 8), "t": torch.zeros(1)}, "in.safetensors")


def _full_and_partial(path, tmp_path) -> None:
    """A step through the Engine fully resident and under a 4 MB budget: the same output, bit for bit."""
    outs = {}
    for name, budget in (("full", None), ("partial", 0.004)):
        e = Engine()
        e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget))
        try:
            r = e.run(Step(str(path), size=(128, 128), steps=2, out=str(tmp_path / f"{name}.safetensors")))
        finally:
            e.close()
        assert r.mode == name and r.architecture == "wan21" and r.output_shape == (1, 16, 1, 16, 16)
        outs[name] = SafetensorsFile(tmp_path / f"{name}.safetensors").tensor("out").clone()
        if name == "partial":
            assert r.streamed_bytes_per_step > 0
    assert torch.equal(outs["full"], outs["partial"])


def test_a_step_full_and_partial_give_the_same_output(wan_file, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    _full_and_partial(wan_file[0], tmp_path)


def test_the_plan_predicts_a_wan_step_at_480p(wan_file, tmp_path, monkeypatch):
    from engine.plan import make_plan

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    from engine.devices import detect_devices

    plan = make_plan(str(wan_file[0]), report=detect_devices(DeviceOptions(cpu=True)), free_bytes=64 << 30)
    (step,) = [s for s in plan["steps"] if s["step"] == "step"]
    d = step["detail"]
    assert (d["width"], d["height"]) == (832, 480) and d["units"] == 52 * 30 and d["s_per_step"] is None


def test_a_gguf_wan_steps_like_its_dequantized_twin(tmp_path):
    """ComfyUI-GGUF's Wan files: the block Linears Q8_0, the rest (patch embedding, modulations, norms)
    as they are; the forward on the GGUF equals the forward on the dequantized safetensors twin."""
    pytest.importorskip("gguf")
    check_gguf_like_its_twin(
        tmp_path, _weights(TINY, seed=5), "wan",
        lambda k, t: k.endswith(".weight") and t.dim() == 2 and k.startswith("blocks.") and t.shape[1] % 32 == 0, "wan21",
    )  # fmt: skip


def test_a_scaled_fp8_wan_steps_like_its_dequantized_twin(tmp_path):
    """ComfyUI's scaled-fp8 Wan files (`scaled_fp8` marker, per-layer `scale_weight`, the blocks' Linears
    in float8_e4m3fn): the forward equals the dequantized twin's."""
    from engine.detect import detect_file

    blocks = lambda k, t: k.startswith("blocks.") and k.endswith(".weight") and t.dim() == 2  # noqa: E731
    q, twin = scaled_fp8_twin(_weights(TINY, seed=6), blocks)
    qp, tp = write(tmp_path / "q.safetensors", q), write(tmp_path / "twin.safetensors", twin)
    assert detect_file(str(qp)).architecture == "wan21"
    dens = [
        denoise.bind(Component("transformer", str(p), "", compute_dtype="float32"), "wan21") for p in (qp, tp)
    ]
    inputs = dens[0].random_inputs(64, 64, seed=4)
    with torch.inference_mode():
        out, want = (d(inputs) for d in dens)
    assert rel_l2(out, want) <= 1e-6


def test_a_diffusers_named_wan_runs_the_same_forward(wan_file, tmp_path):
    """diffusers' WanTransformer3DModel saved as it is (its names, `scale_shift_table`s) is renamed onto the
    original paths and gives the diffusers model's output."""
    _, ref = wan_file
    path = write(
        tmp_path / "wan_diffusers.safetensors", {k: v.contiguous() for k, v in ref.state_dict().items()}
    )
    c = Component("transformer", str(path), "", compute_dtype="float32")
    den = denoise.bind(c, "wan21")
    assert den.naming == "diffusers"
    inputs = den.random_inputs(64, 96, seed=7)
    with torch.inference_mode():
        got = den(inputs)
        want = ref(hidden_states=inputs["x"], timestep=inputs["t"], encoder_hidden_states=inputs["context"],
                   return_dict=False)[0]  # fmt: skip
    assert rel_l2(got, want) <= TOL


@pytest.mark.parametrize("flf", [False, True])
def test_wan21_image_to_video_equals_diffusers(tmp_path, flf):
    """Wan 2.1 I2V / FLF2V: CLIP image features through img_emb and a second attention in every
    cross-attention (k_img / v_img), 36 input channels; against diffusers' model on the same weights
    (its single-file converter), in the original naming and in diffusers' own."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    c = TINY.with_(in_dim=36, clip_image=True, flf=flf)
    w = _weights(c, seed=8)
    ref = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=c.dim // 128, attention_head_dim=128, in_channels=36,
        out_channels=16, text_dim=c.text_dim, freq_dim=256, ffn_dim=c.ffn, num_layers=c.layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=1280,
        added_kv_proj_dim=c.dim, pos_embed_seq_len=2 * 257 if flf else None,
    ).eval()  # fmt: skip
    converted = convert_wan_transformer_to_diffusers(dict(w))
    if flf:  # the single-file converter leaves FLF2V's emb_pos out (its convert_wan_to_diffusers.py script
        converted["condition_embedder.image_embedder.pos_embed"] = w["img_emb.emb_pos"]  # renames it so)
        converted.pop("img_emb.emb_pos", None)
    missing, unexpected = ref.load_state_dict(converted, strict=False)
    assert not missing and not unexpected
    original = write(tmp_path / "i2v.safetensors", w)
    named = write(tmp_path / "i2v_d.safetensors", {k: v.contiguous() for k, v in ref.state_dict().items()})
    tokens = 514 if flf else 257
    for path, naming in ((original, "original"), (named, "diffusers")):
        den = denoise.bind(Component("transformer", str(path), "", compute_dtype="float32"), "wan21")
        assert den.naming == naming and den.input_names == ("x", "t", "context", "clip_fea")
        inputs = den.random_inputs(64, 96, seed=9)
        assert inputs["x"].shape[1] == 36 and inputs["clip_fea"].shape == (1, tokens, 1280)
        with torch.inference_mode():
            got = den(inputs)
            # diffusers takes FLF2V's two images as [2B, 257, 1280] (its embedder views them as one sequence)
            img = inputs["clip_fea"].reshape(-1, 257, 1280) if flf else inputs["clip_fea"]
            want = ref(hidden_states=inputs["x"], timestep=inputs["t"], encoder_hidden_states=inputs["context"],
                       encoder_hidden_states_image=img, return_dict=False)[0]  # fmt: skip
        assert got.shape == want.shape == (1, 16, 1, 12, 8)
        print(f"{naming} flf={flf}: relative L2 {rel_l2(got, want):.2e}")
        assert rel_l2(got, want) <= TOL, naming
    with torch.inference_mode():  # the image branch is computed: other image features, another output
        other = den({**inputs, "clip_fea": torch.zeros_like(inputs["clip_fea"])})
    assert rel_l2(other, got) > 1e-3
    with pytest.raises(FormatError, match="clip_fea"):  # the image features are required
        den.check_inputs({k: v for k, v in inputs.items() if k != "clip_fea"}, "in.safetensors")


@pytest.mark.parametrize(
    "config",
    [TINY.with_(in_dim=36, clip_image=True), TINY.with_(layers=4, vace_layers=(0, 2))],
    ids=["i2v", "vace"],
)
def test_i2v_and_vace_steps_full_and_partial_are_equal_and_in_op_order(tmp_path, monkeypatch, config):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    path = write(tmp_path / "wan2.1_tiny.safetensors", _weights(config, 9))
    c, den = _bind(path)
    _assert_ops_run_in_op_order(c, den)
    _full_and_partial(path, tmp_path)


def test_wan_vace_equals_diffusers(tmp_path):
    """VACE: the control video through vace_patch_embedding and the VACE blocks (the first adding
    before_proj of it to the patched latents), their after_proj hints added after every 2nd main block
    (the 1.3B's spread); against diffusers' WanVACETransformer3DModel on the same weights, both namings."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    c = TINY.with_(layers=4, vace_layers=(0, 2), vace_in=96)
    w = _weights(c, seed=11)
    ref = diffusers.WanVACETransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=c.dim // 128, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=c.text_dim, freq_dim=256, ffn_dim=c.ffn, num_layers=c.layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, vace_layers=[0, 2], vace_in_channels=96,
    ).eval()  # fmt: skip
    missing, unexpected = ref.load_state_dict(convert_wan_transformer_to_diffusers(dict(w)), strict=False)
    assert not missing and not unexpected
    original = write(tmp_path / "vace.safetensors", w)
    named = write(tmp_path / "vace_d.safetensors", {k: v.contiguous() for k, v in ref.state_dict().items()})
    for path, naming in ((original, "original"), (named, "diffusers")):
        den = denoise.bind(Component("transformer", str(path), "", compute_dtype="float32"), "wan21")
        assert den.naming == naming and den.input_names == ("x", "t", "context", "vace_context")
        assert den.model.vace_layers == (0, 2)
        inputs = den.random_inputs(64, 96, seed=12)
        with torch.inference_mode():
            got = den(inputs)
            want = ref(hidden_states=inputs["x"], timestep=inputs["t"], encoder_hidden_states=inputs["context"],
                       control_hidden_states=inputs["vace_context"], return_dict=False)[0]  # fmt: skip
            other = den({**inputs, "vace_context": torch.zeros_like(inputs["vace_context"])})
        print(f"{naming}: relative L2 {rel_l2(got, want):.2e}")
        assert got.shape == want.shape and rel_l2(got, want) <= TOL, naming
        assert rel_l2(other, got) > 1e-3  # the control video reaches the output
    # the hints' strength (the original's vace_context_scale; diffusers takes one per VACE layer)
    scaled = den.check_inputs({**inputs, "vace_context_scale": torch.tensor([0.7])}, "in.safetensors")
    assert torch.equal(scaled["vace_context_scale"], torch.tensor([0.7]))
    with torch.inference_mode():
        got = den(scaled)
        want = ref(hidden_states=inputs["x"], timestep=inputs["t"], encoder_hidden_states=inputs["context"],
                   control_hidden_states=inputs["vace_context"], control_hidden_states_scale=torch.full((2,), 0.7),
                   return_dict=False)[0]  # fmt: skip
        one = den({**inputs, "vace_context_scale": torch.ones(1)})
        plain = den(inputs)
    assert rel_l2(got, want) <= TOL and torch.equal(one, plain) and rel_l2(got, plain) > 1e-4
    short = inputs["vace_context"][..., :4]  # the control video's frames and size are the latents'
    with pytest.raises(FormatError, match="vace_context"):
        den.check_inputs({**inputs, "vace_context": short}, "in.safetensors")
