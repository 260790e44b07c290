"""The base a LoRA of Bria FIBO, Bria FIBO 2 or GLM-Image names, from PEFT-named files whose factors take the real
layouts' widths (diffusers' classes at their default configs, built on the meta device); FLUX.1's and Z-Image's LoRAs
still name theirs; Bria FIBO by its caption projections or 48-channel latent, Bria 3.2 by its stem, T5-wide text and
64-channel latent, and a LoRA that could be either names none rather than FLUX.1."""

from __future__ import annotations

import pytest
from layouts_2026.common import meta_shapes

from engine.formats.safetensors import read_header, write_sparse
from engine.lora import describe_lora

diffusers = pytest.importorskip("diffusers")


def _base(tmp_path, cls, modules, **config) -> str | None:
    """The base of a rank-8 PEFT LoRA (`transformer.` + diffusers' names) of `modules` of `cls`'s real layout."""
    rows = meta_shapes(cls, **config)
    entries = []
    for m in modules:
        out, inp = rows[f"{m}.weight"]
        entries += [(f"transformer.{m}.lora_A.weight", "BF16", (8, inp)),
                    (f"transformer.{m}.lora_B.weight", "BF16", (out, 8))]  # fmt: skip
    path = write_sparse(tmp_path / f"{cls.__name__}_{len(modules)}.safetensors", entries)
    info = describe_lora(read_header(path))
    assert info.base is None or info.targets == (
        "transformer",
    )  # a named base's modules are a DiT's, not a UNet's
    return info.base


ATTN = ("to_q", "to_k", "to_v", "to_out.0")


def _fibo2():
    from diffusers.models.transformers.transformer_bria_fibo2 import BriaFibo2Transformer2DModel

    return BriaFibo2Transformer2DModel


def test_a_bria_fibo2_lora_names_it(tmp_path):
    attn = [f"layers.{i}.attention.{p}" for i in (0, 1) for p in ATTN]
    assert _base(tmp_path, _fibo2(), attn) == "bria_fibo2"  # its NextDiT layers, 3584 wide
    cross = [f"layers.6.cross_attention.{p}" for p in ATTN] + ["perceiver.layers.0.ffn.w1"]
    assert _base(tmp_path, _fibo2(), cross) == "bria_fibo2"


def test_z_image_and_flux1_loras_still_name_theirs(tmp_path):
    from diffusers import FluxTransformer2DModel, ZImageTransformer2DModel

    z = [f"layers.{i}.attention.{p}" for i in (0, 1) for p in ATTN] + ["layers.0.feed_forward.w1"]
    assert _base(tmp_path, ZImageTransformer2DModel, z) == "z_image"
    flux = [f"transformer_blocks.0.attn.{p}" for p in (*ATTN, "add_q_proj", "to_add_out")]
    flux += ["single_transformer_blocks.0.attn.to_q", "single_transformer_blocks.0.proj_mlp"]
    assert _base(tmp_path, FluxTransformer2DModel, flux) == "flux1"
    stems = ["time_text_embed.timestep_embedder.linear_1", "context_embedder", "x_embedder"]
    assert _base(tmp_path, FluxTransformer2DModel, flux + stems) == "flux1"


def test_bria_fibo_and_bria_32_loras_name_theirs_where_a_key_or_width_says(tmp_path):
    from diffusers import BriaFiboTransformer2DModel, BriaTransformer2DModel

    blocks = [f"transformer_blocks.0.attn.{p}" for p in (*ATTN, "add_q_proj")] + [
        "single_transformer_blocks.0.proj_mlp"
    ]
    stems = ["time_embed.timestep_embedder.linear_1", "context_embedder"]
    fibo = blocks + stems + ["caption_projection.0.linear", "caption_projection.7.linear"]
    assert _base(tmp_path, BriaFiboTransformer2DModel, fibo) == "bria_fibo"
    # the release's 48-channel latent (Wan 2.2's VAE) without the projections
    assert (
        _base(tmp_path, BriaFiboTransformer2DModel, blocks + stems + ["x_embedder"], in_channels=48)
        == "bria_fibo"
    )
    assert _base(tmp_path, BriaFiboTransformer2DModel, blocks + ["proj_out"], in_channels=48) == "bria_fibo"
    # Bria 3.2: its stem (no pooled vector: not FLUX.1), T5's 4096-wide text and the 64-channel packed latent
    assert _base(tmp_path, BriaTransformer2DModel, blocks + stems + ["x_embedder"]) == "bria"
    # without the latent's width its stems are FIBO's too: no base said, and not FLUX.1
    assert _base(tmp_path, BriaTransformer2DModel, blocks + stems) is None
    # its blocks alone are FLUX.1's, key for key and width for width: read as FLUX.1, as before
    assert _base(tmp_path, BriaTransformer2DModel, blocks) == "flux1"
    assert _base(tmp_path, BriaTransformer2DModel, blocks + ["x_embedder"]) == "flux1"


def test_a_longcat_lora_with_its_stem_still_names_longcat(tmp_path):
    from diffusers import LongCatImageTransformer2DModel

    mods = [
        "transformer_blocks.0.attn.to_q",
        "time_embed.timestep_embedder.linear_1",
        "context_embedder",
        "x_embedder",
    ]
    assert _base(tmp_path, LongCatImageTransformer2DModel, mods) == "longcat_image"


def test_a_glm_image_lora_names_it(tmp_path):
    from diffusers import GlmImageTransformer2DModel

    attn = [f"transformer_blocks.{i}.attn1.{p}" for i in (0, 3) for p in ATTN]
    assert _base(tmp_path, GlmImageTransformer2DModel, attn) == "glm_image"  # 2560 wide, no attn2
    more = ["glyph_projector.net.2", "transformer_blocks.0.ff.net.2"]
    assert _base(tmp_path, GlmImageTransformer2DModel, more) == "glm_image"


def test_other_attn1_dits_do_not_read_as_glm_image(tmp_path):
    from diffusers import LTXVideoTransformer3DModel, MochiTransformer3DModel, PixArtTransformer2DModel

    for cls in (LTXVideoTransformer3DModel, MochiTransformer3DModel, PixArtTransformer2DModel):
        attn = [f"transformer_blocks.0.attn1.{p}" for p in ATTN]
        assert _base(tmp_path, cls, attn) != "glm_image", cls.__name__
