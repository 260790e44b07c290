"""A DC-AE's config read off its file (diffusers `AutoencoderDC` naming: `decoder.up_blocks.{stage}.{i}`,
`encoder.down_blocks.{stage}.{i}`), and the model built and loaded strictly.

What the weights show: the stages and their widths, each block's kind (a ResBlock's `conv1`, an
EfficientViTBlock's `attn`), the blocks per stage, the up block's kind (its conv's outputs: the stage's
width when it interpolates, 4x when it pixel-shuffles) and the down block's (the next width for a stride-2
conv, a quarter for a pixel unshuffle), the latent channels, GLUMBConv's expansion, the multi-scale
kernels and the attention's head dim (the multi-scale 1x1 conv is grouped by 3 x heads: its weight's
second axis is head_dim). What they do not show comes from diffusers' AutoencoderDC defaults, which the
released configs keep (`get_ae_config` in diffusers' `scripts/convert_dcae_to_diffusers.py`): the norms'
eps 1e-5, SiLU in the blocks, ReLU before conv_out, nearest interpolation, the in/out shortcuts, and
head_dim 32 where no multi-scale branch shows it. The ImageNet "in" / "mix" releases (BatchNorm and ReLU
ResBlocks in the decoder, no first-stage blocks) are refused by name.
"""

from __future__ import annotations

import re

import torch

from ..errors import FormatError, UnsupportedModel
from .dc_ae import AutoencoderDC, DCConfig, Half


def is_dc_ae(sd) -> bool:
    """A DC-AE in diffusers' naming: its decoder's `up_blocks` end in a `norm_out` with no mid block, or
    an encoder of `down_blocks` with EfficientViT (`attn.to_qkv_multiscale` / `conv_out.conv_inverted`)."""
    keys = list(sd)
    if any(".mid_block." in k or ".mid." in k for k in keys):
        return False
    dec = "decoder.norm_out.weight" in sd and any(k.startswith("decoder.up_blocks.") for k in keys)
    enc = any(re.match(r"encoder\.down_blocks\.\d+\.\d+\.(attn\.to_q|conv1)\.weight$", k) for k in keys) and (
        "encoder.conv_out.weight" in sd
        and not any(k.startswith("encoder.down_blocks.0.resnets.") for k in keys)
    )
    return dec or enc


def _shape(sd, key: str, path: str) -> tuple[int, ...]:
    if key not in sd:
        raise FormatError(f"{path}: incomplete DC-AE, tensor {key} is missing", path=path)
    return tuple(sd[key].shape)


def _half(sd, side: str, blocks: str, path: str) -> tuple[Half, dict]:
    """The stages of the encoder or decoder, and what its resampling blocks' shapes show."""
    rx = re.compile(rf"{side}\.{blocks}\.(\d+)\.(\d+)\.(conv1|attn|conv)\.")
    found: dict[int, dict[int, str]] = {}
    for k in sd:
        m = rx.match(k)
        if m:
            found.setdefault(int(m.group(1)), {})[int(m.group(2))] = m.group(3)
    if not found:
        raise FormatError(f"{path}: a DC-AE {side} without {side}.{blocks}.*", path=path)
    n = max(found) + 1
    widths, layers, kinds, scales = [], [], [], []
    resample: dict = {"head_dim": None, "expand": None}
    for i in range(n):
        entries = found.get(i, {})
        blocks_ = [j for j, what in sorted(entries.items()) if what != "conv"]
        if not blocks_:
            raise UnsupportedModel(
                f"{path}: a DC-AE whose {side} stage {i} has no blocks (the ImageNet 'in' / 'mix' releases' "
                "layout): Loadout decodes the f32c32 Sana / PRX DC-AE, not this variant yet",
                path=path,
            )
        kind = {entries[j] for j in blocks_}
        if len(kind) != 1:
            raise UnsupportedModel(f"{path}: a DC-AE {side} stage {i} mixing block kinds", path=path)
        p = f"{side}.{blocks}.{i}.{blocks_[0]}."
        if "conv1" in kind:
            widths.append(_shape(sd, p + "conv1.weight", path)[0])
            kinds.append("res")
            scales.append(())
        else:
            c = _shape(sd, p + "attn.to_q.weight", path)[1]
            widths.append(c)
            kinds.append("vit")
            ks = []
            while f"{p}attn.to_qkv_multiscale.{len(ks)}.proj_in.weight" in sd:
                ks.append(sd[f"{p}attn.to_qkv_multiscale.{len(ks)}.proj_in.weight"].shape[-1])
                resample["head_dim"] = _shape(sd, f"{p}attn.to_qkv_multiscale.0.proj_out.weight", path)[1]
            scales.append(tuple(ks))
            resample["expand"] = _shape(sd, p + "conv_out.conv_inverted.weight", path)[0] // (2 * c)
        layers.append(len(blocks_))
        if blocks_ != list(range(blocks_[0], blocks_[0] + len(blocks_))):
            raise FormatError(f"{path}: DC-AE {side} stage {i} has gaps in its blocks ({blocks_})", path=path)
        if any(k.startswith(f"{side}.{blocks}.{i}.") and k.endswith("running_mean") for k in sd):
            raise UnsupportedModel(
                f"{path}: a DC-AE with BatchNorm blocks (the ImageNet 'in' / 'mix' releases): Loadout decodes the "
                "f32c32 Sana / PRX DC-AE, not this variant yet",
                path=path,
            )
    return Half(tuple(widths), tuple(layers), tuple(kinds), tuple(scales)), resample


