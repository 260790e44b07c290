"""AuraFlow (fal / cloneofsimo) transformer: native naming and diffusers naming.

Native structure (cloneofsimo/AuraFlow `model.py` MMDiT, as diffusers'
convert_auraflow_transformer_checkpoint_to_diffusers reads it): init_x_linear (patch^2*in -> hidden),
positional_encoding [1, max_pos, hidden], register_tokens [1, 8, hidden], cond_seq_linear (T5 2048 ->
hidden, no bias), t_embedder.mlp.{0,2} (256 -> hidden); double_layers.N with modX.1 / modC.1 (6*hidden
modulations, no bias), attn.w2{q,k,v,o} (image) and attn.w1{q,k,v,o} (text), mlpX / mlpC SwiGLU
(c_fc1, c_fc2, c_proj, no bias); single_layers.N with modCX.1, attn.w1{q,k,v,o}, mlp.*; modF.1
(2*hidden) and final_linear (hidden -> patch^2*out), all without bias.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class AuraFlowConfig:
    in_channels: int = 4
    patch: int = 2
    double_layers: int = 4
    single_layers: int = 32
    heads: int = 12
    head_dim: int = 256
    context_dim: int = 2048
    max_pos: int = 1024
    registers: int = 8

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def mlp(self) -> int:
        # SwiGLU width: 2/3 of 4*hidden rounded up to a multiple of 256 (AuraFlow model.py MLP)
        h = int(2 * 4 * self.hidden / 3)
        return (h + 255) // 256 * 256


# fal/AuraFlow(-v0.3) transformer/config.json (= diffusers AuraFlowTransformer2DModel defaults):
# in_channels 4, patch 2, 4 MMDiT + 32 single layers, 12 heads of 256, joint_attention_dim 2048,
# pos_embed_max_size 1024.
AURAFLOW = AuraFlowConfig()


def auraflow_native(b: Builder, c: AuraFlowConfig) -> None:
    h, m = c.hidden, c.mlp
    b.t("register_tokens", (1, c.registers, h))
    b.t("positional_encoding", (1, c.max_pos, h))
    b.linear("init_x_linear", h, c.patch * c.patch * c.in_channels)
    b.linear("cond_seq_linear", h, c.context_dim, bias=False)
    b.linear("t_embedder.mlp.0", h, 256)
    b.linear("t_embedder.mlp.2", h, h)

    def mlp(key: str) -> None:
        b.linear(f"{key}.c_fc1", m, h, bias=False)
        b.linear(f"{key}.c_fc2", m, h, bias=False)
        b.linear(f"{key}.c_proj", h, m, bias=False)

    for i in range(c.double_layers):
        d = f"double_layers.{i}"
        b.linear(f"{d}.modX.1", 6 * h, h, bias=False)
        b.linear(f"{d}.modC.1", 6 * h, h, bias=False)
        for p in ("w1q", "w1k", "w1v", "w1o", "w2q", "w2k", "w2v", "w2o"):
            b.linear(f"{d}.attn.{p}", h, h, bias=False)
        mlp(f"{d}.mlpX")
        mlp(f"{d}.mlpC")
    for i in range(c.single_layers):
        s = f"single_layers.{i}"
        b.linear(f"{s}.modCX.1", 6 * h, h, bias=False)
        for p in ("w1q", "w1k", "w1v", "w1o"):
            b.linear(f"{s}.attn.{p}", h, h, bias=False)
        mlp(f"{s}.mlp")
    b.linear("modF.1", 2 * h, h, bias=False)
    b.linear("final_linear", c.patch * c.patch * c.in_channels, h, bias=False)
