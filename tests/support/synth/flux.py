"""FLUX.1 transformer key layout in BFL naming (black-forest-labs/flux `src/flux/model.py`, `modules/layers.py`).

img_in (hidden <- in_channels), time_in / guidance_in / vector_in MLPEmbedders (in_layer, out_layer;
time and guidance take a 256-wide sinusoidal embedding), txt_in (hidden <- context_in_dim);
double_blocks.N: {img,txt}_mod.lin (6*hidden), {img,txt}_attn.qkv (3*hidden, qkv_bias),
{img,txt}_attn.norm.{query,key}_norm.scale (RMSNorm over head_dim), {img,txt}_attn.proj,
{img,txt}_mlp.{0,2} (hidden*mlp_ratio); the LayerNorms have no affine parameters.
single_blocks.N: linear1 (3*hidden + mlp), linear2 (hidden <- hidden + mlp), norm.{query,key}_norm.scale,
modulation.lin (3*hidden); final_layer.adaLN_modulation.1 (2*hidden) and final_layer.linear.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._build import Builder


@dataclass(frozen=True)
class FluxConfig:
    in_channels: int = 64
    out_channels: int = 64
    vec_in_dim: int = 768
    context_in_dim: int = 4096
    hidden_size: int = 3072
    mlp_ratio: float = 4.0
    num_heads: int = 24
    depth: int = 19
    depth_single_blocks: int = 38
    guidance_embed: bool = True
    chroma: bool = False  # Chroma: per-block modulations replaced by one distilled_guidance_layer
    approximator_hidden: int = 5120  # Chroma's distilled_guidance_layer width (5 layers)

    def with_(self, **kw) -> FluxConfig:
        return replace(self, **kw)


# black-forest-labs/flux src/flux/util.py configs["flux-dev"]: in_channels 64, vec_in_dim 768,
# context_in_dim 4096, hidden_size 3072, mlp_ratio 4.0, num_heads 24, depth 19, depth_single_blocks 38,
# guidance_embed True; "flux-schnell" is the same with guidance_embed False.
FLUX_DEV = FluxConfig()
FLUX_SCHNELL = FLUX_DEV.with_(guidance_embed=False)
# FLUX.1 Fill takes 384 input channels (64 latent + 64 masked image + 256 mask), the Depth / Canny
# control models 128 (flux util.py "flux-dev-fill" / "flux-dev-depth" / "flux-dev-canny" in_channels).
FLUX_FILL = FLUX_DEV.with_(in_channels=384)
FLUX_DEPTH = FLUX_DEV.with_(in_channels=128)
# lodestones/Chroma (FLUX.1-schnell derived; diffusers ChromaTransformer2DModel defaults and its single-file
# converter): the time / vector / guidance embedders and every block's modulation are replaced by
# distilled_guidance_layer (in_proj 64 -> 5120, layers.N.{in_layer,out_layer} and norms.N.scale for
# N < 5, out_proj 5120 -> hidden); the final layer keeps only its linear.
CHROMA = FLUX_SCHNELL.with_(chroma=True)


def _mlp_embedder(b: Builder, key: str, hidden: int, inp: int) -> None:
    b.linear(f"{key}.in_layer", hidden, inp)
    b.linear(f"{key}.out_layer", hidden, hidden)


def flux_bfl(b: Builder, c: FluxConfig) -> None:
    h = c.hidden_size
    mlp = int(h * c.mlp_ratio)
    hd = h // c.num_heads
    b.linear("img_in", h, c.in_channels)
    if c.chroma:
        g = "distilled_guidance_layer"
        a = c.approximator_hidden
        b.linear(f"{g}.in_proj", a, 64)
        for n in range(5):
            b.linear(f"{g}.layers.{n}.in_layer", a, a)
            b.linear(f"{g}.layers.{n}.out_layer", a, a)
            b.t(f"{g}.norms.{n}.scale", (a,))
        b.linear(f"{g}.out_proj", h, a)
    else:
        _mlp_embedder(b, "time_in", h, 256)
        _mlp_embedder(b, "vector_in", h, c.vec_in_dim)
        if c.guidance_embed:
            _mlp_embedder(b, "guidance_in", h, 256)
    b.linear("txt_in", h, c.context_in_dim)
    for i in range(c.depth):
        for s in ("img", "txt"):
            k = f"double_blocks.{i}.{s}"
            if not c.chroma:
                b.linear(f"{k}_mod.lin", 6 * h, h)
            b.linear(f"{k}_attn.qkv", 3 * h, h)
            b.t(f"{k}_attn.norm.query_norm.scale", (hd,))
            b.t(f"{k}_attn.norm.key_norm.scale", (hd,))
            b.linear(f"{k}_attn.proj", h, h)
            b.linear(f"{k}_mlp.0", mlp, h)
            b.linear(f"{k}_mlp.2", h, mlp)
    for i in range(c.depth_single_blocks):
        k = f"single_blocks.{i}"
        b.linear(f"{k}.linear1", 3 * h + mlp, h)
        b.linear(f"{k}.linear2", h, h + mlp)
        b.t(f"{k}.norm.query_norm.scale", (hd,))
        b.t(f"{k}.norm.key_norm.scale", (hd,))
        if not c.chroma:
            b.linear(f"{k}.modulation.lin", 3 * h, h)
    if not c.chroma:
        b.linear("final_layer.adaLN_modulation.1", 2 * h, h)
    b.linear("final_layer.linear", c.out_channels, h)


def flux_diffusers(b: Builder, c: FluxConfig) -> None:
    """diffusers FluxTransformer2DModel naming (models/transformers/transformer_flux.py): the fused BFL
    qkv / linear1 are split into to_q/to_k/to_v (+ proj_mlp), modulations become norm*.linear."""
    h = c.hidden_size
    mlp = int(h * c.mlp_ratio)
    hd = h // c.num_heads
    b.linear("x_embedder", h, c.in_channels)
    b.linear("context_embedder", h, c.context_in_dim)
    b.linear("time_text_embed.timestep_embedder.linear_1", h, 256)
    b.linear("time_text_embed.timestep_embedder.linear_2", h, h)
    if c.guidance_embed:
        b.linear("time_text_embed.guidance_embedder.linear_1", h, 256)
        b.linear("time_text_embed.guidance_embedder.linear_2", h, h)
    b.linear("time_text_embed.text_embedder.linear_1", h, c.vec_in_dim)
    b.linear("time_text_embed.text_embedder.linear_2", h, h)
    for i in range(c.depth):
        t = f"transformer_blocks.{i}"
        b.linear(f"{t}.norm1.linear", 6 * h, h)
        b.linear(f"{t}.norm1_context.linear", 6 * h, h)
        for p in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_out.0", "to_add_out"):
            b.linear(f"{t}.attn.{p}", h, h)
        for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            b.t(f"{t}.attn.{n}.weight", (hd,))
        for ff in ("ff", "ff_context"):
            b.linear(f"{t}.{ff}.net.0.proj", mlp, h)
            b.linear(f"{t}.{ff}.net.2", h, mlp)
    for i in range(c.depth_single_blocks):
        t = f"single_transformer_blocks.{i}"
        b.linear(f"{t}.norm.linear", 3 * h, h)
        b.linear(f"{t}.proj_mlp", mlp, h)
        b.linear(f"{t}.proj_out", h, h + mlp)
        for p in ("to_q", "to_k", "to_v"):
            b.linear(f"{t}.attn.{p}", h, h)
        b.t(f"{t}.attn.norm_q.weight", (hd,))
        b.t(f"{t}.attn.norm_k.weight", (hd,))
    b.linear("norm_out.linear", 2 * h, h)
    b.linear("proj_out", c.out_channels, h)


@dataclass(frozen=True)
class Flux2Config:
    in_channels: int = 128
    context_in_dim: int = 15360
    hidden_size: int = 6144
    mlp_ratio: float = 3.0
    num_heads: int = 48
    depth: int = 8
    depth_single_blocks: int = 48
    guidance_embed: bool = True


# FLUX.2 [dev] (diffusers Flux2Transformer2DModel defaults, the black-forest-labs/FLUX.2-dev config):
# in_channels 128 (32 latent channels patchified 2x2), joint_attention_dim 15360, 48 heads of 128,
# 8 double and 48 single blocks, mlp_ratio 3 with SwiGLU, guidance embedding, no biases anywhere.
FLUX2_DEV = Flux2Config()


def flux2_bfl(b: Builder, c: Flux2Config) -> None:
    """FLUX.2 in BFL naming, as diffusers' convert_flux2_transformer_checkpoint_to_diffusers reads it: like
    FLUX.1 but without biases or the pooled-vector embedder, with SwiGLU MLPs (mlp.0 is 2*mlp wide) and the
    modulations shared by all blocks (double_stream_modulation_{img,txt}.lin, single_stream_modulation.lin)."""
    h = c.hidden_size
    mlp = int(h * c.mlp_ratio)
    hd = h // c.num_heads
    b.linear("img_in", h, c.in_channels, bias=False)
    b.linear("txt_in", h, c.context_in_dim, bias=False)
    b.linear("time_in.in_layer", h, 256, bias=False)
    b.linear("time_in.out_layer", h, h, bias=False)
    if c.guidance_embed:
        b.linear("guidance_in.in_layer", h, 256, bias=False)
        b.linear("guidance_in.out_layer", h, h, bias=False)
    b.linear("double_stream_modulation_img.lin", 6 * h, h, bias=False)
    b.linear("double_stream_modulation_txt.lin", 6 * h, h, bias=False)
    b.linear("single_stream_modulation.lin", 3 * h, h, bias=False)
    for i in range(c.depth):
        for s in ("img", "txt"):
            k = f"double_blocks.{i}.{s}"
            b.linear(f"{k}_attn.qkv", 3 * h, h, bias=False)
            b.t(f"{k}_attn.norm.query_norm.scale", (hd,))
            b.t(f"{k}_attn.norm.key_norm.scale", (hd,))
            b.linear(f"{k}_attn.proj", h, h, bias=False)
            b.linear(f"{k}_mlp.0", 2 * mlp, h, bias=False)
            b.linear(f"{k}_mlp.2", h, mlp, bias=False)
    for i in range(c.depth_single_blocks):
        k = f"single_blocks.{i}"
        b.linear(f"{k}.linear1", 3 * h + 2 * mlp, h, bias=False)
        b.linear(f"{k}.linear2", h, h + mlp, bias=False)
        b.t(f"{k}.norm.query_norm.scale", (hd,))
        b.t(f"{k}.norm.key_norm.scale", (hd,))
    b.linear("final_layer.adaLN_modulation.1", 2 * h, h, bias=False)
    b.linear("final_layer.linear", c.in_channels, h, bias=False)
