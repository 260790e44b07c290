"""Loading a real-size SD1.5 layout (random fp16 weights in a temporary file) into usable components.

Baseline ("load_file + copy"): safetensors.torch.load_file(path), then every tensor copied into a module
whose parameters were allocated beforehand — what load_state_dict does. Ours: build the components from
the header (parameters are zero-copy mmap views: the disk tier), then Residency.load() module by module
(each module's span of the file mapped privately and populated: the page-cache pages themselves). Cold =
the file's pages dropped from the page cache first (posix_fadvise DONTNEED, this file only); warm =
cached. Every timed load, on either side, starts from a collected and trimmed heap, and the baseline's
parameters are faulted in before its clock starts (a built model's are): glibc otherwise handed the
baseline its previous round's freed pages in some rounds and fresh ones in others, and its warm copy
took 0.33 s or 0.93 s with the order the loads ran in.

Lines: build_disk_tier, load_cold, load_warm, unload, load_uss_vs_ledger, partial_load_50pct (each a
best over the rounds).
Usage: bench_load.py [--gb SIZE] [--repeat N]  (default: the whole SD1.5 layout, ~2.1 GB, 2 rounds).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _record import record  # noqa: E402

MANIFEST = Path(__file__).resolve().parents[2] / "shared" / "data" / "manifests" / "sd15_ldm_single_file.json"
PREFIXES = {
    "unet": "model.diffusion_model.",
    "clip_l": "cond_stage_model.transformer.",
    "vae": "first_stage_model.",
}


def write_layout(path: Path, limit: int | None) -> int:
    """Random fp16 weights with the SD1.5 names and shapes (a prefix of them up to `limit` bytes)."""
    import math

    import torch

    from engine.formats.safetensors import save_tensors

    tensors = json.loads(MANIFEST.read_text())["tensors"]
    pool = torch.randn(40 << 20, generator=torch.Generator().manual_seed(0), dtype=torch.float16)
    out, total, off = {}, 0, 0
    for k, v in tensors.items():
        if not k.startswith(tuple(PREFIXES.values())):
            continue
        n = math.prod(v["shape"])
        if limit is not None and total + 2 * n > limit:
            continue
        if v["dtype"] == "I64":
            out[k] = torch.zeros(v["shape"], dtype=torch.int64)
            total += 8 * n
            continue
        start = (off * 7919) % (pool.numel() - n + 1)  # a random-valued slice of the pool: cheap to make
        out[k] = pool[start : start + n].reshape(v["shape"])
        off += 1
        total += 2 * n
    save_tensors(path, out)
    return total


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


PARTIAL_PAIRS = 5  # partial loads (ours, then the baseline's) per round


def cold_start(path: Path) -> None:
    """The file out of this machine's page cache, from the same state every time: read through once
    sequentially, then dropped. On this (virtual) machine a guest-cold read is fed by the host's cache
    of the disk for a few seconds after the file was last read: a plain read of the 2.1 GB file took
    0.64-0.74 s right after another, 1.17 s a second later, 2.5 s after 3 s, 3.0 s after 10 s; and
    right after load_file's read (2.2-2.5 s) or our populate (1.5-2.9 s) it was slow as well (the
    guest's own counters -- faults, file THP, compaction, allocations -- were the same in every case).
    Our cold load read 0.67-0.68 s after a plain read against 1.0-1.5 s after load_file, which is what
    made load_cold depend on which side ran first. So load_cold compares both sides guest-cold but
    host-warm. Read cold from the disk itself (10 s after the drop, 2026-11-26) our load took 1.46-1.66 s
    in two sessions, load_file + copy 1.04-1.14 s in the first and 1.9-3.9 s in the second (a plain
    read 3.65 s): the host's disk sets that side, so how the two compare there is not settled here.
    On a disk of its own, the read leaves nothing behind."""
    drop_cache(path)
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    drop_cache(path)


def settle() -> None:
    """The same starting heap for every timed load: garbage collected, free heap pages handed back."""
    from engine.memory import trim_heap

    gc.collect()
    trim_heap()


def baseline(path: Path, keys: set | None = None) -> tuple[float, dict]:
    """load_file, then copy each tensor (or only `keys`) into pre-allocated module parameters — the
    work of load_state_dict."""
    import torch
    from safetensors.torch import load_file

    from engine.formats.dtypes import torch_dtype
    from engine.formats.safetensors import read_header

    h = read_header(path)
    want = [k for k in h.tensors if keys is None or k in keys]
    settle()
    params = {k: torch.empty(h.tensors[k].shape, dtype=torch_dtype(h.tensors[k].dtype)) for k in want}
    for p in params.values():  # untimed: a built model's parameters exist, their pages faulted in
        p.fill_(0)
    t = time.perf_counter()
    sd = load_file(str(path))
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(sd[k])
    dt = time.perf_counter() - t
    del sd
    return dt, params


def ours(path: Path, budget: int | None = None, prefixes: dict | None = None):
    """Build `prefixes`' components (default: SD1.5's three) on the disk tier, then Residency.load() them
    on the CPU under `budget`: (build s, load s, the Residency, the components). bench_ckpt_load's too."""
    from engine.model import build_components
    from engine.residency import Policy, Residency

    settle()
    t = time.perf_counter()
    comps = build_components(path, prefixes or PREFIXES)
    t_build = time.perf_counter() - t
    m = Residency(
        "cpu",
        probe=lambda: 1 << 50,
        policy=Policy(reserve_bytes=0, min_inference_bytes=0, vram_budget=budget, auto_top_up=False),
    )
    t = time.perf_counter()
    m.load(list(comps.values()))
    t_load = time.perf_counter() - t
    return t_build, t_load, m, comps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=None, help="write only this many GB of the layout")
    ap.add_argument("--repeat", type=int, default=2, help="rounds (the best of each is reported)")
    a = ap.parse_args()
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    with tempfile.TemporaryDirectory(prefix="bench_load_") as d:
        path = Path(d) / "sd15_fp16.safetensors"
        size = write_layout(path, None if a.gb is None else int(a.gb * 1e9))
        gb = size / 1e9
        # Rounds alternate baseline and ours so both see the same machine load; the best round counts.
        best = {
            k: float("inf")
            for k in ("b_cold", "o_cold", "b_warm", "o_warm", "b_free", "o_free", "build", "o_part", "b_part")
        }
        resident: set | None = None
        part_bytes = 0
        freed = 0

        def baseline_cold() -> None:
            cold_start(path)  # cold: this file's pages out of the page cache
            dt, params = baseline(path)
            best["b_cold"] = min(best["b_cold"], dt)
            del params
            gc.collect()

        def ours_cold() -> int:
            cold_start(path)
            build, o_cold, m, comps = ours(path)
            best["o_cold"] = min(best["o_cold"], build + o_cold)
            t = time.perf_counter()
            freed = m.unload_all()
            best["o_free"] = min(best["o_free"], time.perf_counter() - t)
            del m, comps
            gc.collect()
            return freed

        for r in range(a.repeat):
            # The cold pair swaps its order each round, and each starts from cold_start's state: a cold
            # load right after load_file's cold read took 0.78-1.13 s against 0.64-0.65 s after a plain
            # read, so whichever ran second carried that cost in every round (see cold_start).
            if r % 2 == 0:
                baseline_cold()
                freed = ours_cold()
            else:
                freed = ours_cold()
                baseline_cold()
            dt, params = baseline(path)  # warm: the page cache holds the file now
            best["b_warm"] = min(best["b_warm"], dt)
            t = time.perf_counter()
            del params
            gc.collect()
            best["b_free"] = min(best["b_free"], time.perf_counter() - t)
            build, o_warm, m, comps = ours(path)
            best["o_warm"] = min(best["o_warm"], build + o_warm)
            best["build"] = min(best["build"], build)
            m.unload_all()
            del m, comps
            # partial, warm: half the bytes allowed; the baseline copies the same modules' tensors. Five
            # pairs a round: each side takes ~0.05 s, and the baseline's moved between 0.047 and 0.075 s
            # from one run to the next (the ratio with it: 0.68-0.92 on unchanged code), so a best of
            # three rounds flagged noise
            for _ in range(PARTIAL_PAIRS):
                build, o_part, m, comps = ours(path, budget=size // 2)
                best["o_part"] = min(best["o_part"], build + o_part)
                got = {
                    k for c in comps.values() for u in c.units if u.tier == "device" for k in u.keys.values()
                }
                assert resident is None or got == resident, "the plan changed between rounds"
                resident, part_bytes = got, m.snapshot().device_bytes
                m.unload_all()
                del m, comps
                dt, params = baseline(path, resident)
                best["b_part"] = min(best["b_part"], dt)
                del params
        common = dict(baseline="load_file + copy", bytes=size, rounds=a.repeat)
        # The goals: every load at most as slow as load_file + copy (issue 14).
        record(
            "load_cold",
            best["o_cold"],
            "s",
            baseline_value=best["b_cold"],
            goal=1.0,
            ours_gb_s=round(gb / best["o_cold"], 3),
            **common,
        )
        record(
            "load_warm",
            best["o_warm"],
            "s",
            baseline_value=best["b_warm"],
            goal=1.0,
            ours_gb_s=round(gb / best["o_warm"], 3),
            build_s=round(best["build"], 4),
            **common,
        )
        # Judged by its own time: the baseline side (freeing load_file's tensors) moved between 43 and
        # 81 ms from run to run, and flagged the ratio in four of five checks on unchanged code (ours
        # 16.6-17.8 ms); a change under 5 ms is none.
        record(
            "unload",
            best["o_free"],
            "s",
            baseline="del tensors + gc",
            baseline_value=best["b_free"],
            judged="value",
            slack=0.005,
            bytes_freed=freed,
            rounds=a.repeat,
        )
        # The ledger against the process (issue 14: on a dense file, USS within 5 % of the ledger): the
        # USS a full load adds, over the bytes the ledger says are resident. Measured from the state
        # after an unload, so what importing torch and building the modules cost is not counted.
        import psutil

        proc = psutil.Process()
        build, _, m, comps = ours(path)
        settle()  # garbage of the rounds above is not the load's (in some runs it was 0.4 GB)
        loaded_uss = proc.memory_full_info().uss
        ledger = sum(c.tier_bytes()["device"] for c in comps.values())
        m.unload_all()
        del m, comps
        settle()
        base_uss = proc.memory_full_info().uss
        record(
            "load_uss_vs_ledger",
            abs((loaded_uss - base_uss) / ledger - 1),
            "fraction",
            baseline="|USS added by the load / ledger bytes - 1|",
            judged="value",
            goal=0.05,
            uss_added=loaded_uss - base_uss,
            ledger_bytes=ledger,
        )
        # the disk tier alone: usable modules whose weights stay on the mmap (zero-copy, fp16 kept)
        from engine.model import build_components

        # best of 5: a 30 ms figure judged against a fixed goal, where one shot moved by half with the
        # machine's noise (it flagged 31.7 ms against a 24.5 ms baseline with no model code changed)
        t_disk = float("inf")
        for _ in range(5):
            comps = None
            t = time.perf_counter()
            comps = build_components(path, PREFIXES)
            t_disk = min(t_disk, time.perf_counter() - t)
        from safetensors.torch import load_file

        t = time.perf_counter()
        sd = load_file(str(path))
        t_map = time.perf_counter() - t
        # judged by its own time: the issue asks for the zero-copy disk tier within 50 ms
        record(
            "build_disk_tier",
            t_disk,
            "s",
            baseline="load_file alone (maps, no copy)",
            baseline_value=t_map,
            judged="value",
            goal=0.05,
            bytes_resident=0,
            modules=sum(len(c.units) for c in comps.values()),
        )
        del sd, comps
        gc.collect()
        record(
            "partial_load_50pct",
            best["o_part"],
            "s",
            baseline="load_file + copy of the same resident modules (warm)",
            baseline_value=best["b_part"],
            goal=1.0,
            budget=size // 2,
            resident=part_bytes,
            rounds=a.repeat,
        )


if __name__ == "__main__":
    main()
