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


# Wan 2.2 Animate 14B: Wan2.2 `wan/modules/animate/model_animate.py` (WanAnimateModel: Wan 2.1's I2V network,
# pose_patch_embedding Conv3d(16, dim), Generator(size=512, style_dim=512, motion_dim=20), FaceEncoder(512, dim,
# 4 heads of 1024), FaceAdapter(num_layers // 5 FaceBlocks: linear1_kv, linear1_q, linear2, per-head q_norm /
# k_norm)); the motion encoder's EncoderApp (a ConvLayer 1×1, a ResBlock per halving of 512 down to 4, an
# EqualConv2d 4×4; the channels per size below), its FusedLeakyReLU biases [1, C, 1, 1] and its Blur kernels,
# persistent buffers the release keeps ([4, 4]). Reduced sizes for the tests through the keywords.
WAN22_ANIMATE_14B = WanConfig(in_dim=36, clip_image=True)
ANIMATE_CHANNELS = {512: 32, 256: 64, 128: 128, 64: 256, 32: 512, 16: 512, 8: 512, 4: 512}


def wan_animate_original(c: WanConfig, size: int = 512, channels: dict | None = None, style: int = 512,
                         motion: int = 20, face_in: int = 512, face_hidden: int = 1024, face_heads: int = 4,
                         inject: int = 5) -> Rows:  # fmt: skip
    r = wan_original(c)
    d = c.dim
    ch = channels or ANIMATE_CHANNELS
    r.conv("pose_patch_embedding", d, 16, (1, 2, 2))
    app = "motion_encoder.enc.net_app.convs"
    r.conv(f"{app}.0.0", ch[size], 3, (1, 1), bias=False)
    r.t(f"{app}.0.1.bias", (1, ch[size], 1, 1))
    n, s = 1, size
    while s > 4:
        i, o = ch[s], ch[s // 2]
        r.conv(f"{app}.{n}.conv1.0", i, i, (3, 3), bias=False)
        r.t(f"{app}.{n}.conv1.1.bias", (1, i, 1, 1))
        r.t(f"{app}.{n}.conv2.0.kernel", (4, 4))
        r.conv(f"{app}.{n}.conv2.1", o, i, (3, 3), bias=False)
        r.t(f"{app}.{n}.conv2.2.bias", (1, o, 1, 1))
        r.t(f"{app}.{n}.skip.0.kernel", (4, 4))
        r.conv(f"{app}.{n}.skip.1", o, i, (1, 1), bias=False)
        n, s = n + 1, s // 2
    r.conv(f"{app}.{n}", style, ch[4], (4, 4), bias=False)
    for j in range(5):
        r.lin(f"motion_encoder.enc.fc.{j}", motion if j == 4 else style, style)
    r.t("motion_encoder.dec.direction.weight", (face_in, motion))
    r.conv("face_encoder.conv1_local.conv", face_hidden * face_heads, face_in, (3,))
    r.conv("face_encoder.conv2.conv", face_hidden, face_hidden, (3,))
    r.conv("face_encoder.conv3.conv", face_hidden, face_hidden, (3,))
    r.lin("face_encoder.out_proj", d, face_hidden)
    r.t("face_encoder.padding_tokens", (1, 1, 1, d))
    for j in range(c.layers // inject):
        k = f"face_adapter.fuser_blocks.{j}"
        r.lin(f"{k}.linear1_kv", 2 * d, d)
        r.lin(f"{k}.linear1_q", d, d)
        r.lin(f"{k}.linear2", d, d)
        r.norm(f"{k}.q_norm", 128, bias=False)
        r.norm(f"{k}.k_norm", 128, bias=False)
    return r


# Wan-Animate-2 (diffusers `transformer_wan_animate_2.py`, WanAnimate2Transformer3DModel): Wan 2.1 I2V 14B's network,
# every block wrapped in the release's in-context module (`blocks.N.block.…`, which diffusers'
# `convert_wan_animate_2_transformer_to_diffusers` unwraps); the tests check it through that converter.
WAN_ANIMATE2_14B = WanConfig(in_dim=36, clip_image=True)


def wan_animate2_release(c: WanConfig) -> Rows:
    out = Rows()
    for k, s in wan_original(c).items():
        if k.startswith("blocks."):
            _, n, rest = k.split(".", 2)
            k = f"blocks.{n}.block.{rest}"
        out[k] = s
    return out


def wan_animate2_diffusers_config(c: WanConfig, layers: int | None = None) -> dict:
    return dict(in_dim=c.in_dim, dim=c.dim, ffn_dim=c.ffn, out_dim=c.out_dim, num_heads=c.dim // 128,
                num_layers=layers or c.layers, use_img_emb=c.clip_image)  # fmt: skip


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


# --- HunyuanVideo 1.0 / 1.5, HunyuanImage 2.1 ----------------------------------------------------------
# ComfyUI naming: comfy/ldm/hunyuan_video/model.py (HunyuanVideo: PatchEmbed img_in.proj, MLPEmbedder
# time_in / vector_in / guidance_in / time_r_in, TokenRefiner txt_in with input_embedder, t_embedder,
# c_embedder and individual_token_refiner.blocks.N {norm1, self_attn.qkv/proj, norm2, mlp.0/2,
# adaLN_modulation.1}, FLUX DoubleStreamBlock / SingleStreamBlock, ByT5Mapper byt5_in, MLPProj vision_in,
# cond_type_embedding, LastLayer). Tencent naming (Tencent/HunyuanVideo `hyvideo/modules/models.py`):
# img_attn_qkv, img_attn_{q,k}_norm, img_mod.linear, img_mlp.fc1/fc2, single_blocks.N.{q,k}_norm /
# modulation.linear, time_in.mlp.0/2, refiner self_attn_qkv / mlp.fc1 — the names diffusers'
# convert_hunyuan_video_transformer_to_diffusers reads.
@dataclass(frozen=True)
class HunyuanConfig:
    hidden: int = 3072
    double: int = 20
    single: int = 40
    in_channels: int = 16
    out_channels: int = 16
    patch: tuple[int, ...] = (1, 2, 2)
    text: int = 4096
    vector: int | None = 768
    guidance: bool = True
    byt5: bool = False
    vision: int | None = None
    cond_type: bool = False

    def with_(self, **kw) -> HunyuanConfig:
        return replace(self, **kw)


HUNYUAN_VIDEO = HunyuanConfig()
HUNYUAN_VIDEO_I2V = HunyuanConfig(in_channels=33)
HUNYUAN_VIDEO15 = HunyuanConfig(
    hidden=2048, double=54, single=0, in_channels=65, out_channels=32, patch=(1, 1, 1), text=3584,
    vector=None, guidance=False, byt5=True, vision=1152, cond_type=True,
)  # fmt: skip
HUNYUAN_IMAGE21 = HunyuanConfig(
    hidden=3584, double=20, single=40, in_channels=64, out_channels=64, patch=(1, 1), text=3584,
    vector=None, guidance=False, byt5=True,
)  # fmt: skip


def _mlp_embedder(r: Rows, k: str, h: int, inp: int, tencent: bool) -> None:
    a, b = ("mlp.0", "mlp.2") if tencent else ("in_layer", "out_layer")
    r.lin(f"{k}.{a}", h, inp)
    r.lin(f"{k}.{b}", h, h)


def hunyuan(c: HunyuanConfig, naming: str = "comfy") -> Rows:
    t = naming == "tencent"
    r = Rows()
    h, mlp = c.hidden, 4 * c.hidden
    r.conv("img_in.proj", h, c.in_channels, c.patch)
    _mlp_embedder(r, "time_in", h, 256, t)
    if c.guidance:
        _mlp_embedder(r, "guidance_in", h, 256, t)
    if c.vector:
        r.lin("vector_in.in_layer", h, c.vector)
        r.lin("vector_in.out_layer", h, h)
    r.lin("txt_in.input_embedder", h, c.text)
    _mlp_embedder(r, "txt_in.t_embedder", h, 256, t)
    if t:
        r.lin("txt_in.c_embedder.linear_1", h, c.text)
        r.lin("txt_in.c_embedder.linear_2", h, h)
    else:
        _mlp_embedder(r, "txt_in.c_embedder", h, c.text, False)
    for n in range(2):
        k = f"txt_in.individual_token_refiner.blocks.{n}"
        r.norm(f"{k}.norm1", h)
        r.lin(f"{k}.self_attn_qkv" if t else f"{k}.self_attn.qkv", 3 * h, h)
        r.lin(f"{k}.self_attn_proj" if t else f"{k}.self_attn.proj", h, h)
        r.norm(f"{k}.norm2", h)
        r.lin(f"{k}.mlp.fc1" if t else f"{k}.mlp.0", mlp, h)
        r.lin(f"{k}.mlp.fc2" if t else f"{k}.mlp.2", h, mlp)
        r.lin(f"{k}.adaLN_modulation.1", 2 * h, h)
    for i in range(c.double):
        for s in ("img", "txt"):
            k = f"double_blocks.{i}.{s}"
            if t:
                r.lin(f"{k}_mod.linear", 6 * h, h)
                r.lin(f"{k}_attn_qkv", 3 * h, h)
                r.t(f"{k}_attn_q_norm.weight", (128,))
                r.t(f"{k}_attn_k_norm.weight", (128,))
                r.lin(f"{k}_attn_proj", h, h)
                r.lin(f"{k}_mlp.fc1", mlp, h)
                r.lin(f"{k}_mlp.fc2", h, mlp)
            else:
                r.lin(f"{k}_mod.lin", 6 * h, h)
                r.lin(f"{k}_attn.qkv", 3 * h, h)
                r.t(f"{k}_attn.norm.query_norm.scale", (128,))
                r.t(f"{k}_attn.norm.key_norm.scale", (128,))
                r.lin(f"{k}_attn.proj", h, h)
                r.lin(f"{k}_mlp.0", mlp, h)
                r.lin(f"{k}_mlp.2", h, mlp)
    for i in range(c.single):
        k = f"single_blocks.{i}"
        r.lin(f"{k}.linear1", 3 * h + mlp, h)
        r.lin(f"{k}.linear2", h, h + mlp)
        if t:
            r.t(f"{k}.q_norm.weight", (128,))
            r.t(f"{k}.k_norm.weight", (128,))
            r.lin(f"{k}.modulation.linear", 3 * h, h)
        else:
            r.t(f"{k}.norm.query_norm.scale", (128,))
            r.t(f"{k}.norm.key_norm.scale", (128,))
            r.lin(f"{k}.modulation.lin", 3 * h, h)
    patch_area = 1
    for p in c.patch[-2:]:
        patch_area *= p
    r.lin("final_layer.linear", c.out_channels * patch_area, h)
    r.lin("final_layer.adaLN_modulation.1", 2 * h, h)
    if c.byt5:
        r.norm("byt5_in.layernorm", 1472)
        r.lin("byt5_in.fc1", 2048, 1472)
        r.lin("byt5_in.fc2", 2048, 2048)
        r.lin("byt5_in.fc3", h, 2048)
    if c.vision:
        r.norm("vision_in.proj.0", c.vision)
        r.lin("vision_in.proj.1", c.vision, c.vision)
        r.lin("vision_in.proj.3", h, c.vision)
        r.norm("vision_in.proj.4", h)
    if c.cond_type:
        r.t("cond_type_embedding.weight", (3, h))
    return r


# --- LTX-Video / LTX-2 (original naming) -------------------------------------------------------------
# Lightricks/LTX-Video and Lightricks/LTX-2 keep diffusers' module tree under other names; these are the
# renames diffusers' convert_ltx_transformer_checkpoint_to_diffusers / convert_ltx2_transformer_to_diffusers
# undo (patchify_proj, adaln_single, q_norm / k_norm; audio_patchify_proj, audio_adaln_single,
# av_ca_*_adaln_single, scale_shift_table_a2v_ca_*). Applied to the real diffusers classes' keys, they
# give the original layout of any config.
_LTX_NAMES = (
    ("proj_in", "patchify_proj"),
    ("time_embed", "adaln_single"),
    ("norm_q", "q_norm"),
    ("norm_k", "k_norm"),
)
_LTX2_NAMES = (
    ("audio_proj_in", "audio_patchify_proj"),
    ("audio_time_embed", "audio_adaln_single"),
    ("av_cross_attn_video_scale_shift", "av_ca_video_scale_shift_adaln_single"),
    ("av_cross_attn_video_a2v_gate", "av_ca_a2v_gate_adaln_single"),
    ("av_cross_attn_audio_scale_shift", "av_ca_audio_scale_shift_adaln_single"),
    ("av_cross_attn_audio_v2a_gate", "av_ca_v2a_gate_adaln_single"),
    ("video_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_video"),
    ("audio_a2v_cross_attn_scale_shift_table", "scale_shift_table_a2v_ca_audio"),
    # LTX-2.3's prompt modulation (the conversion script's LTX_2_3_TRANSFORMER_KEYS_RENAME_DICT)
    ("prompt_adaln", "prompt_adaln_single"),
    ("audio_prompt_adaln", "audio_prompt_adaln_single"),
)


def ltx_original(diffusers_shapes: dict, ltx2: bool = False) -> Rows:
    r = Rows()
    for k, s in diffusers_shapes.items():
        r.t(ltx2_release_key(k) if ltx2 else _ltx_renamed(k, _LTX_NAMES), s)
    return r


def _ltx_renamed(key: str, names: tuple) -> str:
    segs = key.split(".")
    for new, old in names:
        segs = [old if seg == new else seg for seg in segs]
    return "model.diffusion_model." + ".".join(segs)


# LTX-2's release file (ltx-2-19b-dev.safetensors; LTX-2.3's ltx-2.3-22b-dev the same way) holds the text connectors
# diffusers keeps apart (LTX2TextConnectors) beside the transformer, under `model.diffusion_model.`, and their
# feature extractor's projection outside it: diffusers' convert_ltx2_to_diffusers.py splits them off by these
# names (LTX_2_0_CONNECTORS_KEYS_RENAME_DICT, and 2.3's per-stream projections), its single-file converter drops
# `video_embeddings_connector` / `audio_embeddings_connector` from the transformer, and Lightricks' loader maps
# `model.diffusion_model.video_embeddings_connector.` and `text_embedding_projection.aggregate_embed.` onto its
# text encoder (ltx_core text_encoders/gemma/encoders/encoder_configurator.py).
_LTX2_CONNECTOR_NAMES = (
    ("video_connector", "video_embeddings_connector"),
    ("audio_connector", "audio_embeddings_connector"),
    ("transformer_blocks", "transformer_1d_blocks"),
    ("norm_q", "q_norm"),
    ("norm_k", "k_norm"),
)
_LTX2_TEXT_PROJECTIONS = {
    "text_proj_in": "aggregate_embed",
    "video_text_proj_in": "video_aggregate_embed",
    "audio_text_proj_in": "audio_aggregate_embed",
}
# The releases' configs, as diffusers' LTX-2 conversion script gives them (versions "2.0" and "2.3"): what differs
# from the classes' defaults, which are the rest of them.
LTX2_TRANSFORMER = {
    "2.0": dict(rope_type="split"),
    "2.3": dict(rope_type="split", gated_attn=True, cross_attn_mod=True, audio_gated_attn=True,
                audio_cross_attn_mod=True, use_prompt_embeddings=False, perturbed_attn=True),
}  # fmt: skip
LTX2_CONNECTORS = {
    "2.0": dict(rope_type="split"),
    "2.3": dict(rope_type="split", video_connector_num_attention_heads=32, video_connector_num_layers=8,
                video_gated_attn=True, audio_connector_num_attention_heads=32, audio_connector_attention_head_dim=64,
                audio_connector_num_layers=8, audio_gated_attn=True, per_modality_projections=True, proj_bias=True),
}  # fmt: skip


def ltx2_release_key(key: str, connectors: bool = False) -> str:
    """A diffusers LTX-2 key — of LTX2VideoTransformer3DModel, or with `connectors` of LTX2TextConnectors — as the
    release file names it."""
    if not connectors:
        return _ltx_renamed(key, _LTX2_NAMES + _LTX_NAMES)
    head, rest = key.split(".", 1)
    if head in _LTX2_TEXT_PROJECTIONS:
        return f"text_embedding_projection.{_LTX2_TEXT_PROJECTIONS[head]}.{rest}"
    return _ltx_renamed(key, _LTX2_CONNECTOR_NAMES)


def ltx2_release(transformer_shapes: dict, connector_shapes: dict) -> Rows:
    """The release file's transformer and text connectors (no VAE, audio VAE or vocoder) from diffusers'
    classes' shapes."""
    r = Rows()
    for k, s in transformer_shapes.items():
        r.t(ltx2_release_key(k), s)
    for k, s in connector_shapes.items():
        r.t(ltx2_release_key(k, connectors=True), s)
    return r


# --- Mochi 1 (original naming) -------------------------------------------------------------------------
# genmoai/mochi `src/genmo/mochi_preview/dit/joint_model/asymm_models_joint.py` (AsymmDiTJoint,
# AsymmetricJointBlock, AsymmetricAttention, AttentionPool t5_y_embedder, t5_yproj): 48 blocks, visual
# 3072 wide, text 1536, 24 heads of 128, MLP ratios 4 (SwiGLU), the last block without a text output.
def mochi_original(layers: int = 48) -> Rows:
    r = Rows()
    x, y = 3072, 1536
    r.conv("x_embedder.proj", x, 12, (2, 2))
    r.lin("t_embedder.mlp.0", x, 256)
    r.lin("t_embedder.mlp.2", x, x)
    r.lin("t5_y_embedder.to_kv", 2 * 4096, 4096)
    r.lin("t5_y_embedder.to_q", 4096, 4096)
    r.lin("t5_y_embedder.to_out", x, 4096)
    r.lin("t5_yproj", y, 4096)
    for i in range(layers):
        k, last = f"blocks.{i}", i == layers - 1
        r.lin(f"{k}.mod_x", 4 * x, x)
        r.lin(f"{k}.mod_y", y if last else 4 * y, x)
        r.lin(f"{k}.attn.qkv_x", 3 * x, x, False)
        r.lin(f"{k}.attn.qkv_y", 3 * x, y, False)
        for n in ("q_norm_x", "k_norm_x", "q_norm_y", "k_norm_y"):
            r.t(f"{k}.attn.{n}.weight", (128,))
        r.lin(f"{k}.attn.proj_x", x, x)
        if not last:
            r.lin(f"{k}.attn.proj_y", y, x)
        r.lin(f"{k}.mlp_x.w1", 2 * 8192, x, False)
        r.lin(f"{k}.mlp_x.w2", x, 8192, False)
        if not last:
            r.lin(f"{k}.mlp_y.w1", 2 * 4096, y, False)
            r.lin(f"{k}.mlp_y.w2", y, 4096, False)
    r.lin("final_layer.mod", 2 * x, x)
    r.lin("final_layer.linear", 48, x)
    r.t("pos_frequencies", (3, 24, 64))
    return r


# --- Cosmos Predict2 / Anima (original naming) ----------------------------------------------------------
# nvidia-cosmos/cosmos-predict2 `cosmos_predict2/models/text2image_dit.py` (MiniTrainDIT, Block with
# self_attn / cross_attn / mlp and adaln_modulation_* LoRA pairs, FinalLayer), the COSMOS_2_0 names
# diffusers' converter reads, under NVIDIA's `net.` prefix; Anima adds `llm_adapter` (diffusers
# AnimaTextConditioner: embed, 6 blocks of self / cross attention over 1024-wide Qwen3 0.6B states, mlp,
# out_proj, norm). 2B: 2048 wide (16 heads), 28 blocks; 14B: 5120 (40 heads), 36 blocks; text 1024.
@dataclass(frozen=True)
class CosmosConfig:
    dim: int = 2048
    layers: int = 28
    in_channels: int = 16  # 17 for Video2World
    anima: bool = False

    def with_(self, **kw) -> CosmosConfig:
        return replace(self, **kw)


COSMOS2_2B_T2I = CosmosConfig()
COSMOS2_14B_V2W = CosmosConfig(dim=5120, layers=36, in_channels=17)
ANIMA = CosmosConfig(anima=True)


def cosmos_original(c: CosmosConfig, prefix: str = "net.") -> Rows:
    r = Rows()
    d = c.dim
    r.lin("x_embedder.proj.1", d, (c.in_channels + 1) * 4, False)
    r.lin("t_embedder.1.linear_1", d, d, False)
    r.lin("t_embedder.1.linear_2", 3 * d, d, False)
    r.t("t_embedding_norm.weight", (d,))
    for i in range(c.layers):
        k = f"blocks.{i}"
        for a, kv in (("self_attn", d), ("cross_attn", 1024)):
            r.lin(f"{k}.{a}.q_proj", d, d, False)
            r.lin(f"{k}.{a}.k_proj", d, kv, False)
            r.lin(f"{k}.{a}.v_proj", d, kv, False)
            r.lin(f"{k}.{a}.output_proj", d, d, False)
            r.t(f"{k}.{a}.q_norm.weight", (128,))
            r.t(f"{k}.{a}.k_norm.weight", (128,))
        r.lin(f"{k}.mlp.layer1", 4 * d, d, False)
        r.lin(f"{k}.mlp.layer2", d, 4 * d, False)
        for m in ("self_attn", "cross_attn", "mlp"):
            r.lin(f"{k}.adaln_modulation_{m}.1", 256, d, False)
            r.lin(f"{k}.adaln_modulation_{m}.2", 3 * d, 256, False)
    r.lin("final_layer.adaln_modulation.1", 256, d, False)
    r.lin("final_layer.adaln_modulation.2", 2 * d, 256, False)
    r.lin("final_layer.linear", 16 * 4, d, False)
    if c.anima:
        a = "llm_adapter"
        r.t(f"{a}.embed.weight", (32128, 1024))
        for n in range(6):
            k = f"{a}.blocks.{n}"
            for part in ("self_attn", "cross_attn"):
                r.t(f"{k}.norm_{part}.weight", (1024,))
                for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    r.lin(f"{k}.{part}.{p}", 1024, 1024, False)
                r.t(f"{k}.{part}.q_norm.weight", (64,))
                r.t(f"{k}.{part}.k_norm.weight", (64,))
            r.t(f"{k}.norm_mlp.weight", (1024,))
            r.lin(f"{k}.mlp.0", 4096, 1024)
            r.lin(f"{k}.mlp.2", 1024, 4096)
        r.lin(f"{a}.out_proj", 1024, 1024)
        r.t(f"{a}.norm.weight", (1024,))
    return r.under(prefix)


def cosmos_diffusers_config(c: CosmosConfig, layers: int | None = None) -> dict:
    """CosmosTransformer3DModel arguments of a Predict2 release (diffusers' Cosmos 2.0 configs)."""
    return dict(
        in_channels=c.in_channels,
        out_channels=16,
        num_attention_heads=c.dim // 128,
        attention_head_dim=128,
        num_layers=layers or c.layers,
        mlp_ratio=4.0,
        text_embed_dim=1024,
        adaln_lora_dim=256,
        max_size=(128, 240, 240),
        patch_size=(1, 2, 2),
        rope_scale=(1.0, 4.0, 4.0),
        concat_padding_mask=True,
        extra_pos_embed_type=None,
    )
