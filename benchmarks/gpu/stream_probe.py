"""Where a partial step's time goes on a lent GPU: the Wan 2.1 step (1.3B width, 4 blocks, 480x480; bench_step's)
at 50 % resident, the rest streamed from pinned RAM, for several look-aheads of the streamer's device copies;
then torch.profiler's chrome trace of a few steps (the copy stream against the compute stream), written to
OUTDIR for reading offline. Run from the repository root (gpu_check's wheels on the path):

    python3 benchmarks/gpu/stream_probe.py OUTDIR [FAMILY] [PCT]
"""

import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, ".")
sys.path.insert(0, "benchmarks")
import torch
from bench_step import FAMILIES, write_random
from torch.profiler import ProfilerActivity, profile

import engine.denoise.device_copies as copies_mod
from engine.devices import DeviceOptions
from engine.facade import Engine
from engine.requests import Step


def run(model: Path, family: str, budget: float | None, steps: int, prof=None) -> dict:
    e = Engine()
    e.detect(DeviceOptions(vram_budget_gb=budget))
    e.residency.policy = dataclasses.replace(e.residency.policy, offload_tier="ram")
    try:
        if prof is not None:
            prof.start()
        r = e.run(Step(str(model), size=FAMILIES[family][0], steps=steps))
        if prof is not None:
            torch.cuda.synchronize()
            prof.stop()
        return {"s": round(statistics.median(r.step_seconds[1:]), 5), "steps": [round(t, 4) for t in r.step_seconds],
                "streamed": r.streamed_bytes_per_step, "prefetched": r.prefetched, "mode": r.mode}  # fmt: skip
    finally:
        e.close()


def main() -> None:
    out = Path(sys.argv[1])
    family = sys.argv[2] if len(sys.argv) > 2 else "wan"
    pct = float(sys.argv[3]) if len(sys.argv) > 3 else 50
    with tempfile.TemporaryDirectory() as d:
        model = Path(d) / f"{family}.safetensors"
        write_random(model, family, dtype=torch.float16)
        budget = model.stat().st_size * pct / 100 / 1024**3
        print("full", run(model, family, None, 12), flush=True)
        for look in (3, 8, 3, 8):
            copies_mod.LOOKAHEAD_COPIES = look
            t0 = time.perf_counter()
            r = run(model, family, budget, 12)
            print(f"lookahead {look}", r, f"({time.perf_counter() - t0:.1f} s)", flush=True)
        copies_mod.LOOKAHEAD_COPIES = 3
        prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        print("profiled", run(model, family, budget, 4, prof), flush=True)
        prof.export_chrome_trace(str(out / f"{family}-{int(pct)}-trace.json"))
        print(
            prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=20, max_name_column_width=60)
        )


if __name__ == "__main__":
    main()
