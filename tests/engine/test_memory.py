"""The memory sampler: sane numbers, RSS that follows real allocations, thread safety, the residency
hook, no torch import; and on a CUDA machine, NVML and torch agreeing."""

from __future__ import annotations

import dataclasses
import gc
import os
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import psutil
import pytest

from engine import memory
from engine.memory import MemorySampler, MemoryTarget

ROOT = Path(__file__).resolve().parents[2]
MB = 1024**2


def test_cpu_sample_is_the_ram_labelled_as_such():
    s = MemorySampler().sample()
    vm = psutil.virtual_memory()
    assert s.device_label == "CPU RAM" and s.device_kind == "cpu" and s.device_source == "psutil"
    assert s.device_is_ram
    assert s.device_total == s.ram_total == vm.total
    assert s.device_used + s.device_free == s.device_total
    assert 0 < s.device_free <= s.device_total
    assert abs(s.ram_available - vm.available) < 512 * MB  # other processes move it a little
    assert s.torch_allocated is s.torch_reserved is s.torch_active is None
    assert 0 < s.process_rss == s.process_device_bytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.device_free = 0  # type: ignore[misc]


def test_rss_follows_a_200_mb_allocation():
    # Earlier tests' garbage (an engine's mapped weights held in a reference cycle) is freed first, not
    # by a collection that happens to run between the two samples: once in CI, RSS rose by only 88 MB.
    # Then the heap's free pages go back to the kernel: glibc serves a 200 MB request from a free heap
    # chunk that big when it has one (it searches its bins before it mmaps), and those pages were still
    # resident -- once in CI, RSS did not move by a single page.
    gc.collect()
    memory.trim_heap()
    sampler = MemorySampler()
    before = sampler.sample().process_rss
    block = np.ones(200 * MB, dtype=np.uint8)  # ones, not zeros: pages must really be touched
    during = sampler.sample().process_rss
    assert 180 * MB < during - before < 260 * MB, (before, during)
    del block
    assert sampler.sample().monotonic >= 0


def test_sampling_from_many_threads_is_consistent():
    sampler = MemorySampler()
    sampler.register_residency_provider(lambda: {"unet": (1, 2)})
    results, errors = [], []

    def work():
        try:
            for _ in range(50):
                results.append(sampler.sample())
        except Exception as e:  # pragma: no cover - a failure is what the test looks for
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and len(results) == 400
    assert all(r.device_used + r.device_free == r.device_total for r in results)
    assert all(r.residency == (memory.ComponentResidency("unet", 1, 2),) for r in results)


def test_residency_providers_merge_unregister_and_survive_failures(caplog):
    sampler = MemorySampler()
    remove_a = sampler.register_residency_provider(lambda: {"vae": (10, 0), "unet": (300, 700)})
    sampler.register_residency_provider(lambda: 1 / 0)
    s = sampler.sample()
    assert [(c.name, c.device_bytes, c.ram_bytes) for c in s.residency] == [
        ("unet", 300, 700),
        ("vae", 10, 0),
    ]
    assert s.to_json()["residency"]["unet"] == {"device_bytes": 300, "ram_bytes": 700}
    assert "residency provider" in caplog.text
    sampler.sample()
    assert caplog.text.count("residency provider") == 1  # logged once, not 20 times a second
    remove_a()
    assert sampler.sample().residency == ()


def test_unified_memory_target_and_torch_free_cpu_target():
    s = MemorySampler(MemoryTarget("mps", 0, "Apple GPU")).sample()
    assert s.device_label == "Unified memory" and s.device_source == "psutil"


def test_an_accelerator_target_without_torch_loaded_falls_back_to_ram_without_importing_torch():
    code = (
        "import sys\n"
        "from engine.memory import MemorySampler, MemoryTarget\n"
        "s = MemorySampler(MemoryTarget('cuda', 0, 'GPU'), use_nvml=False).sample()\n"
        "assert s.device_source == 'psutil', s\n"
        "from engine import memory\n"
        "for _ in range(20): memory.sample()\n"
        "assert 'torch' not in sys.modules, 'the sampler imported torch'\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_cuda_target_on_a_machine_without_cuda_never_initialises_it():
    import torch

    s = MemorySampler(MemoryTarget("cuda", 0, "GPU"), use_nvml=False).sample()
    if not torch.cuda.is_initialized():
        assert s.device_source == "psutil" and s.torch_allocated is None
        assert not torch.cuda.is_initialized()


def test_target_for_maps_devices():
    from engine.devices import DeviceInfo

    assert memory.target_for(DeviceInfo("cpu", 0, "x", 1, "cpu")) == memory.CPU_TARGET
    t = memory.target_for(DeviceInfo("cuda", 1, "RTX", 1, "cuda:1", uuid="abc"))
    assert (t.kind, t.index, t.name, t.uuid) == ("cuda", 1, "RTX", "abc")


class FakeNVML(types.ModuleType):
    """A stand-in for the pynvml module (nvidia-ml-py) on machines without an NVIDIA driver: it answers
    like NVML for one 24 GiB card, so the sampler's own logic (UUID lookup, this process's share,
    giving up cleanly when NVML breaks) is exercised. The real library is covered by the cuda test."""

    class NVMLError(Exception):
        pass

    def __init__(self):
        super().__init__("pynvml")
        self.looked_up: list[str] = []
        self.broken = False

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.looked_up.append(uuid)
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, i):
        self.looked_up.append(f"index {i}")
        return "handle"

    def nvmlDeviceGetMemoryInfo(self, handle):
        if self.broken:
            raise self.NVMLError("GPU is lost")
        return types.SimpleNamespace(total=24 * 1024**3, used=10 * 1024**3, free=14 * 1024**3)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        me = os.getpid()
        P = types.SimpleNamespace
        return [P(pid=me, usedGpuMemory=3 * MB), P(pid=me + 1, usedGpuMemory=900 * MB),
                P(pid=me, usedGpuMemory=1 * MB), P(pid=me, usedGpuMemory=None)]  # fmt: skip


