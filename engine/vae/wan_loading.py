"""A Wan-family VAE from its tensors: diffusers' names (AutoencoderKLWan / AutoencoderKLQwenImage) renamed
onto the original codebase's (what ComfyUI's repackaged `wan_2.1_vae`, `wan2.2_vae` and `qwen_image_vae`
files use), the configuration read from the shapes, then a strict load.

Name facts: Wan-Video/Wan2.1 `wan/modules/vae.py` and Wan2.2 `vae2_2.py` (module paths), diffusers'
`convert_wan_vae_to_diffusers` and the AutoencoderKLWan classes (the other naming): conv_in/conv_out ->
conv1/head.2, norm_out -> head.0, mid_block.{resnets.0, attentions.0, resnets.1} -> middle.{0, 1, 2},
resnet {norm1, conv1, norm2, conv2, conv_shortcut} -> residual.{0, 2, 3, 6}, shortcut; quant_conv /
post_quant_conv -> conv1 / conv2; Wan 2.1's decoder levels are flattened (3 resnets then the upsampler
per level), Wan 2.2's stay nested (`upsamples.I.upsamples.J`, the resampler last).
"""

from __future__ import annotations

import re

import torch

from ..errors import FormatError
from .wan import WanConfig

_RESNET = {"norm1.gamma": "residual.0.gamma", "conv1.": "residual.2.", "norm2.gamma": "residual.3.gamma",
           "conv2.": "residual.6.", "conv_shortcut.": "shortcut."}  # fmt: skip
_TOP = {"conv_in.": "conv1.", "conv_out.": "head.2.", "norm_out.gamma": "head.0.gamma"}


def is_wan_vae(keys) -> bool:
    """A Wan-style VAE: RMS-norm `gamma`s in its (original or diffusers) middle block."""
    return any(
        k.endswith(("decoder.middle.0.residual.0.gamma", "decoder.mid_block.resnets.0.norm1.gamma",
                    "encoder.middle.0.residual.0.gamma", "encoder.mid_block.resnets.0.norm1.gamma"))
        for k in keys
    )  # fmt: skip


def is_diffusers(keys) -> bool:
    return any(".mid_block." in k or ".up_blocks." in k or ".down_blocks." in k for k in keys)


def _resnet(rest: str) -> str:
    for a, b in _RESNET.items():
        if rest.startswith(a):
            return b + rest[len(a) :]
    return rest


