"""LTX-2's vocoders, mel spectrogram to waveform, on castable ops in Lightricks' names (`vocoder.conv_pre`, `.ups.N`,
`.resblocks.N`, `.conv_post`; engine.vae.audio_loading renames diffusers' `conv_in`, `upsamplers`, `resnets`,
`conv_out`, `act_out`, `downsample.filter`):
  * LTX-2.0: HiFi-GAN (jik876/hifi-gan's generator: ResBlock1 / ResBlock2, leaky ReLU 0.1 before each upsampler and
    around every convolution, a plain leaky ReLU (slope 0.01) before conv_post, tanh at the end), 16 kHz mel frames
    of hop 160 to 24 kHz: upsample_rates 6, 5, 2, 2, 2 (kernels 16, 15, 8, 4, 4), width 1024;
  * LTX-2.3: BigVGAN v2 (NVIDIA/BigVGAN's AMPBlock1: Snake / SnakeBeta activations with log-scale alpha and beta,
    each anti-aliased -- upsampled 2x by a Kaiser-windowed sinc, activated, low-passed and decimated; no activation
    before the upsamplers), then a bandwidth extension: the 16 kHz waveform's own log-mel spectrogram (a causal STFT
    as a convolution with the file's windowed DFT basis, the file's mel filterbank) through a second BigVGAN whose
    output is added to the waveform resampled 3x (a Hann-windowed sinc), clamped to [-1, 1]: 48 kHz.
Facts from diffusers `pipelines/ltx2/vocoder.py` (LTX2Vocoder, LTX2VocoderWithBWE), ComfyUI
`comfy/ldm/lightricks/vocoders/vocoder.py` (the metadata config's names: upsample_rates, resblock "1" / "2" / "AMP1",
activation, use_bias_at_final, ...) and diffusers `convert_ltx2_to_diffusers.py` (the releases' configs).

Each upsampler's stride is not in the weights (its kernel is): the config says it, else the release whose kernels
these are (`RELEASE_STRIDES`). Everything runs in float32, as ComfyUI runs the BWE vocoder: its 108 convolutions in
bf16 lose the high band.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops

LRELU = 0.1  # HiFi-GAN's slope inside its blocks and before each upsampler
# The releases' upsampler strides by their kernels (diffusers convert_ltx2_to_diffusers): LTX-2.0's HiFi-GAN, LTX-2.3's
# BigVGAN and its bandwidth extender
RELEASE_STRIDES = {
    (16, 15, 8, 4, 4): (6, 5, 2, 2, 2),
    (11, 4, 4, 4, 4, 4): (5, 2, 2, 2, 2, 2),
    (12, 11, 4, 4, 4): (6, 5, 2, 2, 2),
}
DILATIONS = (
    (1, 3, 5),
    (1, 3, 5),
    (1, 3, 5),
)  # HiFi-GAN V1's and BigVGAN's resblock dilations (every release)


@dataclass(frozen=True)
class VocoderConfig:
    mel_in: int  # conv_pre's input: mel bins x audio channels (128: stereo 64-bin mels)
    width: int  # upsample_initial_channel
    kernels: tuple[int, ...]  # each upsampler's kernel
    strides: tuple[int, ...]
    res_kernels: tuple[int, ...]
    dilations: tuple[tuple[int, ...], ...]
    block: str  # "1" / "2" (HiFi-GAN) or "AMP1" (BigVGAN v2)
    activation: str  # AMP1's: snake | snakebeta
    out_ch: int
    final: str | None  # tanh | clamp | None
    final_bias: bool
    sample_rate: int  # of the waveform out

    @property
    def hop(self) -> int:
        return math.prod(self.strides)


class ConvTranspose1d(ops.FromFile, nn.ConvTranspose1d):
    """An upsampler: torch's transposed convolution on the castable op's cast (and patched) weight."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.compute_dtype is not None:
            x = x.to(self.compute_dtype)
        w, b = self.cast_params(x)
        return F.conv_transpose1d(
            x, w, b, self.stride, self.padding, self.output_padding, self.groups, self.dilation
        )


