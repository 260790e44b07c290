"""Motif-Video's transformer (engine.denoise.motif_video) against diffusers' MotifVideoTransformer3DModel on the same
weights (bit for bit on the CPU; the bound is TOL), bare, under `transformer.` and under `model.diffusion_model.`; 2
double and 3 single blocks, 2 heads of 128, 64-wide text, float32, CPU. Two layouts: the default config's (no
cross-attention, no decoder, no image embedder, 1-frame patches) and every branch switched on (text cross-attention in
both kinds of block, one decoder block, an image embedder, 2-frame patches). Each: its op order, a step fully and
partially resident, what it refuses; the default-size layout binding whole, a PEFT LoRA baked and on the fly (its base
told from its names), the command line."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "transformer."
SMALL = dict(num_layers=2, num_single_layers=3, num_attention_heads=2, text_embed_dim=64)
LAYOUTS = {
    "plain": SMALL,
    "branches": dict(
        SMALL,
        num_decoder_layers=1,
        image_embed_dim=32,
        enable_text_cross_attention_dual=True,
        enable_text_cross_attention_single=True,
        patch_size_t=2,
    ),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """layout -> (layout, bare file, prefixed file, diffusers' model, its state dict)."""
    out = {}
    for layout, cfg in LAYOUTS.items():
        ref, sd = well_scaled(diffusers.MotifVideoTransformer3DModel(**cfg), 61)
        d = tmp_path_factory.mktemp(layout)
        bare = write(d / "motif.safetensors", sd)
        prefixed = write(d / "motif_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()})
        out[layout] = (layout, bare, prefixed, ref, sd)
    return out


@pytest.fixture(params=sorted(LAYOUTS))
def tiny(request, files):
    return files[request.param]


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "motif_video"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "motif_video")


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"],
                   encoder_attention_mask=x.get("encoder_attention_mask"), image_embeds=x.get("image_embeds"),
                   return_dict=False)[0]  # fmt: skip


def _inputs(layout, seed=1, tokens=10):
    g = torch.Generator().manual_seed(seed)
    x = {
        # 2 frames of 2 x 3 tokens (the branches' patches are 2 frames deep)
        "hidden_states": torch.randn(2, 33, 4 if layout == "branches" else 2, 4, 6, generator=g),
        "timestep": torch.tensor([937.0, 211.0]),
        "encoder_hidden_states": torch.randn(2, tokens, 64, generator=g),
        "encoder_attention_mask": torch.ones(2, tokens),
    }
    x["encoder_attention_mask"][1, 6:] = 0  # the second prompt padded
    if layout == "branches":
        x["image_embeds"] = torch.randn(2, 5, 32, generator=g)
    return x


