"""Video VAEs (3-D causal convolutions): Wan 2.1 (also Qwen-Image's), Wan 2.2, HunyuanVideo (and 1.5),
LTX-Video, LTX-2, Mochi, Kandinsky 6 SR's and Cosmos 1.0's tokenizer, in original and diffusers naming. A VAE's architecture is the family that
introduced its layout; `also` names the other families whose pipelines use a VAE of that very layout.

Facts (cited, not copied):
* Wan (Wan-Video/Wan2.1 `wan/modules/vae.py`, Wan2.2 `vae2_2.py`; diffusers AutoencoderKLWan and
  convert_wan_vae_to_diffusers): RMS norms with a `gamma` (`decoder.middle.0.residual.0.gamma`, diffusers
  `decoder.mid_block.resnets.0.norm1.gamma`), `decoder.conv1` / `conv_in` from z latent channels. Wan 2.1:
  z 16, dim 96, RGB in (`encoder.conv1` 3 channels); Wan 2.2: z 48, dim 160 / decoder 256, 2x2-patchified
  RGB (12 channels) and nested `upsamples.N.upsamples.M` (ComfyUI sd.py tells 2.2 by that key). Wan 2.2
  A14B and Cosmos Predict2 load the Wan 2.1 VAE file itself (Wan2.2 `wan_t2v_A14B.py`: Wan2.1_VAE.pth);
  Qwen-Image's VAE is its layout key for key (diffusers AutoencoderKLQwenImage builds the same state dict)
  with its own weights, and Krea 2 and Anima decode with Qwen-Image's (diffusers krea2 / anima pipelines).
  Qwen-Image-Layered's VAE takes RGBA: 4 image channels.
* Qwen-Image 2.1 (diffusers AutoencoderKLQwenImage21, `autoencoder_kl_qwenimage21.py`): Wan 2.2's residual
  levels (AvgDown3D / DupUp3D shortcuts, `decoder.up_blocks.N.upsampler.`) in Wan's module tree, but every
  "causal 3-D" convolution is an nn.Conv2d -- 4-D weights (`decoder.conv_in.weight` [1152, 64, 3, 3]),
  `time_conv`s 1x1 -- for single images: z 64, RGBA (4 image channels), no patchify, four 2x spatial
  levels (dim_mult [1, 2, 4, 8, 8]) → 16x. The single-file converter has no entry for it (diffusers
  naming only); the RMS-norm `gamma`s stay 3-D-shaped ([C, 1, 1, 1]).
* HunyuanVideo (diffusers AutoencoderKLHunyuanVideo; ComfyUI sd.py: a conv3d AutoencoderKL in LDM names,
  `decoder.conv_in.conv.weight`): z 16, 4x temporal / 8x spatial; HunyuanVideo 1.5: z 32, 16x spatial
  (ComfyUI sd.py; diffusers AutoencoderKLHunyuanVideo15).
* LTX (Lightricks causal_video_autoencoder; diffusers convert_ltx_vae / convert_ltx2_vae): z 128
  (`decoder.conv_in.conv` in-channels), `per_channel_statistics`. The decoder's sequence of blocks tells
  the generation: LTX-Video's has up_blocks 0-8 (0.9.1+) or 0-9 (0.9.0), diffusers 4 up blocks; LTX-2's
  has up_blocks 0-6, diffusers 3.
* Mochi (genmoai/mochi `vae/models.py`, names ComfyUI sd.py tests: `blocks.2.blocks.3.stack.5.weight`
  in the decoder, `layers.4.layers.1.attn_block.attn.qkv.weight` in the encoder; diffusers
  AutoencoderKLMochi `decoder.block_in`, `decoder.conv_in` from 12 channels): z 12.
* Kandinsky 6 SR (diffusers Kandinsky6SRVAE, `autoencoder_kandinsky6_sr.py`): KVAE's latent-conditioned decoder
  norms (`decoder.mid.block_1.norm1.conv_y`) around RMS norms (`norm1.norm_layer.gamma`, [C, 1, 1, 1]) where the
  image KVAE (`autoencoder_kl_kvae.py`: 2-D convolutions) and the video KVAE (`autoencoder_kl_kvae_video.py`,
  z 16) normalise with GroupNorms (`norm_layer.weight`); z 64, `decoder.conv_in.conv` [2048, 64, 3, 3, 3].
  Diffusers naming only.
* MiniMax-H3 (diffusers AutoencoderKLMiniMaxH3, `autoencoder_kl_minimax_h3.py`): a causal 3-D convolution encoder
  and a ViT decoder (`decoder.register_tokens`, `decoder.proj_in` from z 24, `decoder.transformer_blocks`) — no
  other family's decoder; its audio VAE (AutoencoderKLMiniMaxH3Audio, `autoencoder_kl_minimax_h3_audio.py`):
  `dec_in_proj` from z 32 into a BigVGAN waveform decoder (`decoder.conv_pre`, `decoder.ups`). Diffusers naming
  only (its single-file converter has no VAE entry); the video VAE decodes (engine.vae.minimax_h3), the audio
  VAE too (engine.vae.minimax_h3_audio).
* Cosmos-Tokenize1 (diffusers AutoencoderKLCosmos, `autoencoder_kl_cosmos.py`; NVIDIA's names in diffusers'
  `convert_cosmos_to_diffusers.py` VAE_KEYS_RENAME_DICT): factorized convolutions (`conv_in.conv_s` 1x3x3 then
  `conv_in.conv_t` 3x1x1; NVIDIA's `conv_in.0.conv3d` / `.1.conv3d`), a middle block with an attention over pixels and
  one over frames (`mid_block.temp_attentions.0`, NVIDIA's `mid.attn_1.1`), wavelet patching: CV8x8x8-1.0, z 16, is
  Cosmos 1.0's (Predict1) VAE, `cosmos_predict1`.
"""

