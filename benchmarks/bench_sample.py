"""Cost of one engine.memory.sample() call, against the bare psutil reads it cannot avoid.

Baseline: psutil.virtual_memory() + Process().memory_info() on a kept Process object (the minimum any
sampler of system RAM and RSS pays). With a CUDA device, also the NVML/torch device path against a
bare torch.cuda.mem_get_info(). One JSON line per measurement; the GUI calls sample() 10-20 times a
second, so `cpu_share_at_20hz` is the fraction of one core that costs.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402
from _record import record  # noqa: E402

from engine.memory import MemorySampler  # noqa: E402

CALLS = 1000
REPEATS = 15


def per_call(fn, base, calls: int = CALLS) -> tuple[float, float]:
    """Seconds per call of `fn` and of `base`, timed in alternating blocks (this machine is shared
    and noisy, so both see the same load) and reported as the best block of REPEATS."""
    for _ in range(100):
        fn()
        base()
    ours, theirs = [], []
    for _ in range(REPEATS):
        for f, out in ((base, theirs), (fn, ours)):
            t = time.perf_counter()
            for _ in range(calls):
                f()
            out.append((time.perf_counter() - t) / calls)
    return min(ours), min(theirs)


BARE = "psutil.virtual_memory+Process.memory_info"


def emit(name: str, ours: float, base: float, *, baseline: str, **extra) -> None:
    record(name, ours, "s", baseline=baseline, baseline_value=base, cpu_share_at_20hz=round(ours * 20, 6),
           calls=CALLS, repeats=REPEATS, **extra)  # fmt: skip


def main() -> None:
    proc = psutil.Process()

    def bare():
        psutil.virtual_memory()
        proc.memory_info()

    cpu = MemorySampler()
    emit("memory.sample cpu", *per_call(cpu.sample, bare), baseline=BARE)

    ledger = {f"component_{i}": (i * 1000, i * 2000) for i in range(50)}
    with_res = MemorySampler()
    with_res.register_residency_provider(lambda: dict(ledger))
    emit("memory.sample cpu + 50-component residency", *per_call(with_res.sample, bare), baseline=BARE)

    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    from engine.devices import DeviceOptions, detect_devices
    from engine.memory import target_for

    report = detect_devices(DeviceOptions())
    target = target_for(report.selected)

    def cuda_bare():
        torch.cuda.mem_get_info(0)

    base = "torch.cuda.mem_get_info"
    nvml = MemorySampler(target)
    emit("memory.sample cuda", *per_call(nvml.sample, cuda_bare, 1000), baseline=base,
         device=report.selected.name, source=nvml.sample().device_source)  # fmt: skip
    torch_only = MemorySampler(target, use_nvml=False)
    emit("memory.sample cuda without NVML", *per_call(torch_only.sample, cuda_bare, 1000), baseline=base,
         device=report.selected.name, source=torch_only.sample().device_source)  # fmt: skip


if __name__ == "__main__":
    main()
