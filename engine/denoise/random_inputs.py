"""Seeded random inputs of a bound forward's shapes for an image (or clip) of a given size: what `step` runs without
`--inputs`, and what the tests feed. The input names and their meaning: engine.denoise.inputs."""

from __future__ import annotations

import torch

from ..errors import FormatError
from .common import timestep_embedding, wshape
from .input_shapes import axes_of
from .inputs import (
    AESTHETIC,
    ANIMA_TOKENS,
    AURAFLOW_TOKENS,
    CLIP_TOKENS,
    COSMOS_TOKENS,
    FLUX2_GUIDANCE,
    FLUX3_TOKENS,
    FLUX_GUIDANCE,
    FLUX_TOKENS,
    FRAMEPACK_IMAGE_TOKENS,
    HIDREAM_TOKENS,
    HUNYUAN_GUIDANCE,
    HUNYUAN_IMAGE_GUIDANCE,
    HUNYUAN_TOKENS,
    KREA2_TOKENS,
    LATENT_16,
    LAYERED_FRAMES,
    LTX2_FRAMES,
    LTX2_TOKENS,
    LTXV_TOKENS,
    MMDIT_TOKENS,
    MOCHI_TOKENS,
    NEXTDIT_TOKENS,
    PIXART_TOKENS,
    POOLED,
    QWEN_TOKENS,
    REFINER_ADM,
    SANA_TOKENS,
    SDXL_ADM,
    SPRINT_GUIDANCE,
    UNET_TOKENS,
    WAN_TOKENS,
    names,
)


def random_inputs(model, width: int, height: int, *, batch: int = 1, seed: int = 0) -> dict:
    """Seeded inputs of the model's shapes for an image of width × height pixels (float32, CPU); a variant's own
    inputs (`model.random_extra`: Wan Animate's clip, Z-Image Omni's edit step) drawn after its family's."""
    g = torch.Generator().manual_seed(seed)
    out = _family_inputs(model, width, height, batch, g)
    extra = getattr(model, "random_extra", None)
    return extra(out, g) if extra is not None else out