from __future__ import annotations

from .audio_vaes import find_audio_vaes
from .keys import KeyIndex
from .parts import Part
from .result import Evidence

WAN21_ALSO = ("wan22", "qwen_image", "cosmos_predict2", "krea2")


def _part(
    ix: KeyIndex, prefix: str, arch: str | None, z: int | None, key: str, why: str, also=(), what="video VAE"
) -> Part:
    return Part(
        prefix,
        "vae",
        what,
        channels=z,
        architecture=arch,
        also=tuple(also),
        evidence=[Evidence(key, ix.shape(key), why)],
    )


def find_video_vaes(ix: KeyIndex) -> list[Part]:
    parts = _wan(ix) + _conv_wrapped(ix) + _mochi(ix) + _minimax_h3(ix) + _cosmos(ix) + find_audio_vaes(ix)
    seen: set[str] = set()
    return [p for p in parts if not (p.prefix in seen or seen.add(p.prefix))]


def _wan(ix: KeyIndex) -> list[Part]:
    out = []
    for norm, conv_in, image_in in (
        ("decoder.middle.0.residual.0.gamma", "decoder.conv1.weight", "encoder.conv1.weight"),
        ("decoder.mid_block.resnets.0.norm1.gamma", "decoder.conv_in.weight", "encoder.conv_in.weight"),
    ):
        for p in ix.prefixes_for(norm):
            shape = ix.shape(p + conv_in)
            if shape is not None and len(shape) == 4:
                out.append(_frame_wan(ix, p, p + conv_in, p + image_in))
                continue
            if shape is None or len(shape) != 5:
                continue
            z = shape[1]
            image = ix.dim(p + image_in, 1)
            key = p + conv_in
            if z == 48:
                why = "a Wan-style 3-D VAE decoding 48 latent channels → the Wan 2.2 VAE (TI2V 5B)"
                out.append(_part(ix, p, "wan22", z, key, why))
            elif z == 16:
                why = "a Wan-style 3-D VAE decoding 16 latent channels → the Wan 2.1 VAE layout"
                part = _part(ix, p, "wan21", z, key, why, WAN21_ALSO)
                part.evidence.append(
                    Evidence(
                        "",
                        None,
                        "Wan 2.2 A14B and Cosmos Predict2 use the Wan 2.1 VAE file; Qwen-Image's VAE (also "
                        "Krea 2's and Anima's) has this layout key for key with its own weights: the header "
                        "cannot tell which file this is",
                    )
                )
                if image == 4:
                    key4 = p + image_in
                    part.evidence.append(
                        Evidence(key4, ix.shape(key4), "4 image channels (RGBA) → Qwen-Image-Layered's VAE")
                    )
                    part.also = ("qwen_image",)
                out.append(part)
            else:
                out.append(
                    _part(
                        ix, p, None, z, key, f"a Wan-style 3-D VAE with {z} latent channels: no known release"
                    )
                )
    return out


