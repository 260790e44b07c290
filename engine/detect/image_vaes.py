"""Image VAEs that are no AutoencoderKL though their names look like one: HunyuanImage 2.1's.

Facts (cited, not copied): diffusers `AutoencoderKLHunyuanImage` (`autoencoder_kl_hunyuanimage.py`) keeps its
ResnetBlocks and resamplers in one flat `decoder.up_blocks.N` list (an AutoencoderKL nests them as
`up_blocks.N.resnets.M` / `upsamplers.0`); an upsampler is a 3x3 conv to 4x the next width followed by
depth-to-space, so its weight is not square ([4096, 1024, 3, 3] in the release). The release (diffusers'
`scripts/convert_hunyuan_image_to_diffusers.py`): latent_channels 64, spatial_compression_ratio 32 (five
2x levels). Tencent's original names (`decoder.up.N.upsample.conv`, `decoder.mid.attn_1`) are LDM-like: there
the non-square upsample conv tells it from an AutoencoderKL's. Header only: names and shapes.
"""

from __future__ import annotations

import re

from .keys import KeyIndex
from .parts import Part
from .result import Evidence

_UP = (
    (re.compile(r"decoder\.up_blocks\.(\d+)\.conv\.weight"), "decoder.mid_block.attentions.0.proj.weight"),
    (re.compile(r"decoder\.up\.(\d+)\.upsample\.conv\.weight"), "decoder.mid.attn_1.proj_out.weight"),
)


def find_hunyuan_image_vaes(ix: KeyIndex) -> list[Part]:
    out = []
    for rx, attn in _UP:
        for p in ix.prefixes_for(attn):
            ups = [k for k in ix.with_prefix(p + "decoder.") if rx.fullmatch(k[len(p) :])]
            shapes = [ix.shape(k) for k in ups]
            if not ups or not all(s is not None and len(s) in (4, 5) and s[0] != s[1] for s in shapes):
                continue
            z = ix.dim(p + "decoder.conv_in.weight", 1)
            key, factor = ups[0], 2 ** len(ups)
            what = (f"resamplers straight in the decoder's block list, an upsample conv to 4x the next width "
                    f"(then depth-to-space), {z} latent channels, {len(ups)} 2x levels → {factor}x")  # fmt: skip
            release = z == 64 and factor == 32
            why = f"{what} → HunyuanImage 2.1's VAE" if release else f"{what}: no known release"
            part = Part(
                p, "vae", "image VAE", channels=z, architecture="hunyuan_image21" if release else None
            )
            part.evidence.append(Evidence(key, ix.shape(key), why))
            out.append(part)
    return out
