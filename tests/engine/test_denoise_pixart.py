"""PixArt-α / Σ's transformer (engine.denoise.pixart) against diffusers' PixArtTransformer2DModel on the same weights,
in diffusers' naming and the release's (fused qkv and kv_linear, `pos_embed` and the null caption beside the layers, the
names OneTrainer's diffusers-to-checkpoint converter writes), XL/2's width (1152: 16 heads of 72) at 1 block, 64-wide
captions, float32, CPU: Σ with a padded prompt on an oblong grid, α 1024 with its size and aspect-ratio conditions; its
op order, a step fully and partially resident, and the release layouts binding whole."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

pytest.importorskip("diffusers")

TOL = 1e-4


def diffusers_pixart(micro: bool, seed: int = 31):
    from diffusers import PixArtTransformer2DModel

    model = PixArtTransformer2DModel(
        num_attention_heads=16, attention_head_dim=72, in_channels=4, out_channels=8, num_layers=1,
        cross_attention_dim=1152, caption_channels=64, sample_size=128, use_additional_conditions=micro,
    )  # fmt: skip
    return well_scaled(model, seed)


TOP = {"pos_embed.proj.": "x_embedder.proj.", "adaln_single.emb.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
       "adaln_single.emb.timestep_embedder.linear_2.": "t_embedder.mlp.2.", "adaln_single.linear.": "t_block.1.",
       "adaln_single.emb.resolution_embedder.linear_1.": "csize_embedder.mlp.0.",
       "adaln_single.emb.resolution_embedder.linear_2.": "csize_embedder.mlp.2.",
       "adaln_single.emb.aspect_ratio_embedder.linear_1.": "ar_embedder.mlp.0.",
       "adaln_single.emb.aspect_ratio_embedder.linear_2.": "ar_embedder.mlp.2.",
       "caption_projection.linear_1.": "y_embedder.y_proj.fc1.", "caption_projection.linear_2.": "y_embedder.y_proj.fc2.",
       "proj_out.": "final_layer.linear.", "scale_shift_table": "final_layer.scale_shift_table"}  # fmt: skip
BLOCK = {"attn1.to_out.0.": "attn.proj.", "attn2.to_q.": "cross_attn.q_linear.", "attn2.to_out.0.": "cross_attn.proj.",
         "ff.net.0.proj.": "mlp.fc1.", "ff.net.2.": "mlp.fc2."}  # fmt: skip


def release(sd: dict) -> dict:
    """diffusers' names back in the release's (PixArt-alpha's checkpoints; OneTrainer's
    convert_pixart_diffusers_to_ckpt writes the same), with the fixed `pos_embed` table and the null caption."""
    out = {"pos_embed": torch.zeros(1, 4096, 1152), "y_embedder.y_embedding": torch.zeros(300, 64)}
    for k, v in sd.items():
        if k.startswith("transformer_blocks."):
            _, n, rest = k.split(".", 2)
            b, attr = f"blocks.{n}.", rest.rsplit(".", 1)[-1]
            if rest.startswith(("attn1.to_k", "attn1.to_v", "attn2.to_v")):
                continue
            if rest.startswith("attn1.to_q."):
                out[b + "attn.qkv." + attr] = torch.cat(
                    [sd[f"{k[: -len(rest)]}attn1.to_{c}.{attr}"] for c in "qkv"]
                )
                continue
            if rest.startswith("attn2.to_k."):
                out[b + "cross_attn.kv_linear." + attr] = torch.cat(
                    [sd[f"{k[: -len(rest)]}attn2.to_{c}.{attr}"] for c in "kv"]
                )
                continue
            rest = next((r + rest[len(a) :] for a, r in BLOCK.items() if rest.startswith(a)), rest)
            out[b + rest] = v
            continue
        out[next((r + k[len(a) :] for a, r in TOP.items() if k.startswith(a)), k)] = v
    return out


@pytest.fixture(scope="module")
def pixart(tmp_path_factory):
    d = tmp_path_factory.mktemp("pixart")
    out = {}
    for name, micro in (("sigma", False), ("alpha", True)):
        ref, sd = diffusers_pixart(micro, seed=31 + micro)
        out[name] = (
            write(d / f"{name}_diffusers.safetensors", sd),
            write(d / f"{name}.safetensors", release(sd)),
            ref,
        )
    return out


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "pixart"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "pixart")


def _diffusers(ref, x: dict) -> torch.Tensor:
    cond = {"resolution": x.get("img_hw"), "aspect_ratio": x.get("aspect_ratio")}
    with torch.inference_mode():
        return ref(hidden_states=x["x"], encoder_hidden_states=x["y"], timestep=x["timestep"], added_cond_kwargs=cond,
                   encoder_attention_mask=x.get("mask")).sample  # fmt: skip


def test_sigma_equals_diffusers_in_both_namings_with_a_padded_prompt(pixart):
    diff_path, rel_path, ref = pixart["sigma"]
    dens = {"diffusers": _bound(diff_path), "release": _bound(rel_path)}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in dens}
    assert dens["release"].input_names == ("x", "timestep", "y") and dens["release"].model.micro is None
    x = dens["release"].random_inputs(96, 160, batch=2, seed=1)  # a 12 x 20 latent: a 6 x 10 grid of patches
    assert x["x"].shape == (2, 4, 20, 12) and x["y"].shape == (2, 300, 64)
    x["y"] = x["y"][:, :12]
    x["mask"] = torch.ones(2, 12)
    x["mask"][0, 7:] = 0
    x = dens["release"].check_inputs(x, "inputs")
    want = _diffusers(ref, x)
    with torch.inference_mode():
        for n, d in dens.items():
            out = d(x)
            err = rel_l2(out, want)
            print(f"pixart sigma ({n}): relative L2 {err:.2e}")
            assert out.shape == (2, 8, 20, 12) and err <= TOL
        x["y"][0, 7:] = 20.0  # the padding does not reach the output
        assert rel_l2(dens["release"](x), want) <= TOL


def test_alpha_1024_size_conditions_equal_diffusers(pixart):
    """PixArt-α 1024's csize / ar embedders: the image's pixel size and aspect ratio, given or read from x."""
    diff_path, rel_path, ref = pixart["alpha"]
    den = _bound(rel_path)
    assert den.model.micro is not None and den.input_names == ("x", "timestep", "y")
    x = den.random_inputs(128, 64, seed=3)
    x["y"] = x["y"][:, :20]
    with torch.inference_mode():
        got = den(x)  # no img_hw / aspect_ratio: the latent's pixel height and width, 64 x 128, ratio 0.5
        x.update(img_hw=torch.tensor([[64.0, 128.0]]), aspect_ratio=torch.tensor([[0.5]]))
        err = rel_l2(got, _diffusers(ref, x))
        print(f"pixart alpha: relative L2 {err:.2e}")
        assert err <= TOL
        x.update(img_hw=torch.tensor([[1024.0, 768.0]]), aspect_ratio=torch.tensor([[1024 / 768]]))
        other = den(x)
        assert rel_l2(other, _diffusers(ref, x)) <= TOL and rel_l2(other, got) > 1e-3  # the conditions count
        assert rel_l2(_bound(diff_path)(x), other) <= TOL


def test_pixart_op_order_is_the_call_order(pixart):
    check_op_order(pixart["alpha"][1], "pixart", plain=4)  # the two tables, pos_embed, the null caption


def test_pixart_steps_fully_and_partially_alike(pixart, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(pixart["sigma"][1], tmp_path, 0.01, "pixart", (1, 8, 8, 8))


@pytest.mark.parametrize("micro", [False, True])
def test_the_release_layouts_bind_whole(tmp_path, micro):
    """PixArt-Σ / α XL/2 (28 blocks, 1152 wide, 16 heads of 72, T5-XXL 4096, 8 output channels), the
    1024 α with its size conditions (384 wide each: a third of 1152)."""
    from engine.formats.safetensors import write_sparse

    d, rows = 1152, {"pos_embed": (1, 4096, 1152), "y_embedder.y_embedding": (300, 4096)}

    def lin(k, o, i):
        rows.update({f"{k}.weight": (o, i), f"{k}.bias": (o,)})

    rows.update({"x_embedder.proj.weight": (d, 4, 2, 2), "x_embedder.proj.bias": (d,)})
    lin("t_embedder.mlp.0", d, 256), lin("t_embedder.mlp.2", d, d), lin("t_block.1", 6 * d, d)
    lin("y_embedder.y_proj.fc1", d, 4096), lin("y_embedder.y_proj.fc2", d, d)
    if micro:
        for n in ("csize_embedder", "ar_embedder"):
            lin(f"{n}.mlp.0", d // 3, 256), lin(f"{n}.mlp.2", d // 3, d // 3)
    for i in range(28):
        b = f"blocks.{i}"
        rows[f"{b}.scale_shift_table"] = (6, d)
        lin(f"{b}.attn.qkv", 3 * d, d), lin(f"{b}.attn.proj", d, d), lin(f"{b}.cross_attn.q_linear", d, d)
        lin(f"{b}.cross_attn.kv_linear", 2 * d, d), lin(f"{b}.cross_attn.proj", d, d)
        lin(f"{b}.mlp.fc1", 4 * d, d), lin(f"{b}.mlp.fc2", d, 4 * d)
    rows["final_layer.scale_shift_table"] = (2, d)
    lin("final_layer.linear", 32, d)
    path = write_sparse(
        tmp_path / "PixArt-XL-2-1024-MS.safetensors", [(k, "F16", s) for k, s in rows.items()]
    )
    m = _bound(path).model
    assert (len(m.blocks), m.in_channels, m.context_dim, m.micro is not None) == (28, 4, 4096, micro)


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_on_the_release_file(pixart, tmp_path, budget):
    """A diffusers / PEFT LoRA (the names PixArt's LoRA trainers write) on the release-named file: the fused qkv and
    kv_linear reached as row blocks, baked (resident) and on the fly (streamed); equal to diffusers' model with the
    LoRA merged by hand."""
    from denoise_files import lora_and_merged, lora_step, plain_and_merged

    _, rel_path, ref = pixart["sigma"]
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    names = ("transformer_blocks.0.attn1.to_q", "transformer_blocks.0.attn1.to_v", "transformer_blocks.0.attn2.to_k",
             "transformer_blocks.0.attn2.to_out.0", "transformer_blocks.0.ff.net.0.proj", "adaln_single.linear",
             "caption_projection.linear_1")  # fmt: skip
    strength = 0.7
    lora, merged = lora_and_merged(sd, {d: f"transformer.{d}" for d in names}, strength, seed=5)
    x = _bound(rel_path).random_inputs(64, 64, seed=9)
    x["y"] = x["y"][:, :10]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(rel_path, lora, strength, x, tmp_path, budget)
    assert r.loras and r.loras[0]["mapped"] == len(names), r.loras
    assert rel_l2(out, want) <= TOL
