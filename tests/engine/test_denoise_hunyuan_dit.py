"""Hunyuan-DiT's transformer (engine.denoise.hunyuan_dit) against diffusers' HunyuanDiT2DModel on the same weights, in
diffusers' naming and the release's (fused Wqkv and kv_proj, norm2 / norm3 the other way round, the final modulation's
halves shift first: the inverse of diffusers' scripts/convert_hunyuandit_to_diffusers.py, written here from its facts),
at 6 blocks (blocks 4 and 5 take the long skips of blocks 1 and 0) of 2 heads of 88 (the release's head width), small
text widths, float32, CPU: v1.1-like (style and image size conditions) and v1.2-like; padded prompts; a square grid and
an oblong one (whose RoPE the release spaces differently from diffusers' helper: the release's table is given to
diffusers there); its op order, a step fully and partially resident, and the real 40-block layouts binding whole."""

from __future__ import annotations

import numpy as np
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
CLIP, T5 = 7, 9  # text tokens (the release: 77 and 256)


def diffusers_hunyuan(style: bool, seed: int):
    from diffusers import HunyuanDiT2DModel

    model = HunyuanDiT2DModel(
        num_attention_heads=2, attention_head_dim=88, in_channels=4, patch_size=2, hidden_size=176, num_layers=6,
        mlp_ratio=4.3637, cross_attention_dim=64, cross_attention_dim_t5=32, pooled_projection_dim=48,
        text_len=CLIP, text_len_t5=T5, sample_size=32, use_style_cond_and_image_meta_size=style,
    )  # fmt: skip
    return well_scaled(model, seed)


TOP = {"pos_embed.proj.": "x_embedder.proj.", "time_extra_emb.timestep_embedder.linear_1.": "t_embedder.mlp.0.",
       "time_extra_emb.timestep_embedder.linear_2.": "t_embedder.mlp.2.", "text_embedder.linear_1.": "mlp_t5.0.",
       "text_embedder.linear_2.": "mlp_t5.2.", "time_extra_emb.extra_embedder.linear_1.": "extra_embedder.0.",
       "time_extra_emb.extra_embedder.linear_2.": "extra_embedder.2.", "time_extra_emb.pooler.": "pooler.",
       "time_extra_emb.style_embedder.": "style_embedder.", "proj_out.": "final_layer.linear."}  # fmt: skip
BLOCK = {"norm1.norm.": "norm1.", "norm1.linear.": "default_modulation.1.", "attn1.norm_q.": "attn1.q_norm.",
         "attn1.norm_k.": "attn1.k_norm.", "attn1.to_out.0.": "attn1.out_proj.", "attn2.to_q.": "attn2.q_proj.",
         "attn2.norm_q.": "attn2.q_norm.", "attn2.norm_k.": "attn2.k_norm.", "attn2.to_out.0.": "attn2.out_proj.",
         "norm2.": "norm3.", "norm3.": "norm2.", "ff.net.0.proj.": "mlp.fc1.", "ff.net.2.": "mlp.fc2."}  # fmt: skip


def release(sd: dict, prefix: str = "") -> dict:
    """diffusers' names back in the release's (Tencent/HunyuanDiT's pytorch_model_*.pt keys)."""
    out = {}
    for k, v in sd.items():
        if k.startswith("blocks."):
            _, n, rest = k.split(".", 2)
            b, attr = f"blocks.{n}.", rest.rsplit(".", 1)[-1]
            if rest.startswith(("attn1.to_k.", "attn1.to_v.", "attn2.to_v.")):
                continue
            if rest.startswith("attn1.to_q."):
                out[b + "attn1.Wqkv." + attr] = torch.cat([sd[f"{b}attn1.to_{c}.{attr}"] for c in "qkv"])
                continue
            if rest.startswith("attn2.to_k."):
                out[b + "attn2.kv_proj." + attr] = torch.cat([sd[f"{b}attn2.to_{c}.{attr}"] for c in "kv"])
                continue
            out[b + next((r + rest[len(a) :] for a, r in BLOCK.items() if rest.startswith(a)), rest)] = v
        elif k.startswith("norm_out.linear."):  # diffusers' (scale, shift) -> the release's (shift, scale)
            scale, shift = v.chunk(2)
            out["final_layer.adaLN_modulation.1." + k.rsplit(".", 1)[-1]] = torch.cat([shift, scale])
        else:
            out[next((r + k[len(a) :] for a, r in TOP.items() if k.startswith(a)), k)] = v
    return {prefix + k: v for k, v in out.items()}


