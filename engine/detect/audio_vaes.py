"""Sound decoders, from the headers. LTX-2's: its audio VAE (a 2-D LDM-style decoder over mel spectrograms whose
convolutions are causal, wrapped as `conv.`) and its vocoder (HiFi-GAN for LTX-2.0, BigVGAN v2 with a bandwidth
extender for LTX-2.3). The release's checkpoint keeps them as `audio_vae.` and `vocoder.`; diffusers' folders
`audio_vae/` (AutoencoderKLLTX2Audio) and `vocoder/` (LTX2Vocoder, LTX2VocoderWithBWE: `conv_in`, `upsamplers`,
`resnets`). Facts from diffusers `autoencoder_kl_ltx2_audio.py`, `pipelines/ltx2/vocoder.py` and
`convert_ltx2_to_diffusers.py`. Kandinsky 6's: MMAudio's mel VAE (diffusers MMAudioVAE, `vae.decoder.*` and
`vae.data_mean`) and its BigVGAN vocoder (MMAudioVocoder: `ups.N.0`). engine.vae.audio_loading decodes them all.

A part's component is "vae" (a file of its own is all audio VAE, or all vocoder); beside a denoiser the checkpoint's
"vae" is its video VAE, so engine.detect.core claims these bytes as "other" there (DESIGN's component names).
"""

from __future__ import annotations

from .keys import KeyIndex
from .parts import Part
from .result import Evidence

AUDIO_WHAT = ("audio VAE", "vocoder")
# MMAudioVocoder's defaults, the release's kernels (strides 8, 4, 2, 2, 2, 2: 512 samples a mel frame)
MMAUDIO_KERNELS = (16, 8, 4, 4, 4, 4)
# The released vocoders' upsampler kernels (diffusers convert_ltx2_to_diffusers): LTX-2.0's HiFi-GAN; LTX-2.3's BigVGAN
RELEASE_KERNELS = {(16, 15, 8, 4, 4): "LTX-2.0's HiFi-GAN vocoder (24 kHz)",
                   (11, 4, 4, 4, 4, 4): "LTX-2.3's BigVGAN v2 vocoder (16 kHz, then its bandwidth extender: 48 kHz)"}  # fmt: skip


def _part(ix: KeyIndex, p: str, arch: str | None, z: int | None, key: str, why: str, what: str) -> Part:
    return Part(p, "vae", what, channels=z, architecture=arch, evidence=[Evidence(key, ix.shape(key), why)])


def find_audio_vaes(ix: KeyIndex) -> list[Part]:
    out = []
    for p in ix.prefixes_for("decoder.up.0.block.0.conv1.conv.weight"):
        key = p + "decoder.conv_in.conv.weight"
        shape = ix.shape(key)
        if shape is None or len(shape) != 4:
            continue
        z = shape[1]
        levels = ix.count_blocks(p + "decoder.up.")
        why = (f"a mel-spectrogram decoder of causal 2-D convolutions from {z} latent channels, {levels} levels "
               "→ LTX-2's audio VAE")  # fmt: skip
        out.append(
            _part(ix, p, "ltx2" if z == 8 else None, z, key, why if z == 8 else why + " layout", "audio VAE")
        )
    for p in ix.prefixes_for(
        "vae.decoder.mid.attn_1.qkv.weight"
    ):  # MMAudio's mel VAE (diffusers' MMAudioVAE)
        key = p + "vae.decoder.conv_in.weight"
        if ix.has(p + "vae.data_mean") and len(ix.shape(key) or ()) == 3:
            z, mels = ix.dim(key, 1), ix.dim(p + "vae.data_mean", 1)
            why = f"a magnitude-preserving 1-D mel VAE (MMAudio's): {z} latent channels, {mels} mels"
            good = (z, mels) == (40, 128)
            out.append(_part(ix, p, "kandinsky6" if good else None, z, key, why + (" → Kandinsky 6's audio VAE" if good else ""), "audio VAE"))  # fmt: skip
    return out + _vocoders(ix)


# The generators' upsampler names: Lightricks' and BigVGAN's `ups.N` (BigVGAN's own in one-element lists, `ups.N.0`),
# diffusers' `upsamplers.N`
_UPS = (("conv_pre.weight", "ups.{}.weight"), ("conv_pre.weight", "ups.{}.0.weight"), ("conv_in.weight", "upsamplers.{}.weight"))  # fmt: skip


