"""SkyReels-V2 and AnyFlow (engine.denoise.wan_variants) against diffusers' SkyReelsV2Transformer3DModel and
AnyFlowTransformer3DModel on the same weights, reduced width and depth, float32, CPU, in the namings the
releases ship; their op order, their inputs, a step fully and partially resident, and AnyFlow-FAR refused."""

from __future__ import annotations

import pytest
import torch
from denoise_files import random_weights, rel_l2, write
from layouts_2026.video import WanConfig, wan_original
from test_denoise_wan import _full_and_partial

from engine import denoise
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TINY = WanConfig(dim=256, ffn=512, layers=2, text_dim=64)
TOL = 1e-5
DIM = TINY.dim
SMALL = dict(num_attention_heads=2, attention_head_dim=128, text_dim=64, ffn_dim=512, num_layers=2)


def _sky_original(seed: int = 1) -> dict[str, torch.Tensor]:
    """SkyworkAI's naming: Wan 2.1's keys plus the fps embedding and its Sequential projection."""
    rows = [(k, "F32", s) for k, s in wan_original(TINY).items()]
    rows += [("fps_embedding.weight", "F32", (2, DIM))]
    rows += [(f"fps_projection.0.{p}", "F32", s) for p, s in (("weight", (DIM, DIM)), ("bias", (DIM,)))]
    rows += [
        (f"fps_projection.2.{p}", "F32", s) for p, s in (("weight", (6 * DIM, DIM)), ("bias", (6 * DIM,)))
    ]
    return random_weights(rows, seed=seed)


def _sky_reference(original: dict) -> torch.nn.Module:
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    sd = {k: v for k, v in original.items() if not k.startswith("fps_")}
    sd = convert_wan_transformer_to_diffusers(sd)
    sd["fps_embedding.weight"] = original["fps_embedding.weight"]
    for o, d in (("0", "net.0.proj"), ("2", "net.2")):
        for p in ("weight", "bias"):
            sd[f"fps_projection.{d}.{p}"] = original[f"fps_projection.{o}.{p}"]
    ref = diffusers.SkyReelsV2Transformer3DModel(**SMALL, inject_sample_info=True).eval()
    ref.load_state_dict(sd, strict=True)
    return ref


@pytest.fixture(scope="module")
def sky(tmp_path_factory):
    w = _sky_original()
    ref = _sky_reference(w)
    d = tmp_path_factory.mktemp("sky")
    original = write(d / "skyreels_v2_df_tiny.safetensors", w)
    named = write(
        d / "skyreels_v2_diffusers_tiny.safetensors", {k: v.contiguous() for k, v in ref.state_dict().items()}
    )
    return original, named, ref


def _assert_ops_run_in_op_order(c, den) -> None:
    """Every streamed op runs once, in den.op_order(); an Embedding (SkyReels' fps rows) is never streamed
    (engine.denoise.stream) and reads no fetch."""
    from engine import ops

    seen = []

    def record(op):
        seen.append(op)
        return {a: getattr(op, a) for a in (op.weight_attr, "bias") if getattr(op, a, None) is not None}

    castable = [u.module for u in c.units if isinstance(u.module, ops.Castable)]
    streamed = [m for m in castable if not isinstance(m, ops.Embedding)]
    for m in castable:
        m.fetch = record
    try:
        with torch.inference_mode():
            den(den.random_inputs(64, 64))
    finally:
        for m in castable:
            m.__dict__.pop("fetch", None)
    assert [id(o) for o in seen] == [id(o) for o in den.op_order()]
    assert len(seen) == len(streamed)


def _bind(path):
    c = Component("transformer", str(path), "")
    return c, denoise.bind(c, "wan21")


