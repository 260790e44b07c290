"""MiniMax-H3's transformer (engine.denoise.minimax_h3) against diffusers' MiniMaxH3Transformer3DModel on the same weights,
in diffusers' naming and the release's (fused [q; k; v] qkv_proj, SwiGLU fc1 as [gate; value], `rope.inv_freq` kept: the
inverse of diffusers' convert_minimax_h3_transformer_checkpoint_to_diffusers, bare and under `model.diffusion_model.`),
2 blocks and 1 refiner block of 2 heads of 112 over a 64-wide stream, float32, CPU: a packed layout of text, audio and
video rows at two noise levels, a batch of two; its op order, a step fully and partially resident, LoRAs in either
naming, and a Q8_0 GGUF."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    rel_l2,
    well_scaled,
    write,
)
from minimax_files import config, to_release

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

pytest.importorskip("diffusers")

TOL = 1e-4
# rope_freq_dim at diffusers' default (16 per axis: 96 of each head's 112 channels turned), so a file without
# rope.inv_freq (diffusers' naming: a non-persistent buffer) is read at the default too
CFG = config(attention_head_dim=112, rope_freq_dim=16, hidden_size=64)


def diffusers_minimax(seed: int = 43):
    from diffusers import MiniMaxH3Transformer3DModel

    return well_scaled(MiniMaxH3Transformer3DModel(**CFG), seed)


def release(ref, sd: dict, prefix: str = "") -> dict:
    out = to_release(sd) | {"rope.inv_freq": ref.rope.inv_freq.clone()}
    return {prefix + k: v for k, v in out.items()}


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    d = tmp_path_factory.mktemp("minimax_h3")
    ref, sd = diffusers_minimax()
    return {
        "diffusers": write(d / "minimax_h3_diffusers.safetensors", sd),
        "release": write(d / "minimax_h3.safetensors", release(ref, sd)),
        "comfy": write(d / "minimax_h3_comfy.safetensors", release(ref, sd, "model.diffusion_model.")),
        "ref": ref,
    }


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "minimax_h3"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "minimax_h3")


def _diffusers(ref, x: dict) -> dict:
    layout = ("timestep_indices", "token_tags", "video_indices", "audio_indices", "text_indices")
    args = {k: (v.long() if k in layout else v) for k, v in x.items()}
    with torch.inference_mode():
        out = ref(**args, return_dict=False)
    return {"out": out[0], "audio_out": out[1]}


def _inputs(den, batch: int, seed: int) -> dict:
    """A 4 x 6 grid of patches (128 x 192 px), 12 text rows and the random step's audio rows; the rows shuffled so
    that no modality sits where the default layout puts it."""
    x = den.random_inputs(128, 192, batch=batch, seed=seed)
    assert x["hidden_states"].shape == (batch, 24, 16) and x["encoder_hidden_states"].shape == (
        batch,
        256,
        40,
    )
    g = torch.Generator().manual_seed(seed + 100)
    t = 12
    keep = torch.cat([torch.arange(t), torch.arange(256, x["position_ids"].shape[0])])
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :t]
    for k in ("timestep_indices", "token_tags", "position_ids"):
        x[k] = x[k][keep]
    s = keep.numel()
    perm = torch.randperm(s, generator=g)  # row i of the old layout goes to perm[i]
    x["video_indices"] = perm[t + 7 :].float()
    x["audio_indices"] = perm[t : t + 7].float()
    x["text_indices"] = perm[:t].float()
    for k in ("timestep_indices", "token_tags", "position_ids"):
        moved = torch.empty_like(x[k])
        moved[perm] = x[k]
        x[k] = moved
    x["position_ids"][:, 1:] *= 1.5  # the pipeline's spread grid: fractional positions
    x["timestep"] = torch.tensor([0.3, 0.85])
    return x


@pytest.mark.parametrize("naming", ["diffusers", "release", "comfy"])
def test_equals_diffusers_on_a_packed_sequence(minimax, naming):
    den = _bound(minimax[naming])
    assert den.naming == ("diffusers" if naming == "diffusers" else "release")
    assert den.input_names[:3] == ("hidden_states", "audio_hidden_states", "encoder_hidden_states")
    assert (len(den.model.blocks), len(den.model.refiner), den.model.heads) == (2, 1, 2)
    x = den.check_inputs(_inputs(den, 2, 1), "inputs")
    want = _diffusers(minimax["ref"], x)
    with torch.inference_mode():
        got = den.outputs(x)
    for k in ("out", "audio_out"):
        err = rel_l2(got[k], want[k])
        print(f"minimax_h3 ({naming}) {k}: relative L2 {err:.2e}")
        assert got[k].shape == want[k].shape and err <= TOL


def test_the_rotation_the_swiglu_halves_and_the_modality_rows_count(minimax, monkeypatch):
    """The comparison would catch a forward that turned the channels the other way, took the SwiGLU's halves the other
    way round, or picked the modulation row by level alone."""
    from engine.denoise import minimax_h3 as m

    den = _bound(minimax["release"])
    x = den.check_inputs(_inputs(den, 1, 2), "inputs")
    want = _diffusers(minimax["ref"], x)["out"]
    right = m._rotate
    with torch.inference_mode():
        assert rel_l2(den(x), want) <= TOL
        monkeypatch.setattr(m, "_rotate", lambda t, cos, sin: right(t, cos, -sin))
        assert rel_l2(den(x), want) > 1e-3
        monkeypatch.setattr(m, "_rotate", right)
        monkeypatch.setattr(m, "MODALITIES", 1)
        assert rel_l2(den(x), want) > 1e-3
        monkeypatch.setattr(m, "MODALITIES", 3)
        den.model.diffusers = True
        assert rel_l2(den(x), want) > 1e-3


def test_a_layout_that_does_not_add_up_is_a_format_error(minimax):
    den = _bound(minimax["release"])
    x = _inputs(den, 1, 3)
    bad = dict(x, token_tags=torch.zeros_like(x["token_tags"]))
    with pytest.raises(FormatError, match="token_tags"):
        den.check_inputs(bad, "inputs")
    bad = dict(x, text_indices=x["video_indices"][:12])
    with pytest.raises(FormatError, match="each once|token_tags"):
        den.check_inputs(bad, "inputs")
    bad = dict(x, timestep_indices=x["timestep_indices"] + 2)
    with pytest.raises(FormatError, match="timestep_indices"):
        den.check_inputs(bad, "inputs")


def test_the_pruned_checkpoint_is_refused(minimax, tmp_path):
    ref, sd = minimax["ref"], minimax["ref"].state_dict()
    rows = {k: v for k, v in release(ref, sd).items() if not k.startswith("time_embedder.")}
    path = write(tmp_path / "pruned.safetensors", rows | {"adaln_t_table": torch.zeros(10, 24)})
    from engine.errors import UnsupportedModel

    with pytest.raises(UnsupportedModel, match="pruned"):
        denoise.bind(Component("transformer", path, ""), "minimax_h3")


def test_minimax_op_order_is_the_call_order(minimax):
    check_op_order(minimax["release"], "minimax_h3", plain=1)  # the rope's inv_freq


def test_minimax_steps_fully_and_partially_alike(minimax, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(minimax["release"], tmp_path, 0.0001, "minimax_h3", (1, 4, 16))


def test_a_gguf_minimax_steps_like_its_dequantized_twin(minimax, tmp_path):
    """A GGUF in the release's names (the Linears' weights Q8_0 where their rows are 32-multiples, the norms and
    inv_freq as they are): the same output as its dequantized safetensors twin."""
    pytest.importorskip("gguf")
    ref = minimax["ref"]
    quantized = check_gguf_like_its_twin(
        tmp_path, release(ref, ref.state_dict()), "minimax_h3", lambda k, t: t.dim() == 2 and t.shape[-1] % 32 == 0,
        "minimax_h3", size=(128, 128),
    )  # fmt: skip
    assert {
        "blocks.0.attn.qkv_proj.weight",
        "blocks.1.mlp.fc1.weight",
        "token_refiner.blocks.0.attn.qkv_proj.weight",
        "final_layer.video_out.weight",
    } <= set(quantized)


@pytest.mark.parametrize("naming", ["release", "comfy", "diffusers"])
def test_the_release_layout_binds_whole(tmp_path, naming):
    """MiniMax-H3 at its released size (diffusers' default config: 50 blocks, 2 refiner blocks, width 5376, 56 heads of
    128, SwiGLU 14336; the release's rows from diffusers' class through the inverse of its converter, which the
    detection tests check), with `rope.inv_freq`, under ComfyUI's prefix, and in diffusers' names: every layer is one
    the forward computes with."""
    from diffusers import MiniMaxH3Transformer3DModel
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(MiniMaxH3Transformer3DModel)
    if naming != "diffusers":
        rows = to_release(rows) | {"rope.inv_freq": (16,)}
    prefix = "model.diffusion_model." if naming == "comfy" else ""
    path = write_sparse(
        tmp_path / "minimax_h3_bf16.safetensors", [(prefix + k, "BF16", s) for k, s in rows.items()]
    )
    den = _bound(path)
    m = den.model
    assert den.naming == ("diffusers" if naming == "diffusers" else "release")
    assert (len(m.blocks), len(m.refiner), m.heads, m.in_channels, m.audio_channels, m.context_dim) == (
        50, 2, 56, 96, 32, 5120)  # fmt: skip
    assert (m.rope is None) == (naming == "diffusers")


# A LoRA in the other naming: diffusers' split q / k / v reach the release's fused qkv_proj as row blocks, the SwiGLU fc1
# through its swapped halves; the rest by the table (engine.lora.family_names_dits.MINIMAX_H3).
PEFT_NAMES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.0.attn.to_v", "transformer_blocks.1.attn.to_k",
              "transformer_blocks.0.attn.to_out.0", "transformer_blocks.1.ff.net.0.proj", "transformer_blocks.0.ff.net.2",
              "transformer_blocks.1.adaln_proj.linear", "token_refiner.refiner_blocks.0.attn.to_k",
              "token_refiner.refiner_blocks.0.ff.net.0.proj", "context_embedder", "proj_in", "audio_proj_out",
              "norm_out.linear", "time_embedder.linear_2")  # fmt: skip
# The release's names of diffusers' modules that are not fused in the release (a LoRA of the fused qkv_proj cannot land
# on diffusers' split q / k / v: one adapter module is placed on one base weight).
RELEASE_NAMES = {"transformer_blocks.0.attn.to_out.0": "blocks.0.attn.out_proj", "transformer_blocks.1.ff.net.0.proj":
                 "blocks.1.mlp.fc1", "transformer_blocks.0.ff.net.2": "blocks.0.mlp.fc2",
                 "transformer_blocks.0.adaln_proj.linear": "blocks.0.adaln_proj.linear",
                 "token_refiner.refiner_blocks.0.ff.net.0.proj": "token_refiner.blocks.0.mlp.fc1",
                 "context_embedder": "condition_proj",
                 "proj_out": "final_layer.video_out", "audio_proj_in": "audio_patch_proj",
                 "norm_out.linear": "final_layer.adaln_proj.linear", "time_embedder.linear_1": "time_embedder.proj_in"}  # fmt: skip


def _swap_halves(w: torch.Tensor) -> torch.Tensor:
    a, b = w.chunk(2, dim=0)
    return torch.cat([b, a])


def _lora_case(minimax, tmp_path, budget, base: str, keys: dict, kohya: bool):
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    ref = minimax["ref"]
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=7, kohya=kohya)
    if base == "diffusers":  # the release's fc1 holds its halves the other way round: so does its ΔW
        for d, k in keys.items():
            if d.endswith("ff.net.0.proj"):
                lora[f"{k}.lora_up.weight"] = _swap_halves(lora[f"{k}.lora_up.weight"])
    x = _inputs(_bound(minimax[base]), 1, 5)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x)["out"])
    assert rel_l2(plain, want) > 100 * TOL
    what = f"minimax_h3 LoRA on the {base} file (budget {budget})"
    check_lora_step(
        minimax[base], lora, strength, x, tmp_path, budget, want, len(keys), what, "minimax_h3", TOL
    )


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_on_the_release_file(minimax, tmp_path, budget):
    """A diffusers / PEFT LoRA (ai-toolkit's and diffusers' names) on the release-named file, baked (resident) and on
    the fly (streamed): equal to diffusers' model with the LoRA merged by hand."""
    _lora_case(minimax, tmp_path, budget, "release", {d: f"transformer.{d}" for d in PEFT_NAMES}, kohya=False)


