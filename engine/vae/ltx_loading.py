"""An LTX-Video VAE from its tensors: diffusers' names (AutoencoderKLLTXVideo) renamed onto Lightricks'
single-file ones (engine.vae.ltx), the configuration read from the shapes, then a strict load of the
decoder.

Name facts (diffusers `convert_ltx_vae_checkpoint_to_diffusers`, inverted): Lightricks' decoder is one flat
`up_blocks` sequence -- block 0 the middle (`mid_block`), then per diffusers up block its width-changing
`conv_in` (0.9.0), its `upsamplers.0`, its `resnets` (+ `time_embedder`) as `res_blocks`; a residual
block's `conv_shortcut.conv` is `conv_shortcut`, its LayerNorm `norm3` is `norm3.norm`; the decoder's
own `time_embedder` / `scale_shift_table` are `last_time_embedder` / `last_scale_shift_table`. The encoder
is the mirror image: one flat `down_blocks` sequence -- per diffusers down block its `resnets` as
`res_blocks`, its `downsamplers.0`, its width-changing `conv_out` (0.9.0) -- then `mid_block` last
(engine.vae.ltx_encoder). The latent statistics are `per_channel_statistics.*` (diffusers: `latents_mean` /
`latents_std`): recorded, not run (the latent format's, not the encoder's).
"""

from __future__ import annotations

import dataclasses
import re

import torch

from ..errors import FormatError, UnsupportedModel
from .ltx import LTXConfig, LTXVideoVAE, Pads
from .ltx_encoder import encoder_config, read_blocks

_STATS = ("per_channel_statistics.", "latents_mean", "latents_std")


def is_ltx_vae(keys) -> bool:
    """LTX's decoder in either naming: a `conv_in.conv` (its convolutions wrap a `conv`) and residual
    blocks under `res_blocks` (Lightricks) or a `mid_block.resnets` of the same kind (diffusers) -- and no
    attention anywhere (the HunyuanVideo VAEs wrap their convolutions the same way and have a middle-block
    attention: engine.vae.hunyuan_video)."""
    keys = set(keys)
    if "decoder.conv_in.conv.weight" not in keys or any(".attentions." in k or ".attn" in k for k in keys):
        return False
    return any(
        k.startswith(("decoder.up_blocks.0.res_blocks.", "decoder.mid_block.resnets.0.conv1.conv."))
        for k in keys
    )


def is_diffusers(keys) -> bool:
    return any(k.startswith("decoder.mid_block.") for k in keys)


def _resnet(rest: str) -> str:
    if rest.startswith("conv_shortcut.conv."):
        return "conv_shortcut." + rest[len("conv_shortcut.conv.") :]
    if rest.startswith("norm3.") and not rest.startswith("norm3.norm."):
        return "norm3.norm." + rest[len("norm3.") :]
    return rest


def _encoder_to_original(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' encoder keys in Lightricks' flat `down_blocks` (each down block's resnets, downsampler and
    width-changing conv_out in that order, the middle block last); other keys as they are."""
    parts: dict[int, set[str]] = {}
    for k in sd:
        if m := re.match(r"encoder\.down_blocks\.(\d+)\.(resnets|downsamplers|conv_out)\.", k):
            parts.setdefault(int(m[1]), set()).add(m[2])
    flat: dict[tuple[int, str], int] = {}
    for i in sorted(parts):
        for what in ("resnets", "downsamplers", "conv_out"):
            if what in parts[i]:
                flat[(i, what)] = len(flat)
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        new = k
        if m := re.match(r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$", k):
            new = f"encoder.down_blocks.{flat[(int(m[1]), 'resnets')]}.res_blocks.{m[2]}.{_resnet(m[3])}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.downsamplers\.0\.(.*)$", k):
            new = f"encoder.down_blocks.{flat[(int(m[1]), 'downsamplers')]}.{m[2]}"
        elif m := re.match(r"encoder\.down_blocks\.(\d+)\.conv_out\.(.*)$", k):
            new = f"encoder.down_blocks.{flat[(int(m[1]), 'conv_out')]}.{_resnet(m[2])}"
        elif m := re.match(r"encoder\.mid_block\.resnets\.(\d+)\.(.*)$", k):
            new = f"encoder.down_blocks.{len(flat)}.res_blocks.{m[1]}.{_resnet(m[2])}"
        out[new] = v
    return out


def diffusers_to_original(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename diffusers' decoder and encoder keys to Lightricks' flat layout; keys no rule knows stay as
    they are (the strict load names them)."""
    sd = _encoder_to_original(sd)
    parts: dict[int, set[str]] = {}
    for k in sd:
        if m := re.match(r"decoder\.up_blocks\.(\d+)\.(conv_in|upsamplers|resnets|time_embedder)\.", k):
            parts.setdefault(int(m[1]), set()).add(m[2])
    flat: dict[tuple[int, str], int] = {}
    n = 1  # block 0 is the middle
    for i in sorted(parts):
        for what in ("conv_in", "upsamplers", "resnets"):
            if what in parts[i]:
                flat[(i, what)] = n
                n += 1
    out: dict[str, torch.Tensor] = {}
    for k, v in sd.items():
        new = k
        if m := re.match(r"decoder\.mid_block\.resnets\.(\d+)\.(.*)$", k):
            new = f"decoder.up_blocks.0.res_blocks.{m[1]}.{_resnet(m[2])}"
        elif m := re.match(r"decoder\.mid_block\.time_embedder\.(.*)$", k):
            new = f"decoder.up_blocks.0.time_embedder.{m[1]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.conv_in\.(.*)$", k):
            new = f"decoder.up_blocks.{flat[(int(m[1]), 'conv_in')]}.{_resnet(m[2])}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.upsamplers\.0\.(.*)$", k):
            new = f"decoder.up_blocks.{flat[(int(m[1]), 'upsamplers')]}.{m[2]}"
        elif m := re.match(r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.*)$", k):
            new = f"decoder.up_blocks.{flat[(int(m[1]), 'resnets')]}.res_blocks.{m[2]}.{_resnet(m[3])}"
        elif (m := re.match(r"decoder\.up_blocks\.(\d+)\.time_embedder\.(.*)$", k)) and (
            int(m[1]),
            "resnets",
        ) in flat:
            new = f"decoder.up_blocks.{flat[(int(m[1]), 'resnets')]}.time_embedder.{m[2]}"
        elif k.startswith("decoder.time_embedder."):
            new = "decoder.last_time_embedder." + k[len("decoder.time_embedder.") :]
        elif k == "decoder.scale_shift_table":
            new = "decoder.last_scale_shift_table"
        out[new] = v
    return out


