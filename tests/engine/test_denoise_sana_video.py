"""SANA-Video's transformer (engine.denoise.sana_video) against diffusers' SanaVideoTransformer3DModel on the same
weights, in diffusers' naming (bare and under `model.diffusion_model.`) and the release's (Sana's fused qkv and
kv_linear, `mlp.t_conv`, the unread `pos_embed`, null caption and `logvar_linear`); 2 blocks, 2 heads of 112, a 3x
Mix-FFN (the release's), 64-wide captions, float32, CPU; 3 latent frames, a padded prompt and the image-to-video
per-token timestep, and the 720p layout's 1×1×1 patches; its op order, a step fully and partially resident, the default-size layout binding whole, a PEFT
LoRA and `loadout step` from the command line."""

from __future__ import annotations

import json
import os
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
CONFIG = dict(num_attention_heads=2, attention_head_dim=112, num_layers=2, num_cross_attention_heads=2,
              cross_attention_head_dim=112, cross_attention_dim=224, caption_channels=64, mlp_ratio=3.0)  # fmt: skip


def release(sd: dict) -> dict:
    """diffusers' names back in the release's (the inverse of diffusers' convert_sana_video_to_diffusers.py): Sana's,
    with the 3-D patch embedding under `x_embedder.proj` and the temporal convolution `mlp.t_conv`."""
    from test_denoise_sana import release as sana_release

    sd = {k.replace("patch_embedding.", "patch_embed.proj."): v for k, v in sd.items()}
    out = {k.replace(".ff.conv_temp.", ".mlp.t_conv."): v for k, v in sana_release(sd).items()}
    out["logvar_linear.weight"], out["logvar_linear.bias"] = torch.zeros(1, 224), torch.zeros(1)
    return out


