"""Video VAE encode (engine.vae.run.encode of an image and of clips): time and peak memory above the process
before the encode (a fresh process each), against the estimate the run and the window give for it
(clip_estimate.encode_clip_bytes / estimate.full_bytes, less the runtime constant), and the time per frame of a clip against
the one-frame encode's.

    python benchmarks/bench_vae_encode.py [--family wan21|wan22|...] [--dim 16] [--size 512x512]
                                          [--frames 1,5,9] [--repeat N]

The VAEs are bench_vae_video's: random deterministic weights at base width `--dim` (96 = the real Wan 2.1
VAE; 16 keeps a CPU run short: activations scale with the width). Threads: 2. The estimate should be above
the measured peak (ratio >= 1) and not far above it: it decides whether the window says "fits".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def run_child(cfg: dict) -> dict:
    """One encode in this (fresh) process: peak RSS above the process before the clip was made."""
    import psutil
    import torch

    torch.set_num_threads(cfg.get("threads", 2))
    import bench_vae_video
    from bench_vae_video import _vae

    bench_vae_video.WITH_ENCODER = True

    from engine.vae import encode
    from engine.vae.estimate import RUNTIME_BYTES
    from engine.vae.run import RunInfo

    vae = _vae(cfg["dim"], cfg["family"])
    with torch.inference_mode():  # page a file's mmapped weights in: the estimate counts them apart
        for p in vae.parameters():
            p.sum()
    base = psutil.Process().memory_info().rss
    g = torch.Generator().manual_seed(1)
    n, h, w = cfg["frames"], cfg["height"], cfg["width"]
    x = torch.rand(1, 3, n, h, w, generator=g) if n > 1 else torch.rand(1, 3, h, w, generator=g)
    info = RunInfo()
    t0 = time.perf_counter()
    lat = encode(vae, x, info=info)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    weights = sum(p.numel() * p.element_size() for p in vae.parameters())
    # the run's estimate less its runtime constant and the weights: both are in `base` already
    return {"seconds": seconds, "peak": peak - base, "estimate": info.estimate_bytes - RUNTIME_BYTES - weights,
            "latent": list(lat.shape)}  # fmt: skip


def child(cfg: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True,
                       env=env, check=False)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    from _record import record

    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="wan21")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--size", default="512x512")
    ap.add_argument("--frames", default="1,5,9")
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    w, h = (int(v) for v in a.size.split("x"))
    runs = {}
    for n in (int(v) for v in a.frames.split(",")):
        got = [child({"family": a.family, "dim": a.dim, "width": w, "height": h, "frames": n})
               for _ in range(a.repeat)]  # fmt: skip
        best = min(got, key=lambda r: r["peak"])
        best["seconds"] = min(r["seconds"] for r in got)
        runs[n] = best
        name = f"vae_encode_{a.family}_{w}x{h}x{n}_dim{a.dim}"
        record(f"{name}_estimate_vs_measured", best["estimate"], "B",
               baseline="measured peak RSS above the process before the encode (the estimate less runtime and weights)",
               baseline_value=best["peak"], better="higher", seconds=best["seconds"], latent=best["latent"])  # fmt: skip
    one = runs.get(1)
    if one is not None:
        for n, r in runs.items():
            if n > 1:
                record(f"vae_encode_{a.family}_{w}x{h}x{n}_dim{a.dim}_time_per_frame", r["seconds"] / n, "s",
                       baseline="the one-frame encode's time", baseline_value=one["seconds"])  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(run_child(json.loads(sys.argv[2]))))
    else:
        main()