@pytest.mark.parametrize(("budget", "prefix"), [(None, "diffusion_model."), (0.0, "lora_unet_")])
def test_a_release_named_lora_lands_on_the_diffusers_file(minimax, tmp_path, budget, prefix):
    """A LoRA in the release's names (diffusion-pipe's `diffusion_model.`, kohya's `lora_unet_` with underscores) on the
    diffusers-named file, baked and on the fly."""
    keys = {
        d: prefix + (r.replace(".", "_") if prefix.endswith("_") else r) for d, r in RELEASE_NAMES.items()
    }
    _lora_case(minimax, tmp_path, budget, "diffusers", keys, kohya=True)


def test_a_peft_lora_of_the_attention_alone_names_minimax_h3_by_its_width():
    """diffusers' attention names are many families'; MiniMax-H3's stream is 5376 wide (heads 7168)."""
    from engine.lora.describe import describe_lora

    r = 4
    lora = {}
    for n, (out, inp) in {"to_q": (7168, 5376), "to_k": (7168, 5376), "to_out.0": (5376, 7168)}.items():
        lora[f"transformer.transformer_blocks.3.attn.{n}.lora_A.weight"] = (r, inp)
        lora[f"transformer.transformer_blocks.3.attn.{n}.lora_B.weight"] = (out, r)
    from engine.detect.keys import index_from_shapes

    assert describe_lora(index_from_shapes(lora, None, dtype="BF16")).base == "minimax_h3"


