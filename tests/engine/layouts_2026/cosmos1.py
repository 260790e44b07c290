"""Cosmos 1.0 (Cosmos-Predict1) Diffusion Text2World / Video2World in NVIDIA's original naming: the keys
diffusers' `convert_cosmos_transformer_checkpoint_to_diffusers` reads (its COSMOS_1_0 renames and removals):
`blocks.blockN.blocks.{0,1,2}` hold the self-attention, cross-attention and MLP, each with its
`adaLN_modulation.1/2` LoRA pair, attentions as `to_q` = (Linear, RMSNorm), `to_k` likewise, `to_v.0`,
`to_out.0`; learnable `extra_pos_embedder.pos_emb_{t,h,w}` (128, 120, 120 rows: max 128 frames, 240 latent
px in 2x2 patches), the EDM `logvar` head and RoPE's `pos_embedder.seq`, under the release's `net.` prefix.
7B: 4096 wide (32 heads), 28 blocks; 14B: 5120 (40 heads), 36 blocks (diffusers' converter configs)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .common import Rows


@dataclass(frozen=True)
class Cosmos1Config:
    dim: int = 4096
    layers: int = 28
    in_channels: int = 16  # 17 for Video2World (the condition mask)
    max_size: tuple[int, int, int] = (128, 240, 240)

    def with_(self, **kw) -> Cosmos1Config:
        return replace(self, **kw)


T2W_7B = Cosmos1Config()
V2W_7B = Cosmos1Config(in_channels=17)
T2W_14B = Cosmos1Config(dim=5120, layers=36)
V2W_14B = Cosmos1Config(dim=5120, layers=36, in_channels=17)


def cosmos1_original(c: Cosmos1Config, prefix: str = "net.") -> Rows:
    r = Rows()
    d = c.dim
    r.lin("x_embedder.proj.1", d, (c.in_channels + 1) * 4, False)
    r.t("pos_embedder.seq", (max(c.max_size[0], c.max_size[1] // 2),))
    for axis, n in zip("thw", (c.max_size[0], c.max_size[1] // 2, c.max_size[2] // 2), strict=True):
        r.t(f"extra_pos_embedder.pos_emb_{axis}", (n, d))
    r.lin("t_embedder.1.linear_1", d, d, False)
    r.lin("t_embedder.1.linear_2", 3 * d, d, False)
    r.t("affline_norm.weight", (d,))
    for i in range(c.layers):
        for j, kv in ((0, d), (1, 1024)):
            k = f"blocks.block{i}.blocks.{j}.block.attn"
            r.lin(f"{k}.to_q.0", d, d, False)
            r.t(f"{k}.to_q.1.weight", (128,))
            r.lin(f"{k}.to_k.0", d, kv, False)
            r.t(f"{k}.to_k.1.weight", (128,))
            r.lin(f"{k}.to_v.0", d, kv, False)
            r.lin(f"{k}.to_out.0", d, d, False)
        r.lin(f"blocks.block{i}.blocks.2.block.layer1", 4 * d, d, False)
        r.lin(f"blocks.block{i}.blocks.2.block.layer2", d, 4 * d, False)
        for j in range(3):
            r.lin(f"blocks.block{i}.blocks.{j}.adaLN_modulation.1", 256, d, False)
            r.lin(f"blocks.block{i}.blocks.{j}.adaLN_modulation.2", 3 * d, 256, False)
    r.lin("final_layer.adaLN_modulation.1", 256, d, False)
    r.lin("final_layer.adaLN_modulation.2", 2 * d, 256, False)
    r.lin("final_layer.linear", 16 * 4, d, False)
    r.t("logvar.0.freqs", (128,))
    r.t("logvar.0.phases", (128,))
    r.lin("logvar.1", 1, 128, False)
    return r.under(prefix)


def cosmos1_diffusers_config(c: Cosmos1Config, layers: int | None = None) -> dict:
    """CosmosTransformer3DModel arguments of a Cosmos 1.0 release (diffusers' converter's 1.0 configs)."""
    return dict(
        in_channels=c.in_channels,
        out_channels=16,
        num_attention_heads=c.dim // 128,
        attention_head_dim=128,
        num_layers=layers or c.layers,
        text_embed_dim=1024,
        adaln_lora_dim=256,
        max_size=c.max_size,
        rope_scale=(2.0, 1.0, 1.0) if c.dim == 4096 else (2.0, 2.0, 2.0),
        concat_padding_mask=True,
        extra_pos_embed_type="learnable",
    )