def _family_inputs(model, width: int, height: int, batch: int, g: torch.Generator) -> dict:
    if hasattr(model, "step_random"):  # a self-described family (engine.denoise.SELF_DESCRIBED)
        return model.step_random(width, height, batch, g)
    if hasattr(model, "model_channels"):
        h, w = _latent(width, height, 8)
        out = {
            "x": torch.randn(batch, model.in_channels, h, w, generator=g),
            "timesteps": torch.rand(batch, generator=g) * 999.0,
            "context": torch.randn(batch, UNET_TOKENS, model.context_dim, generator=g),
        }
        if model.adm_channels:
            out["y"] = _adm(model.adm_channels, width, height, batch, g)
        return out
    if getattr(model, "family", "") == "mmdit":
        h, w = _latent(width, height, 16)
        return {
            "x": torch.randn(batch, model.in_channels, 2 * h, 2 * w, generator=g),
            "t": torch.rand(batch, generator=g) * 1000.0,
            "y": torch.randn(batch, model.pooled_dim, generator=g),
            "context": torch.randn(batch, MMDIT_TOKENS, model.context_dim, generator=g),
        }
    if getattr(model, "family", "") == "text":  # a prompt's worth of token ids (the size does not apply)
        return {"input_ids": torch.randint(0, model.vocab, (batch, model.tokens), generator=g)}
    if getattr(model, "family", "") in (
        "qwen_image",
        "nextdit",
        "auraflow",
    ):  # a latent, t in 0–1, text states
        h, w = _latent(width, height, 16)
        x, t, text = names(model)
        tokens = {"qwen_image": QWEN_TOKENS, "auraflow": AURAFLOW_TOKENS}.get(model.family, NEXTDIT_TOKENS)
        out = {
            x: torch.randn(batch, model.in_channels, 2 * h, 2 * w, generator=g),
            t: torch.rand(batch, generator=g),
            text: torch.randn(batch, tokens, model.context_dim, generator=g),
        }
        if getattr(model, "layered", False):  # its pipeline's 4 layers + the composite, and the input image
            out["ref_latents"] = out[x]
            out[x] = torch.randn(batch, model.in_channels, LAYERED_FRAMES, 2 * h, 2 * w, generator=g)
        return out
    if getattr(model, "family", "") == "hunyuan_video":  # one latent frame, as Wan's
        h, w = _latent(width, height, 16)
        out = {
            "x": torch.randn(batch, model.in_channels, 1, 2 * h, 2 * w, generator=g),
            "t": torch.rand(batch, generator=g) * 1000.0,
            "text_states": torch.randn(batch, HUNYUAN_TOKENS, model.context_dim, generator=g),
            "text_states_2": torch.randn(batch, model.vec_dim, generator=g),
        }
        if model.guidance_in is not None:
            out["guidance"] = torch.full((batch,), HUNYUAN_GUIDANCE)
        if getattr(model, "image_proj", None) is not None:  # FramePack: the first frame's SigLIP states
            width_in = wshape(model.image_proj[0])[1]
            out["image_embeddings"] = torch.randn(batch, FRAMEPACK_IMAGE_TOKENS, width_in, generator=g)
        return out
    if getattr(model, "family", "") == "qwen_image21":
        # its 16x VAE's latent, unpatched, even (2 x the 32 px grid)
        h, w = _latent(width, height, 32)
        return model.random_inputs(2 * h, 2 * w, batch, g)
    if getattr(model, "family", "") == "pixart":  # SD's 8x latent, T5-XXL states
        h, w = _latent(width, height, 16)
        return {
            "x": torch.randn(batch, model.in_channels, 2 * h, 2 * w, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "y": torch.randn(batch, PIXART_TOKENS, model.context_dim, generator=g),
        }
    if getattr(model, "family", "") == "hunyuan_dit":
        # SD's 8x latent, CLIP and mT5 states at the file's lengths
        h, w = _latent(width, height, 16)
        return {
            "x": torch.randn(batch, model.in_channels, 2 * h, 2 * w, generator=g),
            "t": torch.rand(batch, generator=g) * 1000.0,
            "encoder_hidden_states": torch.randn(batch, model.clip_tokens, model.clip_dim, generator=g),
            "encoder_hidden_states_t5": torch.randn(batch, model.t5_tokens, model.t5_dim, generator=g),
        }
    if getattr(model, "family", "") == "sana":  # the DC-AE's 32x latent
        h, w = _latent(width, height, 32)
        sprint = model.guidance is not None  # SANA-Sprint: TrigFlow's t in 0–1, its pipeline's guidance
        out = {
            "x": torch.randn(batch, model.in_channels, h, w, generator=g),
            "timesteps": torch.rand(batch, generator=g) * (1.0 if sprint else 1000.0),
            "context": torch.randn(batch, SANA_TOKENS, model.context_dim, generator=g),
        }
        if sprint:
            out["guidance"] = torch.full((batch,), SPRINT_GUIDANCE)
        return out
    if getattr(model, "family", "") == "hunyuan_image21":  # its 32x VAE's latent, no glyph text
        h, w = _latent(width, height, 32)
        out = {
            "x": torch.randn(batch, model.in_channels, h, w, generator=g),
            "t": torch.rand(batch, generator=g) * 1000.0,
            "text_states": torch.randn(batch, HUNYUAN_TOKENS, model.context_dim, generator=g),
        }
        if model.guidance_in is not None:
            out["guidance"] = torch.full((batch,), HUNYUAN_IMAGE_GUIDANCE)
        return out
    if getattr(model, "family", "") == "hidream":  # t in 0–1000, T5 / 32 Llama layers / pooled CLIP states
        h, w = _latent(width, height, 16)
        model.padded_length(2 * h, 2 * w, source=f"--size {width}x{height}")
        return {
            "hidden_states": torch.randn(batch, model.in_channels, 2 * h, 2 * w, generator=g),
            "timesteps": torch.rand(batch, generator=g) * 1000.0,
            "encoder_hidden_states_t5": torch.randn(batch, HIDREAM_TOKENS, model.t5_dim, generator=g),
            "encoder_hidden_states_llama3": torch.randn(
                model.llama_layers, batch, HIDREAM_TOKENS, model.llama_dim, generator=g
            ),
            "pooled_embeds": torch.randn(batch, model.pooled_dim, generator=g),
        }
    if getattr(model, "family", "") == "minimax_h3":  # one latent frame of its 16x VAE in 2x2 patches, packed
        from .minimax_h3 import random_inputs as minimax_inputs

        return minimax_inputs(model, *_latent(width, height, 32), batch, g)
    if getattr(model, "family", "") == "flux3":  # packed tokens, an image-to-image step
        from .flux3 import random_inputs as flux3_inputs

        return flux3_inputs(model, *_latent(width, height, 16), FLUX3_TOKENS, batch, g)
    if getattr(model, "family", "") == "krea2":  # a latent, t in 0–1, L layers of text states per token
        h, w = _latent(width, height, 16)
        return {
            "x": torch.randn(batch, model.in_channels, 2 * h, 2 * w, generator=g),
            "timesteps": torch.rand(batch, generator=g),
            "context": torch.randn(batch, KREA2_TOKENS, model.text_layers, model.context_dim, generator=g),
        }
    if getattr(model, "family", "") == "cosmos":  # one latent frame of the Wan VAE
        h, w = _latent(width, height, 16)
        out = {
            "x": torch.randn(batch, LATENT_16, 1, 2 * h, 2 * w, generator=g),
            "timesteps": torch.rand(batch, generator=g),
            "context": torch.randn(batch, COSMOS_TOKENS, model.context_dim, generator=g),
        }
        if model.adapter is not None:  # Anima: a prompt's Qwen3 states and its T5 token ids
            out["context"] = out["context"][:, :ANIMA_TOKENS]
            out["t5xxl_ids"] = torch.randint(0, model.adapter.vocab, (batch, ANIMA_TOKENS), generator=g)
        return out
    if getattr(model, "family", "") == "stable_cascade":  # each stage's latent from its pipeline's scale
        return model.random_inputs(width, height, batch, g)
    if getattr(model, "family", "") == "mochi":  # one latent frame of its 8x VAE, sigma in 0–1, T5-XXL states
        h, w = _latent(width, height, 16)
        return {
            "x": torch.randn(batch, model.in_channels, 1, 2 * h, 2 * w, generator=g),
            "sigma": torch.rand(batch, generator=g),
            "y_feat": torch.randn(batch, MOCHI_TOKENS, model.context_dim, generator=g),
        }
    if getattr(model, "family", "") == "ltxv":  # one latent frame of its 32x VAE
        h, w = _latent(width, height, 32)
        return {
            "x": torch.randn(batch, model.in_channels, 1, h, w, generator=g),
            "timestep": torch.rand(batch, generator=g),
            "context": torch.randn(batch, LTXV_TOKENS, model.context_dim, generator=g),
        }
    if getattr(model, "family", "") == "ltx2":
        # a few latent frames of its 32x VAE, and the audio latent of their time
        from .ltx2 import AUDIO_RATE, FPS

        h, w = _latent(width, height, 32)
        audio = round((8 * (LTX2_FRAMES - 1) + 1) / FPS * AUDIO_RATE)  # as its pipelines size the audio
        t = torch.rand(batch, generator=g)
        return {
            "video_latent": torch.randn(batch, model.in_channels, LTX2_FRAMES, h, w, generator=g),
            "video_timesteps": t,
            "video_context": torch.randn(batch, LTX2_TOKENS, model.context_dim, generator=g),
            "audio_latent": torch.randn(batch, audio, model.audio_channels, generator=g),
            "audio_timesteps": t.clone(),  # both streams at the step's sigma
            "audio_context": torch.randn(batch, LTX2_TOKENS, model.audio_context_dim, generator=g),
        }
    if getattr(model, "family", "") == "hunyuan_video15":  # one frame of its 16x VAE, no glyph text, t2v
        h, w = _latent(width, height, 16)
        return {
            "x": torch.randn(batch, model.in_channels, 1, h, w, generator=g),
            "t": torch.rand(batch, generator=g) * 1000.0,
            "text_states": torch.randn(batch, HUNYUAN_TOKENS, model.context_dim, generator=g),
        }
    if getattr(model, "family", "") == "wan_animate2":  # a two-frame clip and its driving frame
        h, w = _latent(width, height, 16)
        return model.random_family(2 * h, 2 * w, batch, g)
    if getattr(model, "family", "") == "wan":  # one latent frame: an image-sized step of a video model
        h, w = _latent(width, height, 16)
        out = {
            "x": torch.randn(batch, model.in_channels, 1, 2 * h, 2 * w, generator=g),
            "t": torch.rand(batch, generator=g) * 1000.0,
            "context": torch.randn(batch, WAN_TOKENS, model.context_dim, generator=g),
        }
        if model.image_dim:
            tokens = model.image_tokens or CLIP_TOKENS
            out["clip_fea"] = torch.randn(batch, tokens, model.image_dim, generator=g)
        if model.vace_channels:
            out["vace_context"] = torch.randn(batch, model.vace_channels, 1, 2 * h, 2 * w, generator=g)
        return out
    h, w = _latent(width, height, 16)
    tokens = FLUX_TOKENS.get(model.architecture, 256)
    axes = axes_of(model)
    ids = torch.zeros(h, w, axes)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    txt_ids = torch.zeros(batch, tokens, axes)
    if axes == 4:  # FLUX.2: the text's own axis l
        txt_ids[..., 3] = torch.arange(tokens)
    out = {
        "img": torch.randn(batch, h * w, model.in_channels, generator=g),
        "img_ids": ids.reshape(1, h * w, axes).repeat(batch, 1, 1),
        "txt": torch.randn(batch, tokens, model.context_dim, generator=g),
        "txt_ids": txt_ids,
        "timesteps": torch.rand(batch, generator=g),
    }
    if model.vec_dim:
        out["y"] = torch.randn(batch, model.vec_dim, generator=g)
    if model.guidance_in is not None:
        out["guidance"] = torch.full((batch,), FLUX2_GUIDANCE if axes == 4 else FLUX_GUIDANCE)
    return out


def _latent(width: int, height: int, multiple: int) -> tuple[int, int]:
    if width <= 0 or height <= 0 or width % multiple or height % multiple:
        raise FormatError(
            f"--size {width}x{height}: width and height must be positive multiples of {multiple} px"
        )
    return height // multiple, width // multiple  # the latent (UNet), or the grid of 2×2 patches (FLUX)


def _adm(adm: int, width: int, height: int, batch: int, g) -> torch.Tensor:
    """SGM's vector conditioning for a random pooled embedding and this image size (no crop)."""
    if adm == SDXL_ADM:
        numbers = [height, width, 0, 0, height, width]
    elif adm == REFINER_ADM:
        numbers = [height, width, 0, 0, AESTHETIC]
    else:
        return torch.randn(batch, adm, generator=g)
    pooled = torch.randn(batch, POOLED, generator=g)
    emb = timestep_embedding(torch.tensor(numbers, dtype=torch.float32), 256).reshape(1, -1)
    return torch.cat([pooled, emb.expand(batch, -1)], dim=1)