def _vocoders(ix: KeyIndex) -> list[Part]:
    roots: dict[str, tuple[str, str]] = {}
    for head, ups in _UPS:
        # anchored on the first upsampler: a long suffix is a narrow slice of the suffix index, where
        # `conv_pre.weight` alone would match many keys of every file a scan detects
        for p in ix.prefixes_for(ups.format(0)):
            if not ix.has(p + head) or ix.has(_parent(p) + "dec_in_proj.weight"):  # not MiniMax-H3's decoder
                continue
            pair = p.endswith(("bwe_generator.", "vocoder.")) and ix.has(_parent(p) + "bwe_generator." + head)
            roots.setdefault(_parent(p) if pair else p, (head, ups))
    out = []
    for root, (head, ups) in roots.items():
        pair = ix.has(root + "bwe_generator." + head)
        first = root + ("vocoder." if pair else "")
        kernels: list[int] = []
        while ix.has(first + ups.format(len(kernels))):
            kernels.append(ix.dim(first + ups.format(len(kernels)), 2))
        key = first + head
        mel = ix.dim(key, 1)
        kind = "BigVGAN v2" if any(".act.alpha" in k for k in ix.with_prefix(first)) else "HiFi-GAN"
        why = f"a {kind} vocoder: {mel} mel features into upsamplers of kernels {kernels}"
        why += " and a bandwidth extender" if pair else ""
        known = RELEASE_KERNELS.get(tuple(kernels))
        arch = None
        if (
            known is not None and mel == 128 and pair == (kernels[0] == 11)
        ):  # 2.3's is the one with an extender
            arch, why = "ltx2", f"{why} → {known}"
        elif tuple(kernels) == MMAUDIO_KERNELS and mel == 128 and not pair:
            arch, why = "kandinsky6", f"{why} → MMAudio's BigVGAN vocoder (44.1 kHz), Kandinsky 6's"
        out.append(_part(ix, root, arch, None, key, why, "vocoder"))
    return out


def _parent(p: str) -> str:
    """`a.b.` -> `a.`; `b.` -> ``."""
    head = p[:-1].rpartition(".")[0]
    return head + "." if head else ""


def sound_part(detection) -> str | None:
    """ "vae" when a detection's evidence holds a sound decoder (the rules above, and MiniMax-H3's audio VAE in
    video_vaes.py): an audio VAE's 2-D mel decoder (`decoder.conv_in.conv` of 4 dims: LTX-2's video VAE's has 5),
    MiniMax-H3's `dec_in_proj` or MMAudio's 1-D `vae.decoder.conv_in`; "vocoder" for a vocoder alone (a 1-D
    `conv_pre` / `conv_in`: what turns an audio VAE's mels into sound, no decoder of latents itself); else None."""
    vocoder = False
    for e in detection.evidence:
        dims = len(e.shape) if e.shape is not None else 0
        if e.key.endswith("dec_in_proj.weight") or (
            e.key.endswith("decoder.conv_in.conv.weight") and dims == 4
        ):
            return "vae"
        if e.key.endswith("vae.decoder.conv_in.weight") and dims == 3:
            return "vae"
        vocoder |= e.key.endswith(("conv_pre.weight", "conv_in.weight")) and dims == 3
    return "vocoder" if vocoder else None


def encodes_sound(names) -> bool:
    """Whether a sound VAE's file also holds an encoder Loadout runs (engine.vae.audio_loading.load_sound_encoder),
    from its tensor names alone: LTX-2's beside its 2-D mel decoder (`encoder.conv_in`, causal or not, bare or under
    the release's `audio_vae.`), or MiniMax-H3's (`encoder.block.0` beside `dec_in_proj`). MMAudio's encoder
    (Kandinsky 6's) is not run, nor an image VAE's."""
    keys = set(names)
    if "dec_in_proj.weight" in keys:
        return any(k.startswith("encoder.block.0.") for k in keys)
    for p in ("audio_vae.", ""):
        if p + "decoder.conv_in.conv.weight" in keys:
            return p + "encoder.conv_in.conv.weight" in keys or p + "encoder.conv_in.weight" in keys
    return False