def _frame_wan(ix: KeyIndex, p: str, key: str, image_key: str) -> Part:
    """A Wan-style VAE whose convolutions are 2-D (4-D weights): Qwen-Image 2.1's image VAE at z 64."""
    z = ix.dim(key, 1)
    # each 2x spatial upsample of the decoder has a `resample.1` conv (diffusers and original naming)
    ups = sum(1 for k in ix.with_prefix(p + "decoder.") if k.endswith("resample.1.weight"))
    what = f"a Wan-style VAE with 2-D convolutions (4-D weights) decoding {z} latent channels"
    if z != 64:
        return _part(ix, p, None, z, key, f"{what}: no known release", what="image VAE")
    part = _part(ix, p, "qwen_image21", z, key, f"{what} → the Qwen-Image 2.1 VAE", what="image VAE")
    if ups:
        part.evidence.append(
            Evidence("", None, f"{ups} 2x upsampling levels in the decoder → {2**ups}x spatial")
        )
    if ix.dim(image_key, 1) == 4:
        part.evidence.append(Evidence(image_key, ix.shape(image_key), "4 image channels (RGBA)"))
    return part


def _conv_wrapped(ix: KeyIndex) -> list[Part]:
    """Causal 3-D VAEs whose convolutions are wrapped (`conv_in.conv.weight`): HunyuanVideo, LTX."""
    out = []
    for p in ix.prefixes_for("decoder.conv_in.conv.weight"):
        key = p + "decoder.conv_in.conv.weight"
        shape = ix.shape(key)
        if shape is None or len(shape) != 5:
            continue
        z = shape[1]
        ltx_original = ix.has(p + "decoder.up_blocks.0.res_blocks.0.conv1.conv.weight")
        if z == 128 or ltx_original:
            out.append(_ltx(ix, p, z, key, ltx_original))
        elif ix.has(p + "decoder.mid.block_1.norm1.norm_layer.gamma"):
            out.append(_kandinsky6_sr(ix, p, z, key))
        elif z == 16 and ix.has(
            p + "decoder.mid.block_1.norm1.conv_y.weight"
        ):  # diffusers autoencoder_kl_kvae_video.py
            why = "a causal 3-D VAE whose decoder norms are conditioned on the latent → Kandinsky's KVAE: not HunyuanVideo's"
            out.append(_part(ix, p, None, z, key, why, what="KVAE (Kandinsky)"))
        elif z == 16 and ix.has(p + "decoder.mid_block.resnets.0.norm1.conv_y.conv.weight"):  # CogVideoX
            why = "a causal 3-D VAE whose decoder norms are conditioned on the latent → CogVideoX's: not HunyuanVideo's"
            out.append(_part(ix, p, None, z, key, why))
        elif z == 16:
            out.append(
                _part(
                    ix,
                    p,
                    "hunyuan_video",
                    z,
                    key,
                    "a causal 3-D VAE decoding 16 latent channels → the HunyuanVideo VAE",
                )
            )
        elif z == 32:
            out.append(
                _part(
                    ix,
                    p,
                    "hunyuan_video15",
                    z,
                    key,
                    "a causal 3-D VAE decoding 32 latent channels (16x spatial) → the HunyuanVideo 1.5 VAE",
                )
            )
        else:
            out.append(
                _part(ix, p, None, z, key, f"a causal 3-D VAE with {z} latent channels: no known release")
            )
    return out


def _kandinsky6_sr(ix: KeyIndex, p: str, z: int, key: str) -> Part:
    """Kandinsky6SRVAE: its latent-conditioned norms normalise with an RMS `gamma` where both KVAEs' are GroupNorms
    (`norm_layer.weight` / `.bias`), its convolutions 3-D where the image KVAE's are 2-D."""
    width = ix.dim(key, 0)
    what = f"a causal 3-D VAE with RMS norms conditioned on the latent, {z} latent channels, a {width}-wide middle"
    if z != 64:
        return _part(ix, p, None, z, key, f"{what}: Kandinsky 6 SR's layout, no known release")
    return _part(ix, p, "kandinsky6_sr", z, key, f"{what} → Kandinsky 6 SR's video VAE")


