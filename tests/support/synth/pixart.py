"""PixArt-α / PixArt-Σ transformers, native (PixArt repo) and diffusers naming.

Native structure (PixArt-alpha `diffusion/model/nets/PixArt.py` / `PixArtMS.py`, key names as read by
PixArt's tools/convert_pixart_alpha_to_diffusers.py): x_embedder.proj (patch conv), t_embedder.mlp.{0,2}
(256 -> hidden), t_block.1 (adaLN-single, 6*hidden), y_embedder.y_embedding ([token_num, 4096], the learned
null caption) and y_embedder.y_proj.fc{1,2}; for PixArtMS at 1024 the micro-conditions csize_embedder /
ar_embedder (.mlp.{0,2}, 256 -> hidden/3); blocks.N.{scale_shift_table [6, hidden], attn.qkv, attn.proj,
cross_attn.q_linear, cross_attn.kv_linear (2*hidden), cross_attn.proj, mlp.fc1 (4*hidden), mlp.fc2};
final_layer.scale_shift_table [2, hidden], final_layer.linear (patch^2 * out_channels). Some training
checkpoints also carry the fixed sin-cos `pos_embed` buffer (option pos_embed).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class PixArtConfig:
    depth: int = 28
    hidden: int = 1152
    patch: int = 2
    in_channels: int = 4
    out_channels: int = 8  # learned sigma doubles the output
    caption: int = 4096
    token_num: int = 120
    micro_conditions: bool = True
    sample: int = 128  # latent size, for the pos_embed buffer


# PixArt-XL-2-1024-MS (diffusers PixArt-alpha/PixArt-XL-2-1024-MS transformer/config.json): 28 layers,
# 16 heads of 72 (1152), in 4, out 8, caption_channels 4096, sample_size 128, use_additional_conditions;
# model_max_length 120 tokens (PixArt-alpha t5 max length).
PIXART_ALPHA = PixArtConfig()
# PixArt-Sigma-XL-2-1024-MS: same transformer without micro-conditions, 300 caption tokens.
PIXART_SIGMA = PixArtConfig(token_num=300, micro_conditions=False)


def pixart_native(b: Builder, c: PixArtConfig, *, pos_embed: bool = False) -> None:
    h = c.hidden
    if pos_embed:
        b.t("pos_embed", (1, (c.sample // c.patch) ** 2, h))
    b.conv("x_embedder.proj", h, c.in_channels, k=c.patch)
    b.linear("t_embedder.mlp.0", h, 256)
    b.linear("t_embedder.mlp.2", h, h)
    b.linear("t_block.1", 6 * h, h)
    b.t("y_embedder.y_embedding", (c.token_num, c.caption))
    b.linear("y_embedder.y_proj.fc1", h, c.caption)
    b.linear("y_embedder.y_proj.fc2", h, h)
    if c.micro_conditions:
        for e in ("csize_embedder", "ar_embedder"):
            b.linear(f"{e}.mlp.0", h // 3, 256)
            b.linear(f"{e}.mlp.2", h // 3, h // 3)
    for i in range(c.depth):
        k = f"blocks.{i}"
        b.t(f"{k}.scale_shift_table", (6, h))
        b.linear(f"{k}.attn.qkv", 3 * h, h)
        b.linear(f"{k}.attn.proj", h, h)
        b.linear(f"{k}.cross_attn.q_linear", h, h)
        b.linear(f"{k}.cross_attn.kv_linear", 2 * h, h)
        b.linear(f"{k}.cross_attn.proj", h, h)
        b.linear(f"{k}.mlp.fc1", 4 * h, h)
        b.linear(f"{k}.mlp.fc2", h, 4 * h)
    b.t("final_layer.scale_shift_table", (2, h))
    b.linear("final_layer.linear", c.patch * c.patch * c.out_channels, h)


def pixart_diffusers(b: Builder, c: PixArtConfig) -> None:
    """diffusers PixArtTransformer2DModel naming (no null-caption embedding, no pos_embed buffer)."""
    h = c.hidden
    b.conv("pos_embed.proj", h, c.in_channels, k=c.patch)
    b.linear("adaln_single.emb.timestep_embedder.linear_1", h, 256)
    b.linear("adaln_single.emb.timestep_embedder.linear_2", h, h)
    if c.micro_conditions:
        for e in ("resolution_embedder", "aspect_ratio_embedder"):
            b.linear(f"adaln_single.emb.{e}.linear_1", h // 3, 256)
            b.linear(f"adaln_single.emb.{e}.linear_2", h // 3, h // 3)
    b.linear("adaln_single.linear", 6 * h, h)
    b.linear("caption_projection.linear_1", h, c.caption)
    b.linear("caption_projection.linear_2", h, h)
    for i in range(c.depth):
        k = f"transformer_blocks.{i}"
        b.t(f"{k}.scale_shift_table", (6, h))
        for a in ("attn1", "attn2"):
            for p in ("to_q", "to_k", "to_v", "to_out.0"):
                b.linear(f"{k}.{a}.{p}", h, h)
        b.linear(f"{k}.ff.net.0.proj", 4 * h, h)
        b.linear(f"{k}.ff.net.2", h, 4 * h)
    b.t("scale_shift_table", (2, h))
    b.linear("proj_out", c.patch * c.patch * c.out_channels, h)
