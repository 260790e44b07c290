"""Video transformers in their original codebases' naming (what ComfyUI's repackaged files keep)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .common import Rows


# --- Wan 2.1 / 2.2 ----------------------------------------------------------------------------------
# Wan-Video/Wan2.1 `wan/modules/model.py` (WanModel, WanAttentionBlock, WanI2VCrossAttention, Head,
# MLPProj), `wan/modules/vace_model.py` (VaceWanModel); Wan2.2 `wan/modules/model.py` (no CLIP branch);
# configs from `wan/configs/wan_*.py` of both repos. Fun markers: aigc-apps/VideoX-Fun
# `videox_fun/models/wan_transformer3d.py` (control_adapter = SimpleAdapter of wan_camera_adapter.py,
# ref_conv Conv2d(16, dim, 2, 2)).
@dataclass(frozen=True)
class WanConfig:
    dim: int = 5120
    ffn: int = 13824
    layers: int = 40
    in_dim: int = 16
    out_dim: int = 16
    text_dim: int = 4096
    clip_image: bool = False  # Wan 2.1 i2v / flf2v: img_emb + k_img / v_img in every block
    flf: bool = False
    vace_layers: tuple[int, ...] = ()
    vace_in: int = 96
    camera: bool = False
    ref_conv: bool = False

    def with_(self, **kw) -> WanConfig:
        return replace(self, **kw)


WAN21_T2V_1_3B = WanConfig(dim=1536, ffn=8960, layers=30)
WAN21_T2V_14B = WanConfig()
WAN21_I2V_14B = WanConfig(in_dim=36, clip_image=True)
WAN21_FLF2V_14B = WAN21_I2V_14B.with_(flf=True)
WAN21_VACE_1_3B = WAN21_T2V_1_3B.with_(vace_layers=tuple(range(0, 30, 2)))
WAN21_VACE_14B = WAN21_T2V_14B.with_(vace_layers=tuple(range(0, 40, 5)))
WAN21_FUN_INP_1_3B = WAN21_T2V_1_3B.with_(in_dim=36, clip_image=True)
WAN21_FUN_CONTROL_14B = WAN21_T2V_14B.with_(in_dim=48, clip_image=True)
WAN21_FUN_CAMERA_1_3B = WAN21_FUN_INP_1_3B.with_(camera=True)
WAN22_T2V_A14B = WAN21_T2V_14B  # each expert (high noise, low noise): the same config (wan_t2v_A14B.py)
WAN22_I2V_A14B = WanConfig(in_dim=36)
WAN22_TI2V_5B = WanConfig(dim=3072, ffn=14336, layers=30, in_dim=48, out_dim=48)
WAN22_FUN_CAMERA_A14B = WAN22_I2V_A14B.with_(camera=True)


def _wan_block(r: Rows, k: str, c: WanConfig, clip_image: bool) -> None:
    d = c.dim
    for a in ("self_attn", "cross_attn"):
        for p in ("q", "k", "v", "o"):
            r.lin(f"{k}.{a}.{p}", d, d)
        r.norm(f"{k}.{a}.norm_q", d, bias=False)  # WanRMSNorm over the whole width (qk_norm)
        r.norm(f"{k}.{a}.norm_k", d, bias=False)
    if clip_image:
        r.lin(f"{k}.cross_attn.k_img", d, d)
        r.lin(f"{k}.cross_attn.v_img", d, d)
        r.norm(f"{k}.cross_attn.norm_k_img", d, bias=False)
    r.norm(f"{k}.norm3", d)  # the affine LayerNorm before cross-attention (cross_attn_norm)
    r.lin(f"{k}.ffn.0", c.ffn, d)
    r.lin(f"{k}.ffn.2", d, c.ffn)
    r.t(f"{k}.modulation", (1, 6, d))


def wan_original(c: WanConfig) -> Rows:
    r = Rows()
    d = c.dim
    r.conv("patch_embedding", d, c.in_dim, (1, 2, 2))
    r.lin("text_embedding.0", d, c.text_dim)
    r.lin("text_embedding.2", d, d)
    r.lin("time_embedding.0", d, 256)
    r.lin("time_embedding.2", d, d)
    r.lin("time_projection.1", 6 * d, d)
    for i in range(c.layers):
        _wan_block(r, f"blocks.{i}", c, c.clip_image)
    r.lin("head.head", c.out_dim * 4, d)
    r.t("head.modulation", (1, 2, d))
    if c.clip_image:
        r.norm("img_emb.proj.0", 1280)
        r.lin("img_emb.proj.1", 1280, 1280)
        r.lin("img_emb.proj.3", d, 1280)
        r.norm("img_emb.proj.4", d)
        if c.flf:
            r.t("img_emb.emb_pos", (1, 2 * 257, 1280))  # two CLIP images of 257 tokens
    if c.vace_layers:
        r.conv("vace_patch_embedding", d, c.vace_in, (1, 2, 2))
        for n, _ in enumerate(c.vace_layers):
            _wan_block(r, f"vace_blocks.{n}", c, False)
            if n == 0:
                r.lin(f"vace_blocks.{n}.before_proj", d, d)
            r.lin(f"vace_blocks.{n}.after_proj", d, d)
    if c.camera:
        r.conv("control_adapter.conv", d, 24 * 8 * 8, (2, 2))
        r.conv("control_adapter.residual_blocks.0.conv1", d, d, (3, 3))
        r.conv("control_adapter.residual_blocks.0.conv2", d, d, (3, 3))
    if c.ref_conv:
        r.conv("ref_conv", d, 16, (2, 2))
    return r


def wan_diffusers_config(c: WanConfig, layers: int | None = None) -> dict:
    """WanTransformer3DModel / WanVACETransformer3DModel arguments for the same release."""
    cfg = dict(
        num_attention_heads=c.dim // 128,
        attention_head_dim=128,
        in_channels=c.in_dim,
        out_channels=c.out_dim,
        ffn_dim=c.ffn,
        num_layers=layers or c.layers,
    )
    if c.clip_image:
        cfg.update(image_dim=1280, added_kv_proj_dim=c.dim)
        if c.flf:
            cfg.update(pos_embed_seq_len=2 * 257)
    if c.vace_layers:
        cfg.update(vace_layers=list(c.vace_layers), vace_in_channels=c.vace_in)
    return cfg
