"""SD3 / SD3.5 MMDiT key layouts, native (Stability `joint_blocks`) and diffusers naming.

Native structure (Stability-AI/sd3.5 `mmditx.py`, as read by diffusers'
convert_sd3_transformer_checkpoint_to_diffusers): x_embedder.proj (patch conv), pos_embed
[1, max^2, hidden], t_embedder.mlp.{0,2} (256 -> hidden), y_embedder.mlp.{0,2} (pooled 2048 -> hidden),
context_embedder (4096 -> hidden); joint_blocks.N.{x_block, context_block} with adaLN_modulation.1,
attn.qkv, attn.proj, optional attn.ln_q / ln_k RMSNorm weights (SD3.5), mlp.fc1 / fc2 (4*hidden).
The last context block is "pre_only": a 2*hidden modulation and no attn.proj or mlp. SD3.5 Medium's
first blocks add x_block.attn2 (a second self-attention), and their x_block modulation is 9*hidden.
final_layer.adaLN_modulation.1 (2*hidden), final_layer.linear (patch^2 * out_channels).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class MMDiTConfig:
    depth: int
    pos_embed_max_size: int = 192
    qk_norm: bool = False
    dual_attention_layers: tuple[int, ...] = ()
    in_channels: int = 16
    patch: int = 2
    head_dim: int = 64
    context_dim: int = 4096
    pooled_dim: int = 2048

    @property
    def hidden(self) -> int:
        # mmditx.py: hidden_size = 64 * depth, num_heads = depth
        return self.head_dim * self.depth


# stabilityai/stable-diffusion-3-medium transformer/config.json: num_layers 24, 24 heads of 64,
# caption_projection_dim 1536, pos_embed_max_size 192, joint_attention_dim 4096, pooled 2048.
SD3_MEDIUM = MMDiTConfig(depth=24)
# stabilityai/stable-diffusion-3.5-large: num_layers 38 (hidden 2432), qk_norm "rms_norm", max 192.
SD35_LARGE = MMDiTConfig(depth=38, qk_norm=True)
# stabilityai/stable-diffusion-3.5-medium: num_layers 24, qk_norm "rms_norm", pos_embed_max_size 384,
# dual_attention_layers 0..12.
SD35_MEDIUM = MMDiTConfig(
    depth=24, pos_embed_max_size=384, qk_norm=True, dual_attention_layers=tuple(range(13))
)


def _attn_native(b: Builder, key: str, h: int, hd: int, qk: bool, proj: bool = True) -> None:
    b.linear(f"{key}.qkv", 3 * h, h)
    if qk:
        b.t(f"{key}.ln_q.weight", (hd,))
        b.t(f"{key}.ln_k.weight", (hd,))
    if proj:
        b.linear(f"{key}.proj", h, h)


def mmdit_native(b: Builder, c: MMDiTConfig) -> None:
    h, hd = c.hidden, c.head_dim
    b.conv("x_embedder.proj", h, c.in_channels, k=c.patch)
    b.t("pos_embed", (1, c.pos_embed_max_size**2, h))
    b.linear("t_embedder.mlp.0", h, 256)
    b.linear("t_embedder.mlp.2", h, h)
    b.linear("y_embedder.mlp.0", h, c.pooled_dim)
    b.linear("y_embedder.mlp.2", h, h)
    b.linear("context_embedder", h, c.context_dim)
    for i in range(c.depth):
        last = i == c.depth - 1
        x = f"joint_blocks.{i}.x_block"
        dual = i in c.dual_attention_layers
        b.linear(f"{x}.adaLN_modulation.1", (9 if dual else 6) * h, h)
        _attn_native(b, f"{x}.attn", h, hd, c.qk_norm)
        if dual:
            _attn_native(b, f"{x}.attn2", h, hd, c.qk_norm)
        b.linear(f"{x}.mlp.fc1", 4 * h, h)
        b.linear(f"{x}.mlp.fc2", h, 4 * h)
        cb = f"joint_blocks.{i}.context_block"
        b.linear(f"{cb}.adaLN_modulation.1", (2 if last else 6) * h, h)
        _attn_native(b, f"{cb}.attn", h, hd, c.qk_norm, proj=not last)
        if not last:
            b.linear(f"{cb}.mlp.fc1", 4 * h, h)
            b.linear(f"{cb}.mlp.fc2", h, 4 * h)
    b.linear("final_layer.adaLN_modulation.1", 2 * h, h)
    b.linear("final_layer.linear", c.patch * c.patch * c.in_channels, h)


def mmdit_diffusers(b: Builder, c: MMDiTConfig) -> None:
    """diffusers SD3Transformer2DModel naming (models/transformers/transformer_sd3.py, attention_processor
    JointAttnProcessor: to_q/k/v for the image stream, add_{q,k,v}_proj / to_add_out for the context)."""
    h, hd = c.hidden, c.head_dim
    b.conv("pos_embed.proj", h, c.in_channels, k=c.patch)
    b.t("pos_embed.pos_embed", (1, c.pos_embed_max_size**2, h))
    b.linear("time_text_embed.timestep_embedder.linear_1", h, 256)
    b.linear("time_text_embed.timestep_embedder.linear_2", h, h)
    b.linear("time_text_embed.text_embedder.linear_1", h, c.pooled_dim)
    b.linear("time_text_embed.text_embedder.linear_2", h, h)
    b.linear("context_embedder", h, c.context_dim)
    for i in range(c.depth):
        last = i == c.depth - 1
        dual = i in c.dual_attention_layers
        t = f"transformer_blocks.{i}"
        b.linear(f"{t}.norm1.linear", (9 if dual else 6) * h, h)
        b.linear(f"{t}.norm1_context.linear", (2 if last else 6) * h, h)
        for p in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
            b.linear(f"{t}.attn.{p}", h, h)
        if c.qk_norm:
            for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
                b.t(f"{t}.attn.{n}.weight", (hd,))
        b.linear(f"{t}.attn.to_out.0", h, h)
        if not last:
            b.linear(f"{t}.attn.to_add_out", h, h)
        if dual:
            for p in ("to_q", "to_k", "to_v", "to_out.0"):
                b.linear(f"{t}.attn2.{p}", h, h)
            if c.qk_norm:
                b.t(f"{t}.attn2.norm_q.weight", (hd,))
                b.t(f"{t}.attn2.norm_k.weight", (hd,))
        b.linear(f"{t}.ff.net.0.proj", 4 * h, h)
        b.linear(f"{t}.ff.net.2", h, 4 * h)
        if not last:
            b.linear(f"{t}.ff_context.net.0.proj", 4 * h, h)
            b.linear(f"{t}.ff_context.net.2", h, 4 * h)
    b.linear("norm_out.linear", 2 * h, h)
    b.linear("proj_out", c.patch * c.patch * c.in_channels, h)
