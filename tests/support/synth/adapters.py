"""ControlNets, IP-Adapters, CLIP vision encoders and textual-inversion embeddings.

IP-Adapter (tencent-ailab/IP-Adapter `ip_adapter/ip_adapter.py`, and diffusers loaders/unet.py
_convert_ip_adapter_attn_to_diffusers which reads the same files): `image_proj.*` projects the CLIP image
embedding to 4 context tokens (proj: [4*cross_dim, image_embed_dim], norm: LayerNorm(cross_dim));
`ip_adapter.N.to_k_ip.weight` / `to_v_ip.weight` ([hidden, cross_dim], no bias) for every
cross-attention processor, numbered 1, 3, 5, ... over the UNet's attention processors in diffusers
order (down blocks, up blocks, then the mid block; self-attention takes the even numbers and no weights).
The "plus" variant replaces image_proj with a Perceiver Resampler (latents, proj_in, proj_out,
norm_out, layers.N.{0: attention norm1/norm2/to_q/to_kv/to_out, 1: LayerNorm + 2 Linear feed-forward}).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import unet as U
from ._build import Builder
from .registry import Parts, register


def cross_attention_hidden_sizes(c: U.UNetConfig) -> list[int]:
    """The hidden size of every cross-attention layer, in diffusers' attn_processors order."""
    mc = c.model_channels
    levels = range(len(c.channel_mult))
    has = [2**i in c.attention_resolutions and c.transformer_depth[i] > 0 for i in levels]
    out: list[int] = []
    for i in levels:  # down blocks
        if has[i]:
            out += [mc * c.channel_mult[i]] * (c.num_res_blocks * c.transformer_depth[i])
    for i in reversed(levels):  # up blocks
        if has[i]:
            out += [mc * c.channel_mult[i]] * ((c.num_res_blocks + 1) * c.transformer_depth[i])
    out += [mc * c.channel_mult[-1]] * c.transformer_depth_middle
    return out


def ip_adapter(
    b: Builder, c: U.UNetConfig, image_embed: int, *, plus: bool = False, tokens: int = 16
) -> None:
    cross = c.context_dim
    if plus:
        _resampler(b.sub("image_proj."), image_embed, cross, tokens)
    else:
        b.linear("image_proj.proj", 4 * cross, image_embed)
        b.norm("image_proj.norm", cross)
    for n, hidden in enumerate(cross_attention_hidden_sizes(c)):
        b.linear(f"ip_adapter.{2 * n + 1}.to_k_ip", hidden, cross, bias=False)
        b.linear(f"ip_adapter.{2 * n + 1}.to_v_ip", hidden, cross, bias=False)


def _resampler(
    b: Builder, embed: int, out: int, tokens: int, dim: int = 0, depth: int = 4, heads: int = 12
) -> None:
    """IP-Adapter Plus Resampler (ip_adapter/resampler.py): dim = cross dim for SD1 (768, 12 heads of 64),
    depth 4, ff_mult 4; SDXL plus uses dim 1280 with 20 heads."""
    dim = dim or out
    inner = 64 * heads
    b.t("latents", (1, tokens, dim))
    b.linear("proj_in", dim, embed)
    b.linear("proj_out", out, dim)
    b.norm("norm_out", out)
    for i in range(depth):
        a = f"layers.{i}.0"
        b.norm(f"{a}.norm1", dim)
        b.norm(f"{a}.norm2", dim)
        b.linear(f"{a}.to_q", inner, dim, bias=False)
        b.linear(f"{a}.to_kv", 2 * inner, dim, bias=False)
        b.linear(f"{a}.to_out", dim, inner, bias=False)
        f = f"layers.{i}.1"
        b.norm(f"{f}.0", dim)
        b.linear(f"{f}.1", 4 * dim, dim, bias=False)
        b.linear(f"{f}.3", dim, 4 * dim, bias=False)


@dataclass(frozen=True)
class VisionConfig:
    width: int
    layers: int
    mlp: int
    projection: int
    patch: int = 14
    image: int = 224


# transformers CLIPVisionConfig of the released encoders: openai/clip-vit-large-patch14 (1024 wide,
# 24 layers, mlp 4096, projection 768), laion CLIP-ViT-H-14 (IP-Adapter models/image_encoder: 1280, 32,
# 5120, 1024), laion CLIP-ViT-bigG-14 (IP-Adapter sdxl_models/image_encoder: 1664, 48, 8192, 1280).
VIT_L = VisionConfig(1024, 24, 4096, 768)
VIT_H = VisionConfig(1280, 32, 5120, 1024)
VIT_BIGG = VisionConfig(1664, 48, 8192, 1280)


