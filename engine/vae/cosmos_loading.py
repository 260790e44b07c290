"""Loading Cosmos 1.0's continuous video tokenizer (engine.vae.cosmos): NVIDIA's names renamed onto diffusers', the
config read from the shapes, strict loading.

NVIDIA's names (the JIT tokenizer's state dict; diffusers' `scripts/convert_cosmos_to_diffusers.py` VAE_KEYS_RENAME_DICT
maps them, ComfyUI's repackaged file keeps them): `{encoder,decoder}.conv_in.0.conv3d` / `.1.conv3d` (the factorized
conv's spatial and temporal halves), `down.N` / `up.N` levels (`up.0` the full-resolution one: the last up block) of
`block.M` resnets (`norm1.norm`, `conv1.0.conv3d`, `nin_shortcut.conv3d`), `attn.M.0` / `attn.M.1` (the attention
over pixels and the one over frames; `q.conv3d`, `k`, `v`, `proj_out`, `norm.norm`), `downsample.convK.conv3d` /
`upsample.convK.conv3d`, `mid.block_1` / `attn_1.0` / `attn_1.1` / `block_2`, `norm_out.norm`, `quant_conv.conv3d`,
`post_quant_conv.conv3d`; buffers `patcher3d.wavelets` / `unpatcher3d.wavelets` (the patching's filter: haar's
1/sqrt(2) taps or rearrange's ones), `_arange`, `patch_size_buffer`, which no computation here reads as weights.
ComfyUI's file adds `latent_mean` / `latent_std` (16 channels x 16 latent frames), which its VAE applies around the
network (comfy/ldm/cosmos/vae.py; tdrussell's diffusion-pipe loads that file into a model with the same two
parameters): kept as the model's `latent_stats`, applied as ComfyUI applies them (engine.vae.cosmos `normalise`).
"""

from __future__ import annotations

import math
import re

import torch

from ..errors import FormatError, UnsupportedModel
from .cosmos import GROUPS, METHODS, CosmosConfig, CosmosVAE

BUFFERS = ("wavelets", "_arange", "patch_size_buffer")
STATS = ("latent_mean", "latent_std")  # ComfyUI's repackaged file: 16 channels x 16 latent frames each
_ATTN = {"q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0", "norm": "norm"}


def is_cosmos(sd) -> bool:
    """The tokenizer's decoder in either naming: its factorized input conv (`conv_in.conv_s` / `conv_in.0.conv3d`) beside
    a middle block whose second attention runs over frames."""
    return (
        "decoder.conv_in.conv_s.weight" in sd and "decoder.mid_block.temp_attentions.0.to_q.weight" in sd
    ) or ("decoder.conv_in.0.conv3d.weight" in sd and "decoder.mid.attn_1.1.q.conv3d.weight" in sd)


def is_original(sd) -> bool:
    return "decoder.conv_in.0.conv3d.weight" in sd


def _inner(rest: str) -> str:
    """A module's own names: factorized convs' halves, the resamplers' and shortcuts' convs, the attentions'."""
    rest = re.sub(r"\b(conv_in|conv_out|conv1|conv2)\.0\.conv3d\.", r"\1.conv_s.", rest)
    rest = re.sub(r"\b(conv_in|conv_out|conv1|conv2)\.1\.conv3d\.", r"\1.conv_t.", rest)
    rest = re.sub(
        r"\b(conv1|conv2|conv3|nin_shortcut|quant_conv|post_quant_conv|q|k|v|proj_out)\.conv3d\.",
        r"\1.",
        rest,
    )
    rest = rest.replace("nin_shortcut.", "conv_shortcut.")
    m = re.match(r"(q|k|v|proj_out)\.(.*)$", rest)
    return f"{_ATTN[m[1]]}.{m[2]}" if m else rest


def _attn(i: str, j: str, rest: str) -> str:
    return f"{'attentions' if j == '0' else 'temp_attentions'}.{i}.{_inner(rest)}"