def test_the_release_files_rotary_frequencies_are_read(tmp_path):
    """A release file's `rope.inv_freq` is what the forward turns by: 4 frequencies per axis (24 of each head's 32
    channels), not diffusers' default 16."""
    from diffusers import MiniMaxH3Transformer3DModel

    ref, sd = well_scaled(MiniMaxH3Transformer3DModel(**config(hidden_size=64)), 44)
    den = _bound(write(tmp_path / "minimax_h3_rope4.safetensors", release(ref, sd)))
    x = den.check_inputs(_inputs(den, 1, 6), "inputs")
    want = _diffusers(ref, x)
    with torch.inference_mode():
        got = den.outputs(x)
    assert all(rel_l2(got[k], want[k]) <= TOL for k in ("out", "audio_out"))


def test_narrow_heads_without_their_frequencies_are_refused(tmp_path):
    """A diffusers-named file (no rope.inv_freq) whose heads are narrower than the default frequencies turn: refused in
    words, not run at the wrong frequencies."""
    from diffusers import MiniMaxH3Transformer3DModel

    from engine.errors import UnsupportedModel

    _, sd = well_scaled(MiniMaxH3Transformer3DModel(**config()), 45)
    with pytest.raises(UnsupportedModel, match="rope_freq_dim"):
        _bound(write(tmp_path / "minimax_h3_rope4_diffusers.safetensors", sd))