def dc_config(sd: dict[str, torch.Tensor], path: str) -> DCConfig:
    has_dec = any(k.startswith("decoder.") for k in sd)
    has_enc = any(k.startswith("encoder.") for k in sd)
    dec = enc = None
    head_dim, expand, up_interp, down_conv = None, None, True, True
    in_ch, latent = 3, None
    if has_dec:
        if "decoder.conv_out.conv.weight" in sd:  # an up block as conv_out: no first-stage blocks
            raise UnsupportedModel(
                f"{path}: a DC-AE whose decoder ends in an up block (the ImageNet 'in' / 'mix' releases): "
                "Loadout decodes the f32c32 Sana / PRX DC-AE, not this variant yet",
                path=path,
            )
        dec, r = _half(sd, "decoder", "up_blocks", path)
        head_dim, expand = r["head_dim"], r["expand"]
        latent = _shape(sd, "decoder.conv_in.weight", path)[1]
        in_ch = _shape(sd, "decoder.conv_out.weight", path)[0]
        if len(dec.widths) > 1:
            up = _shape(sd, "decoder.up_blocks.0.0.conv.weight", path)[0]
            if up not in (dec.widths[0], 4 * dec.widths[0]):
                raise FormatError(f"{path}: decoder.up_blocks.0.0.conv.weight has {up} outputs for a stage "
                                  f"{dec.widths[0]} wide", path=path)  # fmt: skip
            up_interp = up == dec.widths[0]
    if has_enc:
        enc, r = _half(sd, "encoder", "down_blocks", path)
        head_dim, expand = head_dim or r["head_dim"], expand or r["expand"]
        latent = latent or _shape(sd, "encoder.conv_out.weight", path)[0]
        in_ch = _shape(sd, "encoder.conv_in.weight", path)[1]
        if len(enc.widths) > 1:
            down = _shape(sd, f"encoder.down_blocks.0.{enc.layers[0]}.conv.weight", path)[0]
            down_conv = down == enc.widths[1]
    if dec is None and enc is None:
        raise FormatError(f"{path}: no encoder.* or decoder.* tensors — not a VAE", path=path)
    return DCConfig(latent, dec, enc, head_dim or 32, up_interp, down_conv, in_ch, expand or 4)


def build(sd: dict[str, torch.Tensor], path: str, strict_load, made) -> AutoencoderDC:
    """The DC-AE of `sd` (its own tensors, diffusers naming), loaded strictly."""
    cfg = dc_config(sd, path)
    with torch.device("meta"):
        model = made(path, lambda: AutoencoderDC(cfg))
    strict_load(model, sd, path)
    model.source = path
    return model