@pytest.fixture(scope="module")
def hunyuan(tmp_path_factory):
    d = tmp_path_factory.mktemp("hunyuan_dit")
    out = {}
    for name, style in (("v11", True), ("v12", False)):
        ref, sd = diffusers_hunyuan(style, seed=41 + style)
        out[name] = (
            write(d / f"{name}_diffusers.safetensors", sd),
            write(d / f"{name}.safetensors", release(sd)),
            ref,
        )
    out["prefixed"] = write(
        d / "v12_prefixed.safetensors", release(diffusers_hunyuan(False, 41)[1], "model.")
    )
    return out


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "hunyuan_dit"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "hunyuan_dit")


def release_rope(head_dim: int, h: int, w: int):
    """The release's calc_rope (posemb_layers.get_fill_resize_and_crop / get_meshgrid / get_2d_rotary_pos_embed)
    as its facts state it, in numpy: the grid fitted in 32 x 32, endpoint-free linspace, w first in the meshgrid."""
    r = h / w
    rh, rw = (32, int(round(32 / h * w))) if r > 1 else (int(round(32 / w * h)), 32)
    top, left = int(round((32 - rh) / 2.0)), int(round((32 - rw) / 2.0))
    gh = np.linspace(top, top + rh, h, endpoint=False, dtype=np.float32)
    gw = np.linspace(left, left + rw, w, endpoint=False, dtype=np.float32)
    grid = np.stack(np.meshgrid(gw, gh))  # [2, h, w], the column first

    def one(pos):
        dim = head_dim // 2
        freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
        f = torch.outer(torch.from_numpy(pos.reshape(-1)), freqs).float()
        return f.cos().repeat_interleave(2, 1), f.sin().repeat_interleave(2, 1)

    (c0, s0), (c1, s1) = one(grid[0]), one(grid[1])
    return torch.cat([c0, c1], 1), torch.cat([s0, s1], 1)


def _diffusers(ref, x: dict, rope) -> torch.Tensor:
    with torch.inference_mode():
        return ref(
            hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["encoder_hidden_states"],
            text_embedding_mask=x["text_embedding_mask"], encoder_hidden_states_t5=x["encoder_hidden_states_t5"],
            text_embedding_mask_t5=x["text_embedding_mask_t5"], image_meta_size=x.get("image_meta_size"),
            style=x.get("style"), image_rotary_emb=rope,
        ).sample  # fmt: skip


def _inputs(den, width: int, height: int, seed: int) -> dict:
    x = den.random_inputs(width, height, batch=2, seed=seed)
    x["text_embedding_mask"], x["text_embedding_mask_t5"] = torch.ones(2, CLIP), torch.ones(2, T5)
    x["text_embedding_mask"][0, 4:] = 0
    x["text_embedding_mask_t5"][1, 6:] = 0
    return x


