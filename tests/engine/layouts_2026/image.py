"""Image transformers in their original codebases' naming (what ComfyUI's repackaged files keep)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .common import Rows


# --- FLUX.1 / Chroma / FLUX.2 (BFL naming) -----------------------------------------------------------
# black-forest-labs/flux `src/flux/model.py` + `modules/layers.py` (DoubleStreamBlock, SingleStreamBlock,
# MLPEmbedder, LastLayer; configs in `util.py`); lodestones/Chroma (FLUX.1-schnell blocks without
# per-block modulation, `distilled_guidance_layer` = Approximator with in_proj, layers.N.{in,out}_layer,
# norms.N.scale, out_proj); black-forest-labs/flux2 `src/flux2/model.py` (no biases, shared modulation,
# SwiGLU MLP). FLUX.2 klein sizes: mflux `models/common/config/model_config.py`.
@dataclass(frozen=True)
class FluxConfig:
    hidden: int = 3072
    heads: int = 24
    depth: int = 19
    single: int = 38
    in_channels: int = 64
    context: int = 4096
    guidance: bool = True
    kind: str = "flux1"  # flux1 | chroma | flux2

    def with_(self, **kw) -> FluxConfig:
        return replace(self, **kw)


FLUX1_DEV = FluxConfig()
FLUX1_SCHNELL = FLUX1_DEV.with_(guidance=False)
FLUX1_FILL = FLUX1_DEV.with_(in_channels=384)
FLUX1_DEPTH = FLUX1_DEV.with_(in_channels=128)
CHROMA = FLUX1_SCHNELL.with_(kind="chroma")
FLUX2_DEV = FluxConfig(
    hidden=6144, heads=48, depth=8, single=48, in_channels=128, context=15360, kind="flux2"
)
FLUX2_KLEIN_4B = FLUX2_DEV.with_(hidden=3072, heads=24, depth=5, single=20, context=7680, guidance=False)
FLUX2_KLEIN_9B = FLUX2_DEV.with_(hidden=4096, heads=32, depth=8, single=24, context=12288, guidance=False)


def flux_bfl(c: FluxConfig) -> Rows:
    r = Rows()
    h, hd = c.hidden, c.hidden // c.heads
    two = c.kind == "flux2"
    bias = not two
    mlp = h * 3 if two else h * 4
    r.lin("img_in", h, c.in_channels, bias)
    r.lin("txt_in", h, c.context, bias)
    if c.kind == "chroma":
        g = "distilled_guidance_layer"
        r.lin(f"{g}.in_proj", 5120, 64)
        for n in range(5):
            r.lin(f"{g}.layers.{n}.in_layer", 5120, 5120)
            r.lin(f"{g}.layers.{n}.out_layer", 5120, 5120)
            r.t(f"{g}.norms.{n}.scale", (5120,))
        r.lin(f"{g}.out_proj", h, 5120)
    else:
        for e in ("time_in", "guidance_in") if c.guidance else ("time_in",):
            r.lin(f"{e}.in_layer", h, 256, bias)
            r.lin(f"{e}.out_layer", h, h, bias)
        if not two:
            r.lin("vector_in.in_layer", h, 768)
            r.lin("vector_in.out_layer", h, h)
    if two:
        r.lin("double_stream_modulation_img.lin", 6 * h, h, False)
        r.lin("double_stream_modulation_txt.lin", 6 * h, h, False)
        r.lin("single_stream_modulation.lin", 3 * h, h, False)
    for i in range(c.depth):
        for s in ("img", "txt"):
            k = f"double_blocks.{i}.{s}"
            if c.kind == "flux1":
                r.lin(f"{k}_mod.lin", 6 * h, h)
            r.lin(f"{k}_attn.qkv", 3 * h, h, bias)
            r.t(f"{k}_attn.norm.query_norm.scale", (hd,))
            r.t(f"{k}_attn.norm.key_norm.scale", (hd,))
            r.lin(f"{k}_attn.proj", h, h, bias)
            r.lin(f"{k}_mlp.0", 2 * mlp if two else mlp, h, bias)
            r.lin(f"{k}_mlp.2", h, mlp, bias)
    for i in range(c.single):
        k = f"single_blocks.{i}"
        r.lin(f"{k}.linear1", 3 * h + (2 * mlp if two else mlp), h, bias)
        r.lin(f"{k}.linear2", h, h + mlp, bias)
        r.t(f"{k}.norm.query_norm.scale", (hd,))
        r.t(f"{k}.norm.key_norm.scale", (hd,))
        if c.kind == "flux1":
            r.lin(f"{k}.modulation.lin", 3 * h, h)
    if c.kind != "chroma":
        r.lin("final_layer.adaLN_modulation.1", 2 * h, h, bias)
    r.lin("final_layer.linear", c.in_channels if two else 64, h, bias)
    return r


def flux_diffusers_config(c: FluxConfig, depth: int | None = None, single: int | None = None) -> dict:
    """FluxTransformer2DModel / ChromaTransformer2DModel / Flux2Transformer2DModel arguments."""
    cfg = dict(
        num_layers=c.depth if depth is None else depth,
        num_single_layers=c.single if single is None else single,
        num_attention_heads=c.heads,
        attention_head_dim=c.hidden // c.heads,
        joint_attention_dim=c.context,
    )
    if c.kind == "flux2":
        cfg.update(in_channels=c.in_channels, guidance_embeds=c.guidance)
    elif c.kind == "flux1":
        cfg.update(in_channels=c.in_channels, out_channels=64, guidance_embeds=c.guidance)
    return cfg


# --- Krea 2 (original naming) -------------------------------------------------------------------------
# The names diffusers' convert_krea2_transformer_checkpoint_to_diffusers reads (first / tmlp / tproj /
# txtmlp / txtfusion / blocks.N.{attn.wq,wk,wv,wo,gate, attn.qknorm.{q,k}norm.scale, mlp.{gate,up,down},
# prenorm, postnorm, mod.lin} / last), the shapes of diffusers' Krea2Transformer2DModel defaults: hidden
# 6144, 48 heads of 128 with 12 K/V heads, SwiGLU 16384, text fusion over 12 Qwen3-VL 4B layers (2560
# wide, 2 layer-wise and 2 refiner blocks of 20 heads, 4 K/V heads... as the defaults say).
@dataclass(frozen=True)
class Krea2Config:
    hidden: int = 6144
    kv: int = 1536
    ffn: int = 16384
    layers: int = 28
    text: int = 2560
    text_kv: int = 2560
    text_ffn: int = 6912
    text_layers: int = 12
    fusion_blocks: int = 2


KREA2 = Krea2Config()


def _krea2_block(r: Rows, k: str, dim: int, kv: int, ffn: int, mod: bool) -> None:
    r.lin(f"{k}.attn.wq", dim, dim, False)
    r.lin(f"{k}.attn.wk", kv, dim, False)
    r.lin(f"{k}.attn.wv", kv, dim, False)
    r.lin(f"{k}.attn.gate", dim, dim, False)
    r.lin(f"{k}.attn.wo", dim, dim, False)
    r.t(f"{k}.attn.qknorm.qnorm.scale", (128,))
    r.t(f"{k}.attn.qknorm.knorm.scale", (128,))
    r.lin(f"{k}.mlp.gate", ffn, dim, False)
    r.lin(f"{k}.mlp.up", ffn, dim, False)
    r.lin(f"{k}.mlp.down", dim, ffn, False)
    r.t(f"{k}.prenorm.scale", (dim,))
    r.t(f"{k}.postnorm.scale", (dim,))
    if mod:
        r.t(f"{k}.mod.lin", (6 * dim,))  # the six modulation vectors, flattened


def krea2_original(c: Krea2Config) -> Rows:
    r = Rows()
    h = c.hidden
    r.lin("first", h, 64)
    r.lin("tmlp.0", h, 256)
    r.lin("tmlp.2", h, h)
    r.lin("tproj.1", 6 * h, h)
    for kind in ("layerwise_blocks", "refiner_blocks"):
        for n in range(c.fusion_blocks):
            _krea2_block(r, f"txtfusion.{kind}.{n}", c.text, c.text_kv, c.text_ffn, False)
    r.lin("txtfusion.projector", 1, c.text_layers, False)
    r.t("txtmlp.0.scale", (c.text,))
    r.lin("txtmlp.1", h, c.text)
    r.lin("txtmlp.3", h, h)
    for i in range(c.layers):
        _krea2_block(r, f"blocks.{i}", h, c.kv, c.ffn, True)
    r.t("last.modulation.lin", (2, h))
    r.t("last.norm.scale", (h,))
    r.lin("last.linear", 64, h)
    return r


# --- Sana (original naming) ---------------------------------------------------------------------------
# NVlabs/Sana `diffusion/model/nets/sana_multi_scale.py` (SanaMSBlock: attn.qkv / proj, cross_attn.q_linear /
# kv_linear / proj, mlp = GLUMBConv inverted_conv / depth_conv / point_conv), the names diffusers'
# convert_sana_transformer_to_diffusers reads. Configs: 600M hidden 1152 (36 heads), 28 blocks; 1600M
# hidden 2240 (70 heads), 20 blocks; Sana 1.5 4.8B hidden 2240, 60 blocks; captions from Gemma 2 2B (2304).
@dataclass(frozen=True)
class SanaConfig:
    hidden: int = 2240
    layers: int = 20
    caption: int = 2304
    latent: int = 32
    pos_tokens: int = 1024

    def with_(self, **kw) -> SanaConfig:
        return replace(self, **kw)


SANA_1600M = SanaConfig()
SANA_600M = SanaConfig(hidden=1152, layers=28)
SANA15_4800M = SanaConfig(layers=60)


def sana_original(c: SanaConfig) -> Rows:
    r = Rows()
    h, mlp = c.hidden, int(c.hidden * 2.5)
    r.t("pos_embed", (1, c.pos_tokens, h))
    r.conv("x_embedder.proj", h, c.latent, (1, 1))
    r.lin("t_embedder.mlp.0", h, 256)
    r.lin("t_embedder.mlp.2", h, h)
    r.lin("t_block.1", 6 * h, h)
    r.t("y_embedder.y_embedding", (300, c.caption))
    r.lin("y_embedder.y_proj.fc1", h, c.caption)
    r.lin("y_embedder.y_proj.fc2", h, h)
    r.t("attention_y_norm.weight", (h,))
    for i in range(c.layers):
        k = f"blocks.{i}"
        r.t(f"{k}.scale_shift_table", (6, h))
        r.lin(f"{k}.attn.qkv", 3 * h, h, False)
        r.lin(f"{k}.attn.proj", h, h)
        r.lin(f"{k}.cross_attn.q_linear", h, h)
        r.lin(f"{k}.cross_attn.kv_linear", 2 * h, h)
        r.lin(f"{k}.cross_attn.proj", h, h)
        r.conv(f"{k}.mlp.inverted_conv.conv", 2 * mlp, h, (1, 1))
        r.conv(f"{k}.mlp.depth_conv.conv", 2 * mlp, 1, (3, 3))
        r.conv(f"{k}.mlp.point_conv.conv", h, mlp, (1, 1), False)
    r.lin("final_layer.linear", c.latent, h)
    r.t("final_layer.scale_shift_table", (2, h))
    return r


def sana_diffusers_config(c: SanaConfig, layers: int | None = None) -> dict:
    """SanaTransformer2DModel arguments: 32-wide self-attention heads; cross-attention 20 x 112 (1600M) or
    16 x 72 (600M), as the released configs split the same width."""
    cross = (20, 112) if c.hidden == 2240 else (16, 72)
    return dict(
        num_attention_heads=c.hidden // 32,
        attention_head_dim=32,
        num_layers=layers or c.layers,
        num_cross_attention_heads=cross[0],
        cross_attention_head_dim=cross[1],
        cross_attention_dim=c.hidden,
    )


# --- HiDream-I1 (HiDream-ai's naming, which diffusers keeps) --------------------------------------------
# HiDream-ai/HiDream-I1 `hi_diffusers/models/transformers/transformer_hidream_image.py` and `moe.py` (PatchEmbed,
# TimestepEmbed, PooledEmbed, HiDreamImageBlock(.block) with attn1 / ff_i / ff_t, MOEFeedForwardSwiGLU, OutEmbed,
# TextProjection); the released config (HiDream-I1-Full / -Dev `transformer/config.json`, E1-Full's the same but its
# max_resolution): 20 heads of 128, 16 double- and 32 single-stream blocks, 4 routed experts, T5 and Llama 3.1 8B
# captions (4096), pooled CLIP-L + CLIP-G (2048), 16 latent channels in 2x2 patches.
@dataclass(frozen=True)
class HiDreamConfig:
    hidden: int = 2560
    doubles: int = 16
    singles: int = 32
    experts: int = 4
    caption: int = 4096
    pooled: int = 2048
    latent: int = 16


HIDREAM_I1 = HiDreamConfig()


def _swiglu_hidden(hidden: int) -> int:
    """FeedForwardSwiGLU's width for `hidden`: two thirds of it, rounded up to a multiple of 256."""
    return 256 * -(-int(2 * hidden / 3) // 256)


def _hidream_swiglu(r: Rows, k: str, dim: int, hidden: int) -> None:
    f = _swiglu_hidden(hidden)
    r.lin(f"{k}.w1", f, dim, False)
    r.lin(f"{k}.w2", dim, f, False)
    r.lin(f"{k}.w3", f, dim, False)


def hidream_release(c: HiDreamConfig) -> Rows:
    r = Rows()
    h = c.hidden
    r.lin("t_embedder.timestep_embedder.linear_1", h, 256)
    r.lin("t_embedder.timestep_embedder.linear_2", h, h)
    r.lin("p_embedder.pooled_embedder.linear_1", h, c.pooled)
    r.lin("p_embedder.pooled_embedder.linear_2", h, h)
    r.lin("x_embedder.proj", h, 4 * c.latent)
    for kind, n in (("double_stream_blocks", c.doubles), ("single_stream_blocks", c.singles)):
        for i in range(n):
            k = f"{kind}.{i}.block"
            double = kind.startswith("double")
            r.lin(f"{k}.adaLN_modulation.1", (12 if double else 6) * h, h)
            for t in ("", "_t") if double else ("",):
                for p in ("to_q", "to_k", "to_v", "to_out"):
                    r.lin(f"{k}.attn1.{p}{t}", h, h)
                r.norm(f"{k}.attn1.q_rms_norm{t}", h, False)
                r.norm(f"{k}.attn1.k_rms_norm{t}", h, False)
            _hidream_swiglu(r, f"{k}.ff_i.shared_experts", h, 2 * h)
            for e in range(c.experts):
                _hidream_swiglu(r, f"{k}.ff_i.experts.{e}", h, 4 * h)
            r.t(f"{k}.ff_i.gate.weight", (c.experts, h))
            if double:
                _hidream_swiglu(r, f"{k}.ff_t", h, 4 * h)
    r.lin("final_layer.linear", 4 * c.latent, h)
    r.lin("final_layer.adaLN_modulation.1", 2 * h, h)
    for i in range(c.doubles + c.singles + 1):
        r.lin(f"caption_projection.{i}.linear", h, c.caption, False)
    return r


def hidream_diffusers_config(c: HiDreamConfig) -> dict:
    """HiDreamImageTransformer2DModel arguments of the released config."""
    return dict(
        patch_size=2, in_channels=c.latent, out_channels=c.latent, num_layers=c.doubles, num_single_layers=c.singles,
        attention_head_dim=128, num_attention_heads=c.hidden // 128, caption_channels=[c.caption, c.caption],
        text_emb_dim=c.pooled, num_routed_experts=c.experts, num_activated_experts=2, axes_dims_rope=(64, 32, 32),
        max_resolution=(128, 128), llama_layers=[min(i, 31) for i in range(c.doubles + c.singles)],
    )  # fmt: skip


# --- Lumina 2 / Z-Image (original / ComfyUI naming) ----------------------------------------------------
# Alpha-VLLM Lumina-Image-2.0 `models/model.py` (NextDiT, JointTransformerBlock, FinalLayer) as ComfyUI keeps
# it (comfy/ldm/lumina/model.py), and Z-Image in the same naming (ComfyUI's `z_image_modulation`: a bare
# Linear from 256 instead of SiLU + Linear from 1024, pad tokens, no attention biases). Lumina 2: dim 2304,
# 26 layers, 24 heads, 8 K/V heads, Gemma 2 2B captions; Z-Image: dim 3840, 30 layers, 30 heads, Qwen3 4B.
@dataclass(frozen=True)
class NextDiTConfig:
    dim: int = 2304
    layers: int = 26
    heads: int = 24
    kv_heads: int = 8
    ffn: int = 9216
    caption: int = 2304
    z_image: bool = False
    siglip: int = 0  # Z-Image Omni's SigLIP2 width (its SigLIP embedder, refiner and pad token)

    def with_(self, **kw) -> NextDiTConfig:
        return replace(self, **kw)


LUMINA2 = NextDiTConfig()
Z_IMAGE = NextDiTConfig(dim=3840, layers=30, heads=30, kv_heads=30, ffn=10240, caption=2560, z_image=True)
# Z-Image-Omni-Base: SigLIP2 so400m grids, 1152 wide (DiffSynth-Studio's model config for its transformer:
# extra_kwargs siglip_feat_dim 1152); diffusers' ZImageTransformer2DModel names the added layers
Z_IMAGE_OMNI = Z_IMAGE.with_(siglip=1152)


def _nextdit_block(r: Rows, k: str, c: NextDiTConfig, modulated: bool) -> None:
    d, hd = c.dim, c.dim // c.heads
    r.lin(f"{k}.attention.qkv", d + 2 * c.kv_heads * hd, d, False)
    r.lin(f"{k}.attention.out", d, d, False)
    r.t(f"{k}.attention.q_norm.weight", (hd,))
    r.t(f"{k}.attention.k_norm.weight", (hd,))
    r.lin(f"{k}.feed_forward.w1", c.ffn, d, False)
    r.lin(f"{k}.feed_forward.w2", d, c.ffn, False)
    r.lin(f"{k}.feed_forward.w3", c.ffn, d, False)
    for n in ("attention_norm1", "ffn_norm1", "attention_norm2", "ffn_norm2"):
        r.t(f"{k}.{n}.weight", (d,))
    if modulated:
        t = 256 if c.z_image else 1024
        r.lin(f"{k}.adaLN_modulation.{0 if c.z_image else 1}", 4 * d, t)


def nextdit_original(c: NextDiTConfig) -> Rows:
    r = Rows()
    d = c.dim
    t = 256 if c.z_image else 1024
    r.lin("x_embedder", d, 64)
    r.lin("t_embedder.mlp.0", 1024, 256)
    r.lin("t_embedder.mlp.2", t, 1024)
    r.t("cap_embedder.0.weight", (c.caption,))
    r.lin("cap_embedder.1", d, c.caption)
    for n in range(2):
        _nextdit_block(r, f"noise_refiner.{n}", c, True)
        _nextdit_block(r, f"context_refiner.{n}", c, False)
    for i in range(c.layers):
        _nextdit_block(r, f"layers.{i}", c, True)
    r.lin("final_layer.linear", 64, d)
    r.lin("final_layer.adaLN_modulation.1", d, t)
    if c.z_image:
        r.t("x_pad_token", (1, d))
        r.t("cap_pad_token", (1, d))
    if c.siglip:
        r.t("siglip_embedder.0.weight", (c.siglip,))
        r.lin("siglip_embedder.1", d, c.siglip)
        for n in range(2):
            _nextdit_block(r, f"siglip_refiner.{n}", c, False)
        r.t("siglip_pad_token", (1, d))
    else:
        r.t("norm_final.weight", (d,))  # present in Lumina-Image-2.0's release, unused
    return r