def test_nvml_path_uuid_lookup_process_share_and_clean_fallback(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    sampler = MemorySampler(MemoryTarget("cuda", 0, "RTX 4090", uuid="1234-abcd"))
    s = sampler.sample()
    assert fake.looked_up == ["GPU-1234-abcd"]
    assert (s.device_source, s.device_label, s.device_total, s.device_free) == ("nvml", "RTX 4090", 24 * 1024**3,
                                                                               14 * 1024**3)  # fmt: skip
    assert s.process_device_bytes == 4 * MB  # only this pid's entries, unknown ones skipped
    fake.broken = True
    after = [sampler.sample() for _ in range(3)]  # NVML broke: fall back, do not crash, do not retry
    assert all(a.device_source != "nvml" for a in after)


def test_nvml_is_not_trusted_by_index_when_cuda_devices_are_renumbered(monkeypatch):
    fake = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    s = MemorySampler(MemoryTarget("cuda", 0, "GPU")).sample()
    assert fake.looked_up == [] and s.device_source != "nvml"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    s = MemorySampler(MemoryTarget("cuda", 0, "GPU")).sample()
    assert fake.looked_up == ["index 0"] and s.device_source == "nvml"


@pytest.mark.cuda
def test_cuda_sample_agrees_with_mem_get_info_and_tracks_allocations():
    import torch

    from engine.devices import DeviceOptions, detect_devices

    report = detect_devices(DeviceOptions())
    sampler = MemorySampler(memory.target_for(report.selected))
    torch_only = MemorySampler(memory.target_for(report.selected), use_nvml=False)
    free, total = torch.cuda.mem_get_info(0)
    s, t = sampler.sample(), torch_only.sample()
    assert t.device_source == "torch" and abs(t.device_total - total) == 0
    # NVML (when installed) and the CUDA runtime describe the same card: totals within 1 GiB
    # (NVML counts memory the driver reserves), free within 256 MiB of each other.
    assert abs(s.device_total - total) < 1024 * MB
    assert abs(s.device_free - free) < 256 * MB
    x = torch.empty(512 * MB, dtype=torch.uint8, device="cuda")
    after = torch_only.sample()
    assert after.torch_allocated - t.torch_allocated >= 512 * MB
    assert t.device_free - after.device_free >= 500 * MB
    if s.device_source == "nvml" and s.process_device_bytes is not None:
        assert sampler.sample().process_device_bytes >= 512 * MB
    del x
    torch.cuda.empty_cache()


# Both probes run in a fresh process: what earlier tests did to this one's heap (and to glibc's mmap
# threshold) would decide where the blocks land.
_HEAP_PRELUDE = """
import ctypes, sys
import psutil
from engine import memory
from engine.memory import trim_heap

libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit(0)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
proc = psutil.Process()

def faulted(n):  # n blocks of 96 KiB, below the mmap threshold: on the heap, every page touched
    blocks = [libc.malloc(96 << 10) for _ in range(n)]
    for b in blocks:
        ctypes.memset(b, 1, 96 << 10)
    return blocks

blocks = faulted(1200)
for b in blocks[::2]:  # every other one: 56 MiB of free chunks the kept ones keep apart, so free()
    libc.free(b)  # cannot hand them back by shrinking the heap's top
"""

_TRIM_PROBE = """
held = proc.memory_info().rss
trim_heap(1 << 40)  # more slack than free heap: kept
kept = proc.memory_info().rss
trim_heap(8 << 20)  # 56 MiB free is more than 8 MiB of slack: handed back
print(held, kept, proc.memory_info().rss)
"""

_RETRIM_PROBE = """
trim_heap(8 << 20)  # the 56 MiB of free chunks go back; glibc still counts them as free heap
trims = []
real = memory._libc.malloc_trim
memory._libc.malloc_trim = lambda pad: trims.append(pad) or real(pad)
low = proc.memory_info().rss
trim_heap(8 << 20)  # nothing held was freed since: nothing to trim, however much glibc counts free
again = len(trims)
for b in faulted(600):  # the freed chunks, faulted in again, and freed
    libc.free(b)
held = proc.memory_info().rss
trim_heap(8 << 20)  # 56 MiB held again and free: handed back
print(again, len(trims), low, held, proc.memory_info().rss)
"""


def _heap_probe(code: str) -> list[int]:
    r = subprocess.run(
        [sys.executable, "-c", _HEAP_PRELUDE + code], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    if r.stdout.strip() == "skip":
        pytest.skip("glibc older than 2.33")
    return list(map(int, r.stdout.split()))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim / mallinfo2")
def test_trim_heap_keeps_free_heap_up_to_the_slack_and_returns_the_rest():
    held, kept, trimmed = _heap_probe(_TRIM_PROBE)
    assert kept > held - (8 << 20)
    assert trimmed < held - (32 << 20)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim / mallinfo2")
def test_trim_heap_trims_only_what_was_freed_since_the_last_trim():
    # glibc keeps counting trimmed pages as free heap: a slack test on that count alone trimmed (and
    # re-faulted) on every call once a big run had left a big free heap behind.
    again, total, low, held, trimmed = _heap_probe(_RETRIM_PROBE)
    assert again == 0
    assert total == 1
    assert held > low + (40 << 20)
    assert trimmed < held - (32 << 20)