@pytest.mark.parametrize("version", ["v11", "v12"])
def test_equals_diffusers_in_both_namings_on_a_square_grid(hunyuan, version):
    """A 12 x 12 latent (6 x 6 patches), padded prompts; diffusers' own pipeline RoPE (the same as the release's
    on a square grid)."""
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    diff_path, rel_path, ref = hunyuan[version]
    dens = {"diffusers": _bound(diff_path), "release": _bound(rel_path)}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in dens}
    assert dens["release"].input_names == ("x", "t", "encoder_hidden_states", "encoder_hidden_states_t5")
    assert (dens["release"].model.style is not None) == (version == "v11")
    x = _inputs(dens["release"], 96, 96, seed=1)
    assert x["x"].shape == (2, 4, 12, 12) and x["encoder_hidden_states_t5"].shape == (2, T5, 32)
    if version == "v11":
        x["image_meta_size"] = torch.tensor([[1024.0, 1024.0, 96.0, 96.0, 0.0, 0.0]]).repeat(2, 1)
        x["style"] = torch.zeros(2)
    x = dens["release"].check_inputs(x, "inputs")
    rope = get_2d_rotary_pos_embed(88, get_resize_crop_region_for_grid((6, 6), 32), (6, 6))
    want = _diffusers(
        ref, {**x, "style": x.get("style", torch.zeros(0)).long() if version == "v11" else None}, rope
    )
    with torch.inference_mode():
        for n, d in dens.items():
            out = d(x)
            err = rel_l2(out, want)
            print(f"hunyuan_dit {version} ({n}): relative L2 {err:.2e}")
            assert out.shape == (2, 8, 12, 12) and err <= TOL
        if version == "v11":  # the defaults are the release's: 1024, 1024, the target's width, height, 0, 0
            rest = {k: v for k, v in x.items() if k not in ("image_meta_size", "style")}
            assert rel_l2(dens["release"](rest), want) <= TOL
            other = dict(x, image_meta_size=torch.tensor([[512.0, 768.0, 96.0, 96.0, 0.0, 0.0]]).repeat(2, 1))
            assert rel_l2(dens["release"](other), want) > 1e-3  # the size condition counts
        x["encoder_hidden_states"][0, 4:] = 30.0  # masked tokens are the learned padding, whatever they held
        assert rel_l2(dens["release"](x), want) <= TOL
        x["encoder_hidden_states_t5"][1, 6:] = 0.0  # ... but the pooler reads every T5 token
        assert rel_l2(dens["release"](x), want) > 1e-3


def test_equals_diffusers_on_an_oblong_grid_with_the_releases_rope(hunyuan):
    """A 16 x 8 latent (8 x 4 patches: the grid fitted as 32 x 16 and centred, columns from 8): the release's
    RoPE, given to diffusers; diffusers' own helper spaces a crop that does not start at 0 otherwise."""
    diff_path, rel_path, ref = hunyuan["v12"]
    den = _bound(rel_path)
    x = den.check_inputs(_inputs(den, 64, 128, seed=2), "inputs")
    assert x["x"].shape == (2, 4, 16, 8)
    want = _diffusers(ref, x, release_rope(88, 8, 4))
    with torch.inference_mode():
        err = rel_l2(den(x), want)
        print(f"hunyuan_dit v12 oblong: relative L2 {err:.2e}")
        assert err <= TOL
        assert rel_l2(_bound(diff_path)(x), want) <= TOL
        cos, sin = release_rope(88, 8, 4)
        half = 44  # a head's halves swapped (row first): another model
        swapped = (torch.cat([cos[:, half:], cos[:, :half]], 1), torch.cat([sin[:, half:], sin[:, :half]], 1))
        assert rel_l2(den(x), _diffusers(ref, x, swapped)) > 1e-3


def test_a_prefixed_release_file_binds(hunyuan):
    den = _bound(hunyuan["prefixed"])
    assert den.naming == "release" and len(den.model.blocks) == 6
    assert [b.skip is not None for b in den.model.blocks] == [False] * 4 + [True] * 2


def test_hunyuan_dit_op_order_is_the_call_order(hunyuan):
    check_op_order(hunyuan["v11"][1], "hunyuan_dit", plain=2)  # the padding rows, the pooler's positions


