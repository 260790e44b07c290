"""HunyuanDiT (v1.0-v1.2) transformer in Tencent's native naming.

Native structure (Tencent/HunyuanDiT `hydit/modules/models.py`, key names as read by diffusers'
scripts/convert_hunyuandit_to_diffusers.py): x_embedder.proj (patch conv), t_embedder.mlp.{0,2},
pooler (attention pooling of the mT5 states: positional_embedding [text_len_t5 + 1, 2048], q/k/v_proj,
c_proj -> 1024), extra_embedder.{0,2} (pooled 1024 [+ 6 image-size sinusoids of 256 + style embedding
for v1.0/1.1] -> 4*hidden -> hidden), style_embedder (v1.0/1.1), mlp_t5.{0,2} (2048 -> 8192 -> 1024),
text_embedding_padding [77 + 256, 1024]; blocks.N with norm1 + default_modulation.1, attn1 (Wqkv,
q_norm/k_norm LayerNorms over head_dim, out_proj), norm2, attn2 (q_proj, kv_proj from the 1024-wide
text, q_norm/k_norm, out_proj), norm3, mlp.fc{1,2}; the second half of the blocks (N > depth // 2) adds
the long-skip skip_norm / skip_linear (2*hidden -> hidden); final_layer.adaLN_modulation.1 and .linear.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class HunyuanDiTConfig:
    depth: int = 40
    hidden: int = 1408
    heads: int = 16
    mlp_ratio: float = 4.3637
    in_channels: int = 4
    patch: int = 2
    text_dim: int = 1024
    t5_dim: int = 2048
    text_len: int = 77
    text_len_t5: int = 256
    style_and_size: bool = True  # v1.0 / v1.1; v1.2 dropped the style and image-size conditions


# Tencent-Hunyuan/HunyuanDiT-Diffusers transformer/config.json (DiT-g/2): 40 layers, hidden 1408, 16 heads
# of 88, mlp_ratio 4.3637, patch 2, in 4 (learn_sigma: out 8), cross_attention_dim 1024, t5 2048,
# text_len 77 + 256; HunyuanDiT-v1.2-Diffusers sets use_style_cond_and_image_meta_size False.
HUNYUAN_DIT_V11 = HunyuanDiTConfig()
HUNYUAN_DIT_V12 = HunyuanDiTConfig(style_and_size=False)


def hunyuan_dit_native(b: Builder, c: HunyuanDiTConfig) -> None:
    h, hd = c.hidden, c.hidden // c.heads
    mlp = int(h * c.mlp_ratio)
    b.t("text_embedding_padding", (c.text_len + c.text_len_t5, c.text_dim))
    b.linear("mlp_t5.0", 4 * c.t5_dim, c.t5_dim)
    b.linear("mlp_t5.2", c.text_dim, 4 * c.t5_dim)
    b.conv("x_embedder.proj", h, c.in_channels, k=c.patch)
    b.linear("t_embedder.mlp.0", h, 256)
    b.linear("t_embedder.mlp.2", h, h)
    b.t("pooler.positional_embedding", (c.text_len_t5 + 1, c.t5_dim))
    for p in ("k_proj", "q_proj", "v_proj"):
        b.linear(f"pooler.{p}", c.t5_dim, c.t5_dim)
    b.linear("pooler.c_proj", c.text_dim, c.t5_dim)
    extra_in = c.text_dim
    if c.style_and_size:
        b.embedding("style_embedder", 1, h)
        extra_in += 6 * 256 + h
    b.linear("extra_embedder.0", 4 * h, extra_in)
    b.linear("extra_embedder.2", h, 4 * h)
    for i in range(c.depth):
        k = f"blocks.{i}"
        b.norm(f"{k}.norm1", h)
        b.linear(f"{k}.default_modulation.1", h, h)
        b.linear(f"{k}.attn1.Wqkv", 3 * h, h)
        b.linear(f"{k}.attn1.out_proj", h, h)
        b.linear(f"{k}.attn2.q_proj", h, h)
        b.linear(f"{k}.attn2.kv_proj", 2 * h, c.text_dim)
        b.linear(f"{k}.attn2.out_proj", h, h)
        for a in ("attn1", "attn2"):
            b.norm(f"{k}.{a}.q_norm", hd)
            b.norm(f"{k}.{a}.k_norm", hd)
        b.norm(f"{k}.norm2", h)
        b.norm(f"{k}.norm3", h)
        b.linear(f"{k}.mlp.fc1", mlp, h)
        b.linear(f"{k}.mlp.fc2", h, mlp)
        if i > c.depth // 2:
            b.norm(f"{k}.skip_norm", 2 * h)
            b.linear(f"{k}.skip_linear", h, 2 * h)
    b.linear("final_layer.adaLN_modulation.1", 2 * h, h)
    b.linear("final_layer.linear", c.patch * c.patch * c.in_channels * 2, h)
