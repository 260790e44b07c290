"""The TAESD family (taesd, taesdxl, taesd3, taef1, taef2): tiny distilled autoencoders that share the
latent API of a full VAE — fast approximate decode/encode and live previews.

Architecture facts from madebyollin/taesd (`taesd.py`, MIT): 3x3 convs with padding 1; Block =
conv, ReLU, conv, ReLU, conv, plus a 1x1 skip (no bias) when channels change, then ReLU of the sum;
the decoder starts with a soft clamp tanh(x / 3) * 3, then conv(latent, 64), ReLU, and three levels of
(3 Blocks, nearest x2 upsample, conv without bias), one Block and conv(64, 3); the encoder is conv(3,
64), Block, then three levels of (stride-2 conv without bias, 3 Blocks), and conv(64, latent). Layer
indices are nn.Sequential positions, which is how the checkpoints name their keys ("3.conv.0.weight").
TAEF2 ("flux_2" variant) adds to the Blocks at latent resolution a residual branch `pool` = 1x1 conv
(64 -> 256, no bias), GroupNorm(4 groups, 256), ReLU, 1x1 conv (256 -> 64, no bias) applied before the
Block (x = x + pool(x)). Images are in [0, 1]; the latents are the diffusion model's (ComfyUI feeds
TAESD `(vae_latent - shift) * scale`), so this wrapper converts from and to VAE space.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops
from .latent_formats import LATENT_FORMATS, LatentFormat

WIDTH = 64


def conv(cin: int, cout: int, **kw) -> ops.Conv2d:
    return ops.Conv2d(cin, cout, 3, padding=1, **kw)


class Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class Block(nn.Module):
    def __init__(self, c: int, mid_gn: bool = False):
        super().__init__()
        self.conv = nn.Sequential(conv(c, c), nn.ReLU(), conv(c, c), nn.ReLU(), conv(c, c))
        self.pool = None
        if mid_gn:
            self.pool = nn.Sequential(
                ops.Conv2d(c, 4 * c, 1, bias=False),
                ops.GroupNorm(4, 4 * c),
                nn.ReLU(),
                ops.Conv2d(4 * c, c, 1, bias=False),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pool is not None:
            x = x + self.pool(x)
        return F.relu(self.conv(x) + x)


def build_decoder(latent_channels: int, mid_gn: bool) -> nn.Sequential:
    layers: list[nn.Module] = [Clamp(), conv(latent_channels, WIDTH), nn.ReLU()]
    for level in range(3):
        layers += [Block(WIDTH, mid_gn and level == 0) for _ in range(3)]
        layers += [nn.Upsample(scale_factor=2), conv(WIDTH, WIDTH, bias=False)]
    layers += [Block(WIDTH), conv(WIDTH, 3)]
    return nn.Sequential(*layers)


def build_encoder(latent_channels: int, mid_gn: bool) -> nn.Sequential:
    layers: list[nn.Module] = [conv(3, WIDTH), Block(WIDTH)]
    for level in range(3):
        layers += [conv(WIDTH, WIDTH, stride=2, bias=False)]
        layers += [Block(WIDTH, mid_gn and level == 2) for _ in range(3)]
    layers += [conv(WIDTH, latent_channels)]
    return nn.Sequential(*layers)


# Where the latent-resolution part begins/ends: decoder layers [0, 6) run on the whole latent (they
# hold TAEF2's GroupNorms), the rest is tiled; encoder layers [0, 11) are tiled, [11, end) run whole.
DECODER_HEAD = 6
ENCODER_TILED = 11


class TAESD(nn.Module):
    """A TAESD-family encoder and/or decoder, speaking VAE-space latents like AutoencoderKL."""

    kind = "vae_approx"
    downscale = 8
    image_range = (0.0, 1.0)

    def __init__(self, name: str, latent_channels: int, mid_gn: bool, encoder: bool, decoder: bool):
        super().__init__()
        self.name = name
        self.fmt: LatentFormat = LATENT_FORMATS[_format_name(name, latent_channels)]
        self.mid_gn = mid_gn
        self._latent_channels = latent_channels
        if encoder:
            self.encoder = build_encoder(latent_channels, mid_gn)
        if decoder:
            self.decoder = build_decoder(latent_channels, mid_gn)

    @property
    def latent_channels(self) -> int:
        return self._latent_channels

    def decode_head(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder[:DECODER_HEAD](self.fmt.to_model(z))

    def decode_steps(self) -> list[tuple]:
        steps: list[tuple] = []
        for layer in self.decoder[DECODER_HEAD:]:
            steps.append(("up2",) if isinstance(layer, nn.Upsample) else ("module", layer))
        return steps

    def decode_tail(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def encode_head(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def encode_steps(self) -> list[tuple]:
        steps: list[tuple] = []
        for layer in self.encoder[:ENCODER_TILED]:
            steps.append(("module", layer))
            if isinstance(layer, ops.Conv2d) and layer.stride == (2, 2):
                steps.append(("scale", 0.5))
        return steps

    def encode_tail(self, h: torch.Tensor) -> torch.Tensor:
        return self.fmt.to_vae(self.encoder[ENCODER_TILED:](h))

    def decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.decoder[DECODER_HEAD:](self.decode_head(z))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode_tail(self.encoder[:ENCODER_TILED](x))


def _format_name(name: str, channels: int) -> str:
    from .latent_formats import DEFAULT_FOR_CHANNELS, TAESD_FORMATS

    return TAESD_FORMATS.get(name) or DEFAULT_FOR_CHANNELS[channels]