def test_hunyuan_dit_steps_fully_and_partially_alike(hunyuan, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(hunyuan["v12"][1], tmp_path, 0.01, "hunyuan_dit", (1, 8, 8, 8))


@pytest.mark.parametrize("version", ["v11", "v12"])
def test_the_release_layouts_bind_whole(tmp_path, version):
    """DiT-g/2 (40 blocks, 1408 wide, 16 heads of 88, MLP 6144, 77 CLIP + 256 mT5 tokens, 8 output channels;
    v1.1 with its style and size conditions), every key at its real shape (tests/support/synth's layouts, checked
    against diffusers' converter in test_synth_dits)."""
    from engine.formats.safetensors import write_sparse
    from tests.support import synth

    rows = synth.layout(f"hunyuan_dit_{version}_transformer")
    path = write_sparse(tmp_path / "pytorch_model_ema.safetensors", rows)
    den = _bound(path)
    m = den.model
    assert (len(m.blocks), m.heads, m.in_channels, m.clip_tokens, m.t5_tokens, m.clip_dim, m.t5_dim) == (
        40, 16, 4, 77, 256, 1024, 2048
    )  # fmt: skip
    assert [b.skip is not None for b in m.blocks] == [i > 20 for i in range(40)]
    assert (m.style is not None) == (version == "v11") and den.naming == "release"


# A LoRA in the other naming: diffusers' split q / k / v and k / v reach the release's fused Wqkv and kv_proj as row
# blocks, norm_out.linear the final adaLN through its swapped halves.
PEFT_NAMES = ("blocks.0.attn1.to_q", "blocks.0.attn1.to_k", "blocks.3.attn1.to_v", "blocks.1.attn2.to_q",
              "blocks.0.attn2.to_k", "blocks.2.attn2.to_v", "blocks.0.attn1.to_out.0", "blocks.3.attn2.to_out.0",
              "blocks.5.ff.net.0.proj", "blocks.4.ff.net.2", "blocks.5.skip_linear", "blocks.2.norm1.linear",
              "norm_out.linear", "proj_out", "text_embedder.linear_1", "time_extra_emb.pooler.q_proj",
              "time_extra_emb.timestep_embedder.linear_2", "time_extra_emb.extra_embedder.linear_1")  # fmt: skip
# The release's names of modules it does not fuse (Tencent's own LoRA training: q_proj, out_proj; kohya, diffusion-pipe).
RELEASE_NAMES = {"blocks.0.attn1.to_out.0": "blocks.0.attn1.out_proj", "blocks.1.attn2.to_q": "blocks.1.attn2.q_proj",
                 "blocks.4.attn2.to_out.0": "blocks.4.attn2.out_proj", "blocks.5.ff.net.0.proj": "blocks.5.mlp.fc1",
                 "blocks.2.ff.net.2": "blocks.2.mlp.fc2", "blocks.4.norm1.linear": "blocks.4.default_modulation.1",
                 "blocks.4.skip_linear": "blocks.4.skip_linear", "norm_out.linear": "final_layer.adaLN_modulation.1",
                 "text_embedder.linear_2": "mlp_t5.2", "time_extra_emb.pooler.k_proj": "pooler.k_proj",
                 "time_extra_emb.timestep_embedder.linear_1": "t_embedder.mlp.0"}  # fmt: skip


def _lora_case(hunyuan, tmp_path, budget, naming: str, keys: dict, kohya: bool, norms: dict):
    from denoise_files import lora_and_merged, plain_and_merged
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid
    from test_denoise_mochi import _swap_halves

    diff_path, rel_path, ref = hunyuan["v12"]
    base = rel_path if naming == "release" else diff_path
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=7, kohya=kohya)
    up = "lora_up" if kohya else "lora_B"
    if naming == "diffusers":  # the release's final adaLN holds (shift, scale): its ΔW, too
        k = keys["norm_out.linear"]
        lora[f"{k}.{up}.weight"] = _swap_halves(lora[f"{k}.{up}.weight"])
    g = torch.Generator().manual_seed(8)
    for (
        d,
        k,
    ) in (
        norms.items()
    ):  # LyCORIS-style full diffs of LayerNorms (diffusers' path d: its norm2 is the release's norm3)
        for part, attr in (("diff", "weight"), ("diff_b", "bias")):
            lora[f"{k}.{part}"] = torch.randn(sd[f"{d}.{attr}"].shape, generator=g) * 0.3
            merged[f"{d}.{attr}"] = sd[f"{d}.{attr}"] + strength * lora[f"{k}.{part}"]
    den = _bound(base)
    x = den.check_inputs(
        _inputs(den, 96, 96, seed=3), "inputs"
    )  # a square grid: diffusers' RoPE is the release's
    rope = get_2d_rotary_pos_embed(88, get_resize_crop_region_for_grid((6, 6), 32), (6, 6))
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x, rope))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"hunyuan_dit LoRA on the {naming} file (budget {budget})"
    check_lora_step(
        base, lora, strength, x, tmp_path, budget, want, len(keys) + len(norms), what, "hunyuan_dit", TOL
    )


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_on_the_release_file(hunyuan, tmp_path, budget):
    """A diffusers / PEFT LoRA (ai-toolkit's, diffusers' names) on the release-named file, baked (resident) and on
    the fly (streamed): equal to diffusers' model with the LoRA merged by hand."""
    norms = {
        d: f"transformer.{d}" for d in ("blocks.1.norm2", "blocks.2.norm3")
    }  # diffusers' norm2: the cross-attention's
    _lora_case(
        hunyuan,
        tmp_path,
        budget,
        "release",
        {d: f"transformer.{d}" for d in PEFT_NAMES},
        kohya=False,
        norms=norms,
    )


