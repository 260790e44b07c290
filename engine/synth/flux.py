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


def _mlp_embedder(b: Builder, key: str, hidden: int, inp: int) -> None:
    b.linear(f"{key}.in_layer", hidden, inp)
    b.linear(f"{key}.out_layer", hidden, hidden)


def flux_bfl(b: Builder, c: FluxConfig) -> None:
    h = c.hidden_size
    mlp = int(h * c.mlp_ratio)
    hd = h // c.num_heads
    b.linear("img_in", h, c.in_channels)
    _mlp_embedder(b, "time_in", h, 256)
    _mlp_embedder(b, "vector_in", h, c.vec_in_dim)
    if c.guidance_embed:
        _mlp_embedder(b, "guidance_in", h, 256)
    b.linear("txt_in", h, c.context_in_dim)
    for i in range(c.depth):
        for s in ("img", "txt"):
            k = f"double_blocks.{i}.{s}"
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
        b.linear(f"{k}.modulation.lin", 3 * h, h)
    b.linear("final_layer.adaLN_modulation.1", 2 * h, h)
    b.linear("final_layer.linear", c.out_channels, h)
