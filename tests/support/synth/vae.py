"""AutoencoderKL key layouts (LDM and diffusers namings), built from the autoencoder's ddconfig.

LDM structure (CompVis/stable-diffusion `ldm/modules/diffusionmodules/model.py` Encoder/Decoder):
encoder conv_in (3 -> ch); down.i.block.j ResnetBlocks (norm1, conv1, norm2, conv2, nin_shortcut
1x1 when channels change) and down.i.downsample.conv except at the last level; mid.block_1,
mid.attn_1 (norm, q, k, v, proj_out as 1x1 convs), mid.block_2; norm_out; conv_out to 2*z
(double_z). Decoder: conv_in (z -> ch*mult[-1]), mid, up.i.block.j with num_res_blocks+1 blocks and
up.i.upsample.conv for i > 0, norm_out, conv_out (-> 3). quant_conv (2z -> 2z) and post_quant_conv
(z -> z) are 1x1 convs present for SD/SDXL and absent for SD3/Flux (diffusers AutoencoderKL
use_quant_conv / use_post_quant_conv False in the SD3 and FLUX.1 vae/config.json).
Diffusers naming (diffusers `models/autoencoders/vae.py`): conv_in, down_blocks.i.resnets.j
(norm1, conv1, norm2, conv2, conv_shortcut), down_blocks.i.downsamplers.0.conv, mid_block.resnets.{0,1},
mid_block.attentions.0.{group_norm, to_q, to_k, to_v, to_out.0} as Linear layers, conv_norm_out,
conv_out; the decoder's up_blocks are in reverse order of the LDM `up` list.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._build import Builder


@dataclass(frozen=True)
class VAEConfig:
    z_channels: int = 4
    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    num_res_blocks: int = 2
    in_channels: int = 3
    out_ch: int = 3
    quant_conv: bool = True
    batchnorm: int = 0  # FLUX.2: BatchNorm2d statistics over the 2x2-patchified latent (no affine)


# v1-inference.yaml first_stage_config: embed_dim 4, z_channels 4, ch 128, ch_mult [1, 2, 4, 4],
# num_res_blocks 2 -- shared by SD1, SD2 and SDXL (sd_xl_base.yaml first_stage_config).
SD = VAEConfig()
# SD3 / FLUX.1 vae/config.json (diffusers): latent_channels 16, no quant convs, same ch/ch_mult.
SD3 = VAEConfig(z_channels=16, quant_conv=False)
FLUX1 = SD3
# FLUX.2 (diffusers AutoencoderKLFlux2 defaults / black-forest-labs/FLUX.2-dev vae/config.json): 32 latent
# channels, quant convs kept, and a BatchNorm2d over 4*32 = 128 patchified channels (running stats only).
FLUX2 = VAEConfig(z_channels=32, batchnorm=128)


def _res(b: Builder, key: str, cin: int, cout: int, shortcut: str) -> None:
    b.norm(f"{key}.norm1", cin)
    b.conv(f"{key}.conv1", cout, cin)
    b.norm(f"{key}.norm2", cout)
    b.conv(f"{key}.conv2", cout, cout)
    if cin != cout:
        b.conv(f"{key}.{shortcut}", cout, cin, k=1)


def vae_ldm(b: Builder, c: VAEConfig) -> None:
    """LDM naming: encoder.*, decoder.*, quant_conv, post_quant_conv."""
    top = c.ch * c.ch_mult[-1]
    e = b.sub("encoder.")
    e.conv("conv_in", c.ch, c.in_channels)
    cin = c.ch
    for i, m in enumerate(c.ch_mult):
        for j in range(c.num_res_blocks):
            _res(e, f"down.{i}.block.{j}", cin, c.ch * m, "nin_shortcut")
            cin = c.ch * m
        if i != len(c.ch_mult) - 1:
            e.conv(f"down.{i}.downsample.conv", cin, cin)
    _mid_ldm(e, top)
    e.norm("norm_out", top)
    e.conv("conv_out", 2 * c.z_channels, top)
    d = b.sub("decoder.")
    d.conv("conv_in", top, c.z_channels)
    _mid_ldm(d, top)
    cin = top
    for i in reversed(range(len(c.ch_mult))):
        cout = c.ch * c.ch_mult[i]
        for j in range(c.num_res_blocks + 1):
            _res(d, f"up.{i}.block.{j}", cin, cout, "nin_shortcut")
            cin = cout
        if i != 0:
            d.conv(f"up.{i}.upsample.conv", cout, cout)
    d.norm("norm_out", c.ch)
    d.conv("conv_out", c.out_ch, c.ch)
    if c.quant_conv:
        b.conv("quant_conv", 2 * c.z_channels, 2 * c.z_channels, k=1)
        b.conv("post_quant_conv", c.z_channels, c.z_channels, k=1)


def _mid_ldm(b: Builder, ch: int) -> None:
    _res(b, "mid.block_1", ch, ch, "nin_shortcut")
    b.norm("mid.attn_1.norm", ch)
    for k in ("q", "k", "v", "proj_out"):
        b.conv(f"mid.attn_1.{k}", ch, ch, k=1)
    _res(b, "mid.block_2", ch, ch, "nin_shortcut")


def _mid_diffusers(b: Builder, ch: int) -> None:
    _res(b, "mid_block.resnets.0", ch, ch, "conv_shortcut")
    b.norm("mid_block.attentions.0.group_norm", ch)
    for k in ("to_q", "to_k", "to_v", "to_out.0"):
        b.linear(f"mid_block.attentions.0.{k}", ch, ch)
    _res(b, "mid_block.resnets.1", ch, ch, "conv_shortcut")


def vae_diffusers(b: Builder, c: VAEConfig) -> None:
    """Diffusers AutoencoderKL naming (vae/diffusion_pytorch_model.safetensors)."""
    top = c.ch * c.ch_mult[-1]
    e = b.sub("encoder.")
    e.conv("conv_in", c.ch, c.in_channels)
    cin = c.ch
    for i, m in enumerate(c.ch_mult):
        for j in range(c.num_res_blocks):
            _res(e, f"down_blocks.{i}.resnets.{j}", cin, c.ch * m, "conv_shortcut")
            cin = c.ch * m
        if i != len(c.ch_mult) - 1:
            e.conv(f"down_blocks.{i}.downsamplers.0.conv", cin, cin)
    _mid_diffusers(e, top)
    e.norm("conv_norm_out", top)
    e.conv("conv_out", 2 * c.z_channels, top)
    d = b.sub("decoder.")
    d.conv("conv_in", top, c.z_channels)
    _mid_diffusers(d, top)
    cin = top
    for n, i in enumerate(reversed(range(len(c.ch_mult)))):
        cout = c.ch * c.ch_mult[i]
        for j in range(c.num_res_blocks + 1):
            _res(d, f"up_blocks.{n}.resnets.{j}", cin, cout, "conv_shortcut")
            cin = cout
        if i != 0:
            d.conv(f"up_blocks.{n}.upsamplers.0.conv", cout, cout)
    d.norm("conv_norm_out", c.ch)
    d.conv("conv_out", c.out_ch, c.ch)
    if c.quant_conv:
        b.conv("quant_conv", 2 * c.z_channels, 2 * c.z_channels, k=1)
        b.conv("post_quant_conv", c.z_channels, c.z_channels, k=1)
    if c.batchnorm:
        b.t("bn.running_mean", (c.batchnorm,))
        b.t("bn.running_var", (c.batchnorm,))
        b.t("bn.num_batches_tracked", (), dtype="I64")
