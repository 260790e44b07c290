"""The facade's sound jobs: an audio latent decoded to a waveform (DecodeAudio), and a sound encoded to an audio latent
(EncodeAudio, LTX-2's). The module of each (engine.vae.audio_loading, engine.vae.ltx2_audio_encoder) is a ledger
component of its file -- `audio_vae` for the decoder and vocoder, `audio_vae_encoder` for the encoder -- placed by the
same rules as a VAE (device, --cpu-vae, budget, eviction of others), always computing in float32, and kept loaded
afterwards. Runs in the engine thread only, on the `Parts` the Engine hands it (engine.decoding)."""

from __future__ import annotations

import os
import time

from .decoding import Parts, marked, vae_placement
from .events import DecodeFinished, DecodeStarted
from .requests import frozen


def _component(parts: Parts, path: str, name: str, model):
    """`model` as the ledger's component `name` of the file, placed as the file's VAE would be, replacing one before."""
    from .model.wrapped import ModuleComponent

    p = vae_placement(model, parts.device_report)
    # float32 on every device (the sound modules set their ops so: their vocoders lose the high band in bf16)
    comp = ModuleComponent(
        name, path, model, device=p.device, storage_dtype=p.storage_dtype, compute_dtype="float32"
    )
    old, _ = parts.loaded.remove(path, name)
    if old is not None:
        parts.residency.unload(old)
    parts.loaded.add(path, name, comp)
    return comp


def audio_component(parts: Parts, req):
    """The file's sound decoder (engine.vae.audio_loading: LTX-2's audio VAE decoder and vocoder, MiniMax-H3's audio
    VAE decoder, Kandinsky 6's MMAudio decoder and vocoder) as its `audio_vae` component: the one an earlier decode
    built when it read the same vocoder, else a new one in its place."""
    from .vae.audio_loading import load_audio

    path = os.path.abspath(req.vae)
    old = parts.loaded.of_file(path).get("audio_vae")
    if old is not None and getattr(old.module, "vocoder_source", None) == req.vocoder:
        return old
    model = load_audio(path, req.vocoder)
    model.vocoder_source = req.vocoder
    return _component(parts, path, "audio_vae", model)


def decode_audio(parts: Parts, req, token, report):
    """An audio latent to a waveform: the audio VAE's decoder, then the vocoder, in float32 on the component's device."""
    import torch

    from . import ops
    from .formats.latent import read_audio_latent
    from .jobs import Progress
    from .requests import AudioResult

    latent = read_audio_latent(req.latent)  # before loading anything: a bad latent costs nothing
    comp = audio_component(parts, req)
    model = comp.module
    z = model.latent(latent, raw=req.raw)
    extra = model.working_bytes(z)
    parts.residency.load([comp], extra_memory=extra, token=token, report=report)
    device = torch.device(comp.device)
    t0 = time.perf_counter()
    report(Progress("audio decode", 0, 1))
    started = DecodeStarted(comp.name, vae=comp.path, latent_shape=tuple(latent.shape), requested_mode="full",
                            downscale=0, media="sound")  # fmt: skip
    with marked(parts, started), ops.cancel_scope(token), torch.inference_mode():
        wave = model(z.to(device))
        token.raise_if_cancelled()
    notes = list(model.notes)
    if wave.shape[0] > 1:
        notes.append(f"the latent holds {wave.shape[0]} clips: the result is the first")
    samples = wave[0].float().T.contiguous().cpu().numpy().astype("<f4").tobytes()
    dt = time.perf_counter() - t0
    parts.events.emit(
        DecodeFinished(comp.name, len(samples), dt, media="sound", dtype="float32", device=str(device))
    )
    report(Progress("audio decode", 1, 1))
    info = {"device": str(device), "latent_shape": list(latent.shape), "audio_seconds": wave.shape[-1] / model.sample_rate,
            "vocoder": model.describe(), "normalised": req.raw is False and model.latent_stats is not None,
            "notes": notes, "component": comp.name, "estimate_bytes": extra}  # fmt: skip
    return AudioResult(samples, wave.shape[1], model.sample_rate, frozen(info), dt, req.latent)


def encode_audio(parts: Parts, req, token, report):
    """A sound file (engine.formats.audio_in) through the file's audio encoder to its normalised latent, written
    atomically: LTX-2's as a ComfyUI .latent [1, 8, T, 16], MiniMax-H3's rows [1, 2 T, 32] as `audio_hidden_states`."""
    import torch

    from . import ops
    from .formats.audio_in import read_audio
    from .formats.latent import write_latent
    from .formats.safetensors import save_tensors
    from .jobs import Progress
    from .requests import EncodedAudio
    from .vae.audio_loading import load_sound_encoder

    wave, rate = read_audio(req.audio, req.seconds)  # before loading anything: a bad file costs nothing
    path = os.path.abspath(req.vae)
    comp = parts.loaded.of_file(path).get("audio_vae_encoder")
    comp = comp or _component(parts, path, "audio_vae_encoder", load_sound_encoder(path))
    model = comp.module
    t0 = time.perf_counter()
    report(Progress("audio encode", 0, 1))
    mel = model.mels(torch.from_numpy(wave)[None], rate)
    parts.residency.load([comp], extra_memory=64 * mel.numel() * 4 * 4, token=token, report=report)
    started = DecodeStarted(comp.name, direction="encode", vae=comp.path, requested_mode="full", downscale=0,
                            media="sound")  # fmt: skip
    with marked(parts, started), ops.cancel_scope(token), torch.inference_mode():
        latent = model(mel.to(comp.device)).float().cpu()
        token.raise_if_cancelled()
    parts.events.emit(DecodeFinished(comp.name, latent.numel() * 4, time.perf_counter() - t0, direction="encode",
                                     media="sound", dtype="float32", device=str(comp.device)))  # fmt: skip
    if latent.dim() == 4:  # LTX-2's [B, 8, T, 16]: a ComfyUI .latent
        write_latent(req.out, latent)
    else:  # MiniMax-H3's rows [1, 2 T, 32]: named as its step inputs take them
        save_tensors(req.out, {"audio_hidden_states": latent.contiguous()})
    report(Progress("audio encode", 1, 1))
    info = {"device": str(comp.device), "latent_shape": list(latent.shape), "audio_seconds": wave.shape[1] / rate,
            "source_rate": rate, "channels": wave.shape[0], "normalised": model.latent_stats is not None,
            "notes": list(model.notes), "component": comp.name}  # fmt: skip
    return EncodedAudio(req.out, frozen(info), time.perf_counter() - t0)
