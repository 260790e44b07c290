"""Mochi 1's transformer (engine.denoise.mochi) against diffusers' MochiTransformer3DModel on the same weights, in
diffusers' naming and the release's (Genmo's `dit.safetensors` / ComfyUI's: fused qkv_x / qkv_y, mod_x / mod_y,
mlp_x.w1 with its SwiGLU halves the other way round, final_layer.mod as (shift, scale): the inverse of diffusers'
convert_mochi_transformer_checkpoint_to_diffusers), 2 blocks (the last one leaving the text as it is) of 2 heads
of 32, a 48-wide text stream, 64-wide T5 states, float32, CPU: padded prompts of one and of several lengths (an
empty one too), frames and an oblong grid; its op order, a step fully and partially resident, and the 48-block 10B
layout binding whole in both namings."""

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

pytest.importorskip("diffusers")

TOL = 1e-4
LAYERS = 2


def diffusers_mochi(seed: int = 41):
    from diffusers import MochiTransformer3DModel

    model = MochiTransformer3DModel(
        num_attention_heads=2, attention_head_dim=32, num_layers=LAYERS, pooled_projection_dim=48, in_channels=12,
        text_embed_dim=64,
    )  # fmt: skip
    return well_scaled(model, seed)


TOP = {"patch_embed.proj.": "x_embedder.proj.", "time_embed.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
       "time_embed.timestep_embedder.linear_2.": "t_embedder.mlp.2.", "time_embed.pooler.": "t5_y_embedder.",
       "time_embed.caption_proj.": "t5_yproj.", "proj_out.": "final_layer.linear."}  # fmt: skip
BLOCK = {"norm1.linear.": "mod_x.", "norm1_context.linear.": "mod_y.", "norm1_context.linear_1.": "mod_y.",
         "attn1.norm_q.": "attn.q_norm_x.", "attn1.norm_k.": "attn.k_norm_x.", "attn1.norm_added_q.": "attn.q_norm_y.",
         "attn1.norm_added_k.": "attn.k_norm_y.", "attn1.to_out.0.": "attn.proj_x.", "attn1.to_add_out.": "attn.proj_y.",
         "ff.net.2.": "mlp_x.w2.", "ff_context.net.2.": "mlp_y.w2."}  # fmt: skip


def _swap_halves(w: torch.Tensor) -> torch.Tensor:
    a, b = w.chunk(2, dim=0)
    return torch.cat([b, a])


def release(sd: dict, prefix: str = "") -> dict:
    """diffusers' names back in the release's (Genmo's checkpoint layout): q / k / v fused row-wise, the SwiGLU's
    halves and the final modulation's halves swapped back."""
    out = {}
    for k, v in sd.items():
        if k.startswith("transformer_blocks."):
            _, n, rest = k.split(".", 2)
            b = f"blocks.{n}."
            if rest.startswith(("attn1.to_k", "attn1.to_v", "attn1.add_k_proj", "attn1.add_v_proj")):
                continue
            if rest.startswith(("attn1.to_q.", "attn1.add_q_proj.")):
                s = "x" if rest.startswith("attn1.to_q.") else "y"
                names = ("to_q", "to_k", "to_v") if s == "x" else ("add_q_proj", "add_k_proj", "add_v_proj")
                out[f"{b}attn.qkv_{s}.weight"] = torch.cat(
                    [sd[f"transformer_blocks.{n}.attn1.{m}.weight"] for m in names]
                )
                continue
            if rest.startswith(("ff.net.0.proj.", "ff_context.net.0.proj.")):
                out[b + ("mlp_x" if rest.startswith("ff.") else "mlp_y") + ".w1.weight"] = _swap_halves(v)
                continue
            rest = next((r + rest[len(a) :] for a, r in BLOCK.items() if rest.startswith(a)), rest)
            out[b + rest] = v
            continue
        if k.startswith("norm_out.linear."):
            out["final_layer.mod." + k.rsplit(".", 1)[1]] = _swap_halves(v)
            continue
        out[next((r + k[len(a) :] for a, r in TOP.items() if k.startswith(a)), k)] = v
    return {prefix + k: v for k, v in out.items()}


