"""`loadout plan`'s sound step. LTX-2 makes a clip's sound with the clip: its checkpoint holds the audio VAE's decoder
and the vocoder beside the denoiser, and a run decodes the sound after the frames. So a video plan (`--decode WxHxF`)
of such a file predicts that decode too, from the header alone: the very module engine.sound decodes with
(engine.vae.audio_loading.load_audio) is built on the meta device from the header's shapes (no tensor is read), its
weights counted at the dtype the VAE's placement stores them in, and its working memory is the module's own estimate
(`working_bytes`, checked against measured decodes at the releases' widths) for the clip's length of sound. A sound
decodes whole, in float32: it fits beside the plan's budget or it does not (no tiles).
"""

from __future__ import annotations

# diffusers' LTX2Pipeline: `audio_num_frames = round(num_frames / frame_rate * sampling_rate / hop_length /
# temporal_compression)`, at its default frame_rate 24 (the rate engine.vae.ltx's clips play at)
LTX2_FPS = 24.0


def holds_sound(tensors) -> bool:
    """Whether a file's tensor names hold LTX-2's sound decoder and its vocoder (the release's single file)."""
    return "audio_vae.decoder.conv_in.conv.weight" in tensors and any(
        k.startswith("vocoder.") for k in tensors
    )


def sound_step(path: str, header, frames: int, place, cap_on) -> dict:
    """The plan's "sound" step for a clip of `frames` frames: `place(file_dtype, size_bytes)` is the VAE's
    placement (engine.model.dtypes.place, as engine.sound places the module), `cap_on(device)` what a decode on
    that device may use."""
    import torch

    from .formats.dtypes import dominant_float_dtype, dtype_name
    from .vae.audio_loading import audio_on_meta

    # the module's structure from the header, none of its bytes
    model = audio_on_meta(path, header, ("audio_vae.", "vocoder."))
    params = [p for p in model.parameters() if p.is_floating_point()]
    file_dtype = dominant_float_dtype(dtype_name(p.dtype) for p in params)
    size = sum(p.numel() * p.element_size() for p in params)
    p = place(file_dtype, size)
    storage = p.storage_dtype  # a torch dtype's name, or None: as the file stores them
    weights = sum(x.numel() for x in params) * getattr(torch, storage).itemsize if storage else size
    dec = model.audio_vae.decoder.cfg
    seconds = frames / LTX2_FPS
    latent_frames = max(1, round(seconds * dec.sample_rate / dec.hop / 2**dec.ups))
    z = torch.empty(1, dec.z, latent_frames, dec.mel_bins // 2**dec.ups, device="meta")
    work = model.working_bytes(z)
    peak = weights + work
    detail = {
        "seconds": round(seconds, 3),
        "latent_frames": latent_frames,
        "sample_rate": model.sample_rate,
        "vocoder": model.describe(),
        "weights_bytes": weights,
        "storage_dtype": storage or file_dtype,
        "compute_dtype": "float32",
        "device": p.device,
        "working_bytes": work,
        "estimate": "the sound decoder's own (engine.vae.audio_loading working_bytes), decoded whole",
    }
    fits = peak <= cap_on(p.device)
    if not fits:
        detail["advice"] = "a sound decodes whole: free memory, or decode it on the CPU (--cpu-vae)"
    return {"step": "sound", "peak_bytes": peak, "mode": "full", "fits": fits, "detail": detail}
