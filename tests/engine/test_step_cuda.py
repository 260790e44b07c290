"""Step on a CUDA device: offloaded modules stream through a side stream from pinned RAM or from the
disk tier, and the result equals the fully resident run (skipped without a GPU)."""

from __future__ import annotations

import dataclasses

import pytest
from denoise_files import (
    FLUX_DEV_TINY,
    PREFIX,
    SD1_TINY,
    diffusers_unet,
    flux_rows,
    random_weights,
    rel_l2,
    run_diffusers_unet,
    unet_rows,
    write,
)

from engine.devices import DeviceOptions
from engine.facade import Engine
from engine.formats.safetensors import SafetensorsFile
from engine.requests import Step

pytestmark = pytest.mark.cuda


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cuda")
    w = random_weights(unet_rows(SD1_TINY), seed=21)
    return {
        "weights": w,
        "sd1": write(d / "sd1.safetensors", w),
        "flux": write(d / "flux.safetensors", random_weights(flux_rows(FLUX_DEV_TINY), seed=22)),
    }


def _run(path, tmp_path, name, *, budget=None, tier=None, fp32=False, steps=3, size=(256, 256)):
    e = Engine()
    e.detect(DeviceOptions(vram_budget_gb=budget, force_dtype="fp32" if fp32 else None))
    if tier is not None:
        e.residency.policy = dataclasses.replace(e.residency.policy, offload_tier=tier)
    try:
        r = e.run(Step(str(path), size=size, steps=steps, out=str(tmp_path / f"{name}.safetensors")))
    finally:
        e.close()
    return r, SafetensorsFile(r.out).tensor("out").clone()


@pytest.mark.parametrize("model", ["sd1", "flux"])
def test_partial_runs_stream_on_a_side_stream_and_equal_the_full_run(files, tmp_path, model):
    import torch

    full, want = _run(files[model], tmp_path, "full")
    # float32 files: FLUX.1-dev prefers bf16 where the card computes it, the UNets fp16 (engine.model.dtypes)
    half = (
        "bfloat16"
        if model == "flux" and torch.cuda.is_bf16_supported(including_emulation=False)
        else "float16"
    )
    assert full.device.startswith("cuda") and full.mode == "full" and full.dtype == half
    half = full.resident_bytes / 2 / 1024**3
    for tier in ("ram", "disk"):
        r, got = _run(files[model], tmp_path, tier, budget=half, tier=tier)
        assert r.mode == "partial" and r.streamed_bytes_per_step > 0
        if tier == "ram":  # the disk tier streams the file's float32 bytes; RAM holds half-precision copies
            assert r.resident_bytes + r.streamed_bytes_per_step == full.resident_bytes
        assert r.prefetched > 0.5, r.prefetched  # most modules' copies were issued before they were needed
        assert rel_l2(got, want) < 1e-3  # the same weights and kernels; bit-exactness is promised on the CPU
        print(f"{model} {tier}: {r.s_per_step * 1000:.1f} ms/step vs {full.s_per_step * 1000:.1f} full, "
              f"prefetched {r.prefetched:.0%}, peak {r.peak_device_bytes >> 20} MiB vs {full.peak_device_bytes >> 20}")  # fmt: skip


def test_the_unet_on_cuda_equals_diffusers(files, tmp_path):
    r, got = _run(files["sd1"], tmp_path, "fp32", fp32=True, steps=1, size=(64, 64))
    assert r.dtype == "float32"
    model, _ = diffusers_unet(
        SD1_TINY, "sd1", {k: v for k, v in files["weights"].items() if k.startswith(PREFIX)}
    )
    from engine import denoise
    from engine.model import Component

    inputs = denoise.bind(Component("unet", files["sd1"], PREFIX), "sd1").random_inputs(64, 64)
    want = run_diffusers_unet(model.cuda(), {k: v.cuda() for k, v in inputs.items()}).cpu()
    assert rel_l2(got, want) <= 1e-3


def test_lora_patches_bake_only_into_the_room_the_card_has(files, tmp_path):
    # A baked patch is a second copy of its weight on the card for the run: with a budget of exactly
    # the weights there is no room for one, the patched ops patch on the fly, and the step's peak stays
    # below the roomy run's, at the same output.
    from test_step import _lora

    from engine.requests import StackItem

    lora = _lora(tmp_path / "lora.safetensors", files["sd1"])
    stack = (StackItem(str(lora), 0.8, 0.8),)

    def run(name, budget=None):
        e = Engine()
        e.detect(DeviceOptions(vram_budget_gb=budget))
        try:
            r = e.run(Step(str(files["sd1"]), stack, size=(256, 256), steps=2,
                           out=str(tmp_path / f"{name}.safetensors")))  # fmt: skip
        finally:
            e.close()
        return r, SafetensorsFile(r.out).tensor("out").clone()

    roomy, want = run("roomy")
    tight, got = run("tight", roomy.resident_bytes / 1024**3)
    assert roomy.mode == tight.mode == "full"
    assert tight.peak_device_bytes < roomy.peak_device_bytes
    assert rel_l2(got, want) < 1e-3


def test_the_streamed_weights_on_the_card_stay_within_the_flight_bound(files, monkeypatch):
    # The CPU queues a step's work far ahead of a busy GPU. Were copies issued by the CPU's position
    # alone, each batch's device copy would wait for the compute stream to pass it, and the card would
    # hold every batch the CPU had queued. Here the GPU sleeps while the CPU queues the whole step: the
    # device's peak grows by at most the streamer's flight bound, not by the bytes the step streams.
    import torch

    from engine import denoise
    from engine.denoise import stream

    monkeypatch.setattr(stream, "BATCH_MIN", 64 * 1024)  # batches of the tiny model's own size
    e = Engine()
    e.detect(DeviceOptions(vram_budget_gb=0.0005))  # ~10 % of the tiny UNet's 5.7 MB in float16
    e.residency.policy = dataclasses.replace(e.residency.policy, offload_tier="ram")
    try:
        assert e.run(Step(str(files["sd1"]), size=(64, 64))).mode == "partial"
        (comp,) = [c for (_, name), c in e.loaded.items() if name == "unet"]
        assert comp.device.startswith("cuda")
        den = denoise.bind(comp, "sd1", torch.float16)
        x = {k: v.cuda() for k, v in den.random_inputs(256, 256).items()}

        def peak(sleep: bool) -> tuple[int, stream.Streamer]:
            st = stream.Streamer(comp, den.op_order(), "cuda", steps=1, pinned=e.residency.pinned)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            with torch.inference_mode(), st:
                if sleep:
                    torch.cuda._sleep(2_000_000_000)  # ~1 s of the compute stream
                den(x)
                torch.cuda.synchronize()
            return torch.cuda.max_memory_allocated() - base, st

        idle, st = peak(False)
        busy, st = peak(True)
    finally:
        e.close()
    assert st.bytes_per_step > 8 * st.flight_bytes  # unbounded, the busy run would hold all of them
    assert st.peak_flight <= st.flight_bytes
    assert busy <= idle + st.flight_bytes + 256 * 1024, (busy, idle, st.flight_bytes, st.bytes_per_step)
