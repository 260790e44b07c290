"""Kandinsky 6's transformer (engine.denoise.kandinsky6) against diffusers' Kandinsky6Transformer3DModel on the same
weights, bare and under `model.diffusion_model.`: a reduced config with the released flags (cross gates, RoPE on the
video-audio attention, each modulation on its own branch), video 128 wide (64-wide heads), audio 64 wide (32-wide
heads), visual conditioning, two token types, 2 + 2 blocks, float32, CPU; with and without audio, with a text mask and
the image-conditioned pipeline's token types and frame positions; its op order, a step fully and partially resident,
the default-size layout binding whole, a PEFT LoRA on the fly, and `loadout step` on a tiny file."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-5
PREFIX = "model.diffusion_model."
FLAGS = dict(ca_rope=True, cross_gates=True, fix_modulation=True)  # the released configs'
CONFIG = dict(in_visual_dim=16, out_visual_dim=16, in_text_dim=96, in_text_dim2=48, time_dim=64, model_dim=128,
              ff_dim=256, num_text_blocks=2, num_visual_blocks=2, axes_dims=(16, 24, 24), visual_cond=True,
              in_audio_dim=20, out_audio_dim=20, model_dim_a=64, ff_dim_a=128,
              visual_token_type_num_embeddings=2, **FLAGS)  # fmt: skip


@pytest.fixture(scope="module")
def k6(tmp_path_factory):
    """(bare file, prefixed file, diffusers' model, state dict)."""
    d = tmp_path_factory.mktemp("k6")
    ref, sd = well_scaled(
        diffusers.Kandinsky6Transformer3DModel(**CONFIG), 61
    )  # modulations: no longer zeros
    bare = write(d / "k6.safetensors", sd)
    return bare, write(d / "k6_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}), ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "kandinsky6"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "kandinsky6")


def _diffusers(ref, x: dict):
    """diffusers' forward as its pipeline calls it (its config's scale_factor, 1, 2, 2)."""
    pos = None
    if "frame_positions" in x:
        _, _, h, w, _ = x["hidden_states"].shape
        pos = (x["frame_positions"], torch.arange(h // 2), torch.arange(w // 2))
    with torch.inference_mode():
        out = ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                  pooled_projections=x["pooled_projections"], timestep=x["timestep"],
                  audio_hidden_states=x.get("audio_hidden_states"), visual_rope_pos=pos,
                  encoder_attention_mask=x.get("encoder_attention_mask"),
                  visual_token_type_ids=x.get("visual_token_type_ids"), return_dict=False)  # fmt: skip
    return {"out": out[0], **({"audio_out": out[1]} if len(out) > 1 else {})}


def _inputs(den, seed=1, frames=3, tokens=10, audio=7):
    """Two items, `frames` latent frames of 6 × 4 (3 × 2 patches), `audio` audio tokens, the condition random too."""
    g = torch.Generator().manual_seed(seed)
    x = den.random_inputs(64, 96, batch=2, seed=seed)
    x["hidden_states"] = torch.randn(2, frames, 6, 4, den.model.in_channels, generator=g)
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :tokens]
    x["audio_hidden_states"] = torch.randn(2, audio, 20, generator=g)
    return x


def _compare(den, x, want, what):
    got = den.outputs(den.check_inputs(x, "inputs"))
    assert got.keys() == want.keys()
    for k in got:
        err = rel_l2(got[k], want[k])
        print(f"kandinsky6 {what} {k}: relative L2 {err:.2e}")
        assert got[k].shape == want[k].shape and err <= TOL, (what, k)


def test_kandinsky6_equals_diffusers_bare_and_prefixed(k6):
    bare, prefixed, ref, _ = k6
    dens = [_bound(bare), _bound(prefixed)]
    assert dens[0].input_names == ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")
    x = _inputs(dens[0])
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[1, 6:] = False  # item 1's prompt is padded
    types = torch.tensor([[0, 0, 1], [0, 0, 1]])  # the image pipeline's reference frame, last, at position 0
    cases = {
        "with audio": x,
        "video alone": {k: v for k, v in x.items() if k != "audio_hidden_states"},
        "masked, image-conditioned": dict(
            x,
            encoder_attention_mask=mask,
            visual_token_type_ids=types,
            frame_positions=torch.tensor([0, 1, 0]),
        ),  # fmt: skip
    }
    for what, inputs in cases.items():
        want = _diffusers(ref, inputs)
        for den, n in zip(dens, ("bare", "prefixed"), strict=True):
            _compare(den, inputs, want, f"{what} ({n})")


def test_the_scale_factor_input_is_the_configs(k6):
    """A model built with another scale_factor equals the forward given it as an input; the default is 1, 2, 2."""
    bare, _, _, sd = k6
    ref = diffusers.Kandinsky6Transformer3DModel(**CONFIG, scale_factor=(1.0, 3.0, 3.0))
    ref.load_state_dict(sd)
    den = _bound(bare)
    x = _inputs(den, seed=3)
    want = _diffusers(ref.eval(), x)
    _compare(den, dict(x, scale_factor=torch.tensor([[1.0, 3.0, 3.0]] * 2)), want, "scale 3")
    with torch.inference_mode():
        assert rel_l2(den.outputs(x)["out"], want["out"]) > 10 * TOL


def test_the_cross_modal_wiring_is_read_as_released(k6, monkeypatch):
    """Fails with the RoPE left off the video-audio attention, a cross modulation read from the other branch, or the
    audio head's second norm left out."""
    from engine.denoise import kandinsky6 as K

    bare, _, ref, _ = k6
    den = _bound(bare)
    x = _inputs(den, seed=4)
    want = _diffusers(ref, x)
    attn, mods = K.Kandinsky6._attn, K._cross_mods
    wrongs = (
        (K.Kandinsky6, "_attn", lambda self, a, x, ctx, pq, pk, m: attn(self, a, x, ctx, pq if ctx is None else None,
                                                                         pk, m)),
        (K, "_cross_mods", lambda blk, c_v, c_a, dv, da: mods(blk, c_a, c_v, dv, da)),
        (K, "_renorm", lambda a: a),
    )  # fmt: skip
    with torch.inference_mode():
        for owner, name, wrong in wrongs:
            with monkeypatch.context() as mp:
                mp.setattr(owner, name, wrong)
                errs = {k: rel_l2(v, want[k]) for k, v in den.outputs(x).items()}
                print(f"kandinsky6 with {name} wrong: {errs}")
                assert max(errs.values()) > 100 * TOL, name


def test_bad_inputs_and_variants_are_refused(k6, tmp_path):
    den = _bound(k6[0])
    x = _inputs(den)
    with pytest.raises(FormatError, match="2×2 patches"):
        den.check_inputs(dict(x, hidden_states=x["hidden_states"][:, :, :5]), "in.safetensors")
    with pytest.raises(FormatError, match="encoder_attention_mask"):
        den.check_inputs(dict(x, encoder_attention_mask=torch.ones(2, 9, dtype=torch.bool)), "in.safetensors")
    with pytest.raises(FormatError, match="visual_token_type_ids"):
        den.check_inputs(dict(x, visual_token_type_ids=torch.full((2, 3), 2)), "in.safetensors")
    with pytest.raises(FormatError, match="frame_positions"):
        den.check_inputs(dict(x, frame_positions=torch.tensor([0, 1])), "in.safetensors")
    _, sd = well_scaled(diffusers.Kandinsky6Transformer3DModel(**dict(CONFIG, cross_gates=False)), 3)
    with pytest.raises(UnsupportedModel, match="cross-gated"):
        _bound(write(tmp_path / "k6_ungated.safetensors", sd))
    _, sd = well_scaled(diffusers.Kandinsky6Transformer3DModel(**dict(CONFIG, axes_dims_a=(8, 12, 12))), 3)
    with pytest.raises(UnsupportedModel, match="one width for both"):  # diffusers' own forward fails on it
        _bound(write(tmp_path / "k6_heads.safetensors", sd))


def test_kandinsky6_op_order_is_the_call_order(k6):
    check_op_order(k6[1], "kandinsky6", PREFIX, plain=1)  # the token types: an image-conditioned step's alone


def test_kandinsky6_steps_fully_and_partially_alike(k6, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(k6[1], tmp_path, 0.001, "kandinsky6", (1, 1, 8, 8, 16))


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (the released width) on the meta device, header only (bf16)."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.Kandinsky6Transformer3DModel, **FLAGS)
    path = write_sparse(tmp_path / "k6.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    got = (
        len(m.video.text_blocks),
        len(m.audio.text_blocks),
        len(m.blocks),
        m.hidden,
        m.in_channels,
        m.text_dim,
    )
    assert got == (4, 4, 60, 4096, 33, 3584) and (m.pooled_dim, m.audio_channels) == (768, 20)


LORA_MODULES = ("visual_transformer_blocks.0.video_dec_block.self_attention.to_query",
                "visual_transformer_blocks.1.video_dec_block.cross_attention.to_value",
                "visual_transformer_blocks.0.audio_dec_block.feed_forward.net.0.proj",
                "visual_transformer_blocks.1.va_cross_attention.to_key",
                "visual_transformer_blocks.0.av_cross_attention.out_layer",
                "visual_transformer_blocks.1.video_dec_block.visual_modulation.out_layer",
                "video_text_transformer_blocks.0.attn.to_value", "audio_text_transformer_blocks.1.feed_forward.net.2",
                "visual_embeddings.in_layer", "out_layer.out_layer")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("prefixed", None), ("bare", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(k6, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    bare, prefixed, ref, sd = k6
    path = prefixed if base == "prefixed" else bare
    strength = 0.8
    names = {d: "transformer." + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, strength, seed=7)
    x = {k: v[:1] for k, v in _inputs(_bound(path), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x)["out"])
    assert rel_l2(plain, want) > 100 * TOL
    what = f"kandinsky6 LoRA (peft on {base}, budget {budget})"
    check_lora_step(
        path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, "kandinsky6", 1e-4
    )


def test_loadout_step_runs_a_tiny_file(k6, tmp_path):
    """From the command line, random inputs at 64×64 (one latent frame of 8×8, a little audio): both outputs."""
    from engine.formats.safetensors import SafetensorsFile

    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(k6[1]), "--size", "64x64",
                        "--cpu", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    f = SafetensorsFile(out)
    assert tuple(f.tensor("out").shape) == (1, 1, 8, 8, 16) and torch.isfinite(f.tensor("out")).all()
    assert tuple(f.tensor("audio_out").shape) == (1, 4, 20)