def _ltx_volumes(ix: KeyIndex, p: str, blocks: int, original: bool) -> list[int]:
    """Each decoder upsampler's volume in order: its convolution's outputs over the width of what it feeds
    (8 for 2x2x2, 2 in time only, 4 in space only; engine.vae.ltx.Upsample)."""
    d = p + "decoder."
    out = []
    for i in range(blocks):
        if original:
            conv, nxt = f"{d}up_blocks.{i}.conv.conv.weight", f"{d}up_blocks.{i + 1}."
            after = ix.dim(nxt + "res_blocks.0.conv1.conv.weight", 1) or ix.dim(nxt + "conv1.conv.weight", 1)
        else:
            conv = f"{d}up_blocks.{i}.upsamplers.0.conv.conv.weight"
            after = ix.dim(f"{d}up_blocks.{i}.resnets.0.conv1.conv.weight", 1)
        after = after or ix.dim(d + "conv_out.conv.weight", 1)
        cout = ix.dim(conv, 0)
        if cout and after and not cout % after:
            out.append(cout // after)
    return out


def _ltx_metadata(ix: KeyIndex) -> str | None:
    """The generation Lightricks' metadata config says ("ltx2" / "ltxv"), or None: LTX-2's code (ltx-core)
    writes the audio VAE's config beside the video one and mirrors the decoder's borders by default, LTX-Video's
    pads them with zeros."""
    import json

    try:
        cfg = json.loads(ix.metadata.get("config", "null"))
    except ValueError:
        return None
    vae = cfg.get("vae") if isinstance(cfg, dict) else None
    if not isinstance(vae, dict):
        return None
    if "audio_vae" in cfg:
        return "ltx2"
    mode = vae.get("decoder_spatial_padding_mode", vae.get("spatial_padding_mode"))
    return "ltx2" if mode == "reflect" else "ltxv"


def _ltx(ix: KeyIndex, p: str, z: int, key: str, original: bool) -> Part:
    """The generation from the decoder's sequence of blocks and its upsamplers' strides: LTX-Video 0.9.0's
    10 (Lightricks) / 4 (diffusers) blocks widen in lone blocks; 0.9.1 adds noise (`per_channel_scale1`);
    0.9.5+ and LTX-2.0 share 7 / 3 blocks of 2x2x2 upsamplers (their metadata tells them: `_ltx_metadata`; without
    it LTX-2.0, as the loader decodes it); LTX-2.3's 9 / 4 blocks upsample once in time only and once in space
    only (diffusers convert_ltx2_to_diffusers, version "2.3": upsample_type spatiotemporal, spatiotemporal,
    temporal, spatial)."""
    blocks = ix.count_blocks(p + "decoder.up_blocks.")
    volumes = _ltx_volumes(ix, p, blocks, original)
    what = (
        f"decoder up_blocks 0-{blocks - 1} (LTX's own naming)"
        if original
        else f"{blocks} decoder up blocks (diffusers naming)"
    )
    said = None
    if volumes and any(v in (2, 4) for v in volumes):
        arch, name = "ltx2", "the LTX-2.3 VAE (upsamplers in time only and in space only)"
    elif blocks == (10 if original else 4) and volumes and all(v == 8 for v in volumes):
        arch, name = "ltxv", "the LTX-Video 0.9.0 VAE"
    elif blocks == (7 if original else 3):
        noise = ix.has_prefix(p + "decoder.") and any(
            "per_channel_scale" in k for k in ix.with_prefix(p + "decoder.up_blocks.")
        )
        said = None if noise else _ltx_metadata(ix)
        arch = "ltxv" if noise or said == "ltxv" else "ltx2"
        name = (
            "the LTX-Video 0.9.1 VAE (noise in the decoder)"
            if noise
            else "the LTX-Video 0.9.5+ VAE"
            if arch == "ltxv"
            else "the LTX-2 VAE"
        )
    else:
        arch, name = None, "no known LTX release"
    part = _part(ix, p, arch, z, key, f"a causal 3-D VAE decoding {z} latent channels, {what} → {name}")
    if said is not None:
        part.evidence.append(
            Evidence("__metadata__.config", None, f"Lightricks' config in the metadata: {name}")
        )
    return part


def _mochi(ix: KeyIndex) -> list[Part]:
    out = []
    for suffix in ("blocks.2.blocks.3.stack.5.weight", "layers.4.layers.1.attn_block.attn.qkv.weight"):
        for p in ix.prefixes_for(suffix):
            if p.endswith(("decoder.", "encoder.")):
                p = p[: -len("decoder.")]
            out.append(
                _part(
                    ix,
                    p,
                    "mochi",
                    12,
                    _key(ix, p, suffix),
                    "Mochi's asymmetric video VAE (genmo naming) → 12 latent channels",
                )
            )
    for p in ix.prefixes_for("decoder.block_in.resnets.0.conv1.conv.weight"):
        key = p + "decoder.conv_in.weight"
        z = ix.dim(key, 1)
        out.append(
            _part(
                ix,
                p,
                "mochi" if z == 12 else None,
                z,
                key,
                f"Mochi's video VAE (diffusers naming) decoding {z} latent channels",
            )
        )
    return out


def _minimax_h3(ix: KeyIndex) -> list[Part]:
    out = []
    for p in ix.prefixes_for("decoder.register_tokens"):
        key = p + "decoder.proj_in.weight"
        if ix.has(p + "decoder.transformer_blocks.0.attn.to_q.weight") and ix.has(key):
            z = ix.dim(key, 1)
            why = f"a ViT decoder over {z}-channel latent patches (register tokens, transformer blocks) → MiniMax-H3's video VAE"
            out.append(_part(ix, p, "minimax_h3", z, key, why))
    for p in ix.prefixes_for("dec_in_proj.weight"):
        key = p + "dec_in_proj.weight"
        if ix.has(p + "decoder.conv_pre.weight_v") or ix.has(p + "decoder.conv_pre.weight"):
            z = ix.dim(key, 1)
            why = f"{z} latent channels into a BigVGAN waveform decoder → MiniMax-H3's audio VAE"
            out.append(_part(ix, p, "minimax_h3", z, key, why, what="audio VAE"))
    return out


def _cosmos(ix: KeyIndex) -> list[Part]:
    """Cosmos-Tokenize1's continuous video tokenizer: a factorized input conv (`conv_in.conv_s` / NVIDIA's
    `conv_in.0.conv3d`) and a middle block whose second attention runs over frames. Its compression is read from the
    headers: the patch p from the output conv (3 p^3 channels), one more 2x in time or space per upsampler that has its
    temporal (`conv1`) or spatial (`conv2`) conv."""
    out = []
    for suffix, original in (
        ("decoder.conv_in.conv_s.weight", False),
        ("decoder.conv_in.0.conv3d.weight", True),
    ):
        for p in ix.prefixes_for(suffix):
            attn = (
                "decoder.mid.attn_1.1.q.conv3d.weight"
                if original
                else "decoder.mid_block.temp_attentions.0.to_q.weight"
            )
            if not ix.has(p + attn):
                continue
            key = p + suffix
            z = ix.dim(key, 1)
            conv_out = p + (
                "decoder.conv_out.1.conv3d.weight" if original else "decoder.conv_out.conv_t.weight"
            )
            cube = (ix.dim(conv_out, 0) or 0) // 3
            patch = round(cube ** (1 / 3)) if cube > 0 else 0
            ups = ix.with_prefix(p + ("decoder.up." if original else "decoder.up_blocks."))
            tail = "upsample.conv{}.conv3d.weight" if original else "upsamplers.0.conv{}.weight"
            time = sum(k.endswith(tail.format(1)) for k in ups)
            space = sum(k.endswith(tail.format(2)) for k in ups)
            if patch < 1 or patch**3 != cube:
                why = f"{attn.rsplit('.', 4)[0]}: a factorized causal video tokenizer (Cosmos's) with no 3 p^3 output conv"
                out.append(_part(ix, p, None, z, key, why))
                continue
            t, s = patch * 2**time, patch * 2**space
            what = f"a factorized causal video tokenizer, {z} latent channels at {t}x{s}x{s} (time x space)"
            if z == 16 and (t, s) == (8, 8):
                out.append(
                    _part(
                        ix,
                        p,
                        "cosmos_predict1",
                        z,
                        key,
                        f"{what} → Cosmos-Tokenize1 CV8x8x8, Cosmos 1.0's VAE",
                    )
                )
            else:
                out.append(
                    _part(ix, p, None, z, key, f"{what}: a Cosmos tokenizer no released model decodes with")
                )
    return out


def _key(ix: KeyIndex, prefix: str, suffix: str) -> str:
    for k in (prefix + "decoder." + suffix, prefix + "encoder." + suffix, prefix + suffix):
        if ix.has(k):
            return k
    return prefix + suffix
