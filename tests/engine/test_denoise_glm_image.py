"""GLM-Image's transformer (engine.denoise.glm_image) against diffusers' GlmImageTransformer2DModel on the same weights,
bare and under `model.diffusion_model.`; 2 blocks, 2 heads of 40, float32, CPU; the prior's tokens kept and dropped,
size conditions; its op order, a step fully and partially resident, the default-size layout binding whole, a PEFT LoRA
and `loadout step` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
CONFIG = dict(num_layers=2, attention_head_dim=40, num_attention_heads=2, text_embed_dim=48, time_embed_dim=64,
              condition_dim=32, prior_vq_quantizer_codebook_size=96)  # fmt: skip


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    ref, sd = well_scaled(diffusers.GlmImageTransformer2DModel(**CONFIG), 51)
    d = tmp_path_factory.mktemp("glm")
    return (
        write(d / "glm_diffusers.safetensors", sd),
        write(d / "glm_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "glm_image"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "glm_image")


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                   prior_token_id=x["prior_token_id"].long(), prior_token_drop=x["prior_token_drop"].bool(),
                   timestep=x["timestep"], target_size=x["target_size"], crop_coords=x["crop_coords"],
                   return_dict=False)[0]  # fmt: skip


def _inputs(den, seed=1, tokens=10):
    x = den.random_inputs(64, 96, batch=2, seed=seed)  # a 12 x 8 latent, 6 x 4 patches
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :tokens]
    x["crop_coords"] = torch.tensor([[0.0, 0.0], [16.0, 32.0]])
    return x


def test_glm_image_equals_diffusers_in_both_namings_with_the_prior_kept_and_dropped(glm):
    diff_path, prefixed_path, ref, _ = glm
    dens = [_bound(diff_path), _bound(prefixed_path)]
    kept = _inputs(dens[0])
    dropped = dict(kept, prior_token_drop=torch.tensor([[1.0] * 24, [0.0, 1.0] * 12]))
    with torch.inference_mode():
        for x, what in ((kept, "prior kept"), (dropped, "prior dropped")):
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(ref, x)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"glm_image ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 16, 12, 8) and err <= TOL
        # the prior's tokens and the size conditions reach the output
        assert rel_l2(dens[0](dropped), dens[0](kept)) > 1e-3
        assert rel_l2(dens[0](dict(kept, target_size=kept["target_size"] + 64)), dens[0](kept)) > 1e-3


def test_rope_axes_modulation_order_and_the_sizes_are_read_as_released(glm, monkeypatch):
    """Fails with the rows' and columns' angles swapped, the image's and text's modulations swapped, or the crop and
    target sizes in the other order."""
    from engine.denoise import glm_image as G

    den = _bound(glm[0])
    x = den.check_inputs(_inputs(den, seed=4), "inputs")
    with torch.inference_mode():
        want = _diffusers(glm[2], x)
        assert rel_l2(den(x), want) <= TOL
        rope = G._rope
        with monkeypatch.context() as mp:
            mp.setattr(G, "_rope", lambda hp, wp, d: tuple(t.reshape(hp, wp, -1).transpose(0, 1).reshape(hp * wp, -1)
                                                           for t in rope(wp, hp, d)))  # fmt: skip
            assert rel_l2(den(x), want) > 10 * TOL
        swapped = dict(x, target_size=x["crop_coords"], crop_coords=x["target_size"])
        assert rel_l2(den(swapped), want) > 10 * TOL
        chunk = torch.Tensor.chunk
        with monkeypatch.context() as mp:
            mp.setattr(torch.Tensor, "chunk", lambda t, n, dim=0: (lambda c: [c[i ^ 1] for i in range(n)])(
                chunk(t, n, dim)) if n == 12 else chunk(t, n, dim))  # fmt: skip
            assert rel_l2(den(x), want) > 10 * TOL


def test_bad_prior_inputs_are_refused(glm):
    from engine.errors import FormatError

    den = _bound(glm[0])
    x = _inputs(den)
    for name, bad, match in (
        ("prior_token_id", torch.full((2, 24), 96.0), "codebook"),
        ("prior_token_id", torch.full((2, 24), 2.5), "codebook"),
        ("prior_token_drop", torch.full((2, 24), 0.5), "0 and 1"),
        ("prior_token_id", torch.zeros(2, 23), "shape"),
    ):
        with pytest.raises(FormatError, match=match):
            den.check_inputs(dict(x, **{name: bad}), "in.safetensors")


def test_glm_image_op_order_is_the_call_order(glm):
    check_op_order(glm[1], "glm_image", PREFIX, plain=1)  # the prior's embedding table is read whole


def test_glm_image_steps_fully_and_partially_alike(glm, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(glm[0], tmp_path, 0.0005, "glm_image", (1, 16, 8, 8))


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (30 blocks, 64 heads of 40, glyph states 1472, a 16384-token codebook), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.GlmImageTransformer2DModel)
    path = write_sparse(tmp_path / "glm.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.heads, m.in_channels, m.context_dim, m.codebook) == (30, 64, 16, 1472, 16384)


def test_step_from_the_command_line(glm, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(glm[1]), "--size", "64x32", "--steps",
                        "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (
        got["architecture"] == "glm_image" and got["mode"] == "full" and got["output_shape"] == [1, 16, 4, 8]
    )


# Every Linear of a block (its modulation, q / k / v / out, the shared MLP), the stems and the head.
LORA_MODULES = ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn1.to_k", "transformer_blocks.0.attn1.to_v",
                "transformer_blocks.1.attn1.to_out.0", "transformer_blocks.0.norm1.linear",
                "transformer_blocks.1.ff.net.0.proj", "transformer_blocks.0.ff.net.2", "image_projector.proj",
                "glyph_projector.net.0.proj", "prior_projector.net.2",
                "time_condition_embed.condition_embedder.linear_1", "norm_out.linear", "proj_out")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("bare", None), ("prefixed", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(glm, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, prefixed_path, ref, sd = glm
    path = prefixed_path if base == "prefixed" else diff_path
    strength = 0.8
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, {d: "transformer." + d for d in LORA_MODULES},
                                   strength, seed=7)  # fmt: skip
    x = {k: v[:1] for k, v in _inputs(_bound(path), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"glm_image LoRA (peft on {base}, budget {budget})"
    check_lora_step(path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, None, TOL)


def test_the_activation_estimate_counts_image_tokens(glm):
    """A step's memory estimate grows with the image's 2x2 patches (engine.stepping), not with the latent's channels."""
    from engine.stepping import _units

    den = _bound(glm[0])
    small, large = den.random_inputs(256, 256, batch=2), den.random_inputs(512, 512, batch=2)
    h, w = small["hidden_states"].shape[-2:]
    assert _units(den, small) == 2 * (h // 2) * (w // 2) and _units(den, large) == 4 * _units(den, small)
