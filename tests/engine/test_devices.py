"""Device state choice from hand-written hardware facts (no GPU needed), the flags, the reserve and
minimum-inference facts, the budget; plus the real probe on this machine and, where present, CUDA."""

from __future__ import annotations

import argparse

import pytest

from engine import device_rules as rules
from engine.devices import (
    CPUState,
    DeviceInfo,
    DeviceOptions,
    GiB,
    HardwareFacts,
    MiB,
    VRAMState,
    add_device_arguments,
    budget_bytes,
    build_report,
    detect_devices,
    options_from_args,
)
from engine.errors import EngineError


def gpu(
    total_gib: float, *, kind="cuda", index=0, name="NVIDIA GeForce RTX 4090", cap=(8, 9), **kw
) -> DeviceInfo:
    fp16, bf16, fp8 = rules.cuda_support(cap, name, "2.13.0") if kind == "cuda" else (True, True, False)
    dev = "mps" if kind == "mps" else f"cuda:{index}"
    return DeviceInfo(kind, index, name, int(total_gib * GiB), dev, capability=cap, fp16=fp16, bf16=bf16,
                      fp8_compute=fp8, **kw)  # fmt: skip


def facts(*accelerators: DeviceInfo, platform="linux", ram_gib=32) -> HardwareFacts:
    return HardwareFacts(platform, int(ram_gib * GiB), "Test CPU", tuple(accelerators), "2.13.0")


def opts(*argv: str) -> DeviceOptions:
    p = argparse.ArgumentParser()
    add_device_arguments(p)
    return options_from_args(p.parse_args(list(argv)))


# -- VRAM / CPU state ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "total_gib, argv, expected",
    [
        (24, [], VRAMState.NORMAL_VRAM),
        (8, [], VRAMState.NORMAL_VRAM),
        (4, [], VRAMState.LOW_VRAM),  # <= 4096 MiB: automatic LOW_VRAM, as ComfyUI
        (3.8, [], VRAMState.LOW_VRAM),
        (4 + 1 / 1024, [], VRAMState.NORMAL_VRAM),  # 4097 MiB is above the line
        (4, ["--normalvram"], VRAMState.NORMAL_VRAM),
        (24, ["--lowvram"], VRAMState.LOW_VRAM),
        (24, ["--novram"], VRAMState.NO_VRAM),
        (4, ["--novram"], VRAMState.NO_VRAM),
        (24, ["--highvram"], VRAMState.HIGH_VRAM),
        (24, ["--gpu-only"], VRAMState.HIGH_VRAM),
        (4, ["--highvram"], VRAMState.HIGH_VRAM),
        (24, ["--cpu"], VRAMState.DISABLED),
    ],
)
def test_vram_state_for_cards_and_flags(total_gib, argv, expected):
    r = build_report(facts(gpu(total_gib)), opts(*argv))
    assert r.vram_state is expected
    assert r.cpu_state is (CPUState.CPU if "--cpu" in argv else CPUState.GPU)


def test_cpu_flag_selects_cpu_even_with_a_gpu():
    r = build_report(facts(gpu(24)), opts("--cpu"))
    assert r.selected.kind == "cpu" and r.selected.torch_device == "cpu"
    assert (r.vram_state, r.cpu_state) == (VRAMState.DISABLED, CPUState.CPU)
    assert [d.kind for d in r.devices] == ["cpu", "cuda"]  # the GPU is still listed


def test_no_accelerator_is_cpu_disabled():
    r = build_report(facts(), DeviceOptions())
    assert (r.vram_state, r.cpu_state, r.selected.kind) == (VRAMState.DISABLED, CPUState.CPU, "cpu")
    assert r.selected.total_memory == 32 * GiB  # the RAM is the device


def test_mps_is_shared_whatever_the_flags():
    m2 = gpu(16, kind="mps", name="Apple arm64 GPU (MPS)", cap=None, integrated=True)
    for argv in ([], ["--highvram"], ["--lowvram"], ["--novram"]):
        r = build_report(facts(m2, platform="darwin"), opts(*argv))
        assert (r.vram_state, r.cpu_state) == (VRAMState.SHARED, CPUState.MPS), argv
    r = build_report(facts(m2, platform="darwin"), opts("--cpu"))
    assert (r.vram_state, r.cpu_state) == (VRAMState.DISABLED, CPUState.CPU)


def test_integrated_cuda_device_is_shared():
    jetson = gpu(8, name="Orin", cap=(8, 7), integrated=True)
    r = build_report(facts(jetson), DeviceOptions())
    assert (r.vram_state, r.cpu_state) == (VRAMState.SHARED, CPUState.GPU)