def diffusers_to_original(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename diffusers' keys to the original layout; keys no rule knows stay as they are (the strict
    load names them)."""
    keys = list(sd)
    nested = any(re.search(r"\.(up|down)sampler\.", k) for k in keys)  # Wan 2.2's blocks
    # resnets and resamplers per decoder level, to flatten Wan 2.1's levels in order
    counts: dict[int, int] = {}
    has_up: set[int] = set()
    for k in keys:
        if m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.", k):
            counts[int(m[1])] = max(counts.get(int(m[1]), 0), int(m[2]) + 1)
        if m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers?\.", k):
            has_up.add(int(m[1]))
    base, n = {}, 0
    for i in sorted(counts):
        base[i] = n
        n += counts[i] + (i in has_up)
    enc_counts: dict[int, int] = {}
    for k in keys:
        if m := re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.", k):
            enc_counts[int(m[1])] = max(enc_counts.get(int(m[1]), 0), int(m[2]) + 1)

    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        new = k
        if k.startswith("quant_conv."):
            new = "conv1." + k[len("quant_conv.") :]
        elif k.startswith("post_quant_conv."):
            new = "conv2." + k[len("post_quant_conv.") :]
        elif m := re.match(r"(encoder|decoder)\.(conv_in\.|conv_out\.|norm_out\.gamma)(.*)$", k):
            new = f"{m[1]}.{_TOP[m[2]]}{m[3]}"
        elif m := re.match(r"(encoder|decoder)\.mid_block\.(resnets|attentions)\.(\d+)\.(.*)$", k):
            slot = 1 if m[2] == "attentions" else 2 * int(m[3])
            rest = m[4] if m[2] == "attentions" else _resnet(m[4])
            new = f"{m[1]}.middle.{slot}.{rest}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$", k):
            i, j = int(m[1]), int(m[2])
            where = f"upsamples.{i}.upsamples.{j}" if nested else f"upsamples.{base[i] + j}"
            new = f"decoder.{where}.{_resnet(m[3])}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.(?:upsampler|upsamplers\.0)\.(.*)$", k):
            i = int(m[1])
            where = f"upsamples.{i}.upsamples.{counts[i]}" if nested else f"upsamples.{base[i] + counts[i]}"
            new = f"decoder.{where}.{m[2]}"
        elif nested and (m := re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$", k)):
            new = f"encoder.downsamples.{m[1]}.downsamples.{m[2]}.{_resnet(m[3])}"
        elif nested and (m := re.match(r"encoder\.down_blocks\.(\d+)\.downsampler\.(.*)$", k)):
            new = f"encoder.downsamples.{m[1]}.downsamples.{enc_counts.get(int(m[1]), 0)}.{m[2]}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.(.*)$", k):
            rest = m[2] if m[2].startswith(("resample.", "time_conv.")) else _resnet(m[2])
            new = f"encoder.downsamples.{m[1]}.{rest}"
        out[new] = v
    return out


def _frame(sd) -> bool:
    """Qwen-Image 2.1's 2-D variant: its convolutions' weights are 4-D (engine.vae.qwen_image21)."""
    t = sd.get("decoder.conv1.weight", sd.get("encoder.conv1.weight"))
    return t is not None and t.dim() == 4


def _shape(sd, key: str, path: str) -> tuple[int, ...]:
    """The shape of one of the causal 3-D convolutions the configuration is read from (every key asked
    for here is one: [out, in, t, h, w]; [out, in, h, w] throughout a 2-D file)."""
    t = sd.get(key)
    if t is None:
        raise FormatError(f"{path}: incomplete Wan VAE, tensor {key} is missing", path=path)
    if t.dim() != (4 if _frame(sd) else 5):
        raise FormatError(
            f"{path}: {key} has shape {list(t.shape)}; a Wan VAE's convolutions are 3-D "
            "([out, in, t, h, w]): a damaged or edited file?",
            path=path,
        )
    return tuple(t.shape)


def _levels(sd, side: str, nested: bool) -> list[tuple[list[str], str | None]]:
    """Each level of encoder.downsamples / decoder.upsamples as (resnet prefixes, resample prefix)."""
    name = "downsamples" if side == "encoder" else "upsamples"
    if nested:
        idx = sorted({int(m[1]) for k in sd if (m := re.match(rf"{side}\.{name}\.(\d+)\.{name}\.", k))})
        levels = []
        for i in idx:
            inner = sorted(
                {int(m[1]) for k in sd if (m := re.match(rf"{side}\.{name}\.{i}\.{name}\.(\d+)\.", k))}
            )
            pre = [f"{side}.{name}.{i}.{name}.{j}." for j in inner]
            res = [p for p in pre if f"{p}residual.0.gamma" in sd]
            rs = [p for p in pre if f"{p}resample.1.weight" in sd]
            levels.append((res, rs[0] if rs else None))
        return levels
    idx = sorted({int(m[1]) for k in sd if (m := re.match(rf"{side}\.{name}\.(\d+)\.", k))})
    levels, cur = [], []
    for i in idx:
        p = f"{side}.{name}.{i}."
        if f"{p}resample.1.weight" in sd:
            levels.append((cur, p))
            cur = []
        else:
            cur.append(p)
    if cur:
        levels.append((cur, None))
    return levels


def _side(sd, side: str, nested: bool, path: str) -> tuple[tuple[int, ...], tuple[bool, ...], int]:
    """One side's widths (conv1's, then each level's), which of its resamples are temporal, and the
    residual blocks of its first level."""
    levels = _levels(sd, side, nested)
    if not levels or not levels[0][0]:
        raise FormatError(f"{path}: a Wan VAE {side} without residual blocks", path=path)
    dims = (_shape(sd, f"{side}.conv1.weight", path)[0],) + tuple(
        _shape(sd, f"{res[0]}residual.2.weight", path)[0] for res, _ in levels
    )
    temporal = tuple(f"{rs}time_conv.weight" in sd for _, rs in levels if rs is not None)
    return dims, temporal, len(levels[0][0])


def wan_config(sd: dict[str, torch.Tensor], path: str) -> WanConfig:
    """The configuration the (original-named) tensors describe; a FormatError names what is missing."""
    has_enc = "encoder.conv1.weight" in sd
    has_dec = "decoder.conv1.weight" in sd
    if not (has_enc or has_dec):
        raise FormatError(f"{path}: a Wan-style VAE without encoder.conv1 or decoder.conv1", path=path)
    nested = any(
        re.match(r"(encoder\.downsamples|decoder\.upsamples)\.\d+\.(down|up)samples\.", k) for k in sd
    )
    z = enc_dims = dec_dims = None
    temporal: tuple[bool, ...] = ()
    nres = 2
    image = 3
    if has_dec:
        dec_dims, temporal, blocks = _side(sd, "decoder", nested, path)
        z = _shape(sd, "decoder.conv1.weight", path)[1]
        nres = blocks - 1
        image = _shape(sd, "decoder.head.2.weight", path)[0]
    if has_enc:
        enc_dims, enc_t, blocks = _side(sd, "encoder", nested, path)
        if not has_dec:
            z = _shape(sd, "encoder.head.2.weight", path)[0] // 2
            temporal = enc_t[::-1]
            nres = blocks
            image = _shape(sd, "encoder.conv1.weight", path)[1]
            # without a decoder its widths mirror the encoder's (the estimate's view only)
            dec_dims = (enc_dims[-1],) + tuple(reversed(enc_dims[1:]))
    frame = _frame(sd)
    patch = 2 if nested and not frame else 1  # Wan 2.2 works on 2x2-patchified pixels, Qwen-Image 2.1 not
    return WanConfig(
        z=z,
        enc_dims=enc_dims or (),
        dec_dims=dec_dims,
        temporal=temporal,
        num_res_blocks=nres,
        residual=nested,
        patch=patch,
        image_channels=image // (patch * patch),
        has_encoder=has_enc,
        has_decoder=has_dec,
        frame=frame,
    )
