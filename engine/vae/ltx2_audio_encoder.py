"""LTX-2's audio VAE encoder: a waveform to the normalised latent [B, 8, T, 16] its denoiser conditions on (audio-to-video,
or a clip's own sound). The release's names (`audio_vae.encoder.*`; diffusers' LTX2AudioEncoder keeps them).

Facts (diffusers `autoencoder_kl_ltx2_audio.py` LTX2AudioEncoder; ComfyUI `comfy/ldm/lightricks/vae/audio_vae.py`
AudioPreprocessor / AudioVAE.encode and `comfy/audio.py`, its torchaudio-derived DSP):
  * the front end: the waveform resampled to the VAE's rate (16 kHz: a Hann-windowed sinc, 6 zero crossings, rolloff
    0.99, as torchaudio's sinc_interp_hann), a magnitude STFT (Hann window of n_fft, centred frames with mirrored
    borders, hop 160) through a Slaney mel filterbank with area normalisation (64 bins, 0 to rate / 2), log(max(x,
    1e-5)), as [B, channels, frames, bins]; a mono clip feeds both channels;
  * the network: the decoder's blocks the other way round -- conv_in, levels of `num_res_blocks` resnets (an attention
    after each where the level has one), a stride-2 3x3 convolution after every level but the last (padded causally:
    two rows before, one column after), the middle block, norm, SiLU, conv_out to 2 z channels: the mean is the first
    z (the posterior's mode, as ComfyUI and the pipelines take it);
  * the latent is then normalised per (channel, bin) with the file's statistics: (x - mean) / std.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .ltx2_audio import Attention, Block, Mid, Resnet, _conv, _norm, run_blocks

N_FFT = 1024  # the release's STFT (its metadata: preprocessing.stft.filter_length; ComfyUI's default)


@dataclass(frozen=True)
class AudioEncoderConfig:
    z: int
    base: int
    in_ch: int
    levels: tuple[
        tuple[tuple[Block, ...], int, bool], ...
    ]  # per level from the input end: (blocks, attentions, down)
    mid_attn: bool
    norm: str
    top: int
    causal: bool = True
    axis: str = "height"
    n_fft: int = N_FFT


class Downsample(nn.Module):
    """A plain stride-2 3x3 convolution (no causal wrapper in the file), padded by the causal axis."""

    PADS = {
        "none": (0, 1, 0, 1),
        "width": (2, 0, 0, 1),
        "height": (0, 1, 2, 0),
        "width-compatibility": (1, 0, 0, 1),
    }

    def __init__(self, c: int, axis: str):
        super().__init__()
        self.conv = ops.Conv2d(c, c, 3, stride=2)
        self.pad = self.PADS[axis]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.pad(x, self.pad))


class Level(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig, blocks: tuple[Block, ...], attns: int, down: bool):
        super().__init__()
        self.block = nn.ModuleList(Resnet(cfg, b) for b in blocks)
        self.attn = nn.ModuleList(Attention(cfg, blocks[i].cout) for i in range(attns))
        if down:
            self.downsample = Downsample(blocks[-1].cout, cfg.axis if cfg.causal else "none")


class AudioEncoder(nn.Module):
    def __init__(self, cfg: AudioEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.conv_in = _conv(cfg, cfg.in_ch, cfg.base, 3)
        self.down = nn.ModuleList(Level(cfg, *lv) for lv in cfg.levels)
        self.mid = Mid(cfg)
        self.norm_out = _norm(cfg, cfg.top)
        self.conv_out = _conv(cfg, cfg.top, 2 * cfg.z, 3)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """log mels [B, channels, frames, bins] -> the posterior's mean [B, z, frames / 4, bins / 4]."""
        h = self.conv_in(mel)
        for level in self.down:
            h = run_blocks(level, h)
            if hasattr(level, "downsample"):
                h = level.downsample(h)
            ops.check_cancelled()
        h = self.conv_out(F.silu(self.norm_out(self.mid(h))))
        return h[:, : self.cfg.z]


