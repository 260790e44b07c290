"""Sound decoders from their files, each one module with `latent()` (a latent file's tensor to the decoder's input),
`forward` (to a waveform [B, channels, samples] in [-1, 1]), `sample_rate`, `describe()` and `working_bytes()`:
LTX-2's (`LTX2Audio`: the audio VAE's decoder, engine.vae.ltx2_audio, and the vocoder, engine.vae.vocoder, here),
MiniMax-H3's (engine.vae.minimax_h3_audio) and Kandinsky 6's (MMAudio's, engine.vae.mmaudio). `load_audio` tells
them by their keys.

Where LTX-2's are:
  * Lightricks' single file (the release's checkpoint, as ComfyUI loads it): `audio_vae.decoder.*`,
    `audio_vae.per_channel_statistics.{mean,std}-of-means`, `vocoder.*` (LTX-2.3: `vocoder.vocoder.*`,
    `vocoder.bwe_generator.*`, `vocoder.mel_stft.*`), and the metadata `config` JSON with "audio_vae" and "vocoder";
  * diffusers' folders: `audio_vae/` (`decoder.*`, `latents_mean` / `latents_std`) and `vocoder/` (`conv_in`,
    `upsamplers`, `resnets`, `conv_out`; LTX2VocoderWithBWE's `vocoder.*`, `bwe_generator.*`, `mel_stft.*`), each
    with its config.json; the vocoder is found in the sibling folder, or named by the caller.
The encoders' tensors are read by engine.vae.ltx2_audio_encoder and minimax_h3_audio_encoder (`load_sound_encoder`).

What the weights do not say is read from the configs, else the release's values: the causal axis ("height"), mel
bins (64), sample rate (16 kHz) and hop (160) of the audio VAE; the vocoders' strides (by their kernels: vocoder
RELEASE_STRIDES), dilations, final activation and output rate.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

import torch
from torch import nn

from .. import ops
from ..errors import FormatError
from . import minimax_h3_audio, mmaudio
from .ltx2_audio import AXES, AudioDecoder, AudioDecoderConfig, Block, denormalise, unpack
from .vocoder import (
    DILATIONS,
    RELEASE_STRIDES,
    BWEConfig,
    Vocoder,
    VocoderConfig,
    VocoderWithBWE,
    fill_filters,
    stage_bytes,
)

_MEAN = ("per_channel_statistics.mean-of-means", "latents_mean")
_STD = ("per_channel_statistics.std-of-means", "latents_std")
# diffusers' vocoder names -> Lightricks' (diffusers convert_ltx2_to_diffusers LTX_2_0 / 2_3_VOCODER_RENAME_DICT, reversed)
_VOCODER_NAMES = {"upsamplers": "ups", "resnets": "resblocks", "conv_in": "conv_pre", "conv_out": "conv_post",
                  "act_out": "act_post"}  # fmt: skip


class LTX2Audio(nn.Module):
    """`audio_vae.decoder` and `vocoder`: the Lightricks file's own names, so a component of it maps onto its bytes."""

    def __init__(self, dec: AudioDecoderConfig, vocoder: nn.Module):
        super().__init__()
        self.audio_vae = nn.Module()
        self.audio_vae.decoder = AudioDecoder(dec)
        self.vocoder = vocoder
        self.latent_stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self.kind = "ltx2_audio"
        self.notes: list[str] = []

    @property
    def sample_rate(self) -> int:
        return self.vocoder.cfg.sample_rate

    @property
    def z(self) -> int:
        return self.audio_vae.decoder.cfg.z

    def latent(self, x: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """The decoder's input from a latent file's tensor: the denoiser's tokens [B, T, z * bins] or the VAE's
        [B, z, T, bins], un-normalised unless `raw` (already in the VAE's space: diffusers' output_type="latent")."""
        if x.dim() == 3:
            x = unpack(x, self.z)
        if x.dim() != 4 or x.shape[1] != self.z:
            raise FormatError(
                f"an audio latent is [B, {self.z}, T, bins] or the denoiser's [B, T, {self.z} x bins], not {list(x.shape)}"
            )
        if not raw and self.latent_stats is not None:
            mean, std = self.latent_stats
            if mean.numel() != x.shape[1] * x.shape[3]:
                raise FormatError(
                    f"the file's latent statistics are {mean.numel()} values, not {x.shape[1]} x {x.shape[3]}"
                )
            x = denormalise(x, mean, std)
        return x

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """VAE-space latent [B, z, T, bins] -> waveform [B, channels, samples] in [-1, 1]."""
        return self.vocoder(self.audio_vae.decoder(z))

    def describe(self) -> str:
        """The vocoder, for the result: hifigan (LTX-2.0), bigvgan, or bwe (LTX-2.3's BigVGAN and extender)."""
        if isinstance(self.vocoder, VocoderWithBWE):
            return "bwe"
        return "bigvgan" if self.vocoder.cfg.block == "AMP1" else "hifigan"

    def working_bytes(self, z: torch.Tensor) -> int:
        """A decode's float32 working memory, the larger of its two halves (the decoder's maps are gone when the vocoder
        runs): the decoder's widest map (a level's widest block at that level's (time, mel) size; the finest level's
        first resnet takes the upsampled width of the level above) times ~5 live maps, and the vocoder's widest stage
        (vocoder.stage_bytes; the extender's from the first stage's waveform's mels). Against a fresh process's RSS
        peak at the releases' widths, 10 s of sound, CPU: the decoder alone 312 MiB estimated / 292 measured; the whole
        decode 526 / 565 (LTX-2.0) and 526 / 359 (LTX-2.3; its vocoder alone measured 518 in another run)."""
        dec = self.audio_vae.decoder
        mel, bins = dec.frames_out(z.shape[2]), dec.cfg.mel_bins
        widest = max(max(max(b.cin, b.cout) for b in blocks) * (mel >> i) * (bins >> i)
                     for i, (blocks, _, _) in enumerate(dec.cfg.levels))  # fmt: skip
        need = 5 * 4 * widest
        if isinstance(self.vocoder, VocoderWithBWE):
            low = self.vocoder.vocoder.cfg
            need = max(
                need,
                stage_bytes(low, mel),
                stage_bytes(self.vocoder.cfg, mel * low.hop // self.vocoder.bwe.hop),
            )
        else:
            need = max(need, stage_bytes(self.vocoder.cfg, mel))
        return z.shape[0] * need


def _meta(path: str) -> dict:
    from ..formats.safetensors import read_header

    try:
        cfg = json.loads(read_header(path).metadata.get("config", "null"))
    except Exception:  # noqa: BLE001 -- no readable metadata: the weights and the release decide
        return {}
    return cfg if isinstance(cfg, dict) else {}


def _beside(path: str) -> dict:
    """diffusers' config.json beside a weights file, or {}."""
    try:
        with open(os.path.join(os.path.dirname(os.path.abspath(path)), "config.json"), encoding="utf-8") as f:
            out = json.load(f)
    except (OSError, ValueError):
        return {}
    return out if isinstance(out, dict) else {}


def _shape(sd: dict, key: str) -> tuple[int, ...]:
    if key not in sd:
        raise FormatError(f"not an LTX-2 audio VAE or vocoder Loadout knows: {key} is missing")
    return tuple(sd[key].shape)


def _count(sd: dict, pattern: str) -> int:
    rx = re.compile(pattern)
    return len({m.group(1) for k in sd if (m := rx.match(k))})


def read_levels(sd: dict, prefix: str, w: str, resample: str, path: str) -> tuple:
    """Each level `{prefix}N.` of an LDM-style audio decoder or encoder: its resnets (widths, shortcut), how many
    attentions, and whether it has the resampler whose key ends `resample` (w: `.conv.weight` for wrapped convs)."""
    levels = []
    for i in range(_count(sd, re.escape(prefix) + r"(\d+)\.block\.0\.")):
        p = f"{prefix}{i}."
        blocks = []
        for j in range(_count(sd, re.escape(p) + r"block\.(\d+)\.conv1\.")):
            b = f"{p}block.{j}."
            cout, cin = _shape(sd, f"{b}conv1{w}")[:2]
            short = "nin" if f"{b}nin_shortcut{w}" in sd else "conv" if f"{b}conv_shortcut{w}" in sd else None
            blocks.append(Block(cin, cout, short))
        if not blocks:
            raise FormatError(f"{path}: {p}block holds no resnets", path=path)
        levels.append((tuple(blocks), _count(sd, re.escape(p) + r"attn\.(\d+)\.q\."), p + resample in sd))
    return tuple(levels)


def decoder_config(sd: dict[str, torch.Tensor], cfg: dict, path: str) -> AudioDecoderConfig:
    """The decoder's structure from its `decoder.*` tensors; the axis, bins and rates from `cfg` (Lightricks'
    "audio_vae" metadata entry or diffusers' config.json)."""
    causal = "decoder.conv_in.conv.weight" in sd
    w = ".conv.weight" if causal else ".weight"
    if f"decoder.conv_in{w}" not in sd or len(_shape(sd, f"decoder.conv_in{w}")) != 4:
        raise FormatError(
            f"{path}: no LTX-2 audio VAE decoder (decoder.conv_in of 2-D convolutions)", path=path
        )
    top, z = _shape(sd, f"decoder.conv_in{w}")[:2]
    levels = read_levels(sd, "decoder.up.", w, f"upsample.conv{w}", path)
    ddc = cfg.get("model", {}).get("params", {}) if isinstance(cfg.get("model"), dict) else {}
    dd = ddc.get("ddconfig", ddc.get("decoder", {})) if isinstance(ddc, dict) else {}
    axis = cfg.get("causality_axis", dd.get("causality_axis", "height"))
    if axis not in AXES:
        raise FormatError(
            f"{path}: its config's causality axis {axis!r} is none of {', '.join(AXES)}", path=path
        )
    stft = cfg.get("preprocessing", {}).get("stft", {}) if isinstance(cfg.get("preprocessing"), dict) else {}
    return AudioDecoderConfig(
        z=z,
        top=top,
        levels=levels,
        mid_attn="decoder.mid.attn_1.q.weight" in sd,
        norm="group" if "decoder.mid.block_1.norm1.weight" in sd else "pixel",
        out_ch=_shape(sd, f"decoder.conv_out{w}")[0],
        causal=causal and axis is not None,
        axis=axis,
        mel_bins=int(cfg.get("mel_bins", dd.get("mel_bins", 64))),
        sample_rate=int(cfg.get("sample_rate", ddc.get("sampling_rate", 16000))),
        hop=int(cfg.get("mel_hop_length", stft.get("hop_length", 160))),
    )


def original_vocoder_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' vocoder names as Lightricks' (`conv_in` -> `conv_pre`, `downsample.filter` ->
    `downsample.lowpass.filter`, ...); Lightricks' names pass through."""
    out = {}
    for k, v in sd.items():
        parts = [_VOCODER_NAMES.get(s, s) for s in k.split(".")]
        if parts[-2:] == ["downsample", "filter"]:
            parts[-1:] = ["lowpass", "filter"]
        out[".".join(parts)] = v
    return out


def generator_config(
    sd: dict, p: str, cfg: dict, pre: str, rate: int, mel_hop: int, final, path: str
) -> VocoderConfig:
    """One generator at prefix `p` (Lightricks' names): widths, kernels and block kind from the weights; strides,
    dilations and the final activation from `cfg` (its `pre`-prefixed keys: diffusers' "bwe_"), else the release."""
    width, mel_in = _shape(sd, f"{p}conv_pre.weight")[:2]
    ups = _count(sd, re.escape(p) + r"ups\.(\d+)\.weight")
    kernels = tuple(_shape(sd, f"{p}ups.{i}.weight")[2] for i in range(ups))
    nres = _count(sd, re.escape(p) + r"resblocks\.(\d+)\.")
    if not ups or nres % ups:
        raise FormatError(
            f"{path}: {p or 'the vocoder'} has {ups} upsamplers and {nres} resblocks", path=path
        )
    per = nres // ups
    amp = f"{p}resblocks.0.acts1.0.act.alpha" in sd
    two = f"{p}resblocks.0.convs.0.weight" in sd
    conv = "convs" if two else "convs1"
    res_kernels = tuple(_shape(sd, f"{p}resblocks.{j}.{conv}.0.weight")[2] for j in range(per))
    strides = cfg.get(pre + "upsample_factors", cfg.get("upsample_rates")) or RELEASE_STRIDES.get(kernels)
    if strides is None or len(strides) != ups:
        raise FormatError(f"{path}: the vocoder's upsamplers (kernels {list(kernels)}) have no stride in its config, "
                          "and are no release's: give the file with its config", path=path)  # fmt: skip
    dil = cfg.get(pre + "resnet_dilations", cfg.get("resblock_dilation_sizes"))
    if dil is None:
        n = _count(sd, re.escape(f"{p}resblocks.0.{conv}.") + r"(\d+)\.weight")
        dil = [d[:n] for d in DILATIONS[:per]]
    if "final_act_fn" in cfg or pre + "final_act_fn" in cfg:
        final = cfg.get(pre + "final_act_fn")
    elif "apply_final_activation" in cfg or "use_tanh_at_final" in cfg:
        final = (
            None
            if not cfg.get("apply_final_activation", True)
            else "tanh"
            if cfg.get("use_tanh_at_final", True)
            else "clamp"
        )
    act = cfg.get(pre + "act_fn", cfg.get("activation"))
    beta = f"{p}resblocks.0.acts1.0.act.beta" in sd
    hop = 1
    for s in strides:
        hop *= int(s)
    return VocoderConfig(
        mel_in=mel_in,
        width=width,
        kernels=kernels,
        strides=tuple(int(s) for s in strides),
        res_kernels=res_kernels,
        dilations=tuple(tuple(int(x) for x in d) for d in dil),
        block="AMP1" if amp else "2" if two else "1",
        activation="snakebeta" if beta or act == "snakebeta" else "snake",
        out_ch=_shape(sd, f"{p}conv_post.weight")[0],
        final=final,
        final_bias=f"{p}conv_post.bias" in sd,
        sample_rate=int(
            cfg.get(pre + "output_sampling_rate", cfg.get("output_sample_rate", 0)) or rate * hop // mel_hop
        ),
    )


def vocoder_module(sd: dict[str, torch.Tensor], cfg: dict, rate: int, mel_hop: int, path: str) -> nn.Module:
    """A lone HiFi-GAN / BigVGAN (`conv_pre.*`), or LTX-2.3's pair (`vocoder.*`, `bwe_generator.*`, `mel_stft.*`)."""
    if "bwe_generator.conv_pre.weight" not in sd:
        return Vocoder(generator_config(sd, "", cfg, "", rate, mel_hop, "tanh", path))
    for k in ("mel_stft.mel_basis", "mel_stft.stft_fn.forward_basis"):
        if k not in sd:  # the mels the extender was trained on: kept in the checkpoint, not recomputed
            raise FormatError(
                f"{path}: the bandwidth extender's mel basis is not in the file ({k})", path=path
            )
    low_cfg = cfg.get("vocoder", cfg) if isinstance(cfg.get("vocoder"), dict) else cfg
    bwe = cfg.get("bwe", cfg) if isinstance(cfg.get("bwe"), dict) else cfg
    n_fft = _shape(sd, "mel_stft.stft_fn.forward_basis")[-1]
    mels = _shape(sd, "mel_stft.mel_basis")[0]
    rate_in = int(bwe.get("input_sampling_rate", rate))
    rate_out = int(bwe.get("output_sampling_rate", 48000))
    hop = int(bwe.get("hop_length", 80))
    low = generator_config(sd, "vocoder.", low_cfg, "", rate, mel_hop, None, path)
    low = dataclasses.replace(low, sample_rate=rate_in)
    pre = "bwe_" if "bwe_upsample_factors" in bwe else ""
    high = generator_config(sd, "bwe_generator.", bwe, pre, rate_in, hop, None, path)
    high = dataclasses.replace(high, sample_rate=rate_out)
    win = int(bwe.get("window_length", bwe.get("n_fft", n_fft)))
    return VocoderWithBWE(low, high, BWEConfig(hop, win, rate_in, rate_out), n_fft, mels)


def _part(sd: dict, prefix: str) -> dict:
    return {k[len(prefix) :]: v for k, v in sd.items() if k.startswith(prefix)}


def _vocoder_root(sd: dict) -> str | None:
    """The prefix of the vocoder's tensors: where `conv_pre` / `conv_in` sits beside the upsamplers (a BWE pair's
    parent), or None."""
    roots = []
    for k in sd:
        for head, ups in (("conv_pre.weight", "ups.0.weight"), ("conv_in.weight", "upsamplers.0.weight")):
            if k.endswith(head) and (k == head or k.endswith("." + head)):
                p = k[: -len(head)]
                if p + ups in sd and not p.startswith(("audio_vae.", "decoder.", "encoder.")):
                    roots.append(p)
    for p in roots:
        if p.endswith("bwe_generator."):
            return p[: -len("bwe_generator.")]
    return min(roots, key=len) if roots else None


def _sibling_vocoder(path: str) -> str | None:
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(path))), "vocoder")
    if not os.path.isdir(folder):
        return None
    files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
    return os.path.join(folder, files[0]) if files else None