def kaiser_sinc(cutoff: float, half_width: float, size: int) -> torch.Tensor:
    """BigVGAN's Kaiser-windowed sinc low-pass (its alias-free-torch filter), normalised to sum 1."""
    half = size // 2
    a = 2.285 * (half - 1) * math.pi * 4 * half_width + 7.95
    beta = 0.1102 * (a - 8.7) if a > 50 else 0.5842 * (a - 21) ** 0.4 + 0.07886 * (a - 21) if a >= 21 else 0.0
    window = torch.kaiser_window(size, beta=beta, periodic=False)
    t = torch.arange(-half, half) + 0.5 if size % 2 == 0 else torch.arange(size) - half
    f = 2 * cutoff * window * torch.sinc(2 * cutoff * t)
    return (f / f.sum()).view(1, 1, size)


def hann_sinc(ratio: int, zeros: int = 6, rolloff: float = 0.99) -> tuple[torch.Tensor, int]:
    """The BWE's resampler: a Hann-windowed sinc interpolator for `ratio`x (torchaudio's default parameters, as
    ComfyUI's and diffusers' UpSample1d write it), and its half width in input samples."""
    width = math.ceil(zeros / rolloff)
    t = (torch.arange(2 * width * ratio + 1) / ratio - width) * rolloff
    window = torch.cos(t.clamp(-zeros, zeros) * math.pi / zeros / 2) ** 2
    return (torch.sinc(t) * window * rolloff / ratio).view(1, 1, -1), width


def upsample(
    x: torch.Tensor, filt: torch.Tensor, ratio: int, pad: int, left: int, right: int
) -> torch.Tensor:
    """Zero-stuff by `ratio` and low-pass with `filt` (a transposed convolution), borders replicated."""
    c = x.shape[1]
    y = ratio * F.conv_transpose1d(
        F.pad(x, (pad, pad), mode="replicate"), filt.to(x).expand(c, -1, -1), stride=ratio, groups=c
    )
    return y[..., left:-right]