def resample(x: torch.Tensor, orig: int, new: int, zeros: int = 6, rolloff: float = 0.99) -> torch.Tensor:
    """Band-limited resampling along the last axis: a Hann-windowed sinc of `zeros` crossings at `rolloff` of the lower
    Nyquist rate, one polyphase filter per output phase (torchaudio's sinc_interp_hann, as ComfyUI resamples)."""
    if orig == new:
        return x
    g = math.gcd(orig, new)
    orig, new = orig // g, new // g
    base = min(orig, new) * rolloff
    width = math.ceil(zeros * orig / base)
    idx = torch.arange(-width, width + orig, dtype=torch.float64)[None, None] / orig
    t = (torch.arange(0, -new, -1, dtype=torch.float64)[:, None, None] / new + idx) * base
    t = t.clamp(-zeros, zeros)
    window = torch.cos(t * math.pi / zeros / 2) ** 2
    kernel = (torch.sinc(t) * window * (base / orig)).to(x.dtype)
    n = x.shape[-1]
    flat = F.pad(x.reshape(-1, 1, n), (width, width + orig))
    out = F.conv1d(flat, kernel, stride=orig).transpose(1, 2).reshape(flat.shape[0], -1)
    return out[:, : (new * n + orig - 1) // orig].reshape(*x.shape[:-1], -1)


def slaney_mels(
    rate: int, n_fft: int, mels: int, f_min: float = 0.0, f_max: float | None = None
) -> torch.Tensor:
    """Slaney's mel filterbank with area normalisation, [bins, n_fft / 2 + 1] (librosa's default; ComfyUI's MelScale):
    linear below 1 kHz (200/3 Hz a mel), logarithmic above (27 mels an octave of 6.4)."""
    f_max = rate / 2 if f_max is None else f_max
    step, knee, logstep = 200.0 / 3, 1000.0, math.log(6.4) / 27.0

    def to_mel(f: float) -> float:
        return knee / step + math.log(f / knee) / logstep if f >= knee else f / step

    m = torch.linspace(to_mel(f_min), to_mel(f_max), mels + 2, dtype=torch.float64)
    hz = torch.where(m >= knee / step, knee * torch.exp(logstep * (m - knee / step)), step * m)
    fft = torch.linspace(0, rate // 2, n_fft // 2 + 1, dtype=torch.float64)
    up = (fft[None, :] - hz[:-2, None]) / (hz[1:-1] - hz[:-2])[:, None]
    down = (hz[2:, None] - fft[None, :]) / (hz[2:] - hz[1:-1])[:, None]
    fb = torch.clamp(torch.minimum(up, down), min=0) * (2.0 / (hz[2:] - hz[:-2]))[:, None]
    return fb.float()


def log_mels(wave: torch.Tensor, rate: int, n_fft: int, hop: int, bins: int) -> torch.Tensor:
    """wave [B, C, N] at `rate` -> log mel magnitudes [B, C, frames, bins] (centred Hann frames, mirrored borders)."""
    b, c, n = wave.shape
    spec = torch.stft(wave.reshape(b * c, n), n_fft, hop, n_fft, torch.hann_window(n_fft, dtype=wave.dtype),
                      center=True, pad_mode="reflect", onesided=True, return_complex=True).abs()  # fmt: skip
    mel = slaney_mels(rate, n_fft, bins).to(spec) @ spec
    return torch.log(mel.clamp(min=1e-5)).reshape(b, c, bins, -1).transpose(2, 3)


def normalise(latent: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """(x - mean) / std per (channel, bin) of a [B, z, T, bins] latent (the inverse of ltx2_audio.denormalise)."""
    b, z, t, f = latent.shape
    flat = latent.permute(0, 2, 1, 3).reshape(b, t, z * f)
    flat = (flat - mean.to(flat)) / std.to(flat)
    return flat.reshape(b, t, z, f).permute(0, 2, 1, 3)


class LTX2AudioEncoder(nn.Module):
    """`audio_vae.encoder` of the release's names, its front end's facts and the latent statistics."""

    def __init__(self, cfg: AudioEncoderConfig, rate: int, hop: int, bins: int):
        super().__init__()
        self.audio_vae = nn.Module()
        self.audio_vae.encoder = AudioEncoder(cfg)
        self.rate, self.hop, self.bins = rate, hop, bins
        self.latent_stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self.notes: list[str] = []

    def mels(self, wave: torch.Tensor, rate: int) -> torch.Tensor:
        """A waveform [B, C, N] at `rate` as the encoder's input: resampled, its channels as the encoder takes them."""
        need = self.audio_vae.encoder.cfg.in_ch
        if wave.shape[1] != need:
            if wave.shape[1] != 1 and need != 1:
                from ..errors import FormatError

                raise FormatError(f"the audio VAE takes {need} channels, the sound has {wave.shape[1]}")
            wave = wave.expand(-1, need, -1) if wave.shape[1] == 1 else wave.mean(dim=1, keepdim=True)
        wave = resample(wave.float(), rate, self.rate)
        return log_mels(wave, self.rate, self.audio_vae.encoder.cfg.n_fft, self.hop, self.bins)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        z = self.audio_vae.encoder(mel)
        return normalise(z, *self.latent_stats) if self.latent_stats is not None else z


def encoder_config(sd: dict, cfg: dict, path: str) -> AudioEncoderConfig:
    """The encoder's structure from its `encoder.*` tensors (the release's names), the rest from the config."""

    from ..errors import FormatError
    from .audio_loading import _shape, read_levels

    causal = "encoder.conv_in.conv.weight" in sd
    w = ".conv.weight" if causal else ".weight"
    if f"encoder.conv_in{w}" not in sd:
        raise FormatError(f"{path}: the audio VAE's encoder is not in this file (decoder only?)", path=path)
    base, in_ch = _shape(sd, f"encoder.conv_in{w}")[:2]
    levels = read_levels(sd, "encoder.down.", w, "downsample.conv.weight", path)
    ddc = cfg.get("model", {}).get("params", {}) if isinstance(cfg.get("model"), dict) else {}
    dd = ddc.get("ddconfig", ddc.get("encoder", {})) if isinstance(ddc, dict) else {}
    stft = cfg.get("preprocessing", {}).get("stft", {}) if isinstance(cfg.get("preprocessing"), dict) else {}
    top = _shape(sd, f"encoder.conv_out{w}")[1]
    return AudioEncoderConfig(
        z=_shape(sd, f"encoder.conv_out{w}")[0] // 2, base=base, in_ch=in_ch, levels=levels,
        mid_attn="encoder.mid.attn_1.q.weight" in sd, norm="group" if "encoder.mid.block_1.norm1.weight" in sd else "pixel",
        top=top, causal=causal, axis=cfg.get("causality_axis", dd.get("causality_axis", "height")),
        n_fft=int(cfg.get("n_fft", stft.get("filter_length", N_FFT))),
    )  # fmt: skip


def load_encoder(path: str, sd: dict | None = None) -> LTX2AudioEncoder:
    """LTX-2's audio encoder from the release's checkpoint or diffusers' audio_vae/ weights, loaded strictly."""
    import os

    from ..errors import FormatError
    from .audio_loading import _MEAN, _STD, _beside, _meta, _part, decoder_config, is_ltx2_audio
    from .loading import _made, read_state_dict, strict_load

    sd = read_state_dict(path) if sd is None else sd
    if not is_ltx2_audio(sd):
        raise FormatError(f"{os.path.basename(path)} holds no audio VAE encoder Loadout runs (LTX-2's, MiniMax-H3's)",
                          path=path)  # fmt: skip
    audio = _part(sd, "audio_vae.") if any(k.startswith("audio_vae.") for k in sd) else sd
    meta = _meta(path) if path.endswith((".safetensors", ".sft")) else {}
    cfg = meta.get("audio_vae") or _beside(path)
    enc_cfg = encoder_config(audio, cfg, path)
    dec = decoder_config(audio, cfg, path)  # the rate, hop and bins its config (or the release) says
    with torch.device("meta"):
        model = _made(path, lambda: LTX2AudioEncoder(enc_cfg, dec.sample_rate, dec.hop, dec.mel_bins))
    strict_load(model, {"audio_vae." + k: v for k, v in audio.items() if k.startswith("encoder.")}, path)
    ops.set_compute_dtype(model, torch.float32)
    mean = next((audio[k] for k in _MEAN if k in audio), None)
    std = next((audio[k] for k in _STD if k in audio), None)
    if mean is not None and std is not None:
        model.latent_stats = (mean, std)
    else:
        model.notes.append(
            "the file keeps no latent statistics: the latent is written as the encoder makes it"
        )
    model.source = path
    return model