def is_ltx2_audio(sd: dict) -> bool:
    """Lightricks' `audio_vae.` tensors, or a 2-D LDM decoder in the audio VAE's names (`decoder.up.N.block`)."""
    conv = sd.get("audio_vae.decoder.conv_in.conv.weight", sd.get("decoder.conv_in.conv.weight"))
    return conv is not None and conv.dim() == 4 and any(".up.0.block.0." in k for k in sd)


def audio_on_meta(path: str, header=None, prefixes: tuple[str, ...] | None = None) -> nn.Module:
    """The sound decoder `load_audio` builds from `path`, on the meta device from the header's shapes and dtypes (no
    tensor of the file is read; a vocoder in a second file is mapped, not read): its structure, parameter sizes and
    `working_bytes`, for an estimate before a run. `prefixes`: only the tensors under these (a checkpoint's
    `audio_vae.` and `vocoder.` beside a denoiser's thousands)."""
    from ..formats.dtypes import torch_dtype
    from ..formats.safetensors import read_header

    header = header if header is not None else read_header(path)
    with torch.device("meta"):
        state = {k: torch.empty(i.shape, dtype=torch_dtype(i.dtype)) for k, i in header.tensors.items()
                 if prefixes is None or k.startswith(prefixes)}  # fmt: skip
    return load_audio(path, header=header, state=state)