class Snake(nn.Module):
    """x + 1 / (b + 1e-9) sin^2(a x), a = exp(alpha), b = exp(beta) (or a: Snake), per channel."""

    def __init__(self, c: int, beta: bool):
        super().__init__()
        self.alpha = nn.Parameter(torch.empty(c), requires_grad=False)
        if beta:
            self.beta = nn.Parameter(torch.empty(c), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.alpha.to(x).exp()[:, None]
        b = self.beta.to(x).exp()[:, None] if hasattr(self, "beta") else a
        return x + torch.sin(x * a).pow(2) / (b + 1e-9)


class LowPass(nn.Module):
    def __init__(self, size: int = 12):
        super().__init__()
        self.register_buffer("filter", torch.empty(1, 1, size))


class Down(nn.Module):
    def __init__(self, size: int = 12):
        super().__init__()
        self.lowpass = LowPass(size)


class Up(nn.Module):
    def __init__(self, size: int = 12):
        super().__init__()
        self.register_buffer("filter", torch.empty(1, 1, size))


class AntiAliased(nn.Module):
    """BigVGAN's Activation1d: 2x up (Kaiser sinc), the activation, low-pass and 2x down; replicated borders."""

    RATIO = 2

    def __init__(self, c: int, beta: bool, size: int = 12):
        super().__init__()
        self.act = Snake(c, beta)
        self.upsample = Up(size)
        self.downsample = Down(size)
        r = self.RATIO
        self.pad = size // r - 1
        self.left = self.pad * r + (size - r) // 2
        self.right = self.pad * r + (size - r + 1) // 2
        self.down_pad = (size // 2 - (size % 2 == 0), size // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(upsample(x, self.upsample.filter, self.RATIO, self.pad, self.left, self.right))
        c = x.shape[1]
        f = self.downsample.lowpass.filter.to(x).expand(c, -1, -1)
        return F.conv1d(F.pad(x, self.down_pad, mode="replicate"), f, stride=self.RATIO, groups=c)


def _same(c: int, k: int, d: int) -> ops.Conv1d:
    return ops.Conv1d(c, c, k, dilation=d, padding=d * (k - 1) // 2)


class ResBlock(nn.Module):
    """HiFi-GAN's ResBlock1 (`convs1` dilated, `convs2` not) or ResBlock2 (`convs` only), or BigVGAN's AMPBlock1
    (ResBlock1's convolutions, each after an anti-aliased Snake: `acts1`, `acts2`)."""

    def __init__(self, cfg: VocoderConfig, c: int, k: int, dilations: tuple[int, ...]):
        super().__init__()
        self.kind = cfg.block
        if cfg.block == "2":
            self.convs = nn.ModuleList(_same(c, k, d) for d in dilations)
            return
        self.convs1 = nn.ModuleList(_same(c, k, d) for d in dilations)
        self.convs2 = nn.ModuleList(_same(c, k, 1) for _ in dilations)
        if cfg.block == "AMP1":
            beta = cfg.activation == "snakebeta"
            self.acts1 = nn.ModuleList(AntiAliased(c, beta) for _ in dilations)
            self.acts2 = nn.ModuleList(AntiAliased(c, beta) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.kind == "2":
            for conv in self.convs:
                x = x + conv(F.leaky_relu(x, LRELU))
            return x
        amp = self.kind == "AMP1"
        for i, (c1, c2) in enumerate(zip(self.convs1, self.convs2, strict=True)):
            h = c1(self.acts1[i](x) if amp else F.leaky_relu(x, LRELU))
            x = x + c2(self.acts2[i](h) if amp else F.leaky_relu(h, LRELU))
        return x


class Vocoder(nn.Module):
    """mel [B, C, T, bins] (C audio channels) -> waveform [B, out_ch, T * hop]."""

    def __init__(self, cfg: VocoderConfig):
        super().__init__()
        self.cfg = cfg
        self.conv_pre = ops.Conv1d(cfg.mel_in, cfg.width, 7, padding=3)
        widths = [cfg.width // 2**i for i in range(len(cfg.kernels) + 1)]
        self.ups = nn.ModuleList(
            ConvTranspose1d(widths[i], widths[i + 1], k, s, padding=(k - s) // 2)
            for i, (k, s) in enumerate(zip(cfg.kernels, cfg.strides, strict=True))
        )
        self.resblocks = nn.ModuleList(
            ResBlock(cfg, widths[i + 1], k, d)
            for i in range(len(cfg.kernels))
            for k, d in zip(cfg.res_kernels, cfg.dilations, strict=True)
        )
        if cfg.block == "AMP1":
            self.act_post = AntiAliased(widths[-1], cfg.activation == "snakebeta")
        self.conv_post = ops.Conv1d(widths[-1], cfg.out_ch, 7, padding=3, bias=cfg.final_bias)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        return self.generate(mel.transpose(2, 3).flatten(1, 2))  # channels outer, mel bins inner

    def generate(self, x: torch.Tensor) -> torch.Tensor:
        """features [B, mel_in, T] -> waveform [B, out_ch, T * hop]."""
        x = self.conv_pre(x)
        n = len(self.cfg.res_kernels)
        amp = self.cfg.block == "AMP1"
        for i, up in enumerate(self.ups):
            x = up(x if amp else F.leaky_relu(x, LRELU))
            blocks = self.resblocks[i * n : (i + 1) * n]
            x = sum(b(x) for b in blocks) / n
            ops.check_cancelled()
        x = self.conv_post(self.act_post(x) if amp else F.leaky_relu(x, 0.01))
        if self.cfg.final == "tanh":
            return torch.tanh(x)
        return x.clamp(-1, 1) if self.cfg.final == "clamp" else x


@dataclass(frozen=True)
class BWEConfig:
    hop: int  # of the STFT over the first stage's waveform
    win: int
    rate_in: int
    rate_out: int


class STFT(nn.Module):
    def __init__(self, n_fft: int):
        super().__init__()
        n = n_fft // 2 + 1
        self.register_buffer("forward_basis", torch.empty(2 * n, 1, n_fft))
        self.register_buffer("inverse_basis", torch.empty(2 * n, 1, n_fft))


class MelSTFT(nn.Module):
    """The causal log-mel spectrogram the extender was trained on: the file's Hann-windowed DFT basis and mel
    filterbank (kept in the checkpoint, so the mels are those of training)."""

    def __init__(self, n_fft: int, mels: int):
        super().__init__()
        self.stft_fn = STFT(n_fft)
        self.register_buffer("mel_basis", torch.empty(mels, n_fft // 2 + 1))

    def forward(self, y: torch.Tensor, hop: int, win: int) -> torch.Tensor:
        """y [N, samples] -> log mel [N, mels, frames]; left padding only (no look-ahead)."""
        spec = F.conv1d(
            F.pad(y[:, None], (max(0, win - hop), 0)), self.stft_fn.forward_basis.to(y), stride=hop
        )
        n = spec.shape[1] // 2
        mag = torch.sqrt(spec[:, :n] ** 2 + spec[:, n:] ** 2)
        return torch.log(torch.clamp(self.mel_basis.to(mag) @ mag, min=1e-5))


class VocoderWithBWE(nn.Module):
    """LTX-2.3's pair: `vocoder` (mel -> 16 kHz), then `bwe_generator` over that waveform's log mel, added to it
    resampled (`rate_out / rate_in` x), clamped and cut to the output's length."""

    def __init__(self, low: VocoderConfig, high: VocoderConfig, bwe: BWEConfig, n_fft: int, mels: int):
        super().__init__()
        self.cfg, self.bwe = high, bwe
        self.vocoder = Vocoder(low)
        self.bwe_generator = Vocoder(high)
        self.mel_stft = MelSTFT(n_fft, mels)
        self.ratio = bwe.rate_out // bwe.rate_in
        self.register_buffer("resampler", torch.empty(1, 1, 1), persistent=False)
        self.make_resampler()

    def make_resampler(self) -> None:
        """The Hann sinc of the skip path (computed, not in the file: diffusers' and ComfyUI's is not persistent). On
        the CPU even while the model is built on the meta device: there its ops' meta kernels import sympy and 800
        other modules, 2.4 s of a process's first sound decode (measured), for a filter of a few dozen taps."""
        with torch.device("cpu"):
            filt, self.width = hann_sinc(self.ratio)
        self.resampler = filt.to(self.mel_stft.mel_basis.device)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.vocoder(mel)
        b, c, n = x.shape
        if n % self.bwe.hop:
            x = F.pad(x, (0, self.bwe.hop - n % self.bwe.hop))
        m = self.mel_stft(x.flatten(0, 1), self.bwe.hop, self.bwe.win)
        residual = self.bwe_generator(m.unflatten(0, (b, c)).transpose(2, 3))
        r, w = self.ratio, self.width
        skip = upsample(x, self.resampler, r, w, 2 * w * r, self.resampler.shape[-1] - r)
        return torch.clamp(residual + skip, -1, 1)[..., : n * self.bwe.rate_out // self.bwe.rate_in]


def bigvgan_names(k: str) -> str:
    """BigVGAN's own generator names (NVIDIA/BigVGAN, as MiniMax-H3's and MMAudio's diffusers classes keep them) as
    this module's: `ups.N.0.` (one-element lists) -> `ups.N.`, each AMP block's interleaved `activations.M` ->
    `acts1.M/2` (even M) / `acts2.M/2` (odd), `activation_post` -> `act_post`."""
    parts = k.split(".")
    if parts[0] == "ups" and len(parts) > 3 and parts[2] == "0":
        del parts[2]
    elif parts[0] == "resblocks" and len(parts) > 3 and parts[2] == "activations":
        m = int(parts[3])
        parts[2:4] = ["acts1" if m % 2 == 0 else "acts2", str(m // 2)]
    elif parts[0] == "activation_post":
        parts[0] = "act_post"
    return ".".join(parts)


def fill_filters(model: nn.Module, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The anti-aliasing filters a file leaves out, computed (BigVGAN's Kaiser sinc at cutoff 0.5 / 2, half width
    0.6 / 2); those the file keeps are used as kept (bf16-rounded in the release, as trained)."""
    out = dict(sd)
    for name, buf in model.state_dict().items():
        if name.endswith("filter") and name not in out:
            out[name] = kaiser_sinc(0.25, 0.3, buf.shape[-1])
    return out


def stage_bytes(cfg: VocoderConfig, frames: int) -> int:
    """A generator's widest float32 stage from `frames` input frames: its width x samples there, times the widest
    resblock kernel + 7 -- a fit, not a count of maps (the stage's input, the resblocks' running sum and a block's
    intermediates live together; an anti-aliased activation runs at twice the samples). Against a fresh process's RSS
    peak at the releases' widths, 10 s of sound, CPU: LTX-2.0's HiFi-GAN 526 MiB estimated / 516 measured, LTX-2.3's
    BigVGAN and extender 526 / 518 (engine.vae.audio_loading LTX2Audio.working_bytes)."""
    widest, c, n = 0, cfg.width, frames
    k = max(cfg.res_kernels)
    for s in cfg.strides:
        c, n = c // 2, n * s
        widest = max(widest, c * n * (7 + k))
    return 4 * widest
