"""Kandinsky 6's sound decoder: MMAudio's mel VAE (its decoder) and its BigVGAN v2 vocoder, latent [B, 40, T] to a
44.1 kHz mono waveform. diffusers' names (MMAudioVAE `vae.decoder.*`, `vae.data_mean` / `vae.data_std`; MMAudioVocoder
`conv_pre`, `ups.N.0`, `resblocks.N.activations.M`, `activation_post`, `conv_post`) on castable ops and
engine.vae.vocoder's generator.

Facts (diffusers `autoencoder_mmaudio.py`, `mmaudio_vocoder.py`, `pipelines/kandinsky6/pipeline_kandinsky6_ti2va.py`;
MMAudio, hkchengrex/MMAudio `ext/autoencoder`):
  * a 1-D decoder over mel frames built of "magnitude-preserving" layers (Karras et al., EDM2): convolutions without
    bias whose weights are applied as stored, SiLU / 0.596, residual sums lerp(x, h, 0.3) / sqrt(0.3^2 + 0.7^2), each
    resnet's input normalised per frame to unit RMS over the channels (+1e-4), activations clipped to +-256;
  * conv_in, a middle block (resnet, one-head attention over the frames with q, k and v normalised likewise, resnet),
    levels from the widest down, each of layers + 1 resnets, a nearest 2x upsample in time where the weights have one
    (the release: one, after the second level), then conv_out of SiLU with the gain `learnable_gain + 1`, and the mel
    statistics (`data_std`, `data_mean`: 128 bins) put back;
  * the release (MMAudioVAE's defaults): 128 mels, latent 40, width 512 x (1, 2, 4), 2 layers; the vocoder width 1536,
    upsample rates 8, 4, 2, 2, 2, 2 (kernels 16, 8, 4, 4, 4, 4): 512 samples a mel frame, 1024 a latent frame, at
    44.1 kHz; clamped to [-1, 1], no bias on conv_post;
  * the denoiser's audio tokens [B, T, 40] are the latent times the VAE config's `scaling_factor` (0.417): the
    pipeline divides by it before the decode.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from ..errors import FormatError
from .vocoder import Vocoder, stage_bytes

CLIP = 256.0
RELEASE_STRIDES = {(16, 8, 4, 4, 4, 4): (8, 4, 2, 2, 2, 2)}  # MMAudioVocoder's defaults: the release's
SCALING = 0.417  # MMAudioVAE's default scaling_factor


def _unit(x: torch.Tensor, dim: int) -> torch.Tensor:
    """x over (1e-4 + its RMS along `dim`): EDM2's normalize for one axis."""
    n = torch.linalg.vector_norm(x, dim=dim, keepdim=True, dtype=torch.float32)
    return x / (1e-4 + n / math.sqrt(x.shape[dim])).to(x.dtype)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return F.silu(x) / 0.596


def _sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.lerp(b, 0.3) / math.sqrt(0.7**2 + 0.3**2)


