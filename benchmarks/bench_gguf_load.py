"""A FLUX.1-dev-size GGUF, Q8_0 as ComfyUI-GGUF quantizes it: what the ledger counts and how fast it loads.

The file is header-faithful (every tensor of the real transformer, its 2-D block weights Q8_0 and the
rest F32, as city96's converter leaves norms, biases and small tensors), written sparse: a hole for
the data, so the 12.7 GB layout costs nothing on disk and its reads come from the page cache's zero
pages — the figures time Loadout's own work, not the disk.

Lines:
* `gguf_q8_ledger_vs_file` — bytes the residency ledger holds after a full load, over the file's
  tensor bytes (goal 1.0: the quantized blocks are held as they are stored, never dequantized).
* `gguf_q8_build` — building the component on the disk tier (zero-copy views of the map).
* `gguf_q8_load_2gb` — loading the first ~2 GB of modules into RAM (the CPU's device tier), against
  gguf-py's own `GGUFReader` plus a copy of the same tensors' bytes into preallocated buffers.

Usage: bench_gguf_load.py [--repeat N]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import record  # noqa: E402

GB = 1 << 30


def write_flux_q8(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    from engine.formats.gguf import write_sparse_gguf
    from tests.support import synth

    rows = []
    for key, _dt, shape in synth.layout("flux1_dev_transformer", dtype="BF16"):
        q8 = len(shape) == 2 and shape[-1] % 32 == 0 and key.endswith(".weight")
        rows.append((key, "Q8_0" if q8 else "F32", tuple(shape)))
    write_sparse_gguf(path, {"general.architecture": "flux"}, rows)
    return {k: (d, s) for k, d, s in rows}


def baseline(path: Path, names: set[str]) -> float:
    """gguf-py reads the file, then the chosen tensors' bytes are copied into buffers allocated first."""
    import numpy as np
    from gguf import GGUFReader

    t = time.perf_counter()
    r = GGUFReader(str(path))
    chosen = [x for x in r.tensors if x.name in names]
    bufs = [np.empty(x.n_bytes, dtype=np.uint8) for x in chosen]
    for x, b in zip(chosen, bufs, strict=True):
        np.copyto(b, np.asarray(x.data).reshape(-1).view(np.uint8))
    dt = time.perf_counter() - t
    del bufs, chosen, r
    gc.collect()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    import torch

    from engine.model import build_components
    from engine.residency import Policy, Residency

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="bench_gguf_") as d:
        path = Path(d) / "flux1-dev-Q8_0.gguf"
        rows = write_flux_q8(path)
        from engine.formats.gguf import read_gguf

        file_bytes = sum(t.nbytes for t in read_gguf(path).tensors.values())
        best = {"build": float("inf"), "ours": float("inf"), "base": float("inf")}
        held = 0
        loaded_names: set[str] = set()
        for _ in range(a.repeat):
            t = time.perf_counter()
            comps = build_components(path, {"transformer": ""})
            best["build"] = min(best["build"], time.perf_counter() - t)
            comp = comps["transformer"]
            m = Residency(
                "cpu",
                probe=lambda: 1 << 50,
                policy=Policy(reserve_bytes=0, min_inference_bytes=0, vram_budget=2 * GB, auto_top_up=False),
            )
            t = time.perf_counter()
            m.load([comp])
            best["ours"] = min(best["ours"], time.perf_counter() - t)
            loaded_names = {k for u in comp.units if u.tier == "device" for k in u.keys.values()}
            m.unload_all()
            del m, comps, comp
            gc.collect()
            best["base"] = min(best["base"], baseline(path, loaded_names))
        # The whole model held (on the disk tier: the ledger's bytes are what the tiers hold).
        comp = build_components(path, {"transformer": ""})["transformer"]
        held = sum(comp.tier_bytes().values())
        record(
            "gguf_q8_ledger_vs_file",
            held,
            "B",
            baseline="tensor bytes in the GGUF file",
            baseline_value=file_bytes,
            goal=1.0,
            tensors=len(rows),
            q8_tensors=sum(1 for dt, _ in rows.values() if dt == "Q8_0"),
        )
        record(
            "gguf_q8_build",
            best["build"],
            "s",
            baseline=None,
            judged="value",
            modules=len(comp.units),
            file_bytes=file_bytes,
        )
        record(
            "gguf_q8_load_2gb",
            best["ours"],
            "s",
            baseline="gguf GGUFReader + copy of the same tensors into preallocated buffers",
            baseline_value=best["base"],
            goal=1.0,
            tensors_loaded=len(loaded_names),
            rounds=a.repeat,
        )


if __name__ == "__main__":
    main()