def original_to_diffusers(sd: dict) -> dict:
    """NVIDIA's names -> diffusers'; keys no rule knows stay as they are (the strict load names them)."""
    ups = {int(m[1]) for k in sd if (m := re.match(r"decoder\.up\.(\d+)\.", k))}
    last = max(ups) if ups else 0
    out = {}
    for k, v in sd.items():
        side, _, rest = k.partition(".")
        new = k
        if m := re.match(r"(down|up)\.(\d+)\.(block|attn)\.(\d+)\.(.*)$", rest):
            level = int(m[2]) if m[1] == "down" else last - int(m[2])
            kind = "down_blocks" if m[1] == "down" else "up_blocks"
            if m[3] == "block":
                tail = f"resnets.{m[4]}.{_inner(m[5])}"
            else:
                j, _, inner = m[5].partition(".")
                tail = _attn(m[4], j, inner)
            new = f"{side}.{kind}.{level}.{tail}"
        elif m := re.match(r"(down|up)\.(\d+)\.(downsample|upsample)\.(.*)$", rest):
            level = int(m[2]) if m[1] == "down" else last - int(m[2])
            kind = "down_blocks" if m[1] == "down" else "up_blocks"
            new = f"{side}.{kind}.{level}.{m[3]}rs.0.{_inner(m[4])}"
        elif m := re.match(r"mid\.block_(\d)\.(.*)$", rest):
            new = f"{side}.mid_block.resnets.{int(m[1]) - 1}.{_inner(m[2])}"
        elif m := re.match(r"mid\.attn_1\.(\d)\.(.*)$", rest):
            new = f"{side}.mid_block.{_attn('0', m[1], m[2])}"
        elif side in ("encoder", "decoder"):
            new = f"{side}.{_inner(rest)}"
        else:
            new = _inner(k)
        out[new] = v
    return out


def _count(sd, pattern: str) -> int:
    got = {int(m[1]) for k in sd if (m := re.match(pattern, k))}
    return max(got) + 1 if got else 0


def _shape(sd, key: str, path: str) -> tuple[int, ...]:
    if key not in sd:
        raise FormatError(f"{path}: a Cosmos tokenizer without {key}", path=path)
    return tuple(sd[key].shape)


def patch_of(sd, side: str, channels: int, path: str) -> int:
    """p from a factorized conv's image-side channels (3 p^3)."""
    cube, rem = divmod(channels, 3)
    p = round(cube ** (1 / 3)) if cube > 0 else 0
    if rem or p < 1 or p**3 != cube or p & (p - 1):
        raise FormatError(f"{path}: the {side}'s image-side conv has {channels} channels, not 3 x p^3 for a power-of-two "
                          "patch p", path=path)  # fmt: skip
    return p


def method_of(buffers: dict, path: str) -> str:
    """The patching method from a wavelet buffer the file keeps (haar's taps 1/sqrt(2), rearrange's 1), else from
    diffusers' `config.json` beside the weights (`patch_type`), else haar (the continuous tokenizers' config, and
    diffusers' default)."""
    for k, v in buffers.items():
        if k.endswith("wavelets") and v.numel() == 2 and v.device.type != "meta":
            tap = float(v.float()[0])
            if math.isclose(tap, 2**-0.5, rel_tol=1e-3):
                return "haar"
            if math.isclose(tap, 1.0, rel_tol=1e-3):
                return "rearrange"
            raise UnsupportedModel(
                f"{path}: {k} = {v.tolist()}: a patching filter Loadout does not know", path=path
            )
    cfg = _diffusers_config(path)
    if cfg is not None and cfg.get("patch_type") in METHODS:
        return cfg["patch_type"]
    return "haar"


def _diffusers_config(path: str) -> dict | None:
    """diffusers' `config.json` of an AutoencoderKLCosmos beside the weights (a `vae/` folder), or None."""
    import json
    import os

    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), "config.json"), encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError):
        return None
    return out if isinstance(out, dict) and out.get("_class_name") == "AutoencoderKLCosmos" else None


