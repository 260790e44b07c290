"""Finders for the non-backbone parts a file may hold: text encoders, VAEs, TAESD-family approximations
and CLIP vision towers. Each works under any prefix, so the same rule finds a text encoder inside a
checkpoint (`conditioner.embedders.1.model.`), a ComfyUI save (`text_encoders.t5xxl.`) or a bare file.

Facts (cited, not copied):
* CLIP text widths: OpenAI CLIP ViT-L/14 768 (12 layers), OpenCLIP ViT-H/14 1024 (24 layers, SD2),
  OpenCLIP ViT-bigG/14 1280 (32 layers, SDXL) — the model cards and transformers `CLIPTextConfig`;
  transformers naming `text_model.final_layer_norm`, OpenCLIP naming `ln_final` / `transformer.resblocks`
  (diffusers single_file_utils `DIFFUSERS_TO_LDM_MAPPING["openclip"]`).
* T5 v1.1 XXL: d_model 4096, vocabulary 32128 (transformers `T5Config` of google/t5-v1_1-xxl); keys
  `encoder.block.N.layer.0.SelfAttention.q.weight`, `encoder.final_layer_norm.weight`.
* AutoencoderKL latent channels from the decoder's first conv (`decoder.conv_in.weight`.shape[1]): 4 for
  SD1/SD2/SDXL, 16 for SD3 and FLUX.1, 32 for FLUX.2 (diffusers AutoencoderKL / AutoencoderKLFlux2 configs).
* TAESD (madebyollin/taesd): nn.Sequential of convs and `Block`s whose body is `conv.0/2/4`; the encoder
  starts from 3 image channels and ends at the latent channels, the decoder the other way round.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .keys import KeyIndex
from .result import Evidence

# Containers that hold one sub-model each; a part found inside one claims the whole container.
_CONTAINERS = (
    r"text_encoders\.[^.]+\.",
    r"conditioner\.embedders\.\d+\.",
    r"cond_stage_model\.",
    r"first_stage_model\.",
    r"(?:clip_[lgh]|t5xxl|t5)\.",
)


def container_of(found_prefix: str) -> str:
    for pat in _CONTAINERS:
        m = re.match(pat, found_prefix)
        if m:
            return m.group(0)
    return found_prefix


@dataclass
class Part:
    """A sub-model found in the keys: where it lives, which component it is, and why we think so."""

    prefix: str
    component: str
    what: str
    channels: int | None = None
    evidence: list[Evidence] = field(default_factory=list)
    architecture: str | None = None  # set where the part alone names a family (video VAEs)
    also: tuple[str, ...] = ()


def _ev(ix: KeyIndex, key: str, reason: str) -> Evidence:
    return Evidence(key, ix.shape(key), reason)


CLIP_WIDTHS = {768: ("clip_l", "CLIP-L"), 1024: ("clip_h", "OpenCLIP-H"), 1280: ("clip_g", "OpenCLIP-G")}


def find_text_encoders(ix: KeyIndex) -> list[Part]:
    """CLIP text towers (transformers or OpenCLIP naming) and T5 encoders, under any prefix."""
    parts: list[Part] = []
    # Anchored on the first layer's norm: the final norm and last layer are often dropped from SDXL files.
    for p in ix.prefixes_for("text_model.encoder.layers.0.layer_norm1.weight"):
        key = p + "text_model.encoder.layers.0.layer_norm1.weight"
        width = (ix.shape(key) or (0,))[0]
        layers = ix.count_blocks(p + "text_model.encoder.layers.")
        comp, name = CLIP_WIDTHS.get(width, ("other", f"CLIP text ({width} wide)"))
        why = f"CLIP text encoder {width} wide, {layers} layers → {name}"
        parts.append(Part(p, comp, name, evidence=[_ev(ix, key, why)]))
    # Files saved by transformers before 4.x lack the `text_model.` level (old SD1 checkpoints).
    for p in ix.prefixes_for("encoder.layers.0.layer_norm1.weight"):
        if p.endswith("text_model.") or not ix.has(p + "embeddings.token_embedding.weight"):
            continue
        key = p + "encoder.layers.0.layer_norm1.weight"
        width = (ix.shape(key) or (0,))[0]
        comp, name = CLIP_WIDTHS.get(width, ("other", f"CLIP text ({width} wide)"))
        why = f"CLIP text encoder {width} wide (old transformers naming) → {name}"
        parts.append(Part(p, comp, name, evidence=[_ev(ix, key, why)]))
    for p in ix.prefixes_for("transformer.resblocks.0.ln_1.weight"):
        if not (ix.has(p + "token_embedding.weight") or ix.has(p + "positional_embedding")):
            continue  # an image tower (visual.transformer...) has neither
        key = p + "transformer.resblocks.0.ln_1.weight"
        width = (ix.shape(key) or (0,))[0]
        layers = ix.count_blocks(p + "transformer.resblocks.")
        comp, name = CLIP_WIDTHS.get(width, ("other", f"OpenCLIP text ({width} wide)"))
        why = f"OpenCLIP text encoder {width} wide, {layers} layers → {name}"
        parts.append(Part(p, comp, name, evidence=[_ev(ix, key, why)]))
    for p in ix.prefixes_for("encoder.block.0.layer.0.SelfAttention.q.weight"):
        key = p + "encoder.final_layer_norm.weight"
        qkey = p + "encoder.block.0.layer.0.SelfAttention.q.weight"
        d_model = (ix.shape(qkey) or (0, 0))[-1]
        vocab = (ix.shape(p + "shared.weight") or (None,))[0]
        blocks = ix.count_blocks(p + "encoder.block.")
        if d_model == 4096 and vocab in (None, 32128):
            parts.append(
                Part(
                    p,
                    "t5xxl",
                    "T5-XXL",
                    evidence=[_ev(ix, qkey, f"T5 encoder d_model 4096, {blocks} blocks → T5-XXL")],
                )
            )
        else:
            parts.append(
                Part(
                    p,
                    "other",
                    f"T5-family encoder (d_model {d_model})",
                    evidence=[
                        _ev(
                            ix,
                            qkey if not ix.has(key) else key,
                            f"T5-family encoder d_model {d_model}, vocabulary {vocab}",
                        )
                    ],
                )
            )
    # llama.cpp naming (GGUF text encoders, e.g. t5-v1_1-xxl-encoder-Q8_0.gguf): enc.blk.N.attn_q.
    for p in ix.prefixes_for("enc.blk.0.attn_q.weight"):
        qkey = p + "enc.blk.0.attn_q.weight"
        d_model = ix.dim(qkey, -1)
        vocab = ix.dim(p + "token_embd.weight", 0)
        comp = "t5xxl" if d_model == 4096 and vocab in (None, 32128) else "other"
        why = f"T5 encoder (llama.cpp naming) d_model {d_model}" + (" → T5-XXL" if comp == "t5xxl" else "")
        parts.append(
            Part(p, comp, "T5-XXL" if comp == "t5xxl" else "T5-family encoder", evidence=[_ev(ix, qkey, why)])
        )
    return parts


# Decoders that are not AutoencoderKL's though their keys look alike (the markers, from diffusers'
# classes): norms conditioned on the latent (Kandinsky's KVAE, `autoencoder_kl_kvae.py`: `norm1.conv_y`),
# temporal convolutions between the 2-D ones (Allegro, `autoencoder_kl_allegro.py`: `temp_conv_in`).
_NOT_KL = {
    ".conv_y.": "decoder norms conditioned on the latent (Kandinsky's KVAE)",
    "temp_conv": "temporal convolutions in the decoder (a video VAE: Allegro's)",
    # Stable Video Diffusion's VideoDecoder (Stability generative-models `sgm/modules/autoencoding/
    # temporal_ae.py`: `time_stack`, `time_mix_conv`; diffusers `AutoencoderKLTemporalDecoder`:
    # `temporal_res_block`): the SD VAE's encoder, a decoder with temporal layers
    ".time_stack.": "temporal layers in the decoder (Stable Video Diffusion's)",
    "time_mix": "temporal layers in the decoder (Stable Video Diffusion's)",
    ".temporal_res_block.": "temporal layers in the decoder (Stable Video Diffusion's)",
    # MiniMax-H3's VAEs (diffusers `autoencoder_kl_minimax_h3.py` / `_audio.py`): a ViT decoder; a BigVGAN one
    "decoder.register_tokens": "a transformer decoder over latent patches (MiniMax-H3's video VAE)",
    "decoder.conv_pre.": "a BigVGAN waveform decoder (an audio VAE: MiniMax-H3's)",
}
# A deep-compression autoencoder (diffusers `autoencoder_dc.py`; Sana's VAE is DC-AE f32c32): a decoder
# of `up_blocks` with an output `norm_out` and no mid block, 32x spatial compression.
_DC_AE = "a deep-compression autoencoder (DC-AE: no mid block, up blocks to a norm_out; Sana's VAE is one)"


def not_kl_decoder(keys) -> tuple[str, str] | None:
    """(a key, why) where the VAE decoder in `keys` (names from its `decoder.`, any prefix before) is not
    an AutoencoderKL's, else None. Detection says it; the VAE loader refuses it in the same words.
    (Every checkpoint's VAE passes here in a library scan: the markers are searched in one joined
    string, not key by key.)"""
    keys = [k for k in keys if "decoder." in k]
    blob = "\n" + "\n".join(keys) + "\n"
    for marker, why in _NOT_KL.items():
        i = blob.find(marker)
        if i >= 0:
            return blob[blob.rfind("\n", 0, i) + 1 : blob.find("\n", i)], why
    j = blob.find("decoder.norm_out.weight\n")
    if j >= 0 and "decoder.up_blocks." in blob and ".mid_block." not in blob and "decoder.mid." not in blob:
        return blob[blob.rfind("\n", 0, j) + 1 : blob.find("\n", j)], _DC_AE
    return None


def find_vaes(ix: KeyIndex) -> list[Part]:
    """AutoencoderKL in LDM (`decoder.mid.block_1`) or diffusers (`decoder.mid_block.resnets`) naming."""
    parts = []
    for suffix in (
        "decoder.mid.block_1.conv1.weight",
        "decoder.mid_block.resnets.0.conv1.weight",
        "decoder.mid_block.resnets.0.spatial_res_block.conv1.weight",  # SVD's, diffusers naming
    ):
        for p in ix.prefixes_for(suffix):
            if p.startswith(("model_ema.", "conditioner.")):
                continue
            key = p + "decoder.conv_in.weight"
            shape = ix.shape(key)
            if shape is not None and len(shape) == 5:
                continue  # a 3-D (video) VAE: video_vaes.py
            z = shape[1] if shape and len(shape) == 4 else None
            part = Part(p, "vae", "AutoencoderKL", channels=z)
            other = not_kl_decoder(ix.with_prefix(p + "decoder."))
            if other is not None and "Stable Video Diffusion" in other[1]:
                part.what, part.architecture = "temporal AutoencoderKL (SVD)", "svd"
                why = f"{other[1]} → Stable Video Diffusion's VAE (the SD VAE's encoder, a temporal decoder)"
                part.evidence.append(_ev(ix, other[0], why))
            elif other is not None:
                part.what = "AutoencoderKL-like decoder"  # no family: see _vae_arch
                part.evidence.append(
                    _ev(ix, other[0], f"{other[1]}: not the SD / SD3 / FLUX VAE ({z} latent channels)")
                )
            elif z is not None:
                family = {4: "SD1 / SD2 / SDXL", 16: "SD3 / FLUX.1", 32: "FLUX.2"}.get(z, "no known family")
                part.evidence.append(_ev(ix, key, f"VAE decoder takes {z} latent channels → {family}"))
            else:
                part.evidence.append(_ev(ix, p + suffix, "AutoencoderKL decoder blocks"))
            parts.append(part)
    kl = {part.prefix for part in parts}
    for p in ix.prefixes_for("decoder.norm_out.weight"):
        if p in kl:  # an LDM-named AutoencoderKL has a norm_out too
            continue
        other = not_kl_decoder(ix.with_prefix(p + "decoder."))
        if other is not None and other[1] == _DC_AE and not p.startswith(("model_ema.", "conditioner.")):
            parts.append(_dc_ae(ix, p, other[0]))
    return parts


def _dc_ae(ix: KeyIndex, p: str, key: str) -> Part:
    """A DC-AE's decoder: its latent channels (conv_in's inputs) and its compression (2 per up block, the
    stages of `up_blocks` less the deepest) name the family. Sana (1.0 / 1.5 / Sprint) and PRX decode with
    the f32c32 releases (dc-ae-f32c32-sana-1.0 / 1.1: 32 channels, 6 stages, 32x)."""
    z = ix.dim(p + "decoder.conv_in.weight", 1)
    f = 2 ** (ix.count_blocks(p + "decoder.up_blocks.") - 1)
    part = Part(p, "vae", "DC-AE", channels=z)
    why = f"{_DC_AE}, decoding {z} latent channels at {f}x"
    if z == 32 and f == 32:
        part.architecture, part.also = "sana", ("prx",)
        why += " → the f32c32 DC-AE Sana's and PRX's pipelines decode with"
    part.evidence.append(_ev(ix, key, why))
    return part


def _numbered_convs(ix: KeyIndex, p: str) -> list[tuple[int, str]]:
    rx = re.compile(re.escape(p) + r"(\d+)\.weight")
    out = []
    for k in ix.tensors:
        m = rx.fullmatch(k)
        if m and len(ix.shape(k) or ()) == 4:
            out.append((int(m.group(1)), k))
    return sorted(out)


def find_taesd(ix: KeyIndex) -> list[Part]:
    """TAESD-family encoders/decoders: numbered convs with `N.conv.0/2/4` blocks between them."""
    parts = []
    seen = set()
    for p in ix.prefixes_for("conv.0.weight"):
        m = re.fullmatch(r"(.*?)(\d+)\.", p)
        if not m:
            continue
        base = m.group(1)
        if base in seen or not ix.has(f"{p}conv.2.weight") or not ix.has(f"{p}conv.4.weight"):
            continue
        seen.add(base)
        convs = _numbered_convs(ix, base)
        if len(convs) < 2:
            continue
        (_, first), (_, last) = convs[0], convs[-1]
        fs, ls = ix.shape(first), ix.shape(last)
        if fs[1] == 3:
            parts.append(
                Part(
                    base,
                    "vae",
                    "TAESD encoder",
                    ls[0],
                    [
                        _ev(
                            ix,
                            last,
                            f"tiny encoder: 3 image channels → {ls[0]} latent channels (TAESD family)",
                        )
                    ],
                )
            )
        elif ls[0] == 3:
            parts.append(
                Part(
                    base,
                    "vae",
                    "TAESD decoder",
                    fs[1],
                    [
                        _ev(
                            ix,
                            first,
                            f"tiny decoder: {fs[1]} latent channels → 3 image channels (TAESD family)",
                        )
                    ],
                )
            )
    return parts


def find_clip_vision(ix: KeyIndex) -> list[Part]:
    """CLIP / OpenCLIP image towers (as used by IP-Adapter, unCLIP and SVD conditioning) and SigLIP's
    (FLUX.1 Redux's image encoder), in transformers' naming under `vision_model.` or bare (how
    transformers 5 holds a CLIPVisionModel / SiglipVisionModel's tensors)."""
    parts = []
    towers = [(p, p + "vision_model.") for p in ix.prefixes_for("vision_model.post_layernorm.weight")]
    towers += [  # (prefixes_for looks at the suffix index's slice for it, not at every key)
        (p, p)
        for p in ix.prefixes_for("embeddings.patch_embedding.weight")
        if not p.endswith("vision_model.")
        and ix.has(p + "post_layernorm.weight")
        and ix.has(p + "encoder.layers.0.self_attn.q_proj.weight")
    ]
    for p, t in towers:
        if "vision_tower." in t or "visual." in t:
            continue  # a multimodal LLM's own tower: part of that text encoder (Gemma 3, Mistral 3)
        key = t + "post_layernorm.weight"
        width = (ix.shape(key) or (0,))[0]
        layers = ix.count_blocks(t + "encoder.layers.")
        # SigLIP (transformers `SiglipVisionTransformer`): no class token and no pre-norm (CLIP's
        # `pre_layrnorm`), pooled by an attention head with a learned probe
        siglip = ix.has(t + "head.probe") or (
            ix.has(t + "embeddings.patch_embedding.weight")
            and not ix.has(t + "embeddings.class_embedding")
            and not ix.has(t + "pre_layrnorm.weight")
        )
        if not siglip:
            name = {1024: "CLIP ViT-L/14", 1280: "CLIP ViT-H/14", 1664: "CLIP ViT-bigG/14"}.get(
                width, f"CLIP vision ({width} wide)"
            )
            why = f"CLIP vision tower {width} wide, {layers} layers → {name}"
        else:
            name = {1152: "SigLIP so400m", 768: "SigLIP base", 1024: "SigLIP large"}.get(
                width, f"SigLIP vision ({width} wide)"
            )
            why = f"a vision tower without a class token, {width} wide, {layers} layers → {name}"
            if width == 1152:
                why += " (FLUX.1 Redux's image encoder)"
        parts.append(Part(p, "other", name, evidence=[_ev(ix, key, why)]))
    for p in ix.prefixes_for("visual.ln_post.weight"):
        key = p + "visual.ln_post.weight"
        width = (ix.shape(key) or (0,))[0]
        parts.append(
            Part(
                p, "other", "OpenCLIP vision", evidence=[_ev(ix, key, f"OpenCLIP vision tower {width} wide")]
            )
        )
    return parts
