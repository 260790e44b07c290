"""`loadout hw` as a user runs it: a subprocess, human text and JSON, flags and usage errors."""

from __future__ import annotations

import json

GiB = 1024**3


def test_hw_text_reads_well(cli):
    r = cli("hw", "--vram-budget", "0.5")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "capped at 512.0 MiB by --vram-budget" in out
    for heading in (
        "Devices",
        "Using",
        "VRAM state",
        "Reserved",
        "Min. inference",
        "Weight budget",
        "Memory now",
    ):
        assert heading in out, heading
    assert "* cpu" in out or "* cuda:0" in out
    assert "Traceback" not in out + r.stderr


def test_hw_json_is_stable_and_consistent(cli):
    r = cli("hw", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"platform", "torch", "devices", "selected", "vram_state", "cpu_state", "vae_device", "reserve_bytes",
            "inference_floor_bytes", "min_inference_bytes", "vram_budget_bytes", "budget_bytes", "dtypes",
            "memory", "warnings"} <= d.keys()  # fmt: skip
    assert d["devices"][0]["kind"] == "cpu"
    assert {"fp16", "bf16", "fp8_compute", "total_memory", "capability", "name", "index"} <= d["devices"][
        0
    ].keys()
    m = d["memory"]
    assert m["device_used"] + m["device_free"] == m["device_total"] > 0
    assert d["min_inference_bytes"] == d["inference_floor_bytes"] + d["reserve_bytes"]
    assert d["budget_bytes"] == max(0, m["device_free"] - d["min_inference_bytes"])
    if d["selected"] == "cpu":
        assert (d["vram_state"], d["cpu_state"]) == ("DISABLED", "CPU")
        assert m["device_label"] == "CPU RAM" and m["device_source"] == "psutil"


def test_hw_flags_change_the_report(cli):
    r = cli(
        "hw", "--json", "--cpu", "--vram-budget", "0.5", "--reserve-vram", "1", "--cpu-vae", "--force-bf16"
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert (d["selected"], d["vram_state"], d["cpu_state"], d["vae_device"]) == (
        "cpu",
        "DISABLED",
        "CPU",
        "cpu",
    )
    assert d["reserve_bytes"] == GiB and d["vram_budget_bytes"] == GiB // 2
    assert d["budget_bytes"] <= GiB // 2 and d["dtypes"]["force"] == "bf16"


def test_hw_usage_errors_exit_2_without_traceback(cli):
    r = cli("hw", "--device", "9")
    assert r.returncode == 2 and "--device 9" in r.stderr and "Traceback" not in r.stderr
    r = cli("hw", "--lowvram", "--highvram")
    assert r.returncode == 2 and "not allowed" in r.stderr
    r = cli("hw", "--reserve-vram", "-3")
    assert r.returncode == 2 and "GiB" in r.stderr
