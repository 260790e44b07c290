"""Writing decoded sound: a WAV file (16-bit PCM, the channels interleaved), written atomically through a
temporary sibling renamed into place, so an interrupted write never leaves half a file behind.

Samples come as float32 in [-1, 1], interleaved frame by frame (engine.requests.AudioResult.samples).
"""

from __future__ import annotations

import wave

from .atomic import atomic_output


def pcm16(samples: bytes) -> bytes:
    """float32 samples in [-1, 1] as little-endian 16-bit integers (clipped, rounded to nearest)."""
    import numpy as np

    x = np.frombuffer(samples, dtype="<f4")
    return (np.clip(x, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def write_wav(path: str, samples: bytes, channels: int, rate: int) -> None:
    with atomic_output(path) as f, wave.open(f, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16(samples))
