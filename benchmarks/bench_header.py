"""Header reads: our validated reader vs the safetensors library, and our torch-zip index vs torch.load.

1. A header-faithful sparse SDXL single-file checkpoint (every real key and shape, data a hole) from
   ../shared/data/manifests/sdxl_base_sgm_single_file.json: our `read_header` and `open_index` vs
   `safetensors.safe_open(path, "pt")` + `.keys()` + `.metadata()`.
2. A real-format torch zip checkpoint with the SD1.5 key layout (shapes clipped so the data is small;
   the pickle, which is what an index reads, has every key): `open_index` vs
   `torch.load(mmap=True, weights_only=True)` + `.keys()`.

Prints one JSON line per measurement; times are the median seconds per call over many repetitions.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _record import record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = Path(os.environ.get("LOADOUT_TEST_DATA") or ROOT.parent / "shared" / "data")


def _median_time(fn, reps: int) -> tuple[float, float]:
    """Median wall seconds per call, and median CPU seconds of this thread (robust on a busy machine)."""
    fn()  # warm the page cache and imports
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        fn()
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(wall), statistics.median(cpu)


def _layout(name: str, fallback_keys: int) -> tuple[list[tuple[str, str, tuple[int, ...]]], str]:
    p = DATA / "manifests" / name
    if p.exists():
        tensors = json.loads(p.read_text())["tensors"]
        return [(k, v["dtype"], tuple(v["shape"])) for k, v in tensors.items()], name
    # No reference data (a user's clone): a synthetic layout of the same size.
    entries = [(f"model.block.{i}.weight", "F16", (640, 640)) for i in range(fallback_keys)]
    return entries, f"synthetic {fallback_keys} keys (manifest {name} not found)"


def _line(name: str, ours: tuple[float, float], baseline: str, base: tuple[float, float], **extra) -> None:
    record(
        name,
        ours[0],
        "s",
        baseline=baseline,
        baseline_value=base[0],
        ours_cpu_s=ours[1],
        baseline_cpu_s=base[1],
        cpu_ratio=ours[1] / base[1],
        **extra,
    )


def bench_safetensors(tmp: Path, reps: int) -> None:
    from safetensors import safe_open

    from engine.formats import open_index, read_header
    from engine.formats.safetensors import write_sparse

    entries, source = _layout("sdxl_base_sgm_single_file.json", 2515)
    path = tmp / "sdxl_sparse.safetensors"
    write_sparse(path, entries, {"modelspec.architecture": "stable-diffusion-xl-v1-base"})
    h = read_header(path)

    def baseline():
        with safe_open(str(path), "pt") as f:
            f.keys()
            f.metadata()

    base = _median_time(baseline, reps)
    common = {"tensors": len(h.tensors), "header_bytes": h.header_size, "file_bytes": h.file_size}
    common |= {"layout": source, "reps": reps}
    _line(
        "safetensors_read_header_sdxl",
        _median_time(lambda: read_header(path), reps),
        "safetensors.safe_open(...).keys()+metadata()",
        base,
        **common,
    )
    _line(
        "safetensors_open_index_sdxl",
        _median_time(lambda: open_index(path), reps),
        "safetensors.safe_open(...).keys()+metadata()",
        base,
        **common,
    )


def bench_torch_zip(tmp: Path, reps: int) -> None:
    import torch

    from engine.formats import open_index

    entries, source = _layout("sd15_ldm_single_file.json", 1131)
    dtypes = {"F16": torch.float16, "F32": torch.float32, "I64": torch.int64}
    sd = {
        k: torch.zeros(tuple(min(s, 4) for s in shape), dtype=dtypes.get(dt, torch.float32))
        for k, dt, shape in entries
    }
    path = tmp / "sd15_layout.ckpt"
    torch.save({"state_dict": sd, "global_step": 840000}, path)
    assert len(open_index(path).tensors) == len(sd)

    def baseline():
        torch.load(path, mmap=True, weights_only=True)["state_dict"].keys()

    _line(
        "torch_zip_open_index_sd15_layout",
        _median_time(lambda: open_index(path), reps),
        "torch.load(mmap=True, weights_only=True)['state_dict'].keys()",
        _median_time(baseline, reps),
        tensors=len(sd),
        file_bytes=path.stat().st_size,
        layout=source + " (shapes clipped to 4)",
        reps=reps,
    )


def main() -> int:
    reps = int(os.environ.get("BENCH_REPS", "200"))
    with tempfile.TemporaryDirectory(prefix="loadout-bench-") as d:
        bench_safetensors(Path(d), reps)
        bench_torch_zip(Path(d), max(10, reps // 4))
    return 0


if __name__ == "__main__":
    sys.exit(main())
