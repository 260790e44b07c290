"""NucleusMoE-Image's transformer (engine.denoise.nucleus_image) against diffusers' NucleusMoEImageTransformer2DModel on
the same weights, bare and under `model.diffusion_model.`; 6 blocks (the first 3 dense, as the release), 4 query heads
of 128 over 2 key heads, 16 experts, the release's capacity factors and route scale, float32 and bf16, CPU; with and without a
text mask; its op order, a step fully and partially resident, the default-size layout binding whole, a PEFT LoRA and
`loadout step` from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-5
PREFIX = "model.diffusion_model."
# the release's capacity factors by block (transformer/config.json), cut to 6 blocks
CONFIG = dict(num_layers=6, out_channels=16, attention_head_dim=128, num_attention_heads=4, num_key_value_heads=2,
              joint_attention_dim=48, num_experts=16, moe_intermediate_dim=32,
              dense_moe_strategy="leave_first_three_blocks_dense", capacity_factors=[0.0, 0.0, 0.0, 4.0, 4.0, 2.0],
              route_scale=2.5, use_sigmoid=False)  # fmt: skip


@pytest.fixture(scope="module")
def nucleus(tmp_path_factory):
    torch.manual_seed(0)
    ref, sd = well_scaled(diffusers.NucleusMoEImageTransformer2DModel(**CONFIG), 17)
    for k in [k for k in sd if k.endswith("img_mod.1.weight")]:  # gates past the ±2 clamp on some channels
        sd[k] = sd[k] * 4
    ref.load_state_dict(sd)
    d = tmp_path_factory.mktemp("nucleus")
    return (
        write(d / "nucleus_diffusers.safetensors", sd),
        write(d / "nucleus_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "nucleus_image"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "nucleus_image")


def _diffusers(ref, x: dict) -> torch.Tensor:
    f, h, w = (int(v) for v in x["img_shapes"][0])
    mask = x.get("encoder_hidden_states_mask")
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"], img_shapes=[(f, h, w)] * len(x["timestep"]),
                   encoder_hidden_states_mask=None if mask is None else mask.bool(), return_dict=False)[0]  # fmt: skip


def _inputs(den, seed=1, batch=2):
    """A 96 x 64 px step (6 x 4 patches) with 12 prompt tokens; the second prompt's last 5 masked."""
    x = den.random_inputs(64, 96, batch=batch, seed=seed)
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :12]
    mask = torch.ones(batch, 12)
    mask[-1, 7:] = 0
    return x, mask