@pytest.mark.parametrize(
    ("budget", "prefix"), [(None, "base_model.model."), (0.0, "lora_unet_"), (0.0, "diffusion_model.")]
)
def test_a_release_named_lora_lands_on_the_diffusers_file(hunyuan, tmp_path, budget, prefix):
    """A LoRA in the release's names (Tencent's PEFT LoRAs: `base_model.model.`, lora_A / lora_B; kohya's
    `lora_unet_` and diffusion-pipe's `diffusion_model.`, lora_down / lora_up) on the diffusers-named file, baked and
    on the fly."""
    kohya = not prefix.startswith("base_model")
    keys = {
        d: prefix + (r.replace(".", "_") if prefix.endswith("_") else r) for d, r in RELEASE_NAMES.items()
    }
    # The release's norm3 / norm2 (diffusers' norm2 / norm3) where the prefix says the release's naming; a PEFT name
    # (base_model.model.) could be either naming's and is read in the base's.
    norms = {} if not kohya else {"blocks.1.norm2": "blocks.1.norm3", "blocks.2.norm3": "blocks.2.norm2"}
    norms = {d: prefix + (r.replace(".", "_") if prefix.endswith("_") else r) for d, r in norms.items()}
    _lora_case(hunyuan, tmp_path, budget, "diffusers", keys, kohya=kohya, norms=norms)


def test_a_gguf_hunyuan_dit_steps_like_its_dequantized_twin(tmp_path):
    """A v1.2 GGUF in the release's names, every 2-D tensor whose rows fill Q8_0 blocks quantized (the Linears of the
    reduced width, and the plain padding rows and pooler positions, read through `held`): the same output as its
    dequantized safetensors twin."""
    pytest.importorskip("gguf")
    _, sd = diffusers_hunyuan(False, 41)
    quantized = check_gguf_like_its_twin(
        tmp_path,
        release(sd),
        "hunyuan_dit",
        lambda k, t: t.dim() == 2 and t.shape[-1] % 32 == 0,
        "hunyuan_dit",
    )
    assert {"blocks.0.attn2.kv_proj.weight", "blocks.0.mlp.fc2.weight", "text_embedding_padding"} <= set(
        quantized
    )
