"""The GPU band size of the tiled VAE executor (ops.GPU_BAND_BYTES), swept on a lent GPU: the SD VAE's
layout at width 128, float16, full decode against 512-px tiles (states on the device) and against a
1 GiB budget (smaller tiles, states in pinned host RAM). Run from the repository root:

    python3 benchmarks/gpu/bands_sweep.py cuda 128 1024,2048

Its output on an H200: benchmarks/gpu/2026-11-26-h200-bands.txt.
"""

import sys

sys.path.insert(0, ".")
sys.path.insert(0, "tests/engine")
sys.path.insert(0, "benchmarks")
import torch
from gpu_check import timed_decode
from vae_fixtures import psnr, small_kl

from engine import ops

dev = sys.argv[1] if len(sys.argv) > 1 else "cuda"
ch = int(sys.argv[2]) if len(sys.argv) > 2 else 128
sizes = [int(v) for v in (sys.argv[3] if len(sys.argv) > 3 else "1024,2048").split(",")]
cuda = dev == "cuda"
dt = torch.float16 if cuda else torch.float32
vae = small_kl(ch=ch, seed=5).to(dev, dt)


def run(z, **kw):
    out, seconds, peak, info = timed_decode(vae, z, dev, dt, **kw)
    return out, seconds, (peak or 0) / 2**20, info


run(torch.randn(1, 4, 32, 32), tiled=False)
zs = {s: torch.randn(1, 4, s // 8, s // 8, generator=torch.Generator().manual_seed(s)) for s in sizes}
fulls = {}
for s in sizes:
    ts = [run(zs[s], tiled=False) for _ in range(2)]
    fulls[s] = ts[-1][0]
    print(f"full {s}: {min(t[1] for t in ts):.3f}s peak {ts[-1][2]:.0f}MiB", flush=True)
for band in (8 << 20, 32 << 20, 128 << 20, 1 << 40):
    ops.GPU_BAND_BYTES = band
    for s in sizes:
        ts = [run(zs[s], tiled=True, tile=512, overlap=64) for _ in range(2)]
        o, _, p, info = ts[-1]
        print(
            f"band {band >> 20}MiB {s} 512-px {info.store}: {min(t[1] for t in ts):.3f}s peak {p:.0f}MiB psnr {psnr(o, fulls[s]):.1f}",
            flush=True,
        )
    o, t, p, info = run(zs[sizes[0]], tiled=True, budget=1 << 30)
    print(
        f"band {band >> 20}MiB {sizes[0]} 1GiB budget {info.store} {info.tile_px}px x{info.tiles}: {t:.3f}s peak {p:.0f}MiB psnr {psnr(o, fulls[sizes[0]]):.1f}",
        flush=True,
    )
