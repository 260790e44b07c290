"""How many batch caps of streamed weights the card may hold at once (engine.model.streaming.FLIGHT_BATCHES):
the step's time and the device's peak at 50 % and 10 % resident, for a few bounds and for none (the
bound before it existed: copies limited only by LOOKAHEAD_COPIES batches ahead of the CPU).

    python3 benchmarks/gpu/flight_probe.py [--families sd15,wan_narrow,flux] [--steps 20] > $OUT/flight.jsonl

One JSON line per run (bench_step's families, float16 random weights, the rest from pinned RAM).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from gpu_check import _step_loadout, emit, warm_gpu  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--families", default="sd15,wan_narrow,flux")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--bounds", default="2,3,4,1000000")
    a = ap.parse_args()
    import torch
    from bench_step import write_random

    from engine.model import streaming

    dev = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a dry run of the script

    for family in a.families.split(","):
        with tempfile.TemporaryDirectory() as d:
            model = Path(d) / f"{family}.safetensors"
            write_random(model, family, dtype=torch.float16)
            total = model.stat().st_size
            warm_gpu(dev)
            full = _step_loadout(str(model), family, None, a.steps)
            full_s = statistics.median(full["steps"][1:])
            emit(family=family, pct=100, s=round(full_s, 5), peak=full["peak"])
            for pct in (50, 10):
                for bound in (int(b) for b in a.bounds.split(",")):
                    streaming.FLIGHT_BATCHES = bound
                    warm_gpu(dev)
                    r = _step_loadout(str(model), family, total * pct / 100 / 1024**3, a.steps)
                    s = statistics.median(r["steps"][1:])
                    emit(family=family, pct=pct, flight_batches=bound, s=round(s, 5), vs_full=round(s / full_s, 3),
                         peak=r["peak"], above_weights_and_full_activations=r["peak"] - r["resident"] - (full["peak"] - full["resident"]),
                         prefetched=round(r["prefetched"], 3), equals_full=bool(torch.equal(r["out"], full["out"])))  # fmt: skip


if __name__ == "__main__":
    main()