@pytest.fixture(scope="module")
def mochi(tmp_path_factory):
    d = tmp_path_factory.mktemp("mochi")
    ref, sd = diffusers_mochi()
    return {
        "diffusers": write(d / "mochi_diffusers.safetensors", sd),
        "release": write(d / "mochi.safetensors", release(sd)),
        "comfy": write(d / "mochi_comfy.safetensors", release(sd, "model.diffusion_model.")),
        "ref": ref,
    }


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "mochi"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "mochi")


def _diffusers(ref, x: dict) -> torch.Tensor:
    """diffusers' forward on Genmo's inputs: its timestep is 1000 (1 - sigma), its output Genmo's as it is."""
    mask = x.get("y_mask", torch.ones(x["y_feat"].shape[:2]))
    with torch.inference_mode():
        return ref(hidden_states=x["x"], encoder_hidden_states=x["y_feat"], timestep=1000 * (1 - x["sigma"]),
                   encoder_attention_mask=mask, return_dict=False)[0]  # fmt: skip


def _inputs(den, batch: int, seed: int, frames: int = 3) -> dict:
    x = den.random_inputs(64, 96, batch=batch, seed=seed)  # a 12 x 8 latent: a 6 x 4 grid of patches
    assert x["x"].shape == (batch, 12, 1, 12, 8) and x["y_feat"].shape == (batch, 256, 64)
    g = torch.Generator().manual_seed(seed + 100)
    x["x"] = torch.randn(batch, 12, frames, 12, 8, generator=g)
    x["y_feat"] = x["y_feat"][:, :16]
    return x


@pytest.mark.parametrize("naming", ["diffusers", "release", "comfy"])
def test_equals_diffusers_with_a_padded_prompt(mochi, naming):
    """One prompt padded to 16 tokens (the original's B = 1 path: its tokens alone), 3 frames of 6 x 4 patches."""
    den = _bound(mochi[naming])
    assert den.naming == ("diffusers" if naming == "diffusers" else "release")
    assert den.input_names == ("x", "sigma", "y_feat") and len(den.model.blocks) == LAYERS
    assert [b.update_y for b in den.model.blocks] == [True, False]
    x = _inputs(den, 1, 1)
    x["y_mask"] = torch.zeros(1, 16)
    x["y_mask"][0, :9] = 1
    x = den.check_inputs(x, "inputs")
    want = _diffusers(mochi["ref"], x)
    with torch.inference_mode():
        out = den(x)
        err = rel_l2(out, want)
        print(f"mochi ({naming}): relative L2 {err:.2e}")
        assert out.shape == (1, 12, 3, 12, 8) and err <= TOL
        x["y_feat"][0, 9:] = 30.0  # the padding does not reach the output
        assert rel_l2(den(x), want) <= TOL
        x["y_mask"][0, 5:] = 0  # the mask does
        assert rel_l2(den(x), want) > 1e-3


def test_a_batch_of_prompts_of_several_lengths_equals_diffusers(mochi):
    """A CFG-like batch padded to 16 tokens: prompts of 12, 7 and no tokens (the pipeline's empty negative prompt
    marks none)."""
    den = _bound(mochi["release"])
    x = _inputs(den, 3, 2, frames=2)
    x["y_mask"] = torch.zeros(3, 16)
    x["y_mask"][0, :12] = 1
    x["y_mask"][1, :7] = 1
    x["sigma"] = torch.tensor([1.0, 0.5, 0.02])
    x = den.check_inputs(x, "inputs")
    want = _diffusers(mochi["ref"], x)
    with torch.inference_mode():
        out = den(x)
        err = rel_l2(out, want)
        print(f"mochi (batch of 3 prompts): relative L2 {err:.2e}")
        assert err <= TOL
        x["y_feat"][x["y_mask"] == 0] = 30.0  # the padding does not reach the output
        assert rel_l2(den(x), want) <= TOL
        for i in range(3):  # each item as it runs alone
            one = {k: v[i : i + 1] for k, v in x.items()}
            assert rel_l2(den(one), want[i : i + 1]) <= TOL


