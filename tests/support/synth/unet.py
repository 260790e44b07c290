"""The LDM/SGM UNet (`openaimodel.UNetModel`) key layout, built from its configuration.

Structure (facts from CompVis/stable-diffusion and Stability-AI/generative-models,
`ldm/modules/diffusionmodules/openaimodel.py` and `ldm/modules/attention.py`):
time_embed.{0,2}; optional label_emb.0.{0,2} (SDXL "sequential" class embedding of adm_in_channels);
input_blocks.0.0 is the stem conv; each level adds num_res_blocks ResBlocks (each followed by a
SpatialTransformer where the downsample factor is in attention_resolutions) and, except the last
level, a Downsample (`op` conv); middle_block is ResBlock, SpatialTransformer, ResBlock;
output_blocks mirror the input blocks with num_res_blocks + 1 ResBlocks per level taking the
skip channels, an Upsample `conv` at the end of every level but the last; out.{0,2} norm and conv.
ResBlock: in_layers.{0 norm, 2 conv}, emb_layers.1 linear, out_layers.{0 norm, 3 conv},
skip_connection 1x1 conv when the channel count changes. SpatialTransformer: norm, proj_in /
proj_out (1x1 conv, or linear when use_linear_in_transformer), transformer_blocks.N with attn1
(self), attn2 (cross, k/v from context_dim), q/k/v without bias, to_out.0 with bias, GEGLU
ff.net.0.proj (dim -> 8*dim), ff.net.2 (4*dim -> dim), norm1..3.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ._build import Builder


@dataclass(frozen=True)
class UNetConfig:
    """The numbers of an LDM UNet config (`unet_config.params` in the original yaml files)."""

    in_channels: int = 4
    out_channels: int = 4
    model_channels: int = 320
    channel_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    attention_resolutions: tuple[int, ...] = (4, 2, 1)
    transformer_depth: tuple[int, ...] = (1, 1, 1, 1)
    transformer_depth_middle: int = 1
    context_dim: int = 768
    use_linear_in_transformer: bool = False
    adm_in_channels: int | None = None
    video: bool = False  # SVD: temporal ResBlocks / transformers beside every spatial one
    extra: dict = field(default_factory=dict, compare=False)

    def with_(self, **kw) -> UNetConfig:
        return replace(self, **kw)


# CompVis/stable-diffusion configs/stable-diffusion/v1-inference.yaml: model_channels 320,
# attention_resolutions [4, 2, 1], num_res_blocks 2, channel_mult [1, 2, 4, 4], transformer_depth 1,
# context_dim 768, conv proj_in/out.
SD1 = UNetConfig()
# Stability-AI/stablediffusion configs/stable-diffusion/v2-inference-v.yaml: as SD1 but
# context_dim 1024 (OpenCLIP-H) and use_linear_in_transformer True.
SD2 = SD1.with_(context_dim=1024, use_linear_in_transformer=True)
# Stability-AI/generative-models configs/inference/sd_xl_base.yaml: adm_in_channels 2816,
# model_channels 320, attention_resolutions [4, 2], channel_mult [1, 2, 4], transformer_depth
# [1, 2, 10] (level 0, ds 1, has no attention), context_dim 2048, use_linear_in_transformer True.
SDXL = UNetConfig(
    channel_mult=(1, 2, 4),
    attention_resolutions=(4, 2),
    transformer_depth=(1, 2, 10),
    transformer_depth_middle=10,
    context_dim=2048,
    use_linear_in_transformer=True,
    adm_in_channels=2816,
)
# generative-models configs/inference/sd_xl_refiner.yaml: adm_in_channels 2560, model_channels 384,
# attention_resolutions [4, 2], channel_mult [1, 2, 4, 4], transformer_depth 4, context_dim 1280.
SDXL_REFINER = UNetConfig(
    model_channels=384,
    channel_mult=(1, 2, 4, 4),
    attention_resolutions=(4, 2),
    transformer_depth=(4, 4, 4, 4),
    transformer_depth_middle=4,
    context_dim=1280,
    use_linear_in_transformer=True,
    adm_in_channels=2560,
)


# Stability-AI/generative-models configs/inference/svd.yaml network_config (VideoUNet): in_channels 8
# (noise + conditioning-frame latent), out 4, model_channels 320, attention_resolutions [4, 2, 1],
# channel_mult [1, 2, 4, 4], transformer_depth 1, context_dim 1024, adm_in_channels 768 (3 x 256 for
# fps / motion bucket / augmentation), use_linear_in_transformer, video_kernel_size [3, 1, 1]
# (= diffusers UNetSpatioTemporalConditionModel defaults).
SVD = SD2.with_(in_channels=8, adm_in_channels=768, video=True)


def _resblock(b: Builder, key: str, ch: int, out: int, emb: int, video: bool = False) -> None:
    b.norm(f"{key}.in_layers.0", ch)
    b.conv(f"{key}.in_layers.2", out, ch)
    b.linear(f"{key}.emb_layers.1", out, emb)
    b.norm(f"{key}.out_layers.0", out)
    b.conv(f"{key}.out_layers.3", out, out)
    if out != ch:
        b.conv(f"{key}.skip_connection", out, ch, k=1)
    if video:  # sgm VideoResBlock: a (3,1,1)-kernel ResBlock in time_stack, blended by time_mixer
        b.norm(f"{key}.time_stack.in_layers.0", out)
        b.conv3d(f"{key}.time_stack.in_layers.2", out, out, (3, 1, 1))
        b.linear(f"{key}.time_stack.emb_layers.1", out, emb)
        b.norm(f"{key}.time_stack.out_layers.0", out)
        b.conv3d(f"{key}.time_stack.out_layers.3", out, out, (3, 1, 1))
        b.t(f"{key}.time_mixer.mix_factor", (1,))


def _transformer(
    b: Builder,
    key: str,
    ch: int,
    depth: int,
    context: int,
    linear: bool,
    video: bool = False,
    temporal: str = "",
) -> None:
    b.norm(f"{key}.norm", ch)
    proj = (lambda k: b.linear(k, ch, ch)) if linear else (lambda k: b.conv(k, ch, ch, k=1))
    proj(f"{key}.proj_in")
    for d in range(depth):
        tb = f"{key}.transformer_blocks.{d}"
        for attn, kv in (("attn1", ch), ("attn2", context)):
            b.linear(f"{tb}.{attn}.to_q", ch, ch, bias=False)
            b.linear(f"{tb}.{attn}.to_k", ch, kv, bias=False)
            b.linear(f"{tb}.{attn}.to_v", ch, kv, bias=False)
            b.linear(f"{tb}.{attn}.to_out.0", ch, ch)
        b.linear(f"{tb}.ff.net.0.proj", ch * 8, ch)
        b.linear(f"{tb}.ff.net.2", ch, ch * 4)
        for n in (1, 2, 3):
            b.norm(f"{tb}.norm{n}", ch)
    proj(f"{key}.proj_out")
    if video:
        _temporal(b, key, ch, depth, context, temporal)


def _temporal(b: Builder, key: str, ch: int, depth: int, context: int, naming: str) -> None:
    """sgm SpatialVideoTransformer's temporal half (video_attention.py VideoTransformerBlock with ff_in):
    norm_in, ff_in (GEGLU), attn1, attn2 (context), ff, norm1..3; time_pos_embed MLP (ch -> 4ch -> ch);
    time_mixer.mix_factor. Native `time_stack` / `time_pos_embed.{0,2}`; diffusers
    `temporal_transformer_blocks` / `time_pos_embed.linear_{1,2}`."""
    stack = "temporal_transformer_blocks" if naming == "diffusers" else "time_stack"
    for d in range(depth):
        tb = f"{key}.{stack}.{d}"
        b.norm(f"{tb}.norm_in", ch)
        b.linear(f"{tb}.ff_in.net.0.proj", ch * 8, ch)
        b.linear(f"{tb}.ff_in.net.2", ch, ch * 4)
        for attn, kv in (("attn1", ch), ("attn2", context)):
            b.linear(f"{tb}.{attn}.to_q", ch, ch, bias=False)
            b.linear(f"{tb}.{attn}.to_k", ch, kv, bias=False)
            b.linear(f"{tb}.{attn}.to_v", ch, kv, bias=False)
            b.linear(f"{tb}.{attn}.to_out.0", ch, ch)
        b.linear(f"{tb}.ff.net.0.proj", ch * 8, ch)
        b.linear(f"{tb}.ff.net.2", ch, ch * 4)
        for n in (1, 2, 3):
            b.norm(f"{tb}.norm{n}", ch)
    first, second = ("linear_1", "linear_2") if naming == "diffusers" else ("0", "2")
    b.linear(f"{key}.time_pos_embed.{first}", ch * 4, ch)
    b.linear(f"{key}.time_pos_embed.{second}", ch, ch * 4)
    b.t(f"{key}.time_mixer.mix_factor", (1,))


def unet_ldm(b: Builder, c: UNetConfig, *, controlnet: bool = False) -> None:
    """Every key of an LDM UNet (or, with controlnet=True, the encoder half a ControlNet copies)."""
    mc = c.model_channels
    emb = mc * 4
    b.linear("time_embed.0", emb, mc)
    b.linear("time_embed.2", emb, emb)
    if c.adm_in_channels:
        b.linear("label_emb.0.0", emb, c.adm_in_channels)
        b.linear("label_emb.0.2", emb, emb)
    b.conv("input_blocks.0.0", mc, c.in_channels)
    chans = [mc]
    ch, ds, n = mc, 1, 1
    for level, mult in enumerate(c.channel_mult):
        for _ in range(c.num_res_blocks):
            _resblock(b, f"input_blocks.{n}.0", ch, mult * mc, emb, c.video)
            ch = mult * mc
            if ds in c.attention_resolutions and c.transformer_depth[level] > 0:
                _transformer(
                    b,
                    f"input_blocks.{n}.1",
                    ch,
                    c.transformer_depth[level],
                    c.context_dim,
                    c.use_linear_in_transformer,
                    c.video,
                )
            chans.append(ch)
            n += 1
        if level != len(c.channel_mult) - 1:
            b.conv(f"input_blocks.{n}.0.op", ch, ch)
            chans.append(ch)
            ds *= 2
            n += 1
    _resblock(b, "middle_block.0", ch, ch, emb, c.video)
    _transformer(
        b,
        "middle_block.1",
        ch,
        c.transformer_depth_middle,
        c.context_dim,
        c.use_linear_in_transformer,
        c.video,
    )
    _resblock(b, "middle_block.2", ch, ch, emb, c.video)
    if controlnet:
        _controlnet_extras(b, c, chans)
        return
    n = 0
    for level, mult in reversed(list(enumerate(c.channel_mult))):
        for i in range(c.num_res_blocks + 1):
            skip = chans.pop()
            _resblock(b, f"output_blocks.{n}.0", ch + skip, mc * mult, emb, c.video)
            ch = mc * mult
            sub = 1
            if ds in c.attention_resolutions and c.transformer_depth[level] > 0:
                _transformer(
                    b,
                    f"output_blocks.{n}.1",
                    ch,
                    c.transformer_depth[level],
                    c.context_dim,
                    c.use_linear_in_transformer,
                    c.video,
                )
                sub = 2
            if level and i == c.num_res_blocks:
                b.conv(f"output_blocks.{n}.{sub}.conv", ch, ch)
                ds //= 2
            n += 1
    b.norm("out.0", ch)
    b.conv("out.2", c.out_channels, mc)


def _controlnet_extras(b: Builder, c: UNetConfig, chans: list[int]) -> None:
    """ControlNet's hint encoder and zero convs (lllyasviel/ControlNet cldm/cldm.py: input_hint_block
    is conv 3->16, 16->16, 16->32 (stride 2), 32->32, 32->96 (s2), 96->96, 96->256 (s2), 256->mc, with
    SiLU between at the odd indices; one 1x1 zero_conv per input block; middle_block_out 1x1)."""
    hint = [(3, 16), (16, 16), (16, 32), (32, 32), (32, 96), (96, 96), (96, 256), (256, c.model_channels)]
    for i, (cin, cout) in enumerate(hint):
        b.conv(f"input_hint_block.{2 * i}", cout, cin)
    for i, ch in enumerate(chans):
        b.conv(f"zero_convs.{i}.0", ch, ch, k=1)
    ch = c.model_channels * c.channel_mult[-1]
    b.conv("middle_block_out.0", ch, ch, k=1)


def _resnet_diffusers(b: Builder, key: str, ch: int, out: int, emb: int, video: bool = False) -> None:
    if video:  # diffusers SpatioTemporalResBlock
        _resnet_diffusers(b, f"{key}.spatial_res_block", ch, out, emb)
        b.norm(f"{key}.temporal_res_block.norm1", out)
        b.conv3d(f"{key}.temporal_res_block.conv1", out, out, (3, 1, 1))
        b.linear(f"{key}.temporal_res_block.time_emb_proj", out, emb)
        b.norm(f"{key}.temporal_res_block.norm2", out)
        b.conv3d(f"{key}.temporal_res_block.conv2", out, out, (3, 1, 1))
        b.t(f"{key}.time_mixer.mix_factor", (1,))
        return
    b.norm(f"{key}.norm1", ch)
    b.conv(f"{key}.conv1", out, ch)
    b.linear(f"{key}.time_emb_proj", out, emb)
    b.norm(f"{key}.norm2", out)
    b.conv(f"{key}.conv2", out, out)
    if out != ch:
        b.conv(f"{key}.conv_shortcut", out, ch, k=1)


def unet_diffusers(b: Builder, c: UNetConfig, *, controlnet: bool = False) -> None:
    """The same UNet in diffusers UNet2DConditionModel naming (diffusers models/unets/unet_2d_blocks.py):
    down_blocks.i.{resnets,attentions}.j, downsamplers.0.conv, mid_block, up_blocks (deepest first),
    time_embedding.linear_{1,2}, add_embedding.linear_{1,2} (SDXL text_time), conv_norm_out, conv_out.
    The Transformer2DModel inside keeps the LDM names (norm, proj_in, transformer_blocks, proj_out)."""
    mc = c.model_channels
    emb = mc * 4
    lin = c.use_linear_in_transformer
    b.conv("conv_in", mc, c.in_channels)
    b.linear("time_embedding.linear_1", emb, mc)
    b.linear("time_embedding.linear_2", emb, emb)
    if c.adm_in_channels:
        b.linear("add_embedding.linear_1", emb, c.adm_in_channels)
        b.linear("add_embedding.linear_2", emb, emb)
    chans = [mc]
    ch = mc
    attn = [
        ds_ in c.attention_resolutions and c.transformer_depth[i] > 0
        for i, ds_ in enumerate(2**i for i in range(len(c.channel_mult)))
    ]
    for level, mult in enumerate(c.channel_mult):
        for j in range(c.num_res_blocks):
            _resnet_diffusers(b, f"down_blocks.{level}.resnets.{j}", ch, mult * mc, emb, c.video)
            ch = mult * mc
            if attn[level]:
                _transformer(
                    b,
                    f"down_blocks.{level}.attentions.{j}",
                    ch,
                    c.transformer_depth[level],
                    c.context_dim,
                    lin,
                    c.video,
                    "diffusers",
                )
            chans.append(ch)
        if level != len(c.channel_mult) - 1:
            b.conv(f"down_blocks.{level}.downsamplers.0.conv", ch, ch)
            chans.append(ch)
    _resnet_diffusers(b, "mid_block.resnets.0", ch, ch, emb, c.video)
    _transformer(
        b, "mid_block.attentions.0", ch, c.transformer_depth_middle, c.context_dim, lin, c.video, "diffusers"
    )
    _resnet_diffusers(b, "mid_block.resnets.1", ch, ch, emb, c.video)
    if controlnet:
        _controlnet_diffusers_extras(b, c, chans)
        return
    for n, (level, mult) in enumerate(reversed(list(enumerate(c.channel_mult)))):
        for j in range(c.num_res_blocks + 1):
            _resnet_diffusers(b, f"up_blocks.{n}.resnets.{j}", ch + chans.pop(), mc * mult, emb, c.video)
            ch = mc * mult
            if attn[level]:
                _transformer(
                    b,
                    f"up_blocks.{n}.attentions.{j}",
                    ch,
                    c.transformer_depth[level],
                    c.context_dim,
                    lin,
                    c.video,
                    "diffusers",
                )
        if level:
            b.conv(f"up_blocks.{n}.upsamplers.0.conv", ch, ch)
    b.norm("conv_norm_out", mc)
    b.conv("conv_out", c.out_channels, mc)


def _controlnet_diffusers_extras(b: Builder, c: UNetConfig, chans: list[int]) -> None:
    """diffusers ControlNetModel (models/controlnets/controlnet.py): controlnet_cond_embedding conv_in /
    blocks.N / conv_out (the hint encoder above, with the same channel steps), one controlnet_down_blocks.N
    1x1 conv per down-block output, controlnet_mid_block."""
    steps = [16, 32, 96, 256]
    b.conv("controlnet_cond_embedding.conv_in", steps[0], 3)
    n = 0
    for cin, cout in zip(steps[:-1], steps[1:], strict=True):
        b.conv(f"controlnet_cond_embedding.blocks.{n}", cin, cin)
        b.conv(f"controlnet_cond_embedding.blocks.{n + 1}", cout, cin)
        n += 2
    b.conv("controlnet_cond_embedding.conv_out", c.model_channels, steps[-1])
    for i, ch in enumerate(chans):
        b.conv(f"controlnet_down_blocks.{i}", ch, ch, k=1)
    ch = c.model_channels * c.channel_mult[-1]
    b.conv("controlnet_mid_block", ch, ch, k=1)
