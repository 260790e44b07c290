"""HiDream-I1's transformer (engine.denoise.hidream) against diffusers' HiDreamImageTransformer2DModel on the same
weights: its one naming (HiDream-ai's, which diffusers' single-file converter only strips of ComfyUI's prefix), bare
and under `model.diffusion_model.`; two 128-wide heads, 2 double- and 3 single-stream blocks, 4 routed experts with
top-2 routing, 64-wide T5 and 48-wide Llama states, float32, CPU — a square latent, a non-square one padded to the
release's 4096 tokens, an E1-style pair side by side under its own max_seq; the released Llama-layer rule over 33
blocks; its op order, a step fully and partially resident, and the 17B release layout bound whole."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_lora_step, check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.denoise.inputs import HIDREAM_INPUTS
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-5
PREFIX = "model.diffusion_model."


def diffusers_hidream(seed: int = 31, heads: int = 2, doubles: int = 2, singles: int = 3, experts: int = 4):
    from diffusers import HiDreamImageTransformer2DModel

    blocks = doubles + singles
    model = HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=16, num_layers=doubles, num_single_layers=singles,
        attention_head_dim=128, num_attention_heads=heads, caption_channels=[64, 48], text_emb_dim=40,
        num_routed_experts=experts, num_activated_experts=2, axes_dims_rope=(64, 32, 32), max_resolution=(128, 128),
        llama_layers=[min(i, 31) for i in range(blocks)],  # the released configs' rule: 0..31, then 31
    )  # fmt: skip
    return well_scaled(model, seed)


@pytest.fixture(scope="module")
def hidream(tmp_path_factory):
    from diffusers.loaders.single_file_utils import convert_hidream_transformer_to_diffusers

    ref, sd = diffusers_hidream()
    comfy = {PREFIX + k: v.clone() for k, v in sd.items()}
    back = convert_hidream_transformer_to_diffusers(dict(comfy))
    assert set(back) == set(sd) and all(torch.equal(back[k], sd[k]) for k in sd)  # one naming, prefix or not
    d = tmp_path_factory.mktemp("hidream")
    files = {"bare": write(d / "hidream_i1_dev.safetensors", sd),
             "prefixed": write(d / "hidream_i1_full.safetensors", comfy)}  # fmt: skip
    return files, ref


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "hidream"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "hidream")


def _diffusers(ref, x: dict, max_seq: int | None = None) -> torch.Tensor:
    was = ref.max_seq
    ref.max_seq = max_seq or was  # what HiDream-E1's config / pipeline set on diffusers' model
    try:
        return ref(**{n: x[n] for n in HIDREAM_INPUTS}).sample
    finally:
        ref.max_seq = was


def _inputs(den, width: int, height: int, batch: int = 2, seed: int = 1) -> dict:
    x = den.random_inputs(width, height, batch=batch, seed=seed)
    x["encoder_hidden_states_t5"] = x["encoder_hidden_states_t5"][:, :10]  # prompts shorter than 128 tokens
    x["encoder_hidden_states_llama3"] = x["encoder_hidden_states_llama3"][:, :, :7]
    return den.check_inputs(x, "inputs")


def test_equal_to_diffusers_bare_and_prefixed(hidream):
    """A square latent runs unpadded."""
    files, ref = hidream
    dens = {n: _bound(p) for n, p in files.items()}
    assert {d.naming for d in dens.values()} == {"diffusers"}
    x = _inputs(dens["bare"], 64, 64)
    assert x["hidden_states"].shape == (2, 16, 8, 8)
    assert x["encoder_hidden_states_llama3"].shape == (32, 2, 7, 48)
    assert x["pooled_embeds"].shape == (2, 40)
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"hidream ({n}): relative L2 {err:.2e}")
            assert err <= TOL


def test_a_non_square_latent_is_padded_as_diffusers_does(hidream):
    """6 × 4 patches, padded to the release's 4096 tokens, the padding's keys zeroed."""
    files, ref = hidream
    den = _bound(files["prefixed"])
    x = _inputs(den, 96, 64)
    assert x["hidden_states"].shape == (2, 16, 8, 12)
    with torch.inference_mode():
        err = rel_l2(den(x), _diffusers(ref, x))
    print(f"hidream (non-square): relative L2 {err:.2e}")
    assert err <= TOL


def test_the_padding_is_the_releases(hidream):
    """The padded tokens take part (a logit 0 for their zeroed keys): a non-square latent's output depends on
    max_seq, and with E1's own max_seq it is diffusers' with that max_seq."""
    files, ref = hidream
    den = _bound(files["bare"])
    target = _inputs(den, 64, 64, batch=1, seed=4)
    reference = den.random_inputs(64, 64, seed=5)["hidden_states"]
    # E1: the target's latent and the reference image's side by side
    x = {**target, "hidden_states": torch.cat([target["hidden_states"], reference], dim=-1)}
    with torch.inference_mode():
        for seq in (32, 40):  # exactly the pair's 4 x 8 patches, then 8 tokens of padding
            got = den.check_inputs({**x, "max_seq": torch.tensor([float(seq)])}, "inputs")
            err = rel_l2(den(got), _diffusers(ref, x, seq))
            print(f"hidream E1 pair, max_seq {seq}: relative L2 {err:.2e}")
            assert err <= TOL
        assert rel_l2(den({**x, "max_seq": torch.tensor([32.0])}), den(x)) > 0.01  # 4096 is another output


def test_sizes_the_padding_cannot_hold_are_refused(hidream):
    den = _bound(hidream[0]["bare"])
    x = _inputs(den, 64, 64)
    wide = {**x, "hidden_states": torch.zeros(2, 16, 8, 16)}  # 32 patches
    with pytest.raises(FormatError, match="max_seq = 24 tokens"):
        den.check_inputs({**wide, "max_seq": torch.tensor([24.0, 24.0])}, "inputs")
    with pytest.raises(FormatError, match="one whole number"):
        den.check_inputs({**wide, "max_seq": torch.tensor([40.0, 48.0])}, "inputs")
    with pytest.raises(FormatError, match="4096"):
        den.random_inputs(2048, 1024)  # 8192 patches, not square
    assert den.random_inputs(1024, 1024)["hidden_states"].shape == (1, 16, 128, 128)
    with pytest.raises(FormatError, match=r"expected \[32, ·, ·, 48\] \(batch 2\)"):
        den.check_inputs(
            {**x, "encoder_hidden_states_llama3": x["encoder_hidden_states_llama3"][:31]}, "inputs"
        )


def test_blocks_past_the_last_llama_layer_read_it(tmp_path):
    """33 blocks: the 33rd reads Llama layer 31 again, as the released config's 48 do from block 32 on."""
    ref, sd = diffusers_hidream(seed=32, heads=1, doubles=1, singles=32, experts=3)
    den = _bound(write(tmp_path / "hidream33.safetensors", sd))
    x = _inputs(den, 32, 32, batch=1, seed=6)
    with torch.inference_mode():
        err = rel_l2(den(x), _diffusers(ref, x))
    print(f"hidream 33 blocks: relative L2 {err:.2e}")
    assert err <= TOL