def test_the_rotation_and_the_swiglu_halves_count(mochi, monkeypatch):
    """The comparison would catch a forward that turned the pairs the other way, read the pairs as halves, or took
    the SwiGLU's halves the other way round."""
    from engine.denoise import mochi as m

    den = _bound(mochi["release"])
    x = _inputs(den, 1, 3)
    want = _diffusers(mochi["ref"], x)
    right = m._rotate

    def halves(t, cos, sin):  # NeoX-style halves instead of interleaved pairs
        a, b = t.float().chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).type_as(t)

    wrong = {
        "backwards": lambda t, cos, sin: right(t, cos, -sin),
        "halves": halves,
    }
    with torch.inference_mode():
        assert rel_l2(den(x), want) <= TOL
        for name, f in wrong.items():
            monkeypatch.setattr(m, "_rotate", f)
            assert rel_l2(den(x), want) > 1e-3, name
        monkeypatch.setattr(m, "_rotate", right)
        den.model.diffusers = True  # the release's w1 read as diffusers' (and its final modulation)
        assert rel_l2(den(x), want) > 1e-3


def test_mochi_op_order_is_the_call_order(mochi):
    check_op_order(mochi["release"], "mochi", plain=1)  # the root's pos_frequencies


def test_mochi_steps_fully_and_partially_alike(mochi, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(mochi["release"], tmp_path, 0.0001, "mochi", (1, 12, 1, 8, 8))


@pytest.mark.parametrize("naming", ["release", "comfy", "diffusers"])
def test_the_release_layout_binds_whole(tmp_path, naming):
    """Mochi 1 preview (48 blocks, visual 3072 = 24 heads of 128, text 1536, T5-XXL 4096, SwiGLU 8192 / 4096, no
    qkv bias, the last block's text stream without proj_y and mlp_y: layouts_2026's, checked against diffusers'
    converter by the detection tests) as Genmo's file holds it, under ComfyUI's prefix, and as diffusers' own
    converter renames it: every layer is one the forward computes with."""
    from layouts_2026 import video as V
    from layouts_2026.common import converted

    from engine.formats.safetensors import write_sparse

    rows = V.mochi_original()
    if naming == "comfy":
        rows = rows.under("model.diffusion_model.")
    if naming == "diffusers":
        from diffusers.loaders.single_file_utils import convert_mochi_transformer_checkpoint_to_diffusers

        rows = converted(convert_mochi_transformer_checkpoint_to_diffusers, rows)
    path = write_sparse(
        tmp_path / "mochi_preview_bf16.safetensors", [(k, "BF16", s) for k, s in rows.items()]
    )
    den = _bound(path)
    m = den.model
    assert den.naming == ("diffusers" if naming == "diffusers" else "release")
    assert (len(m.blocks), m.in_channels, m.context_dim, m.heads) == (48, 12, 4096, 24)
    assert [b.update_y for b in m.blocks[-2:]] == [True, False]


# A LoRA in the other naming: diffusers' split q / k / v reach the release's fused qkv_x / qkv_y as row blocks, the
# SwiGLU w1 and the final modulation through their swapped halves, the last block's norm1_context.linear_1 its mod_y.
PEFT_NAMES = ("transformer_blocks.0.attn1.to_q", "transformer_blocks.0.attn1.to_v", "transformer_blocks.1.attn1.to_k",
              "transformer_blocks.0.attn1.add_k_proj", "transformer_blocks.1.attn1.add_v_proj",
              "transformer_blocks.0.attn1.to_out.0", "transformer_blocks.0.attn1.to_add_out",
              "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.0.ff_context.net.0.proj",
              "transformer_blocks.1.ff.net.2", "transformer_blocks.0.norm1_context.linear",
              "transformer_blocks.1.norm1_context.linear_1", "norm_out.linear", "proj_out", "time_embed.caption_proj",
              "time_embed.pooler.to_kv")  # fmt: skip
# The release's names of diffusers' modules that are not fused in the release (genmoai/mochi's trainer, musubi-style).
RELEASE_NAMES = {"transformer_blocks.0.attn1.to_out.0": "blocks.0.attn.proj_x",
                 "transformer_blocks.0.attn1.to_add_out": "blocks.0.attn.proj_y",
                 "transformer_blocks.0.ff.net.0.proj": "blocks.0.mlp_x.w1",
                 "transformer_blocks.1.ff.net.0.proj": "blocks.1.mlp_x.w1",
                 "transformer_blocks.0.ff_context.net.2": "blocks.0.mlp_y.w2",
                 "transformer_blocks.0.norm1.linear": "blocks.0.mod_x",
                 "transformer_blocks.1.norm1_context.linear_1": "blocks.1.mod_y", "norm_out.linear": "final_layer.mod",
                 "time_embed.caption_proj": "t5_yproj", "time_embed.timestep_embedder.linear_1": "t_embedder.mlp.0"}  # fmt: skip


def _lora_case(mochi, tmp_path, budget, base: str, keys: dict, kohya: bool):
    from denoise_files import lora_and_merged, plain_and_merged

    ref = mochi["ref"]
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=7, kohya=kohya)
    if (
        base == "diffusers"
    ):  # the release's w1 and final_layer.mod hold their halves the other way round: so its ΔW
        for d, k in keys.items():
            if d.endswith(("ff.net.0.proj", "norm_out.linear")):
                lora[f"{k}.lora_up.weight"] = _swap_halves(lora[f"{k}.lora_up.weight"])
    x = _inputs(_bound(mochi[base]), 1, 5, frames=2)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"mochi LoRA on the {base} file (budget {budget})"
    check_lora_step(mochi[base], lora, strength, x, tmp_path, budget, want, len(keys), what, "mochi", TOL)


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_on_the_release_file(mochi, tmp_path, budget):
    """A diffusers / PEFT LoRA (diffusers' Mochi trainer's and ai-toolkit's names) on Genmo's release-named file,
    baked (resident) and on the fly (streamed): equal to diffusers' model with the LoRA merged by hand."""
    _lora_case(mochi, tmp_path, budget, "release", {d: f"transformer.{d}" for d in PEFT_NAMES}, kohya=False)


@pytest.mark.parametrize(("budget", "prefix"), [(None, "diffusion_model."), (0.0, "lora_unet_")])
def test_a_release_named_lora_lands_on_the_diffusers_file(mochi, tmp_path, budget, prefix):
    """A LoRA in the release's names (diffusion-pipe's `diffusion_model.`, kohya's `lora_unet_` with underscores) on the
    diffusers-named file, baked and on the fly."""
    keys = {
        d: prefix + (r.replace(".", "_") if prefix.endswith("_") else r) for d, r in RELEASE_NAMES.items()
    }
    _lora_case(mochi, tmp_path, budget, "diffusers", keys, kohya=True)


def test_a_gguf_mochi_steps_like_its_dequantized_twin(tmp_path):
    """A GGUF in Genmo's names (the Linears' weights Q8_0, `pos_frequencies` and the norms as they are): the same
    output as its dequantized safetensors twin."""
    pytest.importorskip("gguf")
    _, sd = diffusers_mochi()
    quantized = check_gguf_like_its_twin(
        tmp_path, release(sd), "mochi", lambda k, t: t.dim() == 2 and t.shape[-1] % 32 == 0, "mochi"
    )
    assert "blocks.0.attn.qkv_x.weight" in quantized
