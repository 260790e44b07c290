"""`loadout plan`: header-only predictions, checked against what the residency manager really does."""

from __future__ import annotations

import json

import pytest
from residency_files import SD15_MANIFEST, SD15_PREFIXES

from engine.devices import DeviceOptions, HardwareFacts, build_report
from engine.errors import InvalidRequest
from engine.formats.safetensors import write_sparse
from engine.model import build_components
from engine.plan import make_plan
from engine.residency import Residency
from engine.vae import estimate_decode_bytes
from engine.vae.choice import Job, choose
from engine.vae.estimate import RUNTIME_BYTES, VaeSpec, tile_bytes

MIB = 1024**2


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    from loadout_test_support import data_file

    manifest = json.loads(data_file(SD15_MANIFEST).read_text())["tensors"]
    p = tmp_path_factory.mktemp("plan") / "sd15_fp16.safetensors"
    entries = [
        (k, "F16" if v["dtype"] == "F32" else v["dtype"], tuple(v["shape"])) for k, v in manifest.items()
    ]
    write_sparse(p, entries)
    return p


def cpu_report(**opts):
    return build_report(HardwareFacts(platform="linux", ram_total=64 << 30), DeviceOptions(**opts))


@pytest.mark.parametrize("budget_gib", [0.1, 0.25])
def test_partial_load_prediction_is_what_the_manager_does(sd15, budget_gib):
    report = cpu_report(vram_budget_gb=budget_gib)
    plan = make_plan(str(sd15), report=report, free_bytes=1 << 40)
    load = plan["steps"][0]
    assert load["step"] == "load" and load["mode"] == "partial"
    assert plan["budget_bytes"] == int(budget_gib * 1024**3)
    unet = build_components(sd15, {"unet": SD15_PREFIXES["unet"]}, report=report)["unet"]
    m = Residency.from_report(report)
    m.probe = lambda: 1 << 40
    m.load([unet])
    row = m.snapshot().get("unet")
    assert row.device_bytes == load["detail"]["resident_bytes"] <= plan["budget_bytes"]
    assert sum(u.tier == "device" for u in unet.units) == load["detail"]["modules_resident"]
    assert row.full_bytes == load["detail"]["bytes"]
    m.unload(unet)


def test_full_load_when_it_fits_and_state_rules(sd15):
    plan = make_plan(str(sd15), report=cpu_report(), free_bytes=64 << 30)
    assert plan["steps"][0]["mode"] == "full" and plan["fits"]
    tiny = make_plan(str(sd15), report=cpu_report(vram_budget_gb=0.01, highvram=True), free_bytes=1 << 40)
    assert tiny["steps"][0]["mode"] in ("full", "partial")


def test_decode_modes_and_the_documented_formula(sd15):
    big = make_plan(str(sd15), decode=(512, 512), report=cpu_report(), free_bytes=64 << 30)
    dec = big["steps"][-1]
    assert dec["step"] == "decode" and dec["mode"] == "full"
    vae = dec["detail"]["vae_bytes"]
    assert dec["peak_bytes"] == estimate_decode_bytes(
        512, 512, dtype="float32", weight_bytes=vae
    )  # CPU: fp32
    # a budget that holds the VAE with 512-px tiles, whatever the estimate's constants are
    need = estimate_decode_bytes(2048, 2048, dtype="float32", weight_bytes=vae, tile=512)
    report = cpu_report(vram_budget_gb=(need + 1) / 1024**3)
    small = make_plan(str(sd15), decode=(2048, 2048), report=report, free_bytes=1 << 40)
    dec = small["steps"][-1]
    assert dec["mode"] == "tiled" and dec["fits"] and dec["peak_bytes"] <= small["budget_bytes"]
    # the decode fits; a 2048² SD1 sampling step on a budget sized for the VAE alone does not
    (step,) = [s for s in small["steps"] if s["step"] == "step"]
    assert not small["fits"] and step["peak_bytes"] > small["budget_bytes"]
    # The tiles are those the run picks (engine.vae.choice, the one place that decides) for the memory
    # it finds free with the runtime and the VAE resident: a tile's activations at most a quarter of it.
    free_at_run = small["budget_bytes"] - RUNTIME_BYTES - vae
    spec = VaeSpec("kl", 4, vae)
    tile = dec["detail"]["tile"]
    assert 128 < tile < 512  # neither bound of the CPU's tile sizes: the budget decided
    assert tile_bytes(spec, tile, 4) <= free_at_run / 4 < tile_bytes(spec, tile + 64, 4)
    job = Job(spec, "decode", (256, 256), 1, 8, 4, False)
    ran = choose(job, free_at_run)
    assert (ran.tile_px, ran.overlap_px, len(ran.rects)) == (
        tile,
        dec["detail"]["overlap"],
        dec["detail"]["tiles"],
    )
    # 2048² at these tiles: the states (9.7 GB) go to disk on the CPU, so the peak is one tile's
    assert dec["peak_bytes"] == estimate_decode_bytes(
        2048, 2048, dtype="float32", weight_bytes=vae, tile=tile
    )