def read_blocks(sd: dict, blocks: str, resampler: str, path: str) -> tuple[list, list, list, list, list]:
    """Per block of `blocks` (`decoder.up_blocks`, `encoder.down_blocks`): its output width, its resnets, whether its
    resampler has `conv1` and `conv2` (the decoder's time and space ups; the encoder's space and time downs), and
    whether it attends."""
    widths, layers, conv1, conv2, attn = [], [], [], [], []
    for i in range(_count(sd, re.escape(blocks) + r"\.(\d+)\.")):
        base = f"{blocks}.{i}."
        widths.append(_shape(sd, base + "resnets.0.conv1.conv_s.weight", path)[0])
        layers.append(_count(sd, re.escape(base) + r"resnets\.(\d+)\."))
        conv1.append(f"{base}{resampler}.0.conv1.weight" in sd)
        conv2.append(f"{base}{resampler}.0.conv2.weight" in sd)
        attn.append(base + "attentions.0.to_q.weight" in sd)
    return widths, layers, conv1, conv2, attn


def cosmos_config(sd: dict, path: str, method: str = "haar") -> CosmosConfig:
    """The decoder's config from its (diffusers-named) shapes; the encoder's where the file holds it."""
    mid, z = _shape(sd, "decoder.conv_in.conv_s.weight", path)[:2]
    widths, layers, time, space, attn = read_blocks(sd, "decoder.up_blocks", "upsamplers", path)
    if not widths:
        raise FormatError(f"{path}: a Cosmos tokenizer decoder without up blocks", path=path)
    out = _shape(sd, "decoder.conv_out.conv_t.weight", path)[0]
    p = patch_of(sd, "decoder", out, path)
    bad = [c for c in (mid, *widths) if c % GROUPS]
    if bad:
        raise UnsupportedModel(f"{path}: widths {bad} for {GROUPS}-group norms", path=path)
    enc = None
    if any(k.startswith("encoder.") for k in sd):
        from .cosmos_encoder import encoder_config

        enc = encoder_config(sd, path, p)
    return CosmosConfig(z, mid, tuple(widths), tuple(layers), tuple(time), tuple(space), tuple(attn), p, method,
                        3, enc)  # fmt: skip


def build(sd: dict, path: str, strict_load, made) -> CosmosVAE:
    """The tokenizer in either naming -- its decoder, and its encoder where the file holds one -- loaded strictly with
    engine.vae.loading's `strict_load`, built through its `made`."""
    buffers = {k: sd[k] for k in sd if k.rsplit(".", 1)[-1] in BUFFERS}
    stats = {k: sd[k] for k in STATS if k in sd}
    sd = {k: v for k, v in sd.items() if k not in buffers and k not in stats}
    if is_original(sd):
        sd = original_to_diffusers(sd)
    cfg = cosmos_config(sd, path, method_of(buffers, path))
    if cfg.encoder is None:
        sd = {k: v for k, v in sd.items() if not k.startswith("quant_conv.")}
    with torch.device("meta"):
        model = made(path, lambda: CosmosVAE(cfg))
    strict_load(model, sd, path)
    model.source = path
    model.notes = []  # engine.vae.run adds them to the decode's notes
    if stats:
        model.latent_stats = _stats(stats, cfg.z, path)
        model.notes.append(
            "the file holds its latent statistics (ComfyUI's Cosmos VAE): latents are read and written normalised, "
            "(z - mean) / std * 0.5 per channel and latent frame, as ComfyUI's VAE does with this file"
        )
    return model


def _stats(stats: dict, z: int, path: str) -> tuple[torch.Tensor, torch.Tensor]:
    if len(stats) != 2:
        raise FormatError(f"{path}: {next(iter(stats))} without its pair ({' and '.join(STATS)})", path=path)
    mean, std = (stats[k].float().reshape(-1) for k in STATS)
    if mean.numel() != std.numel() or mean.numel() % z or not mean.numel():
        raise FormatError(f"{path}: latent_mean / latent_std of {mean.numel()} / {std.numel()} values: not {z} channels "
                          "x a number of latent frames each", path=path)  # fmt: skip
    return mean.view(z, -1).clone(), std.view(z, -1).clone()