def _conv(cin: int, cout: int, k: int) -> ops.Conv1d:
    return ops.Conv1d(cin, cout, k, padding=k // 2, bias=False)


class Resnet(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1, self.conv2 = _conv(cin, cout, 3), _conv(cout, cout, 3)
        if cin != cout:
            self.nin_shortcut = _conv(cin, cout, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _unit(x, 1)
        h = self.conv2(_silu(self.conv1(_silu(x))))
        return _sum(self.nin_shortcut(x) if hasattr(self, "nin_shortcut") else x, h)


class Attention(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.qkv, self.proj_out = _conv(c, 3 * c, 1), _conv(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, t = x.shape
        q, k, v = _unit(self.qkv(x).reshape(b, 1, c, 3, t), 2).unbind(3)  # channel i of q is row 3i of qkv
        o = F.scaled_dot_product_attention(*(a.transpose(2, 3) for a in (q, k, v)))
        return _sum(x, self.proj_out(o.transpose(2, 3).reshape(b, c, t)))


class Upsample(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = _conv(c, c, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest-exact"))


class Mid(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.block_1, self.attn_1, self.block_2 = Resnet(c, c), Attention(c), Resnet(c, c)


class Level(nn.Module):
    def __init__(self, widths: list[tuple[int, int]], up: bool):
        super().__init__()
        self.block = nn.ModuleList(Resnet(a, b) for a, b in widths)
        if up:
            self.upsample = Upsample(widths[-1][1])


class MelDecoder(nn.Module):
    """`levels`: per level from the output end, its resnets' (in, out) widths and whether it upsamples after them."""

    def __init__(self, z: int, top: int, mels: int, levels: list[tuple[list[tuple[int, int]], bool]]):
        super().__init__()
        self.conv_in = _conv(z, top, 3)
        self.mid = Mid(top)
        self.up = nn.ModuleList(Level(w, up) for w, up in levels)
        self.conv_out = _conv(levels[0][0][-1][1], mels, 3)
        self.learnable_gain = nn.Parameter(torch.empty(()), requires_grad=False)
        self.ups = sum(up for _, up in levels)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        h = self.mid.block_1(self.conv_in(z))
        h = self.mid.block_2(self.mid.attn_1(h)).clamp(-CLIP, CLIP)
        for level in reversed(self.up):
            for block in level.block:
                h = block(h).clamp(-CLIP, CLIP)
            if hasattr(level, "upsample"):
                h = level.upsample(h)
            ops.check_cancelled()
        return self.conv_out(_silu(h)) * (self.learnable_gain.to(h) + 1)


class MMAudio(nn.Module):
    """`vae.decoder` and its mel statistics, and the `vocoder` (a second file's, in diffusers' folders)."""

    def __init__(self, decoder: MelDecoder, mels: int, vocoder: Vocoder):
        super().__init__()
        self.vae = nn.Module()
        self.vae.decoder = decoder
        self.vae.register_buffer("data_mean", torch.empty(1, mels, 1))
        self.vae.register_buffer("data_std", torch.empty(1, mels, 1))
        self.vocoder = vocoder
        self.scaling = SCALING
        self.notes: list[str] = []
        self.z = decoder.conv_in.in_channels

    @property
    def sample_rate(self) -> int:
        return self.vocoder.cfg.sample_rate

    def describe(self) -> str:
        return "bigvgan"

    def latent(self, x: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """[B, z, T] from the denoiser's tokens [B, T, z] (its `audio_hidden_states`) or the VAE's own [B, z, T]; divided
        by the scaling factor unless `raw`."""
        if x.dim() != 3 or self.z not in (x.shape[1], x.shape[2]):
            raise FormatError(
                f"a Kandinsky 6 audio latent is [B, T, {self.z}] tokens or [B, {self.z}, T], not {list(x.shape)}"
            )
        if x.shape[2] == self.z and x.shape[1] != self.z:
            x = x.transpose(1, 2)
        return x if raw else x / self.scaling

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        mel = self.vae.decoder(z) * self.vae.data_std.to(z) + self.vae.data_mean.to(z)
        return self.vocoder.generate(mel)  # [B, 1, samples]: mono

    def working_bytes(self, z: torch.Tensor) -> int:
        dec = self.vae.decoder
        frames = z.shape[2] * 2**dec.ups
        widest = 16 * dec.conv_in.out_channels * frames  # ~4 maps of the widest level at the mel rate
        return z.shape[0] * max(widest, stage_bytes(self.vocoder.cfg, frames))


def is_mmaudio(sd: dict) -> bool:
    return "vae.decoder.conv_in.weight" in sd and "vae.data_mean" in sd


def decoder_levels(sd: dict, path: str) -> list[tuple[list[tuple[int, int]], bool]]:
    import re

    n = len({m.group(1) for k in sd if (m := re.match(r"vae\.decoder\.up\.(\d+)\.block\.0\.", k))})
    if not n:
        raise FormatError(f"{path}: vae.decoder.up holds no levels", path=path)
    out = []
    for i in range(n):
        p = f"vae.decoder.up.{i}."
        m = len({x.group(1) for k in sd if (x := re.match(re.escape(p) + r"block\.(\d+)\.conv1\.", k))})
        shapes = [sd[f"{p}block.{j}.conv1.weight"].shape for j in range(m)]
        widths = [(s[1], s[0]) for s in shapes]
        out.append((widths, f"{p}upsample.conv.weight" in sd))
    return out


def build(sd: dict, cfg: dict, vsd: dict, vcfg: dict, path: str, vpath: str, strict_load, made) -> MMAudio:
    """The decoder of diffusers' audio_vae/ file (its encoder and mel front end left unread) and the vocoder of its
    vocoder/ file, loaded strictly; the scaling factor from the VAE's config.json (else the release's 0.417)."""
    from .audio_loading import generator_config
    from .vocoder import bigvgan_names, fill_filters

    dec = {k: v for k, v in sd.items() if k.startswith(("vae.decoder.", "vae.data_"))}
    top, z = dec["vae.decoder.conv_in.weight"].shape[:2]
    mels = dec["vae.decoder.conv_out.weight"].shape[0]
    levels = decoder_levels(dec, path)
    voc = {bigvgan_names(k): v for k, v in vsd.items()}
    ups = sum(1 for k in voc if k.startswith("ups.") and k.endswith(".weight"))
    kernels = tuple(voc[f"ups.{i}.weight"].shape[2] for i in range(ups))
    rate = int(cfg.get("sample_rate", vcfg.get("sample_rate", 44100)))
    facts = {"upsample_rates": vcfg.get("upsample_rates") or RELEASE_STRIDES.get(kernels), "output_sample_rate": rate,
             "resblock_dilation_sizes": vcfg.get("resblock_dilation_sizes"), "final_act_fn": "clamp"}  # fmt: skip
    gcfg = generator_config(
        voc, "", {k: v for k, v in facts.items() if v is not None}, "", rate, 1, None, vpath
    )
    if gcfg.mel_in != mels:
        raise FormatError(f"{vpath}: the vocoder takes {gcfg.mel_in} mels, the VAE makes {mels}", path=vpath)
    with torch.device("meta"):
        model = made(path, lambda: MMAudio(MelDecoder(z, top, mels, levels), mels, Vocoder(gcfg)))
    voc = {"vocoder." + k: v for k, v in fill_filters(model.vocoder, voc).items()}
    strict_load(model, {**dec, **voc}, path)
    ops.set_compute_dtype(model, torch.float32)
    model.scaling = float(cfg.get("scaling_factor", SCALING))
    return model