def _shape(sd, key: str, path: str, dims: int = 5) -> tuple[int, ...]:
    t = sd.get(key)
    if t is None:
        raise FormatError(f"{path}: incomplete LTX-Video VAE, tensor {key} is missing", path=path)
    if len(t.shape) != dims:
        raise FormatError(
            f"{path}: {key} has shape {list(t.shape)}; an LTX-Video VAE's convolutions are 3-D: a damaged or "
            "edited file?",
            path=path,
        )
    return tuple(t.shape)


def ltx_config(sd: dict[str, torch.Tensor], path: str) -> LTXConfig:
    """The decoder the (Lightricks-named) tensors describe; what Loadout does not run is refused by name."""
    noise = next((k for k in sd if "per_channel_scale" in k), None)
    if noise is not None:
        raise UnsupportedModel(
            f"{path}: an LTX-Video VAE whose decoder adds random noise in its blocks ({noise}: the 0.9.1 "
            "release's): Loadout decodes LTX-Video 0.9.0 and 0.9.5 and later, not this one",
            path=path,
        )
    z = _shape(sd, "decoder.conv_in.conv.weight", path)[1]
    width = _shape(sd, "decoder.conv_in.conv.weight", path)[0]
    raw = read_blocks(sd, path, "decoder", _shape)
    out_w = _shape(sd, "decoder.conv_out.conv.weight", path)[1]
    blocks: list[tuple[str, int, int]] = []
    for j, b in enumerate(raw):
        if b[0] != "up":
            blocks.append(b)
            continue
        nxt = raw[j + 1] if j + 1 < len(raw) else None
        after = out_w if nxt is None else nxt[1]  # what the next block takes in: a width
        cin, cout = b[1], b[2]
        if cout != 8 * after or (8 * cin) % cout:
            raise UnsupportedModel(
                f"{path}: LTX-Video decoder block {j} upsamples {cin} -> {cout} channels before a block of "
                f"{after}: not a 2x2x2 depth-to-space upsampler (Loadout runs those only)",
                path=path,
            )
        blocks.append(("up", cin, 8 * cin // cout))
    head = _shape(sd, "decoder.conv_out.conv.weight", path)[0]
    if head % 16:
        raise FormatError(
            f"{path}: decoder.conv_out gives {head} channels, not 4x4 pixels of a colour", path=path
        )
    return LTXConfig(z, width, tuple(blocks), "decoder.timestep_scale_multiplier" in sd, 4, head // 16)


def _file_config(path: str) -> dict | None:
    """The `vae` part of the JSON config Lightricks' single files store in their metadata (`config`), or
    None (another format, no such entry)."""
    import json

    from ..formats.safetensors import read_header

    try:
        cfg = json.loads(read_header(path).metadata.get("config", "null"))
    except Exception:  # noqa: BLE001 -- no readable metadata: the weights decide
        return None
    return cfg.get("vae") if isinstance(cfg, dict) and isinstance(cfg.get("vae"), dict) else None


# LTX-2's decoder (Lightricks' metadata config: decoder_spatial_padding_mode "reflect", causal_decoder false)
LTX2_PADS = Pads(causal=False, reflect=True)


def _diffusers_config(path: str) -> dict | None:
    """diffusers' `config.json` beside the weights (a `vae/` folder), or None."""
    import json
    import os

    cfg = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    try:
        with open(cfg, encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError):
        return None
    return (
        out
        if isinstance(out, dict) and str(out.get("_class_name", "")).startswith("AutoencoderKLLTX")
        else None
    )


def _generation(cfg: LTXConfig, path: str) -> tuple[str, Pads]:
    """LTX-Video or LTX-2, and how the decoder pads. LTX-2's VAE has the tensors of LTX-Video 0.9.5's
    (diffusers' two classes give the same shapes), so what tells them is the config the release ships:
    Lightricks' metadata (`decoder_spatial_padding_mode`, `causal_decoder`) or diffusers' config.json
    (`_class_name`, `decoder_spatial_padding_mode`, `decoder_causal`). 0.9.0's layout is LTX-Video's
    alone; a residual decoder with neither config (a VAE file stripped of its metadata) decodes as LTX-2's,
    the generation its detection names, and the decode says so: a 0.9.5+ VAE so decoded differs only at
    the frame's borders (mirrored there, zeros in LTX-Video's), where a refusal would lose the whole decode.
    Returns the generation, the padding and that note (None where a config decided)."""
    meta = _file_config(path)
    if meta is not None:
        pads = Pads(
            bool(meta.get("causal_decoder", False)), meta.get("decoder_spatial_padding_mode") == "reflect"
        )
        return ("ltx2" if pads.reflect else "ltxv"), pads, None
    dc = _diffusers_config(path)
    if dc is not None:
        two = dc["_class_name"] == "AutoencoderKLLTX2Video"
        # the classes' defaults where the config leaves them out: LTX-2 reflect and causal, LTX-Video zeros
        causal = bool(dc.get("decoder_causal", two))
        pads = Pads(
            causal, dc.get("decoder_spatial_padding_mode", "reflect" if two else "zeros") == "reflect"
        )
        return ("ltx2" if two else "ltxv"), pads, None
    if any(b[0] == "up" and b[2] > 1 for b in cfg.blocks):
        return (
            "ltx2",
            LTX2_PADS,
            (
                "an LTX VAE without its config (no `config` in the file's metadata, no diffusers config.json beside "
                "it): decoded as LTX-2's (mirrored borders). LTX-Video 0.9.5+'s has the same tensors and pads with "
                "zeros: its borders would differ -- load the release's own file to be sure"
            ),
        )
    return "ltxv", Pads(), None


def _encoder_padding(path: str) -> tuple[bool, bool]:
    """(causal, mirrored borders) of the encoder, from the release's config: diffusers' config.json
    (`encoder_causal`, `encoder_spatial_padding_mode`) or Lightricks' metadata (its encoder is causal;
    `encoder_spatial_padding_mode`); by default causal with zero borders, both classes' defaults."""
    cfg = _diffusers_config(path) or _file_config(path) or {}
    return bool(cfg.get("encoder_causal", True)), cfg.get("encoder_spatial_padding_mode") == "reflect"


def build(sd: dict[str, torch.Tensor], path: str, strict_load, made, pads: Pads | None = None) -> LTXVideoVAE:
    """The decoder in either naming, and the encoder where the file holds its tensors, loaded strictly;
    the latent statistics kept as `latent_stats`."""
    if is_diffusers(sd):
        sd = diffusers_to_original(sd)
    stats = {k: v for k, v in sd.items() if k.startswith(_STATS)}
    dec = {k: v for k, v in sd.items() if not k.startswith(("encoder.", *_STATS))}
    enc = {k: v for k, v in sd.items() if k.startswith("encoder.")}
    cfg = ltx_config(dec, path)
    # `pads`: a caller that knows the generation (a test, a benchmark) says so; else the release's config
    generation, pads, note = (
        ("ltx2" if pads.reflect else "ltxv", pads, None) if pads is not None else _generation(cfg, path)
    )
    cfg = dataclasses.replace(cfg, pads=pads, generation=generation)
    enc_cfg = encoder_config(enc, cfg.z, path, *_encoder_padding(path)) if enc else None
    with torch.device("meta"):
        model = made(path, lambda: LTXVideoVAE(cfg, enc_cfg))
    strict_load(model, {**dec, **enc}, path)
    model.latent_stats = stats
    model.notes = [note] if note else []  # engine.vae.run adds them to the decode's notes
    model.source = path
    return model
