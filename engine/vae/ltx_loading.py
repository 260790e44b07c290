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
from .ltx_encoder import STRIDES, encoder_config, read_blocks

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


def ltx_config(sd: dict[str, torch.Tensor], path: str, residual: list[bool] | None = None) -> LTXConfig:
    """The decoder the (Lightricks-named) tensors describe; what Loadout does not run is refused by name.
    An upsampler's stride and factor are in its shapes: its convolution gives volume x (what the next block
    takes in) channels from factor x that many. Whether it adds its input back (`residual`, per upsampler in
    order) is not: the release's config says (engine.vae.ltx_loading.build); without one, the layouts'
    releases decide -- 0.9.1 - LTX-2.0's 2x2x2 upsamplers of factor 2 all do, 0.9.0's (factor 1) and LTX-2.3's
    (one in time only, one in space only) none."""
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
    ups: list[tuple[int, int, int, tuple[int, int, int]]] = []  # (index, cin, factor, stride)
    for j, b in enumerate(raw):
        if b[0] != "up":
            continue
        nxt = raw[j + 1] if j + 1 < len(raw) else None
        after = out_w if nxt is None else nxt[1]  # what the next block takes in: a width
        cin, cout = b[1], b[2]
        if cout % after or cout // after not in STRIDES or cin % after:
            raise UnsupportedModel(
                f"{path}: LTX-Video decoder block {j} upsamples {cin} -> {cout} channels before a block of "
                f"{after}: not a 2x depth-to-space upsampler in time, space or both (Loadout runs those only)",
                path=path,
            )
        ups.append((j, cin, cin // after, STRIDES[cout // after]))
    if residual is None or len(residual) != len(ups):
        whole = all(u[3] == (2, 2, 2) for u in ups)
        residual = [whole and u[2] > 1 for u in ups]
    blocks = list(raw)
    for (j, cin, factor, stride), res in zip(ups, residual, strict=True):
        blocks[j] = ("up", cin, factor, stride, bool(res))
    head = _shape(sd, "decoder.conv_out.conv.weight", path)[0]
    if head % 16:
        raise FormatError(
            f"{path}: decoder.conv_out gives {head} channels, not 4x4 pixels of a colour", path=path
        )
    return LTXConfig(z, width, tuple(blocks), "decoder.timestep_scale_multiplier" in sd, 4, head // 16)


def _file_meta(path: str) -> dict | None:
    """The JSON config Lightricks' single files store in their metadata (`config`: "vae", and in LTX-2's
    "transformer", "audio_vae", ...), or None (another format, no such entry)."""
    import json

    from ..formats.safetensors import read_header

    try:
        cfg = json.loads(read_header(path).metadata.get("config", "null"))
    except Exception:  # noqa: BLE001 -- no readable metadata: the weights decide
        return None
    return cfg if isinstance(cfg, dict) else None


def _file_config(path: str) -> dict | None:
    """The `vae` part of the file's metadata config, or None."""
    cfg = _file_meta(path)
    return cfg.get("vae") if cfg is not None and isinstance(cfg.get("vae"), dict) else None


# LTX-2's decoder (Lightricks' metadata config: decoder_spatial_padding_mode "reflect", causal_decoder false)
LTX2_PADS = Pads(causal=False, reflect=True)
# Lightricks' ltx-core (LTX-2) names the upsamplers of its metadata's `decoder_blocks` by their stride
_LTX2_ONLY_BLOCKS = ("compress_time", "compress_space")


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


def _meta_residual(vae: dict) -> list[bool] | None:
    """Each upsampler's residual, in the decoder's order, from the metadata's `decoder_blocks`: listed in the
    encoder's order (the decoder runs them reversed), an upsampler `compress_*` with {"residual": ...},
    False where not said (Lightricks' DepthToSpaceUpsample default)."""
    blocks = vae.get("decoder_blocks")
    if not isinstance(blocks, list):
        return None
    out = []
    for b in reversed(blocks):
        if isinstance(b, list | tuple) and b and str(b[0]).startswith("compress"):
            params = b[1] if len(b) > 1 and isinstance(b[1], dict) else {}
            out.append(bool(params.get("residual", False)))
    return out


def _is_ltx2_meta(meta: dict, vae: dict) -> bool:
    """A config of Lightricks' LTX-2 code (ltx-core): the audio VAE beside the video one, or upsamplers in
    time or space only (LTX-2.3's)."""
    blocks = vae.get("decoder_blocks") if isinstance(vae.get("decoder_blocks"), list) else []
    return "audio_vae" in meta or any(
        isinstance(b, list | tuple) and b and b[0] in _LTX2_ONLY_BLOCKS for b in blocks
    )


def _generation(cfg: LTXConfig, path: str) -> tuple[str, Pads, list[bool] | None, str | None]:
    """LTX-Video or LTX-2, how the decoder pads, whether each upsampler adds its input back, and a note
    where the weights alone decided. LTX-2.0's VAE has the tensors of LTX-Video 0.9.5's (diffusers' two classes
    give the same shapes), so what tells them is the config the release ships: Lightricks' metadata
    (`decoder_spatial_padding_mode`, `causal_decoder`, `decoder_blocks`; where the padding is not said, the
    code that wrote the file decides: LTX-2's ltx-core mirrors, LTX-Video's CausalVideoAutoencoder pads
    zeros) or diffusers' config.json (`_class_name`, `decoder_spatial_padding_mode`, `decoder_causal`,
    `upsample_residual`, listed from the output end: reversed here). Without either:
      * 0.9.0's layout is LTX-Video's alone;
      * LTX-2.3's layout (upsamplers in time only and space only: the only release with them) is LTX-2's,
        with zero borders and no residual (diffusers' convert_ltx2_to_diffusers, version "2.3");
      * a residual 2x2x2 decoder (a VAE file stripped of its metadata) decodes as LTX-2.0's, the generation
        its detection names, and the decode says so: a 0.9.5+ VAE so decoded differs only at the frame's
        borders (mirrored there, zeros in LTX-Video's), where a refusal would lose the whole decode."""
    meta = _file_meta(path)
    vae = meta.get("vae") if meta is not None and isinstance(meta.get("vae"), dict) else None
    if vae is not None:
        two = _is_ltx2_meta(meta, vae)
        mode = vae.get("decoder_spatial_padding_mode", vae.get("spatial_padding_mode"))
        reflect = mode == "reflect" if mode is not None else two
        pads = Pads(bool(vae.get("causal_decoder", False)), reflect)
        return ("ltx2" if two or reflect else "ltxv"), pads, _meta_residual(vae), None
    dc = _diffusers_config(path)
    if dc is not None:
        two = dc["_class_name"] == "AutoencoderKLLTX2Video"
        # the classes' defaults where the config leaves them out: LTX-2 reflect and causal, LTX-Video zeros
        causal = bool(dc.get("decoder_causal", two))
        pads = Pads(
            causal, dc.get("decoder_spatial_padding_mode", "reflect" if two else "zeros") == "reflect"
        )
        res, scaled = dc.get("upsample_residual"), dc.get("decoder_spatio_temporal_scaling")
        residual = None
        if isinstance(res, list | tuple):  # one per up block; those without an upsampler are passed over
            scaled = list(reversed(scaled)) if isinstance(scaled, list | tuple) else [True] * len(res)
            residual = [bool(r) for r, s in zip(reversed(res), scaled, strict=False) if s]
        return ("ltx2" if two else "ltxv"), pads, residual, None
    ups = [b for b in cfg.blocks if b[0] == "up"]
    if any(b[3] != (2, 2, 2) for b in ups):
        return "ltx2", Pads(), None, None
    if any(b[2] > 1 for b in ups):
        return (
            "ltx2",
            LTX2_PADS,
            None,
            (
                "an LTX VAE without its config (no `config` in the file's metadata, no diffusers config.json beside "
                "it): decoded as LTX-2's (mirrored borders). LTX-Video 0.9.5+'s has the same tensors and pads with "
                "zeros: its borders would differ -- load the release's own file to be sure"
            ),
        )
    return "ltxv", Pads(), None, None


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
    generation, pads, residual, note = (
        ("ltx2" if pads.reflect else "ltxv", pads, None, None) if pads is not None else _generation(cfg, path)
    )
    if residual is not None:  # the config says which upsamplers add their input back
        cfg = ltx_config(dec, path, residual)
    cfg = dataclasses.replace(cfg, pads=pads, generation=generation)
    enc_cfg = encoder_config(enc, cfg.z, path, *_encoder_padding(path)) if enc else None
    with torch.device("meta"):
        model = made(path, lambda: LTXVideoVAE(cfg, enc_cfg))
    strict_load(model, {**dec, **enc}, path)
    model.latent_stats = stats
    model.notes = [note] if note else []  # engine.vae.run adds them to the decode's notes
    model.source = path
    return model
