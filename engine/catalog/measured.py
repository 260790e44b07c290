"""What a sampling step costs: the activation memory a forward pass asks for, and the steps Loadout has
measured (Step / `loadout step` / the Loaded panel's "Try a step"), kept per model file and device so
`loadout plan` calibrates its step prediction from them. Torch-free: the plan reads it from headers.

Records are JSON lines in the user cache folder (`measured_steps.jsonl`), each appended with one
write (O_APPEND: lines from two processes never interleave); a file is known by its absolute path,
size and modification time, so a replaced file is not calibrated from its predecessor's steps.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .cache import cache_dir

FILE = "measured_steps.jsonl"
MAX_BYTES = 4 << 20  # beyond this the oldest half is dropped on the next write

# Activation memory a step asks for on top of the weights (so other models are evicted first): bytes
# per latent pixel (UNet) or image token (FLUX) per batch item in float32, half that in 16-bit — our own
# rough figures (skips, the GEGLU / MLP widths and attention with SDPA's memory-efficient kernels).
ACTIVATION_BYTES = {
    "unet": 64 * 1024,
    "flux": 128 * 1024,
    "mmdit": 96 * 1024,
    "qwen_image": 128 * 1024,
    "qwen_image21": 128 * 1024,  # width 4096, SwiGLU 12288, one token per 16x16 pixels (unpatched 16x latent)
    "nextdit": 128 * 1024,  # Z-Image: width 3840, SwiGLU 10240 (Lumina 2: 2304, 6144)
    "auraflow": 128 * 1024,  # width 3072 as FLUX.1's, SwiGLU 8192
    "wan": 96 * 1024,
    "hunyuan_video": 128 * 1024,  # width 3072 as FLUX.1's, its 4x MLP
    "hunyuan_video15": 96 * 1024,  # width 2048, its 4x MLP
    "cosmos": 96 * 1024,  # width 2048 (14B: 5120), 4x MLP
    "krea2": 192 * 1024,  # width 6144, SwiGLU 16384
    "flux3": 256 * 1024,  # width 3072, SwiGLU 9216; a random step holds a reference image: twice the tokens
    "hunyuan_image21": 144 * 1024,  # width 3584, 4x MLP
    "sana": 96 * 1024,  # width 2240, a 2.5x Mix-FFN
    "pixart": 64 * 1024,  # width 1152, 4x MLP
    "mochi": 128 * 1024,  # width 3072, SwiGLU 8192 (its 1536-wide text stream is few tokens)
    "hunyuan_dit": 80 * 1024,  # width 1408, a 4.36x MLP (6144)
    "hidream": 128 * 1024,  # width 2560, SwiGLU 6912 (two routed experts and the shared one per token)
    "ltxv": 96 * 1024,  # width 2048 (13B: 4096), 4x MLP, one token per 32x32 pixels
    "ltx2": 160 * 1024,  # video width 4096, 4x MLP, one token per 32x32 pixels (its audio tokens are few)
    "ernie_image": 112 * 1024,  # width 3072, a GELU-gated MLP of 8192 (text tokens beside the image's)
    "stable_cascade_c": 160 * 1024,  # width 2048, a 4x channelwise MLP, attention over few positions
    "stable_cascade_b": 32 * 1024,  # per 2x2 patch of its latent: level 0 is 320 wide (4x MLP), the skips
    "text": 64 * 1024,  # text encoders: per token
    "minimax_h3": 256 * 1024,  # width 5376, SwiGLU 14336, per video row (text and audio rows ride)
    "bria": 128 * 1024,  # FLUX.1's blocks: width 3072, 4x MLP (128 text tokens beside the image's)
    "bria_fibo": 128 * 1024,  # FLUX.1's blocks: width 3072, 4x MLP (its long JSON prompts ride beside)
    "glm_image": 96 * 1024,  # width 2560, a 4x MLP, one token per 16x16 pixels (its glyph tokens are few)
    "ideogram4": 160 * 1024,  # width 4608, SwiGLU 12288, one row per 16x16 pixels (text rows ride)
    "prx": 64 * 1024,  # width 1792, a GELU-gated MLP of 6272 (text tokens are keys only)
    "joyimage": 128 * 1024,  # width 3072, 4x MLP, two streams (per image token, the reference's counted too)
    "longcat_image": 128 * 1024,  # FLUX.1's blocks: width 3072, 4x MLP (512 text tokens ride)
    "ovis_image": 144 * 1024,  # FLUX.1's width, SwiGLU 2 x 12288 (256 text tokens ride)
    "kandinsky5": 96 * 1024,  # width 1792 (Pro 4096, Image 2560), a 4x GELU MLP; its few text tokens ride
    "sana_video": 160 * 1024,  # width 2240, a 3x Mix-FFN: two 13440-wide conv outputs alive at once
    "nucleus_image": 80
    * 1024,  # width 2048, SwiGLU 5376 or ~3 experts of 1344 per token (text tokens are keys only)
    "motif_video": 128
    * 1024,  # FLUX.1's blocks (diffusers' default width 3072, 4x MLP); 512 text tokens ride
    "cosmos_predict1": 160 * 1024,  # width 4096 (14B: 5120), 4x MLP, a learnable position table per token
    "bria_fibo2": 128
    * 1024,  # width 3584, SwiGLU 9536, one token per 16x16 pixels (256-512 gist tokens ride)
    "kandinsky6": 160 * 1024,  # width 4096, a 4x GELU MLP, per video token (text and audio tokens ride)
    "kandinsky6_sr": 96 * 1024,  # width 1792, a 4x GELU MLP, per latent pixel (a band of NABLA's mask rides)
}
# Latent pixels per image pixel side: a UNet works on the 8x latent, FLUX.1, MMDiT and Wan on 2x2 patches
# (Wan: per latent frame).
UNIT_PX = {
    "unet": 8,
    "flux": 16,
    "mmdit": 16,
    "qwen_image": 16,
    "nextdit": 16,
    "auraflow": 16,
    "wan": 16,
    "hunyuan_video": 16,
    "hunyuan_video15": 16,
    "ltxv": 32,
    "ltx2": 32,
    "cosmos": 16,
    "krea2": 16,
    "flux3": 16,
    "hunyuan_image21": 32,
    "sana": 32,
    "pixart": 16,
    "hunyuan_dit": 16,
    "hidream": 16,
    "qwen_image21": 16,
    "mochi": 16,
    "stable_cascade_c": 42,
    "stable_cascade_b": 8,
    "ernie_image": 16,
    "minimax_h3": 32,
    "bria": 16,
    "bria_fibo": 16,
    "glm_image": 16,
    "ideogram4": 16,
    "prx": 16,
    "joyimage": 16,
    "longcat_image": 16,
    "ovis_image": 16,
    "kandinsky5": 16,
    "sana_video": 16,
    "nucleus_image": 16,
    "motif_video": 16,
    "cosmos_predict1": 16,  # 2x2 patches of its 8x tokenizer's latent, per latent frame
    "bria_fibo2": 16,
    "kandinsky6": 16,
    "kandinsky6_sr": 16,
}
# Latent frames a step of a video family stands for where it is more than one: LTX-2's random step is a short
# clip (engine.denoise.inputs.LTX2_FRAMES), its video and the audio of that time.
STEP_FRAMES = {"ltx2": 3}
# HiDream-I1 pads a non-square image's tokens to 4096 (engine.denoise.hidream: max_resolution 128 x 128 latents)
HIDREAM_MAX_SEQ = 4096
# Bytes a second a partial step streams its offloaded modules at, for the prediction before any step
# is measured (pinned host RAM to a GPU over PCIe 4 x16 ~ 12 GB/s; page cache to RAM ~ 4 GB/s here).
STREAM_BYTES_PER_S = {"cuda": 12e9, "cpu": 4e9}


def units(kind: str, width: int, height: int, batch: int = 1) -> int:
    """Latent pixels (UNet) or image tokens (FLUX) of one forward pass at width x height (LTX-2: of its frames)."""
    f = UNIT_PX[kind]
    n = max(1, height // f) * max(1, width // f)
    if kind == "hidream" and width != height:
        n = max(n, HIDREAM_MAX_SEQ)
    return batch * STEP_FRAMES.get(kind, 1) * n


def activation_bytes(kind: str, n_units: int, esize: int) -> int:
    return n_units * ACTIVATION_BYTES[kind] * esize // 4


def _identity(model: str) -> dict:
    st = os.stat(model)
    return {"model": os.path.abspath(model), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _path() -> Path:
    return cache_dir() / FILE


def record_step(model: str, device: str, kind: str, width: int, height: int, result: dict) -> None:
    """Append one measured step (result: s_per_step, mode, streamed_bytes_per_step, peak_device_bytes,
    resident_bytes, dtype); an unwritable cache is not an error (the plan then goes uncalibrated)."""
    try:
        line = {**_identity(model), "device": device, "kind": kind, "width": width, "height": height,
                "units": units(kind, width, height), "time": time.time(), **result}  # fmt: skip
        p = _path()
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.exists() and p.stat().st_size > MAX_BYTES:
            _trim(p)
        data = (json.dumps(line, sort_keys=True) + "\n").encode()
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    except (OSError, ValueError, KeyError):
        pass


def _trim(p: Path) -> None:
    lines = p.read_bytes().splitlines(keepends=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_bytes(b"".join(lines[len(lines) // 2 :]))
    os.replace(tmp, p)


def latest_step(model: str, device: str) -> dict | None:
    """The newest measured step of this very file on `device` (its label), or None."""
    try:
        ident = _identity(model)
        raw = _path().read_text(errors="replace").splitlines()
    except OSError:
        return None
    for text in reversed(raw):
        try:
            rec = json.loads(text)
        except ValueError:
            continue  # a torn or foreign line: skipped
        if rec.get("device") == device and all(rec.get(k) == v for k, v in ident.items()):
            return rec
    return None


def predict_seconds(rec: dict, kind: str, n_units: int, streamed_bytes: int, device_type: str) -> float:
    """Seconds per step at `n_units` streaming `streamed_bytes`, calibrated from a measured step: its
    compute time per unit (the measured time less its own streaming at the nominal rate) scales with
    the units, and streaming adds bytes over the same rate."""
    bw = STREAM_BYTES_PER_S["cuda" if device_type == "cuda" else "cpu"]
    measured = float(rec["s_per_step"])
    compute = max(measured * 0.05, measured - float(rec.get("streamed_bytes_per_step", 0)) / bw)
    per_unit = compute / max(1, int(rec.get("units") or units(kind, rec["width"], rec["height"])))
    return per_unit * n_units + streamed_bytes / bw