def test_a_config_without_routed_experts(tmp_path):
    """diffusers' num_routed_experts=0: a plain SwiGLU `ff_i` in every block (no release has it; the binder reads it)."""
    ref, sd = diffusers_hidream(seed=33, experts=0)
    den = _bound(write(tmp_path / "hidream_dense.safetensors", sd))
    x = _inputs(den, 64, 64, batch=1, seed=7)
    with torch.inference_mode():
        assert rel_l2(den(x), _diffusers(ref, x)) <= TOL


def test_hidream_op_order_is_the_call_order(hidream):
    check_op_order(hidream[0]["prefixed"], "hidream", PREFIX)


def test_an_idle_expert_still_runs_and_adds_nothing():
    """Routing that leaves experts 2 and 3 idle: they still run (on no tokens: the ops a step fetches are the same
    whatever the routing), and the output is the two chosen experts' by their softmax weights plus the shared one."""
    from engine.denoise.hidream import MoE, _moe

    g = torch.Generator().manual_seed(8)
    calls = []

    def linear(name: str, i: int, o: int):
        w = torch.randn(o, i, generator=g)

        def op(x):
            calls.append((name, x.shape[0]))
            return x @ w.T

        return op

    def swiglu(name: str):
        return tuple(linear(f"{name}.{n}", *io) for n, io in (("w1", (4, 6)), ("w3", (4, 6)), ("w2", (6, 4))))

    logits = torch.tensor([2.0, 1.0, -3.0, -4.0])
    moe = MoE(lambda x: logits.expand(x.shape[0], 4), [swiglu(f"e{e}") for e in range(4)], swiglu("shared"))
    x = torch.randn(1, 5, 4, generator=g)
    out = _moe(moe, x)
    assert [c for c in calls if c[1] == 0] == [(f"e{e}.{n}", 0) for e in (2, 3) for n in ("w1", "w3", "w2")]
    assert [c[0] for c in calls] == [
        f"{e}.{n}" for e in ("e0", "e1", "e2", "e3", "shared") for n in ("w1", "w3", "w2")
    ]
    p = logits.softmax(-1)

    def f(ff, x):
        return ff[2](torch.nn.functional.silu(ff[0](x)) * ff[1](x))

    want = p[0] * f(moe.experts[0], x[0]) + p[1] * f(moe.experts[1], x[0]) + f(moe.shared, x[0])
    assert torch.allclose(out[0], want, atol=1e-5)


