"""Every GPU check in one call, for the device tool's lent machine (its python3 holds a CUDA torch;
diffusers and gguf travel as wheels in `.whl`, see /work/.library/device/README.md):

    python3 benchmarks/gpu_check.py [--device cuda] [--dim 96] [--skip-tests] > gpu-check.txt

1. the `cuda`-marked tests (pytest -m cuda: residency streams and pinned memory, the step, VAE, GGUF);
2. the Wan 2.1 video VAE (its real width 96, random weights, float16) decoding 832x480, 5 latent frames:
   whole frames in one chunk, whole frames in chunks of one latent frame, and 512-px tiles in chunks of
   one -- the device's peak (torch.cuda.max_memory_allocated above the weights) against
   engine.vae.estimate's prediction for the same tiling (its CPU runtime left out), and the seconds.
   The estimate's coefficients were calibrated on the CPU only; these lines are what recalibrates
   them for CUDA (`K_VIDEO_*` in engine/vae/estimate.py).

Each figure is one JSON line on stdout. `--device cpu --dim 16` runs the same code here (peaks are then
not measured) to check the script before a GPU session spends its minutes on it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def cuda_tests() -> None:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen", PYTHONPATH=str(ROOT))
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "tests/engine", "-m", "cuda", "-q", "-p", "no:cacheprovider"],
                       cwd=ROOT, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
    emit(check="pytest -m cuda", rc=r.returncode, seconds=round(time.perf_counter() - t0, 1), tail=tail)


def video_vae(device: str, dim: int) -> None:
    import torch
    from bench_vae_video import _vae

    from engine.vae import decode
    from engine.vae.estimate import RUNTIME_BYTES
    from engine.vae.run import RunInfo, job_of

    cuda = device == "cuda"
    dtype = torch.float16 if cuda else torch.float32
    vae = _vae(dim).to(device=device, dtype=dtype)
    z = torch.randn(1, 16, 5, 60, 104, generator=torch.Generator().manual_seed(1))
    runs = (("full, one chunk", dict(tiled=False, tile_frames=5)), ("full, chunks of 1", dict(tiled=False, tile_frames=1)),
            ("512-px tiles, chunks of 1", dict(tiled=True, tile=512, overlap=64, tile_frames=1)))  # fmt: skip
    for name, kw in runs:
        info = RunInfo()
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        decode(vae, z, device=device, dtype=dtype, info=info, **kw)
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        job = job_of(vae, z, "decode", torch.device(device), dtype)
        weights = sum(p.numel() * p.element_size() for p in vae.parameters())
        tiled = info.mode == "tiled"
        predicted = job.video_bytes(
            info.tile_px if tiled else None, info.tile_frames, info.overlap_px if tiled else None
        )
        predicted -= RUNTIME_BYTES + weights
        peak = torch.cuda.max_memory_allocated() - base if cuda else None
        emit(check=f"wan21 dim{dim} 832x480x17 {name}", device=device, dtype=str(dtype).removeprefix("torch."),
             mode=info.mode, tile_px=info.tile_px, tile_frames=info.tile_frames, oom_retries=info.oom_retries,
             seconds=round(seconds, 2), peak_bytes=peak, predicted_bytes=predicted,
             predicted_over_peak=round(predicted / peak, 3) if peak else None)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dim", type=int, default=96)
    ap.add_argument("--skip-tests", action="store_true")
    a = ap.parse_args()
    import torch

    emit(check="machine", torch=torch.__version__, cuda=torch.cuda.is_available(),
         gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None)  # fmt: skip
    if not a.skip_tests:
        cuda_tests()
    video_vae(a.device, a.dim)


if __name__ == "__main__":
    main()
