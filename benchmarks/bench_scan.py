"""Library scan speed on 1,000 header-faithful files of mixed layouts (ComfyUI folders).

* cold scan (empty cache: every header read and detected) vs a bare loop of
  `safetensors.safe_open(f).keys()` + `.metadata()` over the same files (the least any header reader
  can do; no validation, no detection, no cache);
* the cold scan with worker processes vs in one process (what a big first scan gains on a multi-core
  machine; the automatic choice uses up to 8 workers, one fewer than the usable CPUs) — measured only
  with 4 or more usable CPUs, or when asked with `--workers`;
* warm re-scan (nothing changed: cache hits, only stat calls) vs the cold scan.

Each measurement prints one JSON line; CPU seconds (process_time) are given beside wall seconds because
on a shared machine wall time also measures the neighbours. Page cache: the baseline loop runs once untimed first, so both
sides read headers from memory.
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.catalog import LibraryCache, scan  # noqa: E402
from engine.catalog.demo_weights import sd1_lora_modules  # noqa: E402
from engine.catalog.parallel import usable_cpus  # noqa: E402
from engine.formats.safetensors import write_sparse  # noqa: E402
from tests.support import synth  # noqa: E402

N_FILES = 1000
# (folder, synth layout or "lora", share of the library)
MIX = [
    ("checkpoints", "sd1_checkpoint", 0.15),
    ("checkpoints", "sdxl_checkpoint", 0.15),
    ("diffusion_models", "flux1_dev_transformer", 0.05),
    ("unet", "sdxl_unet", 0.05),
    ("vae", "sd_vae", 0.05),
    ("text_encoders", "clip_l", 0.05),
    ("text_encoders", "t5xxl", 0.03),
    ("loras", "lora", 0.47),
]


def _lora_rows():
    rows = []
    for name, i, o, conv in sd1_lora_modules():
        k = (1, 1) if conv else ()
        rows += [
            (f"{name}.lora_down.weight", "F16", (16, i, *k)),
            (f"{name}.lora_up.weight", "F16", (o, 16, *k)),
        ]
        rows.append((f"{name}.alpha", "F16", ()))
    return rows


def _clone_sparse(template: Path, dest: Path) -> None:
    """Same header, same hole: a faithful copy without reading (or writing) the data region."""
    with open(template, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        head = f.read(8 + n)
    size = template.stat().st_size
    with open(dest, "wb") as f:
        f.write(head)
        f.truncate(size)


def build_library(root: Path) -> list[Path]:
    templates = root / "_templates"
    templates.mkdir(parents=True)
    files = []
    for folder, layout, share in MIX:
        tpl = templates / f"{layout}.safetensors"
        if not tpl.exists():
            if layout == "lora":
                write_sparse(
                    tpl, _lora_rows(), {"ss_network_module": "networks.lora", "ss_network_dim": "16"}
                )
            else:
                synth.write(layout, tpl)
        for i in range(round(N_FILES * share)):
            p = root / "models" / folder / f"{layout}_{i:04d}.safetensors"
            p.parent.mkdir(parents=True, exist_ok=True)
            _clone_sparse(tpl, p)
            files.append(p)
    shutil.rmtree(templates)
    return files


def baseline(files: list[Path]) -> tuple[float, float]:
    """(wall, CPU) seconds of the bare safe_open loop."""
    from safetensors import safe_open

    t, c = time.perf_counter(), time.process_time()
    for p in files:
        with safe_open(str(p), framework="numpy") as f:
            f.keys()
            f.metadata()
    return time.perf_counter() - t, time.process_time() - c


def main() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="loadout-bench-scan-"))
    try:
        lib = tmp / "ComfyUI"
        files = build_library(lib)
        baseline(files)  # warm the page cache
        base_s, base_cpu = baseline(files)
        cache = LibraryCache(tmp / "cache.sqlite3")
        t, c = time.perf_counter(), time.process_time()
        cold = scan([lib], cache=cache, workers=1)
        cold_s, cold_cpu = time.perf_counter() - t, time.process_time() - c
        assert cold.read == len(files) and not cold.bad, (cold.read, [e.error for e in cold.bad][:3])
        warm_runs = []
        for _ in range(3):
            t = time.perf_counter()
            warm = scan([lib], cache=cache)
            warm_runs.append(time.perf_counter() - t)
            assert warm.read == 0 and warm.from_cache == len(files)
        warm_s = min(warm_runs)
        cache.close()
        common = {"files": len(files), "layouts": len(MIX)}
        print(json.dumps({"name": "scan_cold", "ours_s": round(cold_s, 4),
                          "baseline": "safetensors.safe_open keys()+metadata() loop",
                          "baseline_s": round(base_s, 4), "ratio": round(cold_s / base_s, 2),
                          "ours_cpu_s": round(cold_cpu, 4), "baseline_cpu_s": round(base_cpu, 4),
                          "cpu_ratio": round(cold_cpu / base_cpu, 2), **common}))  # fmt: skip
        if usable_cpus() >= 4 or "--workers" in sys.argv:  # on 2 CPUs there is nothing to gain (and CI has 2)
            workers = max(2, min(8, usable_cpus() - 1))
            with LibraryCache(tmp / "cache-workers.sqlite3") as wcache:
                t = time.perf_counter()
                par = scan([lib], cache=wcache, workers=workers)
                par_s = time.perf_counter() - t
            assert par.read == len(files)
            print(json.dumps({"name": "scan_cold_workers", "ours_s": round(par_s, 4),
                              "baseline": "cold scan in one process", "baseline_s": round(cold_s, 4),
                              "ratio": round(par_s / cold_s, 3), "workers": workers,
                              "usable_cpus": usable_cpus(), **common}))  # fmt: skip
        print(json.dumps({"name": "scan_warm", "ours_s": round(warm_s, 4), "baseline": "cold scan (empty cache)",
                          "baseline_s": round(cold_s, 4), "ratio": round(warm_s / cold_s, 4),
                          "vs_safe_open_loop": round(warm_s / base_s, 3), **common}))  # fmt: skip
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
