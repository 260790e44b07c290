"""'Will it fit?' for one decode or encode before it runs, from headers alone: the input's size (a
latent's header, an image's header), the VAE's kind and weight bytes (its detection), then
engine.vae.estimate's formulas. Torch-free, so the window's bridge answers it in a background thread; a sound's
latent alone builds its decoder on the meta device (engine.vae.audio_loading.decode_bytes: torch is loaded by
then)."""

from __future__ import annotations

import os

from .errors import EngineError, FormatError
from .requests import DecodeEstimate, EstimateDecode

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp")


def _vae_facts(path: str) -> tuple[str, int | None, tuple[int, int] | None]:
    """('taesd' | 'kl' | a video kind (estimate.VIDEO_KINDS) | an image VAE's architecture (estimate.IMAGE_SPECS), weight bytes or None, a video VAE's widths or
    None) as the VAE's header says; an unreadable VAE counts as a full KL VAE of the usual size (the
    estimate's defaults)."""
    from .detect import detect_file
    from .vae.estimate import IMAGE_SPECS, VIDEO_KINDS, video_widths

    det = detect_file(path)
    kind = "taesd" if det.kind == "vae_approx" else "kl"
    if (
        det.kind == "vae" and det.architecture in IMAGE_SPECS
    ):  # a 32x image VAE: the DC-AE, HunyuanImage 2.1's
        kind = det.architecture
    widths = None
    if det.kind == "vae" and det.architecture in VIDEO_KINDS:
        kind = det.architecture
        comp = det.components.get("vae")
        widths = video_widths(path, kind, comp.prefix if comp is not None else "")
    return kind, sum(int(c.bytes or 0) for c in det.components.values()) or None, widths


def _quiet(ask, path: str):
    """`ask(path)`, or None where the file cannot answer (the latent's own reader then says why)."""
    try:
        return ask(path)
    except (EngineError, OSError, ValueError):
        return None


def estimate(req: EstimateDecode) -> DecodeEstimate:
    """The estimate for `req`; a missing or unreadable input is a FormatError whose message says why."""
    from .formats.latent import audio_latent_key
    from .vae import estimate_decode_bytes, estimate_encode_bytes
    from .vae.estimate import IMAGE_SPECS, VIDEO_SPECS, video_frames
    from .vae.frames import encodable_frames

    if req.source.lower().endswith((".safetensors", ".latent")) and _quiet(audio_latent_key, req.source):
        from .vae.audio_loading import decode_bytes  # torch: the sound decoder is built on the meta device

        need = decode_bytes(req.vae, req.source)
        return DecodeEstimate("decode", 0, 0, need, need, 0, media="sound")
    try:
        from .vae.clips import clip_info, is_clip

        clip = clip_info(req.source) if is_clip(req.source) else None
        if clip is not None:  # a clip to encode with a video VAE (engine.decoding.encode)
            width, height = clip.width, clip.height
            batch, channels, fn, direction = 1, 4, estimate_encode_bytes, "encode"
        elif req.source.lower().endswith(IMAGE_SUFFIXES):
            from .vae.images import image_size

            width, height = image_size(req.source)
            batch, channels, fn, direction = 1, 4, estimate_encode_bytes, "encode"
        else:
            from .formats.latent import latent_info

            shape = latent_info(req.source).shape
            batch, channels, h, w = shape[0], shape[1], shape[-2], shape[-1]
            fn, direction = estimate_decode_bytes, "decode"
    except EngineError:
        raise
    except (OSError, ValueError) as e:  # missing, unreadable, not an image
        raise FormatError(str(e), path=req.source) from e
    kind, weights, widths = _vae_facts(req.vae)
    kw = dict(kind=kind, latent_channels=channels, batch=batch, weight_bytes=weights)
    frames = 0
    if clip is not None:
        if kind not in VIDEO_SPECS:
            raise FormatError(f"{os.path.basename(req.source.rstrip(os.sep))} is a clip: encoding a clip needs a "
                              "video VAE (Wan, HunyuanVideo, LTX-Video, ...)", path=req.source)  # fmt: skip
        frames = encodable_frames(kind, clip.frames) or 1  # the frames its encoder will take (0: unknown)
        kw["frames"] = frames
    if direction == "encode" and kind in VIDEO_SPECS:
        kw["widths"] = widths  # the file's own widths: a reduced VAE needs less than the published one
    if direction == "decode":
        spec = VIDEO_SPECS.get(kind) or IMAGE_SPECS.get(kind)
        f = spec.downscale if spec is not None else 8
        width, height = w * f, h * f
        if kind in VIDEO_SPECS:
            t = shape[2] if len(shape) == 5 else 1
            kw["latent_frames"] = t
            kw["widths"] = widths
            frames = video_frames(kind, t) if len(shape) == 5 else 0
    full = fn(width, height, **kw)
    tile = req.tile
    if "latent_frames" in kw:  # a video tile computes its whole box: as the run plans it
        from .vae.choice import largest_box_px
        from .vae.estimate import VIDEO_SPECS, VIT_KINDS, VIT_TILE

        overlap = VIDEO_SPECS[kind].context_px("decode") * 2
        if kind in VIT_KINDS:  # its release's tiles are its output: the ones the run takes
            tile, overlap = VIT_TILE
        kw["tile_area"] = largest_box_px((h, w), f, tile, overlap) * batch
    tiled = fn(width, height, tile=tile, **kw)
    return DecodeEstimate(direction, width, height, full, tiled, tile, frames)