@pytest.mark.parametrize("naming", ["original", "diffusers"])
def test_skyreels_v2_equals_diffusers_with_fps_and_per_frame_timesteps(sky, naming):
    path = sky[0] if naming == "original" else sky[1]
    ref = sky[2]
    _, den = _bind(path)
    assert den.naming == naming and den.input_names == ("x", "t", "context", "fps")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 3, 8, 12, generator=g)
    ctx = torch.randn(1, 512, TINY.text_dim, generator=g)
    outs = []
    with torch.inference_mode():
        for fps in (0, 1):
            got = den({"x": x, "t": torch.tensor([640.0]), "context": ctx, "fps": torch.tensor([float(fps)])})
            want = ref(x, torch.tensor([640.0]), ctx, fps=[fps], return_dict=False)[0]
            assert rel_l2(got, want) <= TOL
            outs.append(got)
        assert rel_l2(outs[0], outs[1]) > 1e-3  # the fps embedding is used
        # diffusion forcing: one timestep per latent frame, as the DF models take it
        t = torch.tensor([[900.0, 500.0, 100.0]])
        got = den({"x": x, "t": t, "context": ctx, "fps": torch.tensor([1.0])})
        want = ref(x, t, ctx, fps=[1], enable_diffusion_forcing=True, return_dict=False)[0]
        assert rel_l2(got, want) <= TOL
        # a batch of two differing samples is each sample's own step
        both = den({"x": x.repeat(2, 1, 1, 1, 1), "t": torch.cat([t, t.flip(1)]), "context": ctx.repeat(2, 1, 1),
                    "fps": torch.tensor([1.0, 0.0])})  # fmt: skip
        alone = den({"x": x, "t": t.flip(1), "context": ctx, "fps": torch.tensor([0.0])})
    assert torch.allclose(both[0], got, atol=1e-5) and torch.allclose(both[1], alone[0], atol=1e-5)


def test_skyreels_v2_inputs_op_order_and_partial_step(sky, tmp_path, monkeypatch):
    c, den = _bind(sky[0])
    _assert_ops_run_in_op_order(c, den)
    x = torch.zeros(1, 16, 3, 8, 8)
    base = {"x": x, "t": torch.zeros(1), "context": torch.zeros(1, 8, 64)}
    with pytest.raises(FormatError, match="fps"):
        den.check_inputs(base, "in.safetensors")
    with pytest.raises(UnsupportedModel, match="index"):
        den.check_inputs({**base, "fps": torch.tensor([24.0])}, "in.safetensors")
    with pytest.raises(FormatError, match="input t"):  # per-frame timesteps: one per latent frame
        den.check_inputs({**base, "t": torch.zeros(1, 2), "fps": torch.zeros(1)}, "in.safetensors")
    assert den.check_inputs({**base, "t": torch.zeros(1, 3), "fps": torch.ones(1)}, "in.safetensors")
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    _full_and_partial(sky[0], tmp_path)


@pytest.fixture(scope="module")
def anyflow(tmp_path_factory):
    torch.manual_seed(3)
    ref = diffusers.AnyFlowTransformer3DModel(**SMALL).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.05)
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    return write(tmp_path_factory.mktemp("anyflow") / "anyflow_tiny.safetensors", sd), ref


def test_anyflow_equals_diffusers_with_its_target_time(anyflow):
    path, ref = anyflow
    _, den = _bind(path)
    assert den.naming == "diffusers" and den.input_names == ("x", "t", "context", "r_timestep")
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 16, 3, 8, 12, generator=g)
    ctx = torch.randn(1, 512, TINY.text_dim, generator=g)
    t, r = torch.tensor([[900.0, 500.0, 100.0]]), torch.tensor([[600.0, 300.0, 0.0]])
    with torch.inference_mode():
        got = den({"x": x, "t": t, "context": ctx, "r_timestep": r})
        # diffusers lays the latents out [B, F, C, H, W]
        want = ref(x.transpose(1, 2), t, r, ctx, return_dict=False)[0].transpose(1, 2)
        assert rel_l2(got, want) <= TOL
        other = den({"x": x, "t": t, "context": ctx, "r_timestep": r * 0})
        assert rel_l2(got, other) > 1e-3  # the target time is used
        # t and r for every frame at once ([B]) are the per-frame step with equal times
        flat = den({"x": x, "t": t[:, :1], "context": ctx, "r_timestep": r[:, :1]})
        same = den({"x": x, "t": t[:, :1].expand(1, 3), "context": ctx, "r_timestep": r[:, :1].expand(1, 3)})
    assert rel_l2(flat, same) <= 1e-6


def test_anyflow_op_order_and_partial_step(anyflow, tmp_path, monkeypatch):
    c, den = _bind(anyflow[0])
    _assert_ops_run_in_op_order(c, den)
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    _full_and_partial(anyflow[0], tmp_path)


def test_anyflow_far_is_refused_by_name(anyflow, tmp_path):
    sd = {k: v.contiguous() for k, v in anyflow[1].state_dict().items()}
    sd["far_patch_embedding.weight"] = torch.zeros(DIM, 16, 1, 4, 4)
    sd["far_patch_embedding.bias"] = torch.zeros(DIM)
    with pytest.raises(UnsupportedModel, match="AnyFlow-FAR"):
        _bind(write(tmp_path / "anyflow_far_tiny.safetensors", sd))


