"""The SD VAE's layout (width 128, fp16) on a lent GPU: full against 512-px tiled decodes (states on the
device), three timings each, twice; then torch.profiler of one tiled run (by GPU and by CPU time) and of
one full run, and cProfile of a tiled run. Run from the repository root (gpu_check's wheels on the path):

    python3 benchmarks/gpu/kl_profile.py [SIZE] [host]

(`host`: the tiled run under a 1 GiB budget instead, its states in pinned host RAM.)

Its output on an H100: benchmarks/gpu/2026-11-26-h100-kl-tiled-profile.txt; on 21a4382 (halos given and
taken: the device's index missing) and bedf609 (in place): benchmarks/gpu/2026-11-27-h100-*-profile.txt.
"""

import cProfile
import io
import pstats
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "tests/engine")
import torch
from torch.profiler import ProfilerActivity, profile
from vae_fixtures import small_kl

from engine.vae import decode
from engine.vae.run import RunInfo

TILED = {"tiled": True, "tile": 512, "overlap": 64}


def main() -> None:
    global TILED
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    if sys.argv[2:] == ["host"]:
        TILED = {"tiled": True, "budget": 1 << 30}
    vae = small_kl(ch=128, seed=5).to("cuda", torch.float16)
    z = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(1))

    def run(**kw):
        torch.cuda.synchronize()
        info = RunInfo()
        t0 = time.perf_counter()
        decode(vae, z, device="cuda", dtype=torch.float16, info=info, **kw)
        torch.cuda.synchronize()
        return time.perf_counter() - t0, info

    for name, kw in (("full", {"tiled": False}), ("tiled", TILED)) * 2:
        print(name, [round(run(**kw)[0], 3) for _ in range(3)], flush=True)
    _, info = run(**TILED)
    print("info", info.mode, info.store, info.tiles, info.notes, flush=True)
    for kw, sorts in (
        (TILED, ("self_cuda_time_total", "self_cpu_time_total")),
        ({"tiled": False}, ("self_cuda_time_total",)),
    ):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            run(**kw)
        for key in sorts:
            print(p.key_averages().table(sort_by=key, row_limit=25, max_name_column_width=70), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    run(**TILED)
    pr.disable()
    for key, n in (("tottime", 30), ("cumtime", 40)):
        s = io.StringIO()
        pstats.Stats(pr, stream=s).sort_stats(key).print_stats(n)
        print(s.getvalue())


if __name__ == "__main__":
    main()