@pytest.fixture(scope="module")
def sana_video(tmp_path_factory):
    ref, sd = well_scaled(diffusers.SanaVideoTransformer3DModel(**CONFIG), 17)
    d = tmp_path_factory.mktemp("sana_video")
    return (
        write(d / "sana_video_diffusers.safetensors", sd),
        write(d / "sana_video_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        write(d / "sana_video_release.safetensors", release(sd)),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "sana_video"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "sana_video")


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                   timestep=x["timestep"], encoder_attention_mask=x.get("encoder_attention_mask"),
                   return_dict=False)[0]  # fmt: skip


def _inputs(seed=1, per_token=False):
    """Two clips of 3 latent frames, 8 x 12 latents (4 x 6 patches), prompts of 7 and 4 tokens (padded to 7)."""
    g = torch.Generator().manual_seed(seed)
    x = {"hidden_states": torch.randn(2, 16, 3, 8, 12, generator=g),
         "encoder_hidden_states": torch.randn(2, 7, 64, generator=g),
         "timestep": torch.rand(2, generator=g) * 1000,
         "encoder_attention_mask": torch.tensor([[1.0] * 7, [1.0] * 4 + [0.0] * 3])}  # fmt: skip
    if per_token:  # the image-to-video pipeline's: t on every token, 0 on the conditioning first frame
        t = x["timestep"][:, None, None, None, None].expand(2, 1, 3, 4, 6).clone()
        t[:, :, 0] = 0
        x["timestep"] = t
    return x


def test_sana_video_equals_diffusers_in_each_naming_with_a_padded_prompt_and_per_token_time(sana_video):
    *paths, ref, _ = sana_video
    dens = [_bound(p) for p in paths]
    assert [d.naming for d in dens] == ["diffusers", "diffusers", "release"]
    with torch.inference_mode():
        for per_token in (False, True):
            x = dens[0].check_inputs(_inputs(per_token=per_token), "inputs")
            want = _diffusers(ref, x)
            for den, n in zip(dens, ("bare", "prefixed", "release"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"sana_video ({n}, per-token t {per_token}): relative L2 {err:.2e}")
                assert out.shape == (2, 16, 3, 8, 12) and err <= TOL


def test_the_first_frame_at_t0_changes_the_others(sana_video):
    """The per-token time reaches the tokens it belongs to: the same t everywhere differs from t = 0 on frame 0."""
    den = _bound(sana_video[0])
    x = den.check_inputs(_inputs(per_token=True), "inputs")
    flat = dict(x, timestep=x["timestep"][:, :, -1:].expand_as(x["timestep"]).clone())
    with torch.inference_mode():
        assert rel_l2(den(x), den(flat)) > 100 * TOL


def test_bad_inputs_and_variants_are_refused(sana_video, tmp_path):
    den = _bound(sana_video[0])
    x = _inputs(per_token=True)
    with pytest.raises(FormatError, match="patches"):
        den.check_inputs(
            dict(x, hidden_states=x["hidden_states"][..., :7], timestep=x["timestep"][..., :3]), "in"
        )
    with pytest.raises(FormatError, match="timestep"):
        den.check_inputs(dict(x, timestep=x["timestep"][..., :5]), "in")  # not the token grid
    sd = sana_video[4] | {"time_embed.guidance_embedder.linear_1.weight": torch.zeros(224, 256)}
    path = write(tmp_path / "guided.safetensors", sd)
    with pytest.raises(UnsupportedModel, match="guidance embedder"):
        _bound(path)


def test_sana_video_op_order_is_the_call_order(sana_video):
    check_op_order(sana_video[1], "sana_video", PREFIX, plain=3)  # the blocks' tables and the final one
    # and the release's pos_embed, null caption and logvar_linear, read by no forward
    check_op_order(sana_video[2], "sana_video", plain=6)


def test_sana_video_steps_fully_and_partially_alike(sana_video, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(sana_video[0], tmp_path, 0.001, "sana_video", (1, 16, 1, 8, 8))


def test_the_default_size_layout_binds_whole(tmp_path):
    """The release's config (20 blocks, 20 heads of 112, a 3x Mix-FFN, 2304-wide Gemma 2 captions), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.SanaVideoTransformer3DModel, mlp_ratio=3.0)
    path = write_sparse(tmp_path / "sana_video.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.in_channels, m.context_dim, m.patch) == (20, 16, 2304, (1, 2, 2))


def test_step_from_the_command_line(sana_video, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(sana_video[2]), "--size", "64x32",
                        "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["architecture"] == "sana_video" and got["mode"] == "full"
    assert got["output_shape"] == [1, 16, 1, 4, 8]


# Every Linear of a block (q / k / v / out of both attentions), its convolutions, the stems and the head.
LORA_MODULES = ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn1.to_k", "transformer_blocks.0.attn1.to_v",
                "transformer_blocks.1.attn1.to_out.0", "transformer_blocks.0.attn2.to_q", "transformer_blocks.1.attn2.to_k",
                "transformer_blocks.0.attn2.to_v", "transformer_blocks.1.attn2.to_out.0",
                "transformer_blocks.0.ff.conv_inverted", "transformer_blocks.1.ff.conv_point",
                "transformer_blocks.0.ff.conv_temp", "caption_projection.linear_1", "time_embed.linear", "proj_out")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("diffusers", None), ("release", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(sana_video, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed), on a base in either
    naming: equal to diffusers' model with the LoRA merged by hand; every module of it placed; read as SANA-Video's."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, _, release_path, ref, sd = sana_video
    path = release_path if base == "release" else diff_path
    strength = 0.8
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, {d: "transformer." + d for d in LORA_MODULES},
                                   strength, seed=7)  # fmt: skip
    x = {k: v[:1] for k, v in _inputs(seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"sana_video LoRA (peft on {base}, budget {budget})"
    check_lora_step(
        path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, "sana_video", TOL
    )


def test_the_720p_layout_patches_one_by_one(tmp_path):
    """The converter's 720p layout (patch (1, 1, 1): the kernel says so) equals diffusers' too."""
    ref, sd = well_scaled(diffusers.SanaVideoTransformer3DModel(**CONFIG, patch_size=(1, 1, 1)), 23)
    den = _bound(write(tmp_path / "sana_video_720p.safetensors", release(sd)))
    assert den.model.patch == (1, 1, 1)
    x = {k: v[..., :4, :6] if k == "hidden_states" else v for k, v in _inputs(seed=2).items()}
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        err = rel_l2(den(x), _diffusers(ref, x))
    print(f"sana_video (720p, patch 1x1x1): relative L2 {err:.2e}")
    assert err <= TOL