def test_hypothetical_gpu_uses_fp16_and_patch_step(sd15, shared_data):
    lora = shared_data("weights/smart_falcon_8_lokr.safetensors")
    plan = make_plan(str(sd15), loras=(str(lora),), decode=(1024, 1024), vram_gb=4, report=cpu_report())
    steps = {s["step"]: s for s in plan["steps"]}
    assert set(steps) == {"load", "step", "patch", "decode"}
    assert plan["device"].startswith("hypothetical 4 GiB")
    assert steps["load"]["detail"]["storage_dtype"] == "float16"
    assert steps["patch"]["detail"]["lora_bytes"] == lora.stat().st_size - 8 - _header_len(lora)
    # the sampling step's activations come out of the reserve kept for inference, the rest out of the budget
    free = plan["budget_bytes"] + steps["load"]["detail"]["min_inference_bytes"]
    fits = all(s["peak_bytes"] <= plan["budget_bytes"] for s in plan["steps"] if s["step"] != "step")
    assert (fits and steps["step"]["peak_bytes"] <= free) == plan["fits"]
    assert steps["step"]["detail"]["width"] == 1024 and steps["step"]["detail"]["units"] == 128 * 128
    assert steps["patch"]["detail"]["warnings"] == []  # an SD1 LoKr on SD1.5: every module maps


def test_plan_warns_when_a_lora_does_not_fit_the_model(tmp_path, shared_data):
    from tests.support import synth

    sdxl = synth.write("sdxl_checkpoint", tmp_path / "sdxl.safetensors")
    lora = shared_data("weights/smart_falcon_8_lokr.safetensors")  # trained on SD1.5
    plan = make_plan(str(sdxl), loras=(str(lora),), vram_gb=8, report=cpu_report())
    (warning,) = next(s for s in plan["steps"] if s["step"] == "patch")["detail"]["warnings"]
    assert warning.startswith("smart_falcon_8_lokr.safetensors: made for SD1: only ")
    assert warning.endswith("onto this SDXL model: the other 261 would be skipped")
    from engine.cli.plan import render_text

    assert f"warning: {warning}" in render_text(str(sdxl), plan)