def decode_bytes(vae: str, latent: str) -> int:
    """A sound decode's memory before it runs (the Decode panel's "will it fit?"), from the headers: the decoder built
    on the meta device (audio_on_meta), its weights as the file stores them plus its own working_bytes for the
    latent's length. A sound decodes whole: one figure."""
    from ..formats.latent import audio_latent_key
    from ..formats.safetensors import read_header

    shape = read_header(latent).tensors[audio_latent_key(latent)].shape
    model = audio_on_meta(os.path.abspath(vae))
    work = model.working_bytes(model.latent(torch.empty(tuple(shape), device="meta")))
    return sum(p.numel() * p.element_size() for p in model.parameters()) + work


def load_audio(path: str, vocoder: str | None = None, header=None, state: dict | None = None) -> LTX2Audio:
    """LTX-2's audio decoder and vocoder from `path` (and `vocoder`, a second file, where the first has none);
    zero-copy views of the files, loaded strictly. `state`: the file's tensors as the caller has them (audio_on_meta's
    from the header: the module's structure and working memory without a byte of its data)."""
    from .loading import _made, read_state_dict, strict_load

    p = os.fspath(path)
    sd = read_state_dict(p, header) if state is None else state
    if minimax_h3_audio.is_minimax_h3_audio(sd):  # MiniMax-H3's: its decoder is its own vocoder
        model = minimax_h3_audio.build(sd, _beside(p), p, strict_load, _made)
        model.source = p
        return model
    if mmaudio.is_mmaudio(sd):  # Kandinsky 6's: MMAudio's mel VAE, its vocoder in a second file
        vpath = vocoder or _sibling_vocoder(p)
        if vpath is None:
            raise FormatError(f"{os.path.basename(p)} is MMAudio's mel VAE (Kandinsky 6's audio VAE) without its vocoder: "
                              "give it with --vocoder (diffusers' vocoder/ folder)", path=p)  # fmt: skip
        model = mmaudio.build(
            sd, _beside(p), read_state_dict(vpath), _beside(vpath), p, vpath, strict_load, _made
        )
        model.source = p
        return model
    if not is_ltx2_audio(sd):
        raise FormatError(
            f"{os.path.basename(p)} holds no audio VAE Loadout decodes: give LTX-2's checkpoint (audio_vae.* and "
            "vocoder.*) or diffusers' audio_vae/ weights of LTX-2, MiniMax-H3 or Kandinsky 6 (MMAudio)",
            path=p)  # fmt: skip
    meta = _meta(p) if p.endswith((".safetensors", ".sft")) else {}
    audio = _part(sd, "audio_vae.") if any(k.startswith("audio_vae.") for k in sd) else sd
    dec_cfg = decoder_config(audio, meta.get("audio_vae") or _beside(p), p)
    mean = next((audio[k] for k in (*_MEAN, *(f"decoder.{m}" for m in _MEAN)) if k in audio), None)
    std = next((audio[k] for k in (*_STD, *(f"decoder.{s}" for s in _STD)) if k in audio), None)
    vpath, vsd, vcfg = p, sd, meta.get("vocoder")
    if vocoder is not None or _vocoder_root(sd) is None:
        vpath = vocoder or _sibling_vocoder(p)
        if vpath is None:
            raise FormatError(f"{os.path.basename(p)} holds the audio VAE but no vocoder: give the vocoder's file "
                              "(--vocoder: the release's checkpoint holds it, diffusers' vocoder/ folder)", path=p)  # fmt: skip
        vsd = read_state_dict(vpath)
        vcfg = _meta(vpath).get("vocoder") if vpath.endswith((".safetensors", ".sft")) else None
        vcfg = vcfg or _beside(vpath)
    root = _vocoder_root(vsd)
    if root is None:
        raise FormatError(f"{vpath}: no vocoder (conv_pre / conv_in beside its upsamplers)", path=vpath)
    voc_sd = original_vocoder_names(_part(vsd, root))
    dec_sd = {
        "audio_vae." + k: v
        for k, v in audio.items()
        if k.startswith("decoder.") and "per_channel_statistics" not in k
    }
    with torch.device("meta"):
        model = _made(
            p,
            lambda: LTX2Audio(
                dec_cfg, vocoder_module(voc_sd, vcfg or {}, dec_cfg.sample_rate, dec_cfg.hop, vpath)
            ),
        )
    voc_sd = {"vocoder." + k: v for k, v in fill_filters(model.vocoder, voc_sd).items()}
    strict_load(model, {**dec_sd, **voc_sd}, p)
    if isinstance(model.vocoder, VocoderWithBWE):  # its resampler was made on the meta device with the model
        model.vocoder.make_resampler()
    # float32 whatever the file's dtype: LTX-2.3's vocoder loses its high band in bf16 (ComfyUI runs it under an
    # fp32 autocast); the ops cast each weight as they use it
    ops.set_compute_dtype(model, torch.float32)
    if mean is not None and std is not None:
        model.latent_stats = (mean, std)
    else:
        model.notes.append("the file keeps no latent statistics: the latent is decoded as it is")
    model.source = p
    return model


def load_sound_encoder(path: str) -> nn.Module:
    """The file's sound encoder: LTX-2's (engine.vae.ltx2_audio_encoder) or MiniMax-H3's
    (engine.vae.minimax_h3_audio_encoder); each has `mels(wave, rate)`, `forward` to its latent, `notes`."""
    from . import minimax_h3_audio_encoder as h3
    from .loading import _made, read_state_dict, strict_load
    from .ltx2_audio_encoder import load_encoder

    p = os.fspath(path)
    sd = read_state_dict(p)
    if minimax_h3_audio.is_minimax_h3_audio(sd):
        model = h3.build_encoder(sd, _beside(p), p, strict_load, _made)
        model.source = p
        return model
    return load_encoder(p, sd)
