"""MiniMax-H3's audio VAE decoder: latent [2, 32, T] (the two stereo channels as a batch) to a 32 kHz waveform
[2, 1, 800 T], then stereo [1, 2, 800 T]. diffusers' AutoencoderKLMiniMaxH3Audio names (its only release naming:
`dec_in_proj`, `decoder.conv_pre`, `decoder.ups.N.0`, `decoder.resblocks.N.activations.M`, `decoder.activation_post`,
`decoder.conv_post`), on engine.vae.vocoder's generator.

Facts (diffusers `autoencoder_kl_minimax_h3_audio.py` and `modular_pipelines/minimax_h3/decoders.py`):
  * `dec_in_proj`, a 1x1 convolution from the 32 latent channels to 2048, then a BigVGAN v2 generator (AMPBlock1 with
    alias-free SnakeBeta activations, no activation before the upsamplers, no bias on conv_post) clamped to [-1, 1]:
    width 1024, upsample rates 5, 5, 2, 2, 2, 2, 2 (kernels 9, 9, 4, 4, 4, 4, 4), 800 samples a latent frame: 40 a
    second at 32 kHz;
  * every convolution is weight-normalised (`weight_g`, `weight_v`: torch's weight_norm over dim 0), folded here into
    one weight at load; each AMP block's activations alternate (`activations.2i` before convs1[i], `2i + 1` before
    convs2[i]);
  * the denoiser's audio rows [B, N, 32] are channel-major (the left channel's N / 2 rows, then the right's); the
    pipeline un-normalises them with the config's `latents_mean` / `latents_std` (32 values each, in config.json, not
    in the weights) before the decode.
"""

from __future__ import annotations

import torch
from torch import nn

from .. import ops
from ..errors import FormatError
from .vocoder import Vocoder, VocoderConfig, bigvgan_names, stage_bytes

# The release's upsampler strides by their kernels (diffusers' defaults: the release's config)
RELEASE_STRIDES = {(9, 9, 4, 4, 4, 4, 4): (5, 5, 2, 2, 2, 2, 2)}
CHANNELS = 2  # the release's sound is stereo, its VAE mono: the channels ride as a batch


class MiniMaxH3Audio(nn.Module):
    def __init__(self, z: int, width: int, cfg: VocoderConfig):
        super().__init__()
        self.dec_in_proj = ops.Conv1d(z, width, 1)
        self.decoder = Vocoder(cfg)
        self.latent_stats: tuple[torch.Tensor, torch.Tensor] | None = None
        self.notes: list[str] = []
        self.z = z

    @property
    def sample_rate(self) -> int:
        return self.decoder.cfg.sample_rate

    def describe(self) -> str:
        return "bigvgan"

    def latent(self, x: torch.Tensor, raw: bool = False) -> torch.Tensor:
        """The decoder's input [B x 2, z, T] from the denoiser's rows [B, N, z] (channel-major stereo) or the VAE's own
        [2 B, z, T]; un-normalised with the config's statistics unless `raw`."""
        if x.dim() != 3 or self.z not in (x.shape[1], x.shape[2]):
            raise FormatError(
                f"a MiniMax-H3 audio latent is [B, N, {self.z}] rows or [2 B, {self.z}, T], not {list(x.shape)}"
            )
        if x.shape[2] == self.z:  # rows
            b, n, _ = x.shape
            if n % CHANNELS:
                raise FormatError(f"{n} audio rows are not {CHANNELS} channels of whole latent frames")
            x = x.reshape(b * CHANNELS, n // CHANNELS, self.z).transpose(1, 2)
        elif x.shape[0] % CHANNELS:
            raise FormatError(f"a batch of {x.shape[0]} is not {CHANNELS} channels per clip")
        if not raw and self.latent_stats is not None:
            mean, std = self.latent_stats
            x = x * std.to(x).view(1, -1, 1) + mean.to(x).view(1, -1, 1)
        return x

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        wave = self.decoder.generate(self.dec_in_proj(z))  # [2 B, 1, samples]
        return wave.reshape(-1, CHANNELS, wave.shape[-1])

    def working_bytes(self, z: torch.Tensor) -> int:
        return z.shape[0] * stage_bytes(self.decoder.cfg, z.shape[2])


def is_minimax_h3_audio(sd: dict) -> bool:
    return "dec_in_proj.weight" in sd and any(k.startswith("decoder.conv_pre.") for k in sd)


def _fold(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """weight_norm's `weight_g` / `weight_v` as one `weight` = g v / |v| (the norm over every dim but the first)."""
    out = {}
    for k, v in sd.items():
        if k.endswith("weight_v"):
            g = sd[k[: -len("v")] + "g"].float()
            v = v.float()
            out[k[: -len("_v")]] = v * (g / v.flatten(1).norm(dim=1).view(-1, *(1,) * (v.dim() - 1)))
        elif not k.endswith("weight_g"):
            out[k] = v
    return out


def _original(k: str) -> str | None:
    """diffusers' decoder names -> engine.vae.vocoder's; None for what the decoder does not read."""
    if k.startswith("dec_in_proj."):
        return k
    return "decoder." + bigvgan_names(k[len("decoder.") :]) if k.startswith("decoder.") else None


def config_stats(model: nn.Module, cfg: dict, z: int, without: str) -> None:
    """The config.json's `latents_mean` / `latents_std` (z values each) as `model.latent_stats`, else a note saying so."""
    mean, std = cfg.get("latents_mean"), cfg.get("latents_std")
    if mean and std and len(mean) == len(std) == z:
        model.latent_stats = (torch.tensor(mean, dtype=torch.float32), torch.tensor(std, dtype=torch.float32))
    else:
        model.notes.append(f"no latents_mean / latents_std in a config.json beside the file: {without}")


def build(sd: dict[str, torch.Tensor], cfg: dict, path: str, strict_load, made) -> MiniMaxH3Audio:
    """The decoder of diffusers' file (its encoder left unread), weight norms folded, loaded strictly; the latent
    statistics from its config.json."""
    import re

    from .audio_loading import generator_config
    from .vocoder import fill_filters

    dec = {n: v for k, v in sd.items() if (n := _original(k)) is not None}
    dec = _fold(dec)
    width, z = dec["dec_in_proj.weight"].shape[:2]
    g = {k[len("decoder.") :]: v for k, v in dec.items() if k.startswith("decoder.")}
    ups = len({m.group(1) for k in g if (m := re.match(r"ups\.(\d+)\.weight", k))})
    kernels = tuple(g[f"ups.{i}.weight"].shape[2] for i in range(ups))
    rate = int(cfg.get("sampling_rate", 32000))
    facts = {"upsample_rates": cfg.get("decoder_rates") or RELEASE_STRIDES.get(kernels), "output_sample_rate": rate,
             "resblock_dilation_sizes": cfg.get("resblock_dilation_sizes"), "final_act_fn": "clamp"}  # fmt: skip
    vcfg = generator_config(g, "", {k: v for k, v in facts.items() if v is not None}, "", rate, 1, None, path)
    with torch.device("meta"):
        model = made(path, lambda: MiniMaxH3Audio(z, width, vcfg))
    filled = {"decoder." + k: v for k, v in fill_filters(model.decoder, g).items()}
    strict_load(model, {**filled, **{k: v for k, v in dec.items() if k.startswith("dec_in_proj.")}}, path)
    ops.set_compute_dtype(
        model, torch.float32
    )  # its DAC / BigVGAN stack degrades in bf16 (diffusers keeps it fp32)
    config_stats(model, cfg, z, "the latent is decoded as it is")
    return model