def test_chronoedit_is_wan21_i2v_with_its_two_frame_rope(tmp_path):
    """ChronoEdit's file is Wan 2.1 I2V's (same layers; detected as one): diffusers' ChronoEdit class differs
    only in RoPE, which puts a two-latent-frame clip's second frame (the edit) at position
    rope_temporal_skip_len − 1; Loadout takes that as an optional input, Wan's positions without it."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    c = TINY.with_(in_dim=36, clip_image=True)
    w = random_weights([(k, "F32", s) for k, s in wan_original(c).items()], seed=8)
    ref = diffusers.ChronoEditTransformer3DModel(
        **SMALL,
        in_channels=36,
        out_channels=16,
        image_dim=1280,
        added_kv_proj_dim=c.dim,
        rope_temporal_skip_len=8,
    ).eval()
    ref.load_state_dict(convert_wan_transformer_to_diffusers(dict(w)), strict=True)
    _, den = _bind(write(tmp_path / "chronoedit_tiny.safetensors", w))
    assert type(den.model).__name__ == "Wan" and den.input_names == ("x", "t", "context", "clip_fea")
    g = torch.Generator().manual_seed(4)
    ctx, img = torch.randn(1, 512, 64, generator=g), torch.randn(1, 257, 1280, generator=g)
    skip = {"rope_temporal_skip_len": torch.tensor([8.0])}
    for frames in (2, 3):  # the edit alone; with a temporal-reasoning frame (Wan's positions)
        x = torch.randn(1, 36, frames, 8, 12, generator=g)
        inputs = {"x": x, "t": torch.tensor([700.0]), "context": ctx, "clip_fea": img}
        den.check_inputs({**inputs, **skip}, "in.safetensors")
        with torch.inference_mode():
            got = den({**inputs, **skip})
            plain = den(inputs)
            want = ref(x, inputs["t"], ctx, img, return_dict=False)[0]
        assert rel_l2(got, want) <= TOL, frames
        assert (rel_l2(plain, want) > 1e-3) == (frames == 2)  # Wan's positions differ at two frames only
    with pytest.raises(FormatError, match="rope_temporal_skip_len"):
        den.check_inputs({**inputs, "rope_temporal_skip_len": torch.tensor([0.5])}, "in.safetensors")


SKY_LORA = ("blocks.0.attn1.to_q", "blocks.1.ffn.net.0.proj", "condition_embedder.time_proj", "fps_projection.net.2",
            "proj_out")  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_on_skyreels_v2_lands_baked_and_on_the_fly(sky, tmp_path, budget):
    """PEFT (`transformer.` + diffusers' names, its fps projection too) on the original-named file, baked and
    streamed: equal to diffusers' model with the LoRA merged by hand."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    original, _, ref = sky
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    lora, merged = lora_and_merged(sd, {d: "transformer." + d for d in SKY_LORA}, 0.8, seed=7)
    g = torch.Generator().manual_seed(5)
    x = {"x": torch.randn(1, 16, 2, 8, 8, generator=g), "t": torch.tensor([[800.0, 300.0]]),
         "context": torch.randn(1, 512, 64, generator=g), "fps": torch.tensor([1.0])}  # fmt: skip

    def run():
        return ref(x["x"], x["t"], x["context"], fps=[1], enable_diffusion_forcing=True, return_dict=False)[0]

    plain, want = plain_and_merged(ref, sd, merged, run)
    assert rel_l2(plain, want) > 1e-3
    check_lora_step(
        original, lora, 0.8, x, tmp_path, budget, want, len(SKY_LORA), f"skyreels LoRA {budget}", None, TOL
    )


def test_step_from_the_command_line(sky, anyflow, tmp_path):
    """`loadout step` with random inputs: SkyReels-V2's fps (row 0) and AnyFlow's target time drawn with them."""
    import json
    import os
    import subprocess
    import sys

    for path in (sky[1], anyflow[0]):
        r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(path), "--size", "64x32", "--steps",
                            "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["architecture"] == "wan21" and got["output_shape"] == [1, 16, 1, 4, 8], got


@pytest.mark.parametrize("size", ["1.3b", "14b"])
def test_real_size_skyreels_v2_detects_and_binds_whole(tmp_path, size):
    """A header-faithful sparse SkyReels-V2 (SkyworkAI's names, bf16) of each released width: detected as such and
    bound whole (no layer left unused), with its fps input."""
    from layouts_2026.video import WAN21_T2V_1_3B, WAN21_T2V_14B

    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse

    c = WAN21_T2V_1_3B if size == "1.3b" else WAN21_T2V_14B
    d = c.dim
    rows = [(k, "BF16", s) for k, s in wan_original(c).items()]
    rows += [("fps_embedding.weight", "BF16", (2, d)), ("fps_projection.0.weight", "BF16", (d, d)),
             ("fps_projection.0.bias", "BF16", (d,)), ("fps_projection.2.weight", "BF16", (6 * d, d)),
             ("fps_projection.2.bias", "BF16", (6 * d,))]  # fmt: skip
    path = write_sparse(tmp_path / f"skyreels_v2_df_{size}.safetensors", rows)
    r = detect_file(str(path))
    assert (r.architecture, r.variant) == ("wan21", f"skyreels_v2-{size}")
    den = denoise.bind(Component("transformer", str(path), ""), r.architecture)
    assert type(den.model).__name__ == "SkyReelsV2" and len(den.model.blocks) == c.layers
    assert den.input_names == ("x", "t", "context", "fps")


def test_an_image_to_video_anyflow_is_refused_by_name(tmp_path):
    """AnyFlow's image tokens share the text's cross-attention (no k_img / v_img): not Wan 2.1 I2V's branch."""
    ref = diffusers.AnyFlowTransformer3DModel(**SMALL, in_channels=36, image_dim=1280).eval()
    sd = {k: v.contiguous() for k, v in ref.state_dict().items()}
    with pytest.raises(UnsupportedModel, match="image-to-video AnyFlow"):
        _bind(write(tmp_path / "anyflow_i2v_tiny.safetensors", sd))


def test_skyreels_v2_asynchronous_mode_equals_diffusers(sky):
    """The asynchronous mode: blocks of 2 of 4 latent frames (`causal_block_size`), each block's self-attention seeing
    itself and the earlier block: diffusers' model with `_set_ar_attention(2)`; the first block's frames do not move
    when a later frame does; a size that does not divide the frames is refused by name."""
    path, _, ref = sky
    _, den = _bind(path)
    assert "causal_block_size" in den.model.optional_inputs
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 16, 4, 8, 12, generator=g)
    ctx = torch.randn(1, 512, TINY.text_dim, generator=g)
    t = torch.tensor([[900.0, 900.0, 300.0, 300.0]])
    inputs = {"x": x, "t": t, "context": ctx, "fps": torch.tensor([1.0])}
    ref._set_ar_attention(2)
    try:
        with torch.inference_mode():
            want = ref(x, t, ctx, fps=[1], enable_diffusion_forcing=True, return_dict=False)[0]
            got = den(inputs | {"causal_block_size": torch.tensor([2.0])})
            plain = den(inputs)
            y = x.clone()
            y[:, :, 3] += 1.0
            moved = den(inputs | {"x": y, "causal_block_size": torch.tensor([2.0])})
    finally:
        ref._set_ar_attention(1)
    assert rel_l2(got, want) <= TOL and rel_l2(got, plain) > 1e-3
    assert torch.equal(moved[:, :, :2], got[:, :, :2]) and not torch.equal(moved[:, :, 2:], got[:, :, 2:])
    with pytest.raises(UnsupportedModel, match="divides the 4 latent frames"):
        den.check_inputs(inputs | {"causal_block_size": torch.tensor([3.0])}, "in.safetensors")


def test_a_ggml_shaped_gguf_skyreels_v2_steps_per_frame_like_its_twin(tmp_path):
    """A GGUF written by ggml's own writer drops the modulation tables' leading axis of 1 ([6, dim]); a step with a
    time per latent frame reads it as the [1, 6, dim] table, as its dequantized safetensors twin does."""
    pytest.importorskip("gguf")
    from tests.support.gguf_files import write_gguf_twin

    twin, quantized = write_gguf_twin(
        tmp_path / "sky.gguf", _sky_original(7), "wan", lambda k, t: t.dim() == 2 and k.endswith(".weight"),
        ggml_dims=True,
    )  # fmt: skip
    assert quantized
    twin_path = write(tmp_path / "twin.safetensors", twin)
    g = torch.Generator().manual_seed(4)
    x = {"x": torch.randn(1, 16, 3, 8, 12, generator=g), "t": torch.tensor([[900.0, 500.0, 100.0]]),
         "context": torch.randn(1, 512, TINY.text_dim, generator=g), "fps": torch.tensor([1.0])}  # fmt: skip
    with torch.inference_mode():
        got, want = (_bind(p)[1](x) for p in (tmp_path / "sky.gguf", twin_path))
    assert rel_l2(got, want) <= 1e-6
