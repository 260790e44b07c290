"""Load a VAE from a file: an SD checkpoint (`first_stage_model.` prefix), an all-in-one file (`vae.`),
a standalone VAE in LDM or diffusers naming, a Wan-family video VAE (Wan 2.1 / 2.2, Qwen-Image; original
or diffusers naming), LTX-Video's or LTX-2's video VAE (its decoder: engine.vae.ltx_loading), the Mochi 1
VAE's decoder (engine.vae.mochi), Cosmos 1.0's tokenizer (engine.vae.cosmos_loading), a DC-AE (Sana's, PRX's: engine.vae.dc_ae_loading), or a TAESD-family encoder/decoder (.pth or .safetensors).

Loading is strict: every tensor of the VAE component is used, none is missing, every shape matches —
anything else is a FormatError naming the keys, never a silently half-initialised model. Weights stay
where the file put them (zero-copy mmap views, in the file's dtype); the castable ops cast per forward.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch
from torch import nn

from ..detect.parts import not_kl_decoder
from ..errors import FormatError, UnsupportedModel
from . import (
    cosmos_loading,
    dc_ae_loading,
    hunyuan_image,
    hunyuan_video,
    kandinsky6_sr,
    ltx_loading,
    minimax_h3,
    mochi,
    wan_loading,
)
from .autoencoder_kl import AutoencoderKL, KLConfig
from .taesd import TAESD
from .wan import WanVAE

PREFIXES = ("first_stage_model.", "vae.")
TAESD_NAMES = ("taesdxl", "taesd3", "taesd", "taef1", "taef2")


def read_state_dict(path: str | os.PathLike, header=None) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors or torch file, as zero-copy views where the format allows
    (`header`: the file's safetensors header when the caller has already read it)."""
    from ..formats import sniff
    from ..formats.safetensors import SafetensorsFile

    p = os.fspath(path)
    if not os.path.isfile(p):
        raise FormatError(f"{p}: no such file", path=p)
    if header is None:
        kind = sniff(p)
    else:  # the caller's parsed header says which: a GGUF file's is a GGUFTable
        from ..formats.gguf import GGUFTable

        kind = "gguf" if isinstance(header, GGUFTable) else "safetensors"
    if kind == "safetensors":
        f = SafetensorsFile(p, header)
        return {k: f.tensor(k) for k in f.header.tensors}
    if kind in ("torch-zip", "pickle"):
        from ..formats.pickles import load_state_dict

        sd = load_state_dict(p)  # refuses pickles that would run code; mmap for torch zips
        return {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    if kind == "gguf":
        return _gguf_state_dict(p)
    raise FormatError(f"{p}: not a safetensors or torch weights file ({kind})", path=p)


class QuantizedTensor:
    """A GGUF tensor held as its raw ggml blocks: `raw` (uint8, a view of the file's mmap) and `spec`
    (type and logical shape). `shape` is the logical one, so layout checks see the real tensor."""

    def __init__(self, raw: torch.Tensor, spec):
        self.raw, self.spec = raw, spec
        self.shape = torch.Size(spec.shape)

    def dequantized(self) -> torch.Tensor:
        return self.spec.dequantize(self.raw)


def _gguf_state_dict(p: str) -> dict:
    """A GGUF file's tensors (ComfyUI-GGUF's layout: the original key names, conv weights stored
    reshaped with `comfy.gguf.orig_shape.*`): float and integer types as zero-copy views of the
    mmap, ggml block types as QuantizedTensor (raw blocks, dequantized per op once loaded)."""
    from ..formats.gguf import GGUFFile
    from ..quant import QuantSpec, is_block_type

    f = GGUFFile(p)
    out: dict = {}
    for k, info in f.header.tensors.items():
        t = f.tensor(k)
        out[k] = QuantizedTensor(t, QuantSpec(info.dtype, info.shape)) if is_block_type(info.dtype) else t
    return out


def _dequantize_all(sd: dict) -> dict[str, torch.Tensor]:
    """Every QuantizedTensor as float32: for layouts whose keys are renamed or reshaped on load
    (diffusers naming, TAESD's Sequential indices), where a tensor's blocks no longer match one op."""
    return {k: v.dequantized() if isinstance(v, QuantizedTensor) else v for k, v in sd.items()}


def _hold_quantized(model: nn.Module, quantized: dict) -> None:
    """Give each QuantizedTensor's op its raw blocks (engine.ops.hold_quantized: the module keeps, moves
    and counts the quantized bytes and dequantizes per forward); a tensor of an op that cannot hold
    blocks (a norm's scale, which ComfyUI-GGUF keeps in float anyway) is dequantized once here."""
    from ..ops import Castable, hold_quantized

    for key, q in quantized.items():
        mpath, _, attr = key.rpartition(".")
        op = model.get_submodule(mpath)
        if isinstance(op, Castable) and attr in ("weight", "bias"):
            hold_quantized(op, attr, q.raw, q.spec)
        else:
            op._parameters[attr] = nn.Parameter(q.dequantized(), requires_grad=False)


def vae_component(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The VAE's own tensors: the `first_stage_model.`/`vae.` part of a checkpoint, else everything."""
    for prefix in PREFIXES:
        part = {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}
        if part:
            return part
    return sd


# -- diffusers -> LDM names ----------------------------------------------------------------------
_ATTN = {
    "group_norm": "norm",
    "to_q": "q",
    "to_k": "k",
    "to_v": "v",
    "to_out.0": "proj_out",
    "query": "q",
    "key": "k",
    "value": "v",
    "proj_attn": "proj_out",
}


def is_diffusers(keys) -> bool:
    return any(".down_blocks." in k or ".up_blocks." in k or ".mid_block." in k for k in keys)


def diffusers_to_ldm(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename diffusers AutoencoderKL keys to the LDM layout (names as in diffusers'
    convert_vae_pt_to_diffusers / single_file_utils mapping, inverted); linear attention weights
    (C, C) become 1x1 conv weights (C, C, 1, 1)."""
    ups = {int(m.group(1)) for k in sd if (m := re.match(r"decoder\.up_blocks\.(\d+)\.", k))}
    n_up = max(ups) + 1 if ups else 0
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        new = k.replace("conv_norm_out", "norm_out").replace("conv_shortcut", "nin_shortcut")
        new = re.sub(r"down_blocks\.(\d+)\.resnets\.", r"down.\1.block.", new)
        new = re.sub(r"down_blocks\.(\d+)\.downsamplers\.0\.", r"down.\1.downsample.", new)
        new = re.sub(r"mid_block\.resnets\.(\d+)\.", lambda m: f"mid.block_{int(m.group(1)) + 1}.", new)
        m = re.match(r"(decoder\.)up_blocks\.(\d+)\.(resnets|upsamplers)\.(.*)$", new)
        if m:
            level = n_up - 1 - int(m.group(2))
            rest = m.group(4)
            if m.group(3) == "resnets":
                new = f"decoder.up.{level}.block.{rest}"
            else:
                new = f"decoder.up.{level}.upsample.{rest.removeprefix('0.')}"
        m = re.match(r"(encoder|decoder)\.mid_block\.attentions\.0\.(.*)\.(weight|bias)$", new)
        if m:
            name = _ATTN.get(m.group(2))
            if name is None:
                out[k] = v  # left unconverted: strict loading will name it
                continue
            new = f"{m.group(1)}.mid.attn_1.{name}.{m.group(3)}"
            if m.group(3) == "weight" and v.dim() == 2:
                v = v.reshape(*v.shape, 1, 1)
        out[new] = v
    return out


def _index_set(keys, pattern: str) -> set[int]:
    return {int(m.group(1)) for k in keys if (m := re.match(pattern, k))}


def kl_config(sd: dict[str, torch.Tensor], path: str) -> KLConfig:
    keys = list(sd)
    has_enc = any(k.startswith("encoder.") for k in keys)
    has_dec = any(k.startswith("decoder.") for k in keys)
    if not (has_enc or has_dec):
        raise FormatError(f"{path}: no encoder.* or decoder.* tensors — not a VAE", path=path)
    try:
        if has_dec:
            ch = sd["decoder.conv_out.weight"].shape[1]
            z = sd["decoder.conv_in.weight"].shape[1]
            levels = sorted(_index_set(keys, r"decoder\.up\.(\d+)\."))
            mult = tuple(sd[f"decoder.up.{i}.block.0.conv2.weight"].shape[0] // ch for i in levels)
            nres = len(_index_set(keys, r"decoder\.up\.0\.block\.(\d+)\.")) - 1
        if has_enc:
            ch = sd["encoder.conv_in.weight"].shape[0]
            z = sd["encoder.conv_out.weight"].shape[0] // 2
            levels = sorted(_index_set(keys, r"encoder\.down\.(\d+)\."))
            mult = tuple(sd[f"encoder.down.{i}.block.0.conv2.weight"].shape[0] // ch for i in levels)
            nres = len(_index_set(keys, r"encoder\.down\.0\.block\.(\d+)\."))
        in_ch = sd["encoder.conv_in.weight"].shape[1] if has_enc else 3
    except KeyError as e:
        raise FormatError(f"{path}: incomplete VAE, tensor {e.args[0]} is missing", path=path) from e
    quant = "quant_conv.weight" in sd or "post_quant_conv.weight" in sd
    return KLConfig(ch, mult, nres, z, in_ch, has_enc, has_dec, quant)


def strict_load(model: nn.Module, sd: dict[str, torch.Tensor], path: str) -> None:
    """Assign every tensor to the model (no copy), refusing missing, unexpected or misshapen keys."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    bad = [k for k in expected if k in sd and tuple(sd[k].shape) != tuple(expected[k].shape)]
    # a weight stored as integers (not a quantized block format: those are their own tensor type)
    ints = [k for k in expected if k in sd and type(sd[k]) is torch.Tensor and expected[k].is_floating_point()
            and not sd[k].is_floating_point()]  # fmt: skip
    if ints:
        k = ints[0]
        raise FormatError(
            f"{path}: {len(ints)} weight(s) stored as {str(sd[k].dtype).removeprefix('torch.')} (e.g. {k}): "
            "a VAE's weights are floating point (a damaged or edited file?)",
            path=path,
        )
    if missing or unexpected or bad:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {', '.join(missing[:3])})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {', '.join(unexpected[:3])})")
        if bad:
            k = bad[0]
            parts.append(
                f"{len(bad)} with the wrong shape (e.g. {k}: {tuple(sd[k].shape)} "
                f"instead of {tuple(expected[k].shape)})"
            )
        raise FormatError(f"{path}: not a VAE layout Loadout knows: " + "; ".join(parts), path=path)
    model.load_state_dict(sd, strict=True, assign=True)
    model.eval().requires_grad_(False)


def _taesd_part(sd: dict[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]] | None:
    """Split a TAESD-family state dict into {'encoder': ..., 'decoder': ...} (numeric Sequential
    keys), from upstream .pth files, ComfyUI's taesd_encoder./taesd_decoder. prefixes or diffusers'
    AutoencoderTiny `encoder.layers.N` / `decoder.layers.N` (whose decoder lacks the clamp layer)."""
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in sd.items():
        m = re.match(r"^(?:(taesd_)?(encoder|decoder)\.(layers\.)?)?(\d+)\.(.+)$", k)
        if not m:
            return None
        idx = int(m.group(4))
        if m.group(2) is None:
            which = "encoder" if "0.weight" in sd and sd["0.weight"].shape[1] == 3 else "decoder"
        else:
            which = m.group(2)
        if m.group(3) and which == "decoder":
            idx += 1
        parts.setdefault(which, {})[f"{idx}.{m.group(5)}"] = v
    return parts


def _taesd_name(path: str, channels: int) -> str:
    base = Path(path).name.lower()
    for name in TAESD_NAMES:
        if base.startswith(name):
            return name
    return {4: "taesd", 16: "taef1", 32: "taef2"}.get(channels, "taesd")


def load_vae(path: str | os.PathLike, *, pair: bool = True, header=None) -> nn.Module:
    """The VAE in `path` (AutoencoderKL or TAESD family). For a TAESD `*_encoder`/`*_decoder` file the
    sibling half is loaded too when present (`pair`), so one path gives both directions."""
    p = os.fspath(path)
    sd = vae_component(read_state_dict(p, header))
    if ltx_loading.is_ltx_vae(sd):  # LTX-Video (its GGUF files, if any, dequantized whole)
        return ltx_loading.build(_dequantize_all(sd), p, strict_load, _made)
    quantized = {k: v for k, v in sd.items() if isinstance(v, QuantizedTensor)}
    if minimax_h3.is_minimax_h3(sd):
        return _build_minimax_h3(_dequantize_all(sd) if quantized else sd, p)
    if kandinsky6_sr.is_kandinsky6_sr(sd):
        return kandinsky6_sr.build(_dequantize_all(sd) if quantized else sd, p, strict_load, _made)
    if hunyuan_image.is_hunyuan_image_vae(sd) or hunyuan_image.is_original(
        sd
    ):  # before AutoencoderKL's names
        return hunyuan_image.build(_dequantize_all(sd) if quantized else sd, p, strict_load, _made)
    if cosmos_loading.is_cosmos(sd):  # Cosmos 1.0's tokenizer (engine.vae.cosmos)
        return cosmos_loading.build(_dequantize_all(sd) if quantized else sd, p, strict_load, _made)
    if hunyuan_video.is_hunyuan_video(sd):
        return hunyuan_video.build(_dequantize_all(sd) if quantized else sd, p, strict_load, _made)
    if dc_ae_loading.is_dc_ae(sd):  # Sana's and PRX's deep-compression autoencoder
        return dc_ae_loading.build(_dequantize_all(sd) if quantized else sd, p, strict_load, _made)
    if quantized:
        if (_taesd_part(sd) is not None or is_diffusers(sd) or mochi.is_mochi_vae(sd)
                or any(k.startswith("bn.") for k in quantized)):  # fmt: skip
            sd, quantized = _dequantize_all(sd), {}
        else:  # the model is built with placeholders of the logical shapes, then given the blocks
            sd = {k: torch.empty(v.shape, device="meta") if k in quantized else v for k, v in sd.items()}
    taesd = _taesd_part(sd)
    if taesd is not None:
        if pair:
            sib = _sibling(p)
            if sib is not None:
                for which, part in (_taesd_part(read_state_dict(sib)) or {}).items():
                    taesd.setdefault(which, part)
        return _build_taesd(taesd, p)
    if mochi.is_mochi_vae(sd):  # Genmo's decoder file brings its encoder's file beside it (`pair`)
        return mochi.build(mochi.with_sibling_encoder(sd, p, read_state_dict) if pair else sd, p)
    if wan_loading.is_wan_vae(sd):
        model = _build_wan(sd, p)
        _hold_quantized(model, quantized)
        return model
    foreign = not_kl_decoder(sd)
    if foreign is not None:
        raise UnsupportedModel(
            f"{p}: {foreign[1]} ({foreign[0]}): not an AutoencoderKL. Loadout decodes the SD, SD3, FLUX and "
            "Wan-family and LTX video VAEs, the DC-AE and TAESD, not this one yet",
            path=p,
        )
    latent_norm = {k: sd.pop(k) for k in [k for k in sd if k.startswith("bn.")]}
    if is_diffusers(sd):
        sd = diffusers_to_ldm(sd)
    cfg = kl_config(sd, p)
    model = _made(p, lambda: AutoencoderKL(cfg))
    strict_load(model, sd, p)
    _hold_quantized(model, quantized)
    # FLUX.2 files carry the batch-norm statistics of the patchified latent: recorded, used where
    # latents enter/leave the diffusion model (not by decode/encode, which work in VAE space).
    model.latent_norm = latent_norm
    model.source = p
    return model


def _build_wan(sd: dict[str, torch.Tensor], path: str) -> WanVAE:
    """A Wan 2.1 / 2.2 / Qwen-Image (1 and 2.1) VAE in either naming, loaded strictly."""
    if wan_loading.is_diffusers(sd):
        sd = wan_loading.diffusers_to_original(sd)
    cfg = wan_loading.wan_config(sd, path)
    with torch.device("meta"):
        model = _made(path, lambda: WanVAE(cfg))
    if cfg.frame:  # Qwen-Image 2.1's 2-D convolutions as 1x3x3 causal ones
        from .qwen_image21 import lift_frame_convs

        sd = lift_frame_convs(sd, model)
    strict_load(model, sd, path)
    model.source = path
    return model


def _build_minimax_h3(sd: dict[str, torch.Tensor], path: str) -> minimax_h3.MiniMaxH3VAE:
    """MiniMax-H3's video VAE (diffusers naming, its only one): the decoder, and the encoder where the file holds
    one, loaded strictly (an encoder whose widths cannot take the release's 32 groups is left unread)."""
    from . import minimax_h3_encoder as h3_enc

    cfg = minimax_h3.h3_config(sd, path)
    enc = h3_enc.encoder_config(sd, cfg.z, cfg.patch, cfg.patch_t, path) if h3_enc.has_encoder(sd) else None
    with torch.device("meta"):
        model = _made(path, lambda: minimax_h3.MiniMaxH3VAE(cfg, enc))
    strict_load(model, sd if enc is not None else minimax_h3.decoder_keys(sd), path)
    model.source = path
    return model


def _made(path: str, build):
    """The model `build` makes from a config read off the file's shapes; a config no model can have
    (an input conv of 3 channels read as the base width: GroupNorm's 32 groups do not divide it) is
    the file's fault, not a ValueError out of torch."""
    try:
        return build()
    except (ValueError, RuntimeError, ZeroDivisionError) as e:
        raise FormatError(f"{path}: its shapes describe no VAE Loadout can build ({e})", path=path) from e


def _sibling(path: str) -> str | None:
    for a, b in (("_encoder", "_decoder"), ("_decoder", "_encoder")):
        name = Path(path).name
        if a in name:
            sib = Path(path).with_name(name.replace(a, b))
            if sib.is_file():
                return str(sib)
    return None


def _build_taesd(parts: dict[str, dict[str, torch.Tensor]], path: str) -> TAESD:
    enc, dec = parts.get("encoder"), parts.get("decoder")
    if dec is not None and "1.weight" not in dec:
        raise FormatError(f"{path}: TAESD decoder without its input conv (1.weight)", path=path)
    if enc is not None and "14.weight" not in enc:
        raise FormatError(f"{path}: TAESD encoder without its output conv (14.weight)", path=path)
    channels = dec["1.weight"].shape[1] if dec is not None else enc["14.weight"].shape[0]
    mid_gn = any(".pool." in k for part in parts.values() for k in part)
    model = _made(
        path, lambda: TAESD(_taesd_name(path, channels), channels, mid_gn, enc is not None, dec is not None)
    )
    sd = {f"encoder.{k}": v for k, v in (enc or {}).items()}
    sd.update({f"decoder.{k}": v for k, v in (dec or {}).items()})
    strict_load(model, sd, path)
    model.source = path
    return model