def test_each_equals_diffusers_bare_and_prefixed(tiny, tmp_path):
    """Bare, under `transformer.` and under a single file's `model.diffusion_model.` (diffusers' single-file loader
    reads Motif-Video's checkpoints by their own names)."""
    layout, bare, prefixed, ref, sd = tiny
    single = write(tmp_path / "single.safetensors", {"model.diffusion_model." + k: v for k, v in sd.items()})
    dens = [_bound(bare), _bound(prefixed), _bound(single)]
    m = dens[0].model
    assert (m.decoders, m.image_in is not None) == ((1, True) if layout == "branches" else (0, False))
    assert dens[0].input_names == ("hidden_states", "timestep", "encoder_hidden_states")
    x = dens[0].check_inputs(_inputs(layout), "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for den, n in zip(dens, ("bare", "prefixed", "single file"), strict=True):
            out = den(x)
            err = rel_l2(out, want)
            print(f"motif_video {layout} ({n}): relative L2 {err:.2e}")
            assert out.shape == x["hidden_states"][:, :16].shape and err <= TOL
        # the mask reaches the output: unmasking the padding changes the padded item alone
        other = dens[0](dict(x, encoder_attention_mask=torch.ones_like(x["encoder_attention_mask"])))
        assert torch.allclose(other[0], out[0], atol=1e-5) and rel_l2(other[1], out[1]) > 1e-3
        # without a mask every text token attends, as in diffusers
        x.pop("encoder_attention_mask")
        assert rel_l2(dens[0](x), _diffusers(ref, x)) <= TOL


def test_inputs_it_cannot_run_are_refused(tiny):
    layout, bare, *_ = tiny
    den = _bound(bare)
    x = _inputs(layout)
    if layout == "plain":
        with pytest.raises(FormatError, match="no image embedder"):
            den.check_inputs(dict(x, image_embeds=torch.randn(2, 5, 32)), "in.safetensors")
    with pytest.raises(FormatError, match="patches are . frames? of 2×2"):
        den.check_inputs(dict(x, hidden_states=torch.randn(2, 33, 2, 4, 5)), "in.safetensors")
    with pytest.raises(FormatError, match="encoder_attention_mask holds values"):
        den.check_inputs(dict(x, encoder_attention_mask=x["encoder_attention_mask"] * 0.5), "in.safetensors")
    empty = x["encoder_attention_mask"].clone()
    empty[1] = 0  # its cross-attention would attend to nothing (diffusers' gives NaN)
    if layout == "branches":
        with pytest.raises(FormatError, match="keeps no prompt token"):
            den.check_inputs(dict(x, encoder_attention_mask=empty), "in.safetensors")
    else:  # the joint attention still has the video tokens
        assert torch.isfinite(den(den.check_inputs(dict(x, encoder_attention_mask=empty), "in"))).all()


def test_op_order_is_the_call_order(tiny):
    _, _, prefixed, *_ = tiny
    check_op_order(prefixed, "motif_video", PREFIX)


def test_steps_fully_and_partially_alike(tiny, tmp_path, monkeypatch):
    layout, _, prefixed, *_ = tiny
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(
        prefixed, tmp_path, 0.004, "motif_video", (1, 16, 2 if layout == "branches" else 1, 8, 8)
    )


def test_loadout_step_runs_it_from_the_command_line(files, tmp_path):
    from engine.formats.safetensors import SafetensorsFile

    _, bare, *_ = files["plain"]
    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(bare), "--size", "32x48", "--cpu",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert SafetensorsFile(out).tensor("out").shape == (1, 16, 1, 6, 4)


def test_a_single_block_cross_attention_after_one_without_is_refused(tmp_path):
    _, sd = well_scaled(diffusers.MotifVideoTransformer3DModel(**LAYOUTS["branches"]), 62)
    moved = {k.replace("single_transformer_blocks.0.cross_attn", "single_transformer_blocks.2.cross_attn"): v
             for k, v in sd.items()}  # fmt: skip
    with pytest.raises(FormatError, match="single blocks"):
        _bound(write(tmp_path / "m.safetensors", moved))


def test_layer_norm_qk_norms_are_refused_by_name(tmp_path):
    from engine.errors import UnsupportedModel

    _, sd = well_scaled(diffusers.MotifVideoTransformer3DModel(**dict(SMALL, qk_norm="layer_norm")), 63)
    with pytest.raises(UnsupportedModel, match="QK norms hold a bias"):
        _bound(write(tmp_path / "m.safetensors", sd))


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config, under transformer., header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.MotifVideoTransformer3DModel)
    path = write_sparse(tmp_path / "t.safetensors", [(PREFIX + k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.doubles), len(m.singles), m.heads, m.context_dim, m.in_channels, m.patch) == (
        20, 40, 24, 4096, 33, (1, 2))  # fmt: skip


# The modules a PEFT LoRA adapts (diffusers' names): both streams' attention and MLPs, the single blocks', their
# modulations, the cross-attention, the stem and the head.
LORA_MODULES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_k_proj", "transformer_blocks.0.attn.to_out.0",
                "transformer_blocks.1.attn.to_add_out", "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.1.ff_context.net.2",
                "transformer_blocks.0.norm1.linear", "transformer_blocks.0.cross_attn.to_k", "single_transformer_blocks.0.attn.to_v",
                "single_transformer_blocks.1.proj_mlp", "single_transformer_blocks.1.cross_attn.to_q",
                "single_transformer_blocks.2.proj_out", "single_transformer_blocks.1.norm.linear", "x_embedder.proj",
                "context_embedder.linear_1", "norm_out.linear", "proj_out")  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_baked_and_on_the_fly(files, tmp_path, budget):
    """PEFT (`transformer.` + diffusers' names) on the layout with every branch, baked (resident) and on the fly
    (streamed): equal to diffusers' model with the LoRA merged by hand; every module of it placed; its base told from
    its names (the cross-attention, the text MLP)."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    layout, bare, _, ref, sd = files["branches"]
    names = {d: PREFIX + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, 0.8, seed=7)
    x = {k: v[:1] for k, v in _inputs(layout, seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(bare, lora, 0.8, x, tmp_path, budget, want, len(LORA_MODULES),
                    f"motif_video LoRA (budget {budget})", "motif_video", TOL)  # fmt: skip


def test_a_lora_names_motif_video_only_where_its_own_modules_say_so(tmp_path):
    """Its cross-attention or its text MLP name it; FLUX.1's block names alone, and a double block's cross-attention
    query alone (Stable Audio 3's blocks have `cross_attn.to_q` too), do not."""
    from engine.formats.safetensors import read_header, write_sparse
    from engine.lora.describe import describe_lora

    def base(name, modules):
        rows = []
        for m in modules:
            rows += [
                (f"transformer.{m}.lora_A.weight", "BF16", (8, 256)),
                (f"transformer.{m}.lora_B.weight", "BF16", (256, 8)),
            ]
        return describe_lora(read_header(write_sparse(tmp_path / name, rows))).base

    flux = ("transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.attn.to_v")
    assert base("cross.safetensors", (*flux, "single_transformer_blocks.0.cross_attn.to_q")) == "motif_video"
    assert base("cross2.safetensors", (*flux, "transformer_blocks.1.cross_attn.to_k")) == "motif_video"
    assert base("text.safetensors", (*flux, "context_embedder.linear_1")) == "motif_video"
    assert base("flux.safetensors", flux) != "motif_video"
    assert base("audio.safetensors", ("transformer_blocks.0.cross_attn.to_q",)) != "motif_video"
