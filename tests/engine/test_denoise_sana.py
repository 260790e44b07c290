"""Sana's transformer (engine.denoise.sana) against diffusers' SanaTransformer2DModel on the same weights, in diffusers'
naming and the release's (fused qkv and kv_linear, `pos_embed` and the null caption beside the layers — the layout
checked against diffusers' own single-file converter), the 600M's width (1152: 36 linear-attention heads of 32, 16
cross-attention heads of 72) at 1 block, 64-wide captions, float32, CPU, with a padded prompt; its op order and a
step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."


def diffusers_sana(seed: int = 25, qk_norm: str | None = None, sprint: bool = False):
    from diffusers import SanaTransformer2DModel

    model = SanaTransformer2DModel(
        in_channels=8, out_channels=8, num_attention_heads=36, attention_head_dim=32, num_layers=1,
        num_cross_attention_heads=16, cross_attention_head_dim=72, cross_attention_dim=1152, caption_channels=64,
        qk_norm=qk_norm, guidance_embeds=sprint,
    )  # fmt: skip
    return well_scaled(model, seed)


def release(sd: dict) -> dict:
    """diffusers' names back in the release's (the inverse of convert_sana_transformer_to_diffusers), with the
    `pos_embed` and null caption the release keeps."""
    top = {"patch_embed.proj.": "x_embedder.proj.", "time_embed.emb.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
           "time_embed.emb.timestep_embedder.linear_2.": "t_embedder.mlp.2.", "time_embed.linear.": "t_block.1.",
           "caption_projection.linear_1.": "y_embedder.y_proj.fc1.", "caption_projection.linear_2.": "y_embedder.y_proj.fc2.",
           "caption_norm.": "attention_y_norm.", "proj_out.": "final_layer.linear.",
           "scale_shift_table": "final_layer.scale_shift_table",
           # SANA-Sprint (NVlabs' convert_sana_to_diffusers: cfg_embedder -> time_embed.guidance_embedder)
           "time_embed.timestep_embedder.linear_1.": "t_embedder.mlp.0.", "time_embed.timestep_embedder.linear_2.": "t_embedder.mlp.2.",
           "time_embed.guidance_embedder.linear_1.": "cfg_embedder.mlp.0.", "time_embed.guidance_embedder.linear_2.": "cfg_embedder.mlp.2."}  # fmt: skip
    block = {"attn1.to_out.0.": "attn.proj.", "attn2.to_q.": "cross_attn.q_linear.", "attn2.to_out.0.": "cross_attn.proj.",
             "attn1.norm_q.": "attn.q_norm.", "attn1.norm_k.": "attn.k_norm.", "attn2.norm_q.": "cross_attn.q_norm.",
             "attn2.norm_k.": "cross_attn.k_norm.", "ff.conv_inverted.": "mlp.inverted_conv.conv.",
             "ff.conv_depth.": "mlp.depth_conv.conv.", "ff.conv_point.": "mlp.point_conv.conv."}  # fmt: skip
    out = {"pos_embed": torch.zeros(1, 16, 1152), "y_embedder.y_embedding": torch.zeros(300, 64)}
    for k, v in sd.items():
        if k.startswith("transformer_blocks."):
            _, n, rest = k.split(".", 2)
            b = f"blocks.{n}."
            if rest.startswith(("attn1.to_k", "attn1.to_v", "attn2.to_v")):
                continue
            if rest.startswith("attn1.to_q."):
                attr = rest.rsplit(".", 1)[1]
                out[b + "attn.qkv." + attr] = torch.cat(
                    [sd[f"transformer_blocks.{n}.attn1.to_{c}.{attr}"] for c in "qkv"]
                )
                continue
            if rest.startswith("attn2.to_k."):
                attr = rest.rsplit(".", 1)[1]
                out[b + "cross_attn.kv_linear." + attr] = torch.cat(
                    [sd[f"transformer_blocks.{n}.attn2.to_{c}.{attr}"] for c in "kv"])  # fmt: skip
                continue
            for a, r in block.items():
                if rest.startswith(a):
                    rest = r + rest[len(a) :]
                    break
            out[b + rest] = v
            continue
        for a, r in top.items():
            if k.startswith(a):
                k = r + k[len(a) :]
                break
        out[k] = v
    return out


@pytest.fixture(scope="module")
def sana(tmp_path_factory):
    from diffusers.loaders.single_file_utils import convert_sana_transformer_to_diffusers

    ref, sd = diffusers_sana()
    rel = release(sd)
    back = convert_sana_transformer_to_diffusers({PREFIX + k: v.clone() for k, v in rel.items()})
    assert set(back) == set(sd) and all(
        torch.equal(back[k], sd[k]) for k in sd
    )  # the release's names are right
    d = tmp_path_factory.mktemp("sana")
    files = {"diffusers": write(d / "sana_diffusers.safetensors", sd),
             "release": write(d / "Sana_600M_1024px.safetensors", {PREFIX + k: v for k, v in rel.items()})}  # fmt: skip
    return files, ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "sana"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "sana")


def _diffusers(ref, x: dict) -> torch.Tensor:
    return ref(hidden_states=x["x"], encoder_hidden_states=x["context"], timestep=x["timesteps"],
               encoder_attention_mask=x.get("context_mask"), guidance=x.get("guidance")).sample  # fmt: skip


def test_both_namings_equal_diffusers_with_a_padded_prompt(sana):
    files, ref, _ = sana
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    x = dens["release"].random_inputs(128, 96, batch=2, seed=1)
    assert x["x"].shape == (2, 8, 3, 4) and x["context"].shape == (2, 300, 64)
    x["context"] = x["context"][:, :12]
    x["context_mask"] = torch.ones(2, 12)
    x["context_mask"][0, 7:] = 0
    x = dens["release"].check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"sana ({n}): relative L2 {err:.2e}")
            assert err <= TOL
        x["context"][0, 7:] = 20.0  # the padding does not reach the output
        assert rel_l2(dens["release"](x), want) <= TOL


def test_sana15_qk_norms(tmp_path):
    """Sana 1.5: q and k RMS-normalised over the whole width in both attentions."""
    ref, sd = diffusers_sana(seed=26, qk_norm="rms_norm_across_heads")
    den = _bound(write(tmp_path / "sana15.safetensors", {PREFIX + k: v for k, v in release(sd).items()}))
    assert den.model.blocks[0].attn.q_norm is not None and den.model.blocks[0].cross.q_norm is not None
    x = den.random_inputs(64, 64, seed=2)
    x["context"] = x["context"][:, :9]
    with torch.inference_mode():
        assert rel_l2(den(x), _diffusers(ref, x)) <= TOL


def test_sana_sprint_guidance_in_both_namings(tmp_path):
    """SANA-Sprint: its guidance embedded beside the time (the release's cfg_embedder, diffusers' guidance_embedder);
    the release file is detected as Sprint too."""
    ref, sd = diffusers_sana(seed=27, sprint=True)
    files = {"release": write(tmp_path / "Sana_Sprint.safetensors", {PREFIX + k: v for k, v in release(sd).items()}),
             "diffusers": write(tmp_path / "sana_sprint_diffusers.safetensors", sd)}  # fmt: skip
    for n, path in files.items():
        assert detect_file(str(path)).variant.startswith("sprint"), n
        den = _bound(path)
        assert den.input_names == ("x", "timesteps", "context", "guidance")
        x = den.random_inputs(64, 64, seed=3)
        assert x["guidance"].tolist() == [pytest.approx(0.45)] and float(x["timesteps"].max()) <= 1.0
        x["context"] = x["context"][:, :9]
        with torch.inference_mode():
            got = den(x)
            err = rel_l2(got, _diffusers(ref, x))
            print(f"sana sprint ({n}): relative L2 {err:.2e}")
            assert err <= TOL
            assert rel_l2(den(dict(x, guidance=torch.tensor([0.1]))), got) > 1e-4  # the guidance counts
    check_op_order(files["release"], "sana", PREFIX, plain=4)  # the tables, pos_embed, the null caption


def test_sana_op_order_is_the_call_order(sana):
    check_op_order(sana[0]["release"], "sana", PREFIX, plain=4)  # the tables, pos_embed, the null caption


def test_sana_steps_fully_and_partially_alike(sana, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(sana[0]["release"], tmp_path, 0.01, "sana", (1, 8, 2, 2))


@pytest.mark.parametrize("config", ["SANA_600M", "SANA_1600M"])
def test_the_release_layouts_bind_whole(tmp_path, config):
    from layouts_2026 import image as I

    from engine.formats.safetensors import write_sparse

    c = getattr(I, config)
    rows = I.sana_original(c).under(PREFIX)
    m = _bound(write_sparse(tmp_path / "sana.safetensors", [(k, "BF16", s) for k, s in rows.items()])).model
    assert (len(m.blocks), m.in_channels, m.context_dim, m.cross_heads) == (
        c.layers,
        32,
        2304,
        16 if c.hidden == 1152 else 20,
    )


def test_a_peft_lora_lands_on_the_release_file(sana, tmp_path):
    """A diffusers / PEFT LoRA on the release-named file (fused qkv and kv_linear as row blocks, the Mix-FFN's
    convolutions by their release names): equal to diffusers' model with the LoRA merged by hand."""
    from denoise_files import lora_and_merged, lora_step, plain_and_merged

    files, ref, sd = sana
    sd = {k: v.clone() for k, v in sd.items()}
    names = ("transformer_blocks.0.attn1.to_k", "transformer_blocks.0.attn2.to_v", "transformer_blocks.0.attn2.to_q",
             "transformer_blocks.0.attn1.to_out.0", "time_embed.linear", "proj_out")  # fmt: skip
    strength = 0.8
    lora, merged = lora_and_merged(sd, {d: f"transformer.{d}" for d in names}, strength, seed=6)
    x = _bound(files["release"]).random_inputs(64, 64, seed=9)
    x["context"] = x["context"][:, :10]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(files["release"], lora, strength, x, tmp_path)
    assert r.loras and r.loras[0]["mapped"] == len(names), r.loras
    assert rel_l2(out, want) <= TOL