def clip_vision(b: Builder, c: VisionConfig, *, position_ids: bool = False) -> None:
    """transformers CLIPVisionModelWithProjection naming (models/clip/modeling_clip.py)."""
    w = c.width
    pos = (c.image // c.patch) ** 2 + 1
    v = b.sub("vision_model.")
    v.t("embeddings.class_embedding", (w,))
    v.t("embeddings.patch_embedding.weight", (w, 3, c.patch, c.patch))
    v.embedding("embeddings.position_embedding", pos, w)
    if position_ids:
        v.t("embeddings.position_ids", (1, pos), dtype="I64")
    v.norm("pre_layrnorm", w)
    for i in range(c.layers):
        lay = f"encoder.layers.{i}"
        v.norm(f"{lay}.layer_norm1", w)
        v.norm(f"{lay}.layer_norm2", w)
        v.linear(f"{lay}.mlp.fc1", c.mlp, w)
        v.linear(f"{lay}.mlp.fc2", w, c.mlp)
        for p in ("k", "out", "q", "v"):
            v.linear(f"{lay}.self_attn.{p}_proj", w, w)
    v.norm("post_layernorm", w)
    b.linear("visual_projection", c.projection, w, bias=False)


# --- registrations --------------------------------------------------------------------------------
def _controlnet(cfg: U.UNetConfig, diffusers: bool, prefix: str):
    def fn(p: Parts) -> None:
        b = p("unet", prefix)
        if diffusers:
            U.unet_diffusers(b, cfg, controlnet=True)
        else:
            U.unet_ldm(b, cfg, controlnet=True)

    return fn


# lllyasviel ControlNet 1.0/1.1 files (and the webui-extracted safetensors) keep the copy under
# "control_model."; thibaud/controlnet-sd21 files have no prefix (diffusers single_file_utils notes both);
# SDXL ControlNets are published in diffusers naming.
for _name, _arch, _cfg, _diff, _prefix in (
    ("sd1_controlnet", "sd1", U.SD1, False, "control_model."),
    ("sd1_controlnet_diffusers", "sd1", U.SD1, True, ""),
    ("sd2_controlnet", "sd2", U.SD2, False, ""),
    ("sdxl_controlnet_diffusers", "sdxl", U.SDXL, True, ""),
):
    register(_name, "controlnet", _arch, {"unet": _prefix}, naming="diffusers" if _diff else "ldm")(
        _controlnet(_cfg, _diff, _prefix)
    )


def _ipa(cfg: U.UNetConfig, embed: int, plus: bool, **kw):
    def fn(p: Parts) -> None:
        ip_adapter(p("other"), cfg, embed, plus=plus, **kw)

    return fn


# h94/IP-Adapter: ip-adapter_sd15 (ViT-H image embeds 1024), ip-adapter-plus_sd15 (Resampler over ViT-H
# hidden states 1280, 16 tokens), ip-adapter_sdxl (ViT-bigG 1280), ip-adapter_sdxl_vit-h (ViT-H 1024).
for _name, _arch, _cfg, _embed, _plus in (
    ("ip_adapter_sd15", "sd1", U.SD1, 1024, False),
    ("ip_adapter_plus_sd15", "sd1", U.SD1, 1280, True),
    ("ip_adapter_sdxl", "sdxl", U.SDXL, 1280, False),
    ("ip_adapter_sdxl_vit_h", "sdxl", U.SDXL, 1024, False),
):
    register(_name, "ip_adapter", _arch, {"other": ""}, naming="ip_adapter")(_ipa(_cfg, _embed, _plus))


for _name, _cfg in (
    ("clip_vision_vit_l", VIT_L),
    ("clip_vision_vit_h", VIT_H),
    ("clip_vision_vit_bigg", VIT_BIGG),
):

    def _cv(p: Parts, position_ids: bool = False, _cfg=_cfg) -> None:
        clip_vision(p("other"), _cfg, position_ids=position_ids)

    register(_name, "clip_vision", None, {"other": ""}, naming="transformers")(_cv)


# --- textual inversion embeddings -----------------------------------------------------------------
# A1111 safetensors embeddings hold `emb_params` [vectors, dim] (dim 768 for SD1, 1024 for SD2); SDXL
# embeddings hold `clip_l` [vectors, 768] and `clip_g` [vectors, 1280]. (.pt files: see write_a1111_pt.)
@register("embedding_sd1", "embedding", "sd1", {"other": ""}, naming="a1111")
def _emb_sd1(p: Parts, vectors: int = 4) -> None:
    p("other").t("emb_params", (vectors, 768))


@register("embedding_sd2", "embedding", "sd2", {"other": ""}, naming="a1111")
def _emb_sd2(p: Parts, vectors: int = 4) -> None:
    p("other").t("emb_params", (vectors, 1024))


@register("embedding_sdxl", "embedding", "sdxl", {"other": ""}, naming="a1111")
def _emb_sdxl(p: Parts, vectors: int = 4) -> None:
    b = p("other")
    b.t("clip_g", (vectors, 1280))
    b.t("clip_l", (vectors, 768))


def write_a1111_pt(path, *, vectors: int = 4, dim: int = 768, name: str = "synthetic", seed: int = 0):
    """A1111's own textual-inversion .pt: a pickled dict with string_to_token / string_to_param
    (modules/textual_inversion/textual_inversion.py save format), small and dense."""
    import torch

    from engine.formats.atomic import atomic_output

    g = torch.Generator().manual_seed(seed)
    data = {
        "string_to_token": {"*": 265},
        "string_to_param": {"*": torch.randn((vectors, dim), generator=g).half()},
        "name": name,
        "step": 1000,
        "sd_checkpoint": "0123456789",
        "sd_checkpoint_name": "v1-5-pruned-emaonly",
    }
    with atomic_output(path) as f:
        torch.save(data, f)
    return path
