"""Text encoder key layouts: CLIP (transformers and OpenCLIP namings) and the T5 encoder.

transformers CLIPTextModel (`models/clip/modeling_clip.py`): text_model.embeddings.{token_embedding,
position_embedding} (+ the position_ids buffer, int64 [1, 77], saved by older transformers),
text_model.encoder.layers.N.{self_attn.{q,k,v,out}_proj, layer_norm1, mlp.fc1, layer_norm2, mlp.fc2},
text_model.final_layer_norm; CLIPTextModelWithProjection adds text_projection.weight (no bias).
OpenCLIP (mlfoundations/open_clip `transformer.py` TextTransformer, as saved under
`cond_stage_model.model.` / `conditioner.embedders.1.model.`): token_embedding.weight,
positional_embedding, transformer.resblocks.N.{ln_1, attn.in_proj_weight/bias (fused qkv),
attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_final, text_projection (a bare [width, proj] matrix),
logit_scale (a scalar).
transformers T5EncoderModel (`models/t5/modeling_t5.py`): shared (vocab, d_model),
encoder.block.N.layer.0.SelfAttention.{q,k,v,o} (no bias), relative_attention_bias only in block 0,
layer.0.layer_norm (weight only, RMS), layer.1.DenseReluDense.{wi_0, wi_1, wo} (gated-GELU, v1.1),
layer.1.layer_norm, encoder.final_layer_norm.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class ClipConfig:
    width: int
    layers: int
    mlp: int
    vocab: int = 49408
    positions: int = 77
    projection: int | None = None


# openai/clip-vit-large-patch14 config.json text_config: hidden 768, 12 layers, intermediate 3072.
CLIP_L = ClipConfig(width=768, layers=12, mlp=3072, projection=768)
# laion/CLIP-ViT-H-14-laion2B-s32B-b79K (SD2's text encoder): width 1024, 24 layers, mlp 4096, embed 1024.
CLIP_H = ClipConfig(width=1024, layers=24, mlp=4096, projection=1024)
# laion/CLIP-ViT-bigG-14-laion2B-39B-b160k (SDXL's second encoder): width 1280, 32 layers, mlp 5120,
# embed 1280.
CLIP_G = ClipConfig(width=1280, layers=32, mlp=5120, projection=1280)


def clip_hf(
    b: Builder,
    c: ClipConfig,
    *,
    position_ids: bool = False,
    projection: bool = False,
    layers: int | None = None,
    final_norm: bool = True,
) -> None:
    """transformers naming under b's prefix (which ends in `transformer.` in LDM/SGM files)."""
    w = c.width
    t = b.sub("text_model.")
    t.embedding("embeddings.token_embedding", c.vocab, w)
    t.embedding("embeddings.position_embedding", c.positions, w)
    if position_ids:
        t.t("embeddings.position_ids", (1, c.positions), dtype="I64")
    for i in range(c.layers if layers is None else layers):
        lay = f"encoder.layers.{i}"
        t.norm(f"{lay}.layer_norm1", w)
        t.norm(f"{lay}.layer_norm2", w)
        t.linear(f"{lay}.mlp.fc1", c.mlp, w)
        t.linear(f"{lay}.mlp.fc2", w, c.mlp)
        for p in ("k", "out", "q", "v"):
            t.linear(f"{lay}.self_attn.{p}_proj", w, w)
    if final_norm:
        t.norm("final_layer_norm", w)
    if projection:
        b.linear("text_projection", c.projection or w, w, bias=False)


def clip_openclip(b: Builder, c: ClipConfig, *, layers: int | None = None, head: bool = True) -> None:
    """OpenCLIP naming; `head` adds ln_final, text_projection and logit_scale."""
    w = c.width
    b.embedding("token_embedding", c.vocab, w)
    b.t("positional_embedding", (c.positions, w))
    for i in range(c.layers if layers is None else layers):
        r = f"transformer.resblocks.{i}"
        b.t(f"{r}.attn.in_proj_weight", (3 * w, w))
        b.t(f"{r}.attn.in_proj_bias", (3 * w,))
        b.linear(f"{r}.attn.out_proj", w, w)
        b.norm(f"{r}.ln_1", w)
        b.norm(f"{r}.ln_2", w)
        b.linear(f"{r}.mlp.c_fc", c.mlp, w)
        b.linear(f"{r}.mlp.c_proj", w, c.mlp)
    if head:
        b.norm("ln_final", w)
        b.t("text_projection", (w, c.projection or w))
        b.t("logit_scale", ())


@dataclass(frozen=True)
class T5Config:
    d_model: int = 4096
    d_ff: int = 10240
    layers: int = 24
    heads: int = 64
    d_kv: int = 64
    vocab: int = 32128
    buckets: int = 32


# google/t5-v1_1-xxl config.json: d_model 4096, d_ff 10240, num_layers 24, num_heads 64, d_kv 64,
# vocab 32128, relative_attention_num_buckets 32, feed_forward_proj gated-gelu.
T5_XXL = T5Config()


def t5_encoder(b: Builder, c: T5Config, *, embed_tokens: bool = False) -> None:
    """transformers T5EncoderModel naming (b's prefix is e.g. `text_encoders.t5xxl.transformer.`)."""
    inner = c.heads * c.d_kv
    b.embedding("shared", c.vocab, c.d_model)
    if embed_tokens:
        b.embedding("encoder.embed_tokens", c.vocab, c.d_model)
    for i in range(c.layers):
        blk = f"encoder.block.{i}.layer"
        for p in ("k", "o", "q", "v"):
            shape = (c.d_model, inner) if p == "o" else (inner, c.d_model)
            b.t(f"{blk}.0.SelfAttention.{p}.weight", shape)
        if i == 0:
            b.t(f"{blk}.0.SelfAttention.relative_attention_bias.weight", (c.buckets, c.heads))
        b.t(f"{blk}.0.layer_norm.weight", (c.d_model,))
        b.t(f"{blk}.1.DenseReluDense.wi_0.weight", (c.d_ff, c.d_model))
        b.t(f"{blk}.1.DenseReluDense.wi_1.weight", (c.d_ff, c.d_model))
        b.t(f"{blk}.1.DenseReluDense.wo.weight", (c.d_model, c.d_ff))
        b.t(f"{blk}.1.layer_norm.weight", (c.d_model,))
    b.t("encoder.final_layer_norm.weight", (c.d_model,))