def test_device_index_picks_among_gpus_and_rejects_missing_ones():
    two = facts(gpu(24, index=0), gpu(12, index=1, name="NVIDIA GeForce RTX 3060", cap=(8, 6)))
    assert build_report(two, opts("--device", "1")).selected.name == "NVIDIA GeForce RTX 3060"
    assert build_report(two, DeviceOptions()).selected.index == 0
    with pytest.raises(EngineError, match="--device 5"):
        build_report(two, opts("--device", "5"))
    with pytest.raises(EngineError, match="no GPU"):
        build_report(facts(), opts("--device", "1"))


def test_cpu_vae_and_forced_dtypes_are_carried():
    r = build_report(facts(gpu(24)), opts("--cpu-vae", "--force-bf16", "--unet-dtype", "fp8_e4m3fn"))
    assert r.vae_device == "cpu"
    assert r.to_json()["dtypes"] == {"force": "bf16", "unet": "fp8_e4m3fn", "vae": None, "text_encoder": None}
    assert build_report(facts(gpu(24)), DeviceOptions()).vae_device == "cuda:0"


def test_every_flag_parses_into_options():
    o = opts("--highvram", "--reserve-vram", "1.5", "--vram-budget", "6", "--cpu-vae", "--force-fp32",
             "--vae-dtype", "bf16", "--text-encoder-dtype", "fp16", "--device", "2", "--disable-smart-memory")  # fmt: skip
    assert o == DeviceOptions(highvram=True, reserve_vram_gb=1.5, vram_budget_gb=6.0, cpu_vae=True,
                              force_dtype="fp32", vae_dtype="bf16", text_encoder_dtype="fp16", device_index=2,
                              disable_smart_memory=True)  # fmt: skip
    assert (
        opts("--gpu-only").gpu_only and opts("--novram").novram and opts("--force-fp16").force_dtype == "fp16"
    )


def test_options_from_a_parser_without_device_flags_are_the_defaults():
    assert options_from_args(argparse.Namespace(json=True)) == DeviceOptions()


def test_report_json_round_trips_through_json():
    import json

    r = build_report(facts(gpu(24)), opts("--lowvram", "--vram-budget", "2"))
    d = json.loads(json.dumps(r.to_json()))
    assert d["vram_state"] == "LOW_VRAM" and d["options"]["lowvram"] is True
    assert d["devices"][1]["capability"] == [8, 9] and d["devices"][1]["fp8_compute"] is True


@pytest.mark.parametrize("argv", [["--lowvram", "--highvram"], ["--force-fp16", "--force-bf16"],
                                  ["--reserve-vram", "-1"], ["--vram-budget", "lots"], ["--vae-dtype", "fp8"]])  # fmt: skip
def test_conflicting_or_bad_flags_are_usage_errors(argv):
    p = argparse.ArgumentParser()
    add_device_arguments(p)
    with pytest.raises(SystemExit) as e:
        p.parse_args(argv)
    assert e.value.code == 2


def test_options_validate_themselves():
    with pytest.raises(ValueError):
        DeviceOptions(reserve_vram_gb=float("nan"))
    with pytest.raises(ValueError):
        DeviceOptions(force_dtype="fp64")
    with pytest.raises(ValueError):
        DeviceOptions(device_index=-1)


# -- reserve, minimum inference memory, budget ----------------------------------------------------------


def test_reserve_and_min_inference_follow_comfyui_defaults():
    linux = build_report(facts(gpu(24)), DeviceOptions())
    assert linux.reserve_bytes == 400 * MiB
    assert linux.inference_floor_bytes == int(0.8 * GiB)
    assert linux.min_inference_bytes == int(0.8 * GiB) + 400 * MiB
    assert build_report(facts(gpu(12), platform="windows"), DeviceOptions()).reserve_bytes == 600 * MiB
    # 15 GiB is not "above 15 GiB"; 16 GiB is.
    assert build_report(facts(gpu(15), platform="windows"), DeviceOptions()).reserve_bytes == 600 * MiB
    assert build_report(facts(gpu(16), platform="windows"), DeviceOptions()).reserve_bytes == 700 * MiB
    assert build_report(facts(gpu(16), platform="darwin"), DeviceOptions()).reserve_bytes == 400 * MiB


def test_reserve_and_floor_are_overridable():
    r = build_report(facts(gpu(16), platform="windows"), opts("--reserve-vram", "2"))
    assert r.reserve_bytes == 2 * GiB and r.min_inference_bytes == 2 * GiB + int(0.8 * GiB)
    r = build_report(facts(gpu(16)), DeviceOptions(reserve_vram_gb=0, inference_memory_gb=0))
    assert r.min_inference_bytes == 0 and r.budget_bytes(5 * GiB) == 5 * GiB