def _header_len(p):
    import struct

    with open(p, "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def test_cli_plan_json_and_errors(cli, sd15, tmp_path):
    r = cli("plan", "--model", str(sd15), "--decode", "1024x768", "--vram", "6", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"device", "budget_bytes", "steps", "fits"}
    assert [s["step"] for s in out["steps"]] == ["load", "step", "decode"]
    assert all(set(s) == {"step", "peak_bytes", "mode", "detail"} for s in out["steps"])
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    r = cli("plan", "--model", str(bad), "--json")
    assert r.returncode == 3 and json.loads(r.stdout)["error"]["type"] == "format"
    assert "Traceback" not in r.stderr
    r = cli("plan", "--model", str(sd15), "--decode", "huge")
    assert r.returncode == 2


def test_plan_text_in_process(sd15, capsys):
    from engine.cli import main

    assert main(["plan", "--model", str(sd15), "--vram", "6", "--decode", "512x512"]) == 0
    text = capsys.readouterr().out
    assert "fits" in text and "load" in text and "decode" in text


def test_the_sampling_step_is_predicted_and_calibrated_from_a_measured_step(sd15, tmp_path, monkeypatch):
    """Without a measured step the plan gives the step's peak and asks for one; after one (recorded as
    Step records it) it predicts s/step at the plan's size, full against partial."""
    from engine.catalog import measured

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    report = cpu_report()
    plan = make_plan(str(sd15), decode=(512, 512), report=report, free_bytes=64 << 30)
    (step,) = [s for s in plan["steps"] if s["step"] == "step"]
    d = step["detail"]
    assert step["mode"] == "full" and d["s_per_step"] is None and "Try a step" in d["advice"]
    assert d["units"] == 64 * 64 and step["peak_bytes"] == d["full_peak_bytes"]
    measured.record_step(str(sd15), report.selected.label, "unet", 256, 256,
                         {"s_per_step": 0.5, "mode": "full", "streamed_bytes_per_step": 0})  # fmt: skip
    again = make_plan(str(sd15), decode=(512, 512), report=report, free_bytes=64 << 30)
    (step,) = [s for s in again["steps"] if s["step"] == "step"]
    d = step["detail"]
    assert d["calibrated_from"]["width"] == 256
    assert abs(d["s_per_step_full"] - 0.5 * 4) < 1e-9  # 4x the latent pixels
    assert d["s_per_step_partial"] >= d["s_per_step_full"]
    # a tight budget: partial, streaming the rest at the nominal rate
    tight = make_plan(
        str(sd15), decode=(512, 512), report=cpu_report(vram_budget_gb=0.5), free_bytes=64 << 30
    )
    (step,) = [s for s in tight["steps"] if s["step"] == "step"]
    d = step["detail"]
    assert step["mode"] == "partial" and d["streamed_bytes_per_step"] > 0
    assert d["s_per_step"] == d["s_per_step_partial"] > d["s_per_step_full"]
    # another file (or this one replaced) is not calibrated from these steps
    assert measured.latest_step(str(tmp_path / "cache"), report.selected.label) is None


def test_a_vae_on_the_cpu_is_planned_against_the_ram_available(sd15, monkeypatch):
    # --cpu-vae on a (hypothetical) GPU: the decode runs in RAM, so what RAM is free decides full or tiles,
    # as engine.vae.run's budget does -- not "always full" because the VAE is off the device.
    import psutil

    from engine.vae.estimate import CPU_RESERVE_BYTES

    real = psutil.virtual_memory()
    report = cpu_report(cpu_vae=True)
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=1 << 40))
    dec = make_plan(str(sd15), decode=(2048, 2048), vram_gb=8, report=report)["steps"][-1]
    assert dec["detail"]["vae_device"] == "cpu" and dec["mode"] == "full"
    # RAM for a quarter of that full decode: tiles, sized for it, and the prediction fits in it
    avail = CPU_RESERVE_BYTES + dec["peak_bytes"] // 4
    monkeypatch.setattr(psutil, "virtual_memory", lambda: real._replace(available=avail))
    tight = make_plan(str(sd15), decode=(2048, 2048), vram_gb=8, report=report)["steps"][-1]
    assert tight["mode"] == "tiled" and tight["peak_bytes"] <= avail - CPU_RESERVE_BYTES
    assert "advice" not in tight["detail"]


def test_a_device_smaller_than_the_sampling_reserve_does_not_fit_a_step(sd15):
    """The reserve kept for sampling (1.2 GiB here) is no memory a 0.1 GiB device has: the step's peak
    is judged against what the device holds, and the plan says why it does not fit, as it does for a
    decode whose smallest tile does not fit."""
    from engine.cli.plan import render_text

    small = make_plan(str(sd15), decode=(1024, 1024), vram_gb=0.1, report=cpu_report())
    step = next(s for s in small["steps"] if s["step"] == "step")
    assert step["peak_bytes"] > 0.1 * 2**30 and not small["fits"]
    assert step["detail"]["room_bytes"] == int(0.1 * 2**30)
    text = render_text(str(sd15), small)
    assert "advice: a 1024x1024 step needs" in text and "has 102 MiB for it" in text
    assert "advice: not even the smallest tile fits beside the VAE" in text  # the decode's, printed too
    roomy = make_plan(str(sd15), decode=(512, 512), vram_gb=8, report=cpu_report())
    assert roomy["fits"] and all("needs" not in s["detail"].get("advice", "") for s in roomy["steps"])


def test_a_lora_as_the_model_or_as_the_base_is_a_usage_error(sd15, shared_data, capsys):
    """`plan --model LORA` printed an empty plan that 'fits', and `lora inspect LORA --base LORA` a
    coverage of 0/350 'on this SD1 model': both now say where the LoRA goes (exit 2)."""
    from engine.cli import main

    lora = str(shared_data("weights/smart_falcon_8_lokr.safetensors"))
    with pytest.raises(InvalidRequest, match="this is a LoRA: it patches a model"):
        make_plan(lora, report=cpu_report())
    assert main(["lora", "inspect", lora, "--base", lora]) == 2
    assert "is a LoRA: give the model the LoRA patches" in capsys.readouterr().err
    assert main(["lora", "inspect", lora, "--base", str(sd15), "--json"]) == 0  # the model as base: fine
