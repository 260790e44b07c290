"""TAESD-family tiny autoencoders (vae_approx): taesd, taesdxl, taesd3, taef1, taef2.

Structure (madebyollin/taesd `taesd.py`, MIT): the encoder and decoder are plain nn.Sequential
stacks saved as separate files with numeric keys. A Block is conv.{0,2,4} (three 3x3 convs with ReLU
between) plus a 1x1 `skip` (no bias) when channels change. Encoder: 0 conv(3->64), 1 Block, then three
times [stride-2 conv without bias, 3 Blocks], then conv(64->latent) at 14. Decoder: 0 Clamp, 1
conv(latent->64), 2 ReLU, three times [3 Blocks, Upsample, conv without bias], 18 Block, 19 conv(64->3).
TAEF2 (FLUX.2, 32 latent channels) gives the Blocks of the deepest level a `pool` branch: 1x1 conv
64->256 (no bias), a 256-channel affine norm, 1x1 conv 256->64 (no bias) -- read from the real
taef2_encoder.pth / taef2_decoder.pth (madebyollin/taesd @ 5cccb12d).
diffusers AutoencoderTiny (`models/autoencoders/vae.py` EncoderTiny / DecoderTiny) keeps the same
stacks under encoder.layers.N / decoder.layers.N; its decoder has no Clamp module, so indices are one
lower.
"""

from __future__ import annotations

from ._build import Builder

CH = 64


def _block(b: Builder, key: str, cin: int, cout: int, pool: bool = False) -> None:
    b.conv(f"{key}.conv.0", cout, cin)
    b.conv(f"{key}.conv.2", cout, cout)
    b.conv(f"{key}.conv.4", cout, cout)
    if cin != cout:
        b.conv(f"{key}.skip", cout, cin, k=1, bias=False)
    if pool:
        b.conv(f"{key}.pool.0", 4 * cout, cout, k=1, bias=False)
        b.norm(f"{key}.pool.1", 4 * cout)
        b.conv(f"{key}.pool.3", cout, 4 * cout, k=1, bias=False)


def taesd_encoder(b: Builder, latent: int, *, pool: bool = False, key: str = "") -> None:
    b.conv(f"{key}0", CH, 3)
    _block(b, f"{key}1", CH, CH)
    n = 2
    for level in range(3):
        b.conv(f"{key}{n}", CH, CH, bias=False)
        for i in range(3):
            _block(b, f"{key}{n + 1 + i}", CH, CH, pool=pool and level == 2)
        n += 4
    b.conv(f"{key}{n}", latent, CH)


def taesd_decoder(b: Builder, latent: int, *, pool: bool = False, key: str = "", clamp: bool = True) -> None:
    o = 1 if clamp else 0  # index shift: taesd.py starts with a Clamp module, diffusers does not
    b.conv(f"{key}{o}", CH, latent)
    n = o + 2
    for level in range(3):
        for i in range(3):
            _block(b, f"{key}{n + i}", CH, CH, pool=pool and level == 0)
        b.conv(f"{key}{n + 4}", CH, CH, bias=False)  # after nn.Upsample at n + 3
        n += 5
    _block(b, f"{key}{n}", CH, CH)
    b.conv(f"{key}{n + 1}", 3, CH)


# latent channels: taesd / taesdxl 4 (SD1/SD2/SDXL latents), taesd3 / taef1 16 (SD3 and FLUX.1 VAEs),
# taef2 32 (FLUX.2) -- madebyollin/taesd README and the shapes of the released files.
FAMILY = {"taesd": 4, "taesdxl": 4, "taesd3": 16, "taef1": 16, "taef2": 32}