def test_nucleus_equals_diffusers_in_both_namings_with_and_without_a_text_mask(nucleus):
    diff_path, prefixed_path, ref, _ = nucleus
    dens = [_bound(diff_path), _bound(prefixed_path)]
    x, mask = _inputs(dens[0])
    with torch.inference_mode():
        for inputs, what in ((x, "unmasked"), (dict(x, encoder_hidden_states_mask=mask), "masked")):
            inputs = dens[0].check_inputs(inputs, "inputs")
            want = _diffusers(ref, inputs)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(inputs)
                err = rel_l2(out, want)
                print(f"nucleus_image ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 24, 64) and err <= TOL
        # the mask matters: the masked tokens are not attended to
        assert rel_l2(dens[0](x), _diffusers(ref, dict(x, encoder_hidden_states_mask=mask))) > 100 * TOL


def test_bf16_equals_diffusers_bit_for_bit(nucleus, tmp_path):
    """In bf16 (the release's dtype) on the CPU: every rounding as diffusers' (its RMSNorm's two, its float32 rotary
    table), so its expert-choice routing picks the same tokens — a one-ulp difference upstream moves tokens between
    experts (31% apart at the last block with F.rms_norm and Qwen-Image's float64 table)."""
    from engine.model import Component

    ref = diffusers.NucleusMoEImageTransformer2DModel(**CONFIG)
    ref.load_state_dict(nucleus[3])
    ref = ref.to(torch.bfloat16).eval()
    path = write(tmp_path / "bf16.safetensors", {k: v.bfloat16() for k, v in nucleus[3].items()})
    den = denoise.bind(Component("transformer", path, "", compute_dtype="bfloat16"), "nucleus_image")
    x, mask = _inputs(den)
    x = {
        k: v if k == "img_shapes" else v.bfloat16()
        for k, v in dict(x, encoder_hidden_states_mask=mask).items()
    }
    with torch.inference_mode():
        assert torch.equal(den(x), _diffusers(ref, x))


def test_routing_is_expert_choice_with_the_release_capacity(nucleus, monkeypatch):
    """Fails with another capacity factor, route scale or an unnormalised gate."""
    from engine.denoise import nucleus_image as N

    den = _bound(nucleus[0])
    x, _ = _inputs(den, seed=4)
    with torch.inference_mode():
        want = _diffusers(nucleus[2], x)
        assert rel_l2(den(x), want) <= TOL
        with monkeypatch.context() as mp:
            mp.setattr(N, "ROUTE_SCALE", 1.0)
            assert rel_l2(den(x), want) > 100 * TOL
        for blk in den.model.blocks[3:]:
            blk.mlp.capacity = 1.0
        assert rel_l2(den(x), want) > 100 * TOL


def test_bad_inputs_are_refused(nucleus):
    from engine.errors import FormatError

    den = _bound(nucleus[0])
    x, _ = _inputs(den)
    with pytest.raises(FormatError, match="img_shapes says"):
        den.check_inputs(dict(x, img_shapes=torch.tensor([[1.0, 5, 4], [1.0, 5, 4]])), "in.safetensors")
    with pytest.raises(FormatError, match="one whole"):
        den.check_inputs(dict(x, img_shapes=torch.tensor([[1.0, 6, 4], [1.0, 4, 6]])), "in.safetensors")


def test_nucleus_op_order_is_the_call_order(nucleus):
    check_op_order(nucleus[1], "nucleus_image", PREFIX, plain=6)  # the unused norm_added_q


def test_a_partial_step_equals_the_full_one_and_streams_the_packed_experts(nucleus, tmp_path, monkeypatch):
    """The experts are a castable op: on a budget they stay off the device and stream like the layers (a plain holder
    would have to be resident whole), and every expert is read each step — expert-choice routing runs them all."""
    from denoise_files import step_full_and_partial

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    runs = step_full_and_partial(nucleus[0], tmp_path, 0.0005, size=(64, 64), steps=1)
    (full, a), (partial, b) = runs["full"], runs["partial"]
    sd = nucleus[3]
    experts = sum(sd[k].numel() * 4 for k in sd if ".experts." in k)
    total = sum(t.numel() * 4 for t in sd.values())
    print(f"nucleus_image: streamed {partial.streamed_bytes_per_step} B/step of {total} (experts {experts})")
    assert (full.architecture, full.output_shape) == ("nucleus_image", (1, 16, 64))
    assert torch.equal(a, b)  # the partial step gives the full step's bits
    assert experts <= partial.streamed_bytes_per_step <= total


def test_the_default_size_layout_binds_whole(tmp_path):
    """The release's config (transformer/config.json: 32 blocks, the first 3 dense, 16 heads of 128 over 4 key heads,
    64 experts of 1344, Qwen3-VL's 4096-wide states), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.NucleusMoEImageTransformer2DModel, num_layers=32, num_key_value_heads=4,
                       joint_attention_dim=4096, num_experts=64, out_channels=16,
                       dense_moe_strategy="leave_first_three_blocks_dense")  # fmt: skip
    path = write_sparse(tmp_path / "nucleus.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    moe = [b.mlp for b in m.blocks if hasattr(b.mlp, "capacity")]
    assert (len(m.blocks), len(moe), m.heads, m.kv_heads, m.in_channels, m.context_dim) == (
        32,
        29,
        16,
        4,
        64,
        4096,
    )
    assert [x.capacity for x in moe[:3]] == [4.0, 4.0, 2.0]


def test_step_from_the_command_line(nucleus, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(nucleus[1]), "--size", "64x32",
                        "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (
        got["architecture"] == "nucleus_image" and got["mode"] == "full" and got["output_shape"] == [1, 8, 64]
    )


# Every Linear kind: the stems, a dense and a MoE block's modulation, text projection, attention, the router, the
# shared expert and the dense SwiGLU, the head. (The packed experts are 3-D tensors no PEFT LoRA targets.)
LORA_MODULES = ("img_in", "time_text_embed.timestep_embedder.linear_1", "transformer_blocks.0.img_mod.1",
                "transformer_blocks.3.encoder_proj", "transformer_blocks.1.attn.to_q", "transformer_blocks.4.attn.to_k",
                "transformer_blocks.5.attn.add_v_proj", "transformer_blocks.3.attn.to_out.0",
                "transformer_blocks.4.img_mlp.gate", "transformer_blocks.5.img_mlp.shared_expert.net.0.proj",
                "transformer_blocks.2.img_mlp.net.2", "norm_out.linear", "proj_out")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("bare", None), ("prefixed", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(nucleus, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed; the file reads as a NucleusMoE-Image LoRA."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, prefixed_path, ref, sd = nucleus
    path = prefixed_path if base == "prefixed" else diff_path
    strength = 0.8
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, {d: "transformer." + d for d in LORA_MODULES},
                                   strength, seed=7)  # fmt: skip
    x, _ = _inputs(_bound(path), seed=9, batch=1)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"nucleus_image LoRA (peft on {base}, budget {budget})"
    check_lora_step(
        path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, "nucleus_image", TOL
    )


def test_a_gguf_with_quantized_experts_steps_like_its_twin(nucleus, tmp_path):
    """Q8_0 packed experts (and the router, attention and shared expert), dequantized as each op runs: the forward
    equals the one on the dequantized twin."""
    from denoise_files import check_gguf_like_its_twin

    def pick(key, t):
        return (
            t.dim() >= 2
            and t.shape[-1] % 32 == 0
            and (".experts." in key or ".attn.to_" in key or "img_mlp" in key)
        )

    # tol 1e-5: the same values, but the experts' fresh dequantized tensors and the twin's mapped ones take the CPU's
    # batched products through differently aligned operands (~1e-6 apart with the experts alone quantized)
    quantized = check_gguf_like_its_twin(tmp_path, nucleus[3], "nucleus_image", pick, "nucleus_image", size=(64, 96),
                                         tol=1e-5)  # fmt: skip
    assert sum(".experts." in k for k in quantized) == 6  # both tensors of the 3 MoE blocks


def test_layouts_it_cannot_run_are_refused_by_name(nucleus, tmp_path):
    from engine.errors import UnsupportedModel

    sd = nucleus[3]
    broken = {k: v for k, v in sd.items() if k != "transformer_blocks.4.img_mlp.experts.down_proj"}
    with pytest.raises(
        UnsupportedModel, match=r"transformer_blocks\.4\.img_mlp\.experts holds gate_up_proj, not"
    ):
        _bound(write(tmp_path / "no_down.safetensors", broken))
    # 2 experts: block 3's capacity factor 4 would have each take more tokens than an image has
    few = dict(CONFIG, num_layers=4, num_experts=2, capacity_factors=[0.0, 0.0, 0.0, 4.0])
    _, sd2 = well_scaled(diffusers.NucleusMoEImageTransformer2DModel(**few), 3)
    with pytest.raises(
        UnsupportedModel, match="routes to 2 experts, fewer than NucleusMoE-Image's capacity factor 4"
    ):
        _bound(write(tmp_path / "few.safetensors", sd2))
