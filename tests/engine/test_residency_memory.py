"""The ledger counts real bytes: on a dense file, each tier's bytes match the process's measured memory
(unique set size) within 5%, and a long load/unload loop keeps memory flat. Measured in a fresh
subprocess so nothing else in the test session moves the numbers."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from residency_files import SD15_MANIFEST, sd15_entries, write_dense

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import gc, json, sys, psutil
    import torch  # imported before the first measurement
    from engine.model import Component
    from engine.residency import Policy, Residency

    proc = psutil.Process()
    def uss():
        gc.collect()
        return proc.memory_full_info().uss

    out = {}
    u0 = uss()
    c = Component("unet", sys.argv[1], "model.diffusion_model.")
    u1 = uss()
    out["disk_bytes"] = c.tier_bytes()["disk"]
    out["built_delta"] = u1 - u0
    m = Residency("cpu", probe=lambda: 1 << 50,
                  policy=Policy(reserve_bytes=0, min_inference_bytes=0, auto_top_up=False))
    m.load([c])
    u2 = uss()
    out["device_bytes"] = m.snapshot().get("unet").device_bytes
    out["load_delta"] = u2 - u1
    freed = m.unload(c, out["device_bytes"] // 3)
    u3 = uss()
    out["partial_freed"] = freed
    out["partial_delta"] = u2 - u3
    out["ledger_after_partial"] = m.snapshot().get("unet").device_bytes
    out["measured_after_partial"] = c.measured_tiers()["device"]
    m.unload(c)
    u4 = uss()
    out["unload_delta"] = u2 - u4
    loop = []
    for i in range(int(sys.argv[2])):
        m.load([c])
        m.unload(c, out["device_bytes"] // 2)
        m.load([c])
        m.unload(c)
        loop.append(uss() - u4)
    out["loop"] = loop
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def dense_unet(tmp_path_factory):
    from loadout_test_support import data_file

    entries, total = sd15_entries(data_file(SD15_MANIFEST), limit_bytes=200 * 1024 * 1024)
    p = tmp_path_factory.mktemp("dense") / "unet_subset.safetensors"
    write_dense(p, entries)
    return p, total


def test_ledger_bytes_match_measured_memory_and_loops_stay_flat(dense_unet):
    path, total = dense_unet
    assert total > 180 * 1024 * 1024  # a real few-hundred-MB file, not a toy
    r = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), "4"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    dev = out["device_bytes"]
    assert dev == total
    # disk tier: zero-copy on the mmap, so building costs (almost) no memory
    assert out["built_delta"] < 0.05 * out["disk_bytes"]
    # device tier (the CPU: a copy in RAM): the ledger's bytes are the process's bytes
    assert abs(out["load_delta"] - dev) <= 0.05 * dev, out
    assert abs(out["partial_delta"] - out["partial_freed"]) <= 0.05 * out["partial_freed"], out
    assert out["ledger_after_partial"] == out["measured_after_partial"]
    assert abs(out["unload_delta"] - dev) <= 0.05 * dev, out
    # 4 rounds of full load, partial unload, reload, unload: memory returns each time
    assert max(abs(x) for x in out["loop"]) <= 0.05 * dev, out["loop"]


LOOP_CHILD = textwrap.dedent(
    """
    import gc, json, sys, psutil
    import torch
    from engine.model import build_components
    from engine.residency import Policy, Residency

    proc = psutil.Process()
    def uss():
        gc.collect()
        return proc.memory_full_info().uss

    comps = build_components(sys.argv[1])  # the whole SD1.5 layout, prefixes from detection
    budget = 48 * 1024 * 1024
    m = Residency("cpu", probe=lambda: 1 << 50,
                  policy=Policy(reserve_bytes=0, min_inference_bytes=0, vram_budget=budget))
    seen, first = [], None
    for i in range(int(sys.argv[2])):
        for c in comps.values():
            m.load([c])
            assert m.snapshot().device_bytes <= budget
        m.unload_all()
        u = uss()
        first = first if first is not None else u
        seen.append(u - first)
    print(json.dumps({"file_bytes": sum(c.file_bytes for c in comps.values()), "seen": seen}))
    """
)


def test_long_loop_over_a_real_size_layout_stays_flat(tmp_path):
    """The whole SD1.5 checkpoint layout (4.3 GB, header-faithful sparse) cycled through a 48 MiB
    budget: every module goes through the device tier and back to the mmap, memory stays flat."""
    from loadout_test_support import data_file

    from engine.formats.safetensors import write_sparse

    manifest = json.loads(data_file(SD15_MANIFEST).read_text())["tensors"]
    p = tmp_path / "sd15.safetensors"
    write_sparse(p, [(k, v["dtype"], tuple(v["shape"])) for k, v in manifest.items()])
    r = subprocess.run(
        [sys.executable, "-c", LOOP_CHILD, str(p), "6"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["file_bytes"] > 4e9
    assert max(abs(x) for x in out["seen"]) < 4 * 1024**2, out["seen"]
