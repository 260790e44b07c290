"""GroupNorm on a lent GPU: torch's F.group_norm against ops.group_norm (per-channel statistics above
ops.FAST_GN_ELEMS), each timed with CUDA events (median of 20) and compared with a float64 reference;
then full decodes of the SD VAE's layout (width 128, float16) with each, alternating. Run from the
repository root (the wheels of gpu_check on the path):

    python3 benchmarks/gpu/groupnorm_probe.py

Its output on an H100: benchmarks/gpu/2026-11-26-h100-groupnorm.txt.
"""

import json
import statistics
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "tests/engine")
import torch
import torch.nn.functional as F
from vae_fixtures import psnr, small_kl

from engine import ops
from engine.vae import decode
from engine.vae.groupstats import Moments

DEFAULT = ops.FAST_GN_ELEMS
SHAPES = ((1, 128, 1024, 1024), (1, 256, 512, 512), (1, 512, 256, 256), (1, 512, 128, 128), (1, 256, 256, 256),
          (2, 128, 1024, 1024), (1, 128, 2048, 2048), (1, 320, 64, 64), (1, 512, 64, 64))  # fmt: skip


def cuda_ms(fn, reps: int = 20) -> float:
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def one_shape(shape, g) -> dict:
    """Each way's milliseconds and its largest and RMS error against float64, for one fp16 input."""
    x = torch.randn(shape, device="cuda", generator=g) * 3
    x = (x + torch.randn(shape[:2] + (1, 1), device="cuda", generator=g) * 5).half()
    c = shape[1]
    w = (1 + 0.1 * torch.randn(c, device="cuda", generator=g)).half()
    b = (0.1 * torch.randn(c, device="cuda", generator=g)).half()
    ref = F.group_norm(x.double(), 32, w.double(), b.double(), 1e-6)

    def moments(x):  # the tiled decode's path: channel moments combined, then scale and shift
        acc = Moments(x.shape[0])
        acc.add(x)
        s = acc.stats(32)
        return ops.group_norm_with_stats(x, 32, s.mean, s.var, w, b, 1e-6)

    ways = {"native": lambda x: F.group_norm(x, 32, w, b, 1e-6), "ops": lambda x: ops.group_norm(x, 32, w, b, 1e-6),
            "ops-force": lambda x: ops.group_norm_with_stats(x, 32, *ops.group_stats(x, 32), w, b, 1e-6),
            "moments": moments}  # fmt: skip
    row = {"shape": list(shape), "per_group": x[0, 0].numel() * c // 32}
    for name, fn in ways.items():
        d = fn(x).double() - ref
        row[name] = {"ms": round(cuda_ms(lambda fn=fn: fn(x)), 4), "max_err": float(d.abs().max()),
                     "rms_err": float(d.square().mean().sqrt())}  # fmt: skip
    return row


def decodes() -> None:
    vae = small_kl(ch=128, seed=5).to("cuda", torch.float16)
    for size in (512, 1024, 2048):
        z = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(size))
        outs, times, peak = {}, {"native": [], "ops": []}, 0
        for _ in range(4):
            for name, elems in (("native", 1 << 62), ("ops", DEFAULT)):
                ops.FAST_GN_ELEMS = elems
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                t0 = time.perf_counter()
                outs[name] = decode(vae, z, tiled=False, device="cuda", dtype=torch.float16)
                torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
                peak = torch.cuda.max_memory_allocated() - base
        ops.FAST_GN_ELEMS = DEFAULT
        print(size, {k: [round(t, 4) for t in v] for k, v in times.items()}, "best native/ops",
              round(min(times["native"][1:]) / min(times["ops"][1:]), 3), "psnr ops vs native",
              round(psnr(outs["ops"], outs["native"]), 1), "peak(last ops)", peak, flush=True)  # fmt: skip


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    for shape in SHAPES:
        print(json.dumps(one_shape(shape, g)), flush=True)
        torch.cuda.empty_cache()
    decodes()


if __name__ == "__main__":
    main()
