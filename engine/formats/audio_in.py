"""Reading a sound to encode: any file FFmpeg decodes (WAV, FLAC, MP3, OGG, M4A, or a video's audio track) through
PyAV's bundled FFmpeg, as float32 planar samples [channels, samples] at the file's own rate (the encoder resamples).
A file with no audio stream, or one FFmpeg cannot read, is a FormatError naming it."""

from __future__ import annotations

import os

from ..errors import FormatError


def read_audio(path: str, seconds: float | None = None):
    """(samples [channels, n] float32 numpy, sample rate) of the first audio stream; at most its first `seconds`."""
    import av
    import numpy as np

    if not os.path.isfile(path):
        raise FormatError(f"{path}: no such file", path=path)
    try:
        box = av.open(path)
    except av.error.FFmpegError as e:
        raise FormatError(f"{path}: not a sound FFmpeg can read ({e})", path=path) from e
    with box:
        stream = next((s for s in box.streams if s.type == "audio"), None)
        if stream is None:
            raise FormatError(f"{path}: holds no audio stream", path=path)
        rate, channels = stream.rate, stream.channels
        limit = None if seconds is None else int(seconds * rate)
        # one layout for every frame: planar float at the stream's own rate and channels
        fit = av.AudioResampler(format="fltp", layout=stream.layout.name, rate=rate)
        parts, got = [], 0
        try:
            for frame in box.decode(stream):
                for f in fit.resample(frame):
                    parts.append(f.to_ndarray())
                    got += parts[-1].shape[1]
                if limit is not None and got >= limit:
                    break
        except av.error.FFmpegError as e:
            raise FormatError(f"{path}: the sound is damaged ({e})", path=path) from e
    if not parts:
        raise FormatError(f"{path}: the audio stream holds no samples", path=path)
    x = np.concatenate(parts, axis=1).astype(np.float32)[:channels]
    return (x if limit is None else x[:, :limit]), rate