def test_budget_is_free_minus_min_inference_never_negative():
    r = build_report(facts(gpu(24)), DeviceOptions())
    assert r.budget_bytes(10 * GiB) == 10 * GiB - (400 * MiB + int(0.8 * GiB))
    assert r.budget_bytes(1 * GiB) == 0
    assert budget_bytes(0, 0) == 0


def test_vram_budget_caps_the_budget_on_a_cpu_only_machine():
    r = build_report(facts(ram_gib=64), opts("--vram-budget", "3"))
    assert r.selected.kind == "cpu" and r.vram_budget_bytes == 3 * GiB
    assert r.budget_bytes(40 * GiB) == 3 * GiB  # capped
    assert r.budget_bytes(2 * GiB) == 2 * GiB - r.min_inference_bytes  # below the cap: free memory rules
    assert r.to_json()["vram_budget_bytes"] == 3 * GiB


# -- dtype rules ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cap, name, expected",
    [
        ((9, 0), "NVIDIA H100 80GB HBM3", (True, True, True)),
        ((8, 9), "NVIDIA GeForce RTX 4090", (True, True, True)),
        ((8, 6), "NVIDIA GeForce RTX 3060", (True, True, False)),
        ((7, 5), "NVIDIA GeForce RTX 2080", (True, False, False)),
        ((7, 5), "NVIDIA GeForce GTX 1660 SUPER", (False, False, False)),
        ((6, 1), "NVIDIA GeForce GTX 1080", (False, False, False)),
    ],
)
def test_cuda_dtype_rules(cap, name, expected):
    assert rules.cuda_support(cap, name, "2.13.0") == expected


def test_fp8_needs_torch_2_3_and_rocm_rules():
    assert rules.cuda_support((8, 9), "RTX 4090", "2.2.1+cu121")[2] is False
    assert rules.rocm_support("gfx1100", "2.13.0", "6.4.1") == (True, True, False)
    assert rules.rocm_support("gfx1030", "2.13.0", "6.4.1") == (True, False, False)
    assert rules.rocm_support("gfx1201", "2.7.0", "6.4.0") == (True, True, True)
    assert rules.rocm_support("gfx1201", "2.7.0", "6.3.0")[2] is False
    assert rules.mps_support((13, 6)) == (True, False, False) and rules.mps_support((14, 2))[1] is True
    assert rules.cpu_support() == (False, False, False)
    assert rules.version_tuple("nonsense") == (0, 0)


# -- the real probe ----------------------------------------------------------------------------------------


def test_detect_devices_on_this_machine_lists_the_cpu_and_is_consistent():
    import psutil
    import torch

    r = detect_devices(DeviceOptions())
    assert r.devices[0].kind == "cpu" and r.devices[0].total_memory == psutil.virtual_memory().total
    assert r.torch_version == torch.__version__
    if not torch.cuda.is_available():
        assert r.selected.kind in ("cpu", "mps", "xpu", "npu")
    assert r.to_json()["selected"] == r.selected.torch_device


@pytest.mark.cuda
def test_cuda_probe_matches_torch():
    import torch

    r = detect_devices(DeviceOptions())
    assert r.selected.kind in ("cuda", "rocm") and r.cpu_state is CPUState.GPU
    p = torch.cuda.get_device_properties(0)
    assert r.selected.name == p.name and r.selected.total_memory == p.total_memory
    assert r.selected.capability == (p.major, p.minor)
    if r.selected.kind == "cuda":
        # Our bf16 rule (cc >= 8.0) agrees with torch's own check without emulation.
        assert r.selected.bf16 == torch.cuda.is_bf16_supported(including_emulation=False)


def test_hw_text_for_an_invented_gpu_machine():
    """The GPU branch of `loadout hw`'s text, which this CPU-only machine never prints for real."""
    from engine.cli.hw import render_text
    from engine.memory import MemorySample

    r = build_report(facts(gpu(4, name="NVIDIA GeForce GTX 1650", cap=(7, 5)), platform="windows"), opts())
    now = MemorySample(0.0, 0.0, "cuda", 0, "NVIDIA GeForce GTX 1650", 4 * GiB, 1 * GiB, 3 * GiB, "nvml",
                       512 * MiB, 256 * MiB, 300 * MiB, 256 * MiB, 900 * MiB, 16 * GiB, 9 * GiB)  # fmt: skip
    text = render_text(r, now, r.budget_bytes(now.device_free))
    assert "* cuda:0  NVIDIA GeForce GTX 1650  cc 7.5  (4.0 GiB)" in text
    assert "fp16 no   bf16 no   fp8 compute no" in text  # a GTX 16-series card: fp16 is broken there
    assert "VRAM state     LOW_VRAM    CPU state GPU" in text  # 4 GiB: automatic LOW_VRAM
    assert "Reserved       600.0 MiB (default on windows)" in text
    assert "this process on device" in text and "torch allocator" in text
    assert "No GPU found" not in text
