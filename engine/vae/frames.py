"""Frame counts of the video VAEs (torch-free, for engine.vae.estimate, the plan and the window): the frames a
latent decodes to, and the latent frames a clip needs."""

from __future__ import annotations


def vit_frames(latent_frames: int, clip_length: int = 17, token_drop: int = 3, time_factor: int = 4) -> int:
    """Frames MiniMax-H3's VAE decodes from `latent_frames` (engine.vae.minimax_h3: chunks of ceil(17 / 4) = 5
    latent frames reading 2 more, 17 frames kept of each, 5 cross-faded into the next; the frames that copies of
    the last latent frame made, cut): 5n + 2 latent frames give 17n + 5; 0 where they make no chunk."""
    chunk = -(-clip_length // time_factor)
    pre, overlap = (-clip_length) % time_factor, (-token_drop) % chunk
    tokens = latent_frames + token_drop
    pad = (-tokens) % chunk
    n = (tokens + pad) // chunk - int(token_drop > 0)
    if n <= 0:
        return 0
    span = chunk * time_factor
    carry = max(0, min(2 * span, (chunk + overlap) * time_factor) - span - pre) if token_drop > 0 else 0
    tail = clip_length % time_factor
    cut = sum(tail if tail and (latent_frames + k) % chunk == 0 else time_factor for k in range(pad))
    return max(0, n * (span - pre) + carry - cut)


def video_frames(kind: str, latent_frames: int) -> int:
    """Frames a video VAE of `kind` decodes from `latent_frames`."""
    from .estimate import VIDEO_SPECS, VIT_KINDS

    if kind in VIT_KINDS:
        return vit_frames(latent_frames)
    tf = VIDEO_SPECS[kind].time_factor if kind in VIDEO_SPECS else 4
    return 1 + tf * (latent_frames - 1) if latent_frames > 0 else 0


def encodable_frames(kind: str, n: int, time_factor: int | None = None) -> int:
    """The most of a clip's first `n` frames a video VAE of `kind` encodes: MiniMax-H3's takes every frame (its
    release pads the last 17-frame clip with copies of the last frame), a causal encoder 1 + k `time_factor` (the
    first frame alone, then groups of time_factor; the loaded model's own where given, else the family's)."""
    from .estimate import VIDEO_SPECS, VIT_KINDS

    if n <= 0 or kind in VIT_KINDS:
        return max(0, n)
    tf = time_factor or (VIDEO_SPECS[kind].time_factor if kind in VIDEO_SPECS else 4)
    return 1 + tf * ((n - 1) // tf)


def latent_frames_for(kind: str, frames: int) -> int:
    """The fewest latent frames that decode to at least `frames` frames."""
    t = 1
    while video_frames(kind, t) < frames and t < 100_000:
        t += 1
    return t