def test_hidream_steps_fully_and_partially_alike(hidream, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(hidream[0]["prefixed"], tmp_path, 0.01, "hidream", (1, 16, 8, 8))


def test_the_release_layout_binds_whole(tmp_path):
    """HiDream-ai's 17B layout (checked against diffusers' model of the released config, key for key)."""
    from layouts_2026 import image as I
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = I.hidream_release(I.HIDREAM_I1)
    assert rows == meta_shapes(
        diffusers.HiDreamImageTransformer2DModel, **I.hidream_diffusers_config(I.HIDREAM_I1)
    )
    assert abs(rows.params() - 17.1e9) < 0.1e9
    m = _bound(
        write_sparse(
            tmp_path / "hidream.safetensors", [(k, "BF16", s) for k, s in rows.under(PREFIX).items()]
        )
    ).model
    assert (len(m.doubles), len(m.singles), len(m.captions), len(m.singles[0].ff_i.experts)) == (
        16,
        32,
        49,
        4,
    )
    assert (m.in_channels, m.t5_dim, m.llama_dim, m.pooled_dim) == (16, 4096, 4096, 2048)


# What HiDream's LoRA trainers target (diffusers' train_dreambooth_lora_hidream: the attentions' to_q / to_k / to_v /
# to_out; ai-toolkit and diffusion-pipe: the blocks' linears, the routed and shared experts' feed-forwards too; the
# router's gate left alone), in both kinds of block.
LORA_MODULES = ("double_stream_blocks.0.block.attn1.to_q", "double_stream_blocks.1.block.attn1.to_v_t",
                "double_stream_blocks.0.block.attn1.to_out", "double_stream_blocks.1.block.attn1.to_out_t",
                "double_stream_blocks.0.block.ff_i.experts.1.w1", "double_stream_blocks.1.block.ff_i.shared_experts.w2",
                "double_stream_blocks.0.block.ff_t.w3", "double_stream_blocks.0.block.adaLN_modulation.1",
                "single_stream_blocks.0.block.attn1.to_k", "single_stream_blocks.2.block.attn1.to_out",
                "single_stream_blocks.1.block.ff_i.experts.3.w2", "single_stream_blocks.2.block.ff_i.shared_experts.w3",
                "caption_projection.1.linear", "x_embedder.proj")  # fmt: skip


@pytest.mark.parametrize(
    ("prefix", "file", "budget"),
    [("transformer.", "prefixed", None), ("transformer.", "prefixed", 0.0), ("diffusion_model.", "bare", 0.0),
     ("lora_transformer_", "bare", None)],
    ids=["peft-baked", "peft-on-the-fly", "comfyui-on-the-fly", "onetrainer-baked"],
)  # fmt: skip
def test_loras_as_trainers_name_them_equal_diffusers_merged(hidream, tmp_path, prefix, file, budget):
    """A PEFT LoRA (`transformer.`: diffusers, ai-toolkit's diffusers form), ai-toolkit's / diffusion-pipe's ComfyUI
    form (`diffusion_model.` over the same names) and OneTrainer's (`lora_transformer_double_stream_blocks_0_…`), on
    the release's prefixed file and the bare one, baked and on the fly, reaching the experts' feed-forwards: equal to
    diffusers' model with the ΔW merged by hand."""
    from denoise_files import lora_and_merged, plain_and_merged

    files, ref = hidream
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    kohya = prefix.startswith("lora_")
    keys = {d: prefix + (d.replace(".", "_") if kohya else d) for d in LORA_MODULES}
    strength = 0.7
    lora, merged = lora_and_merged(sd, keys, strength, seed=13, kohya=kohya)
    x = _inputs(_bound(files[file]), 64, 64, batch=1, seed=3)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"hidream LoRA {prefix} on {file} ({budget})"
    check_lora_step(files[file], lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, tol=TOL)
