"""The engine facade as the app and CLI use it, without Qt: detect, load/unload/pin through the ledger,
LoRA stacks on loaded components, bake, plan, and device options applied live (configure)."""

from __future__ import annotations

import os

import pytest
from facade_files import write_files

from engine.devices import DeviceOptions
from engine.errors import EngineError, FormatError, InvalidRequest
from engine.facade import Engine
from engine.requests import (
    Configure,
    DetectDevices,
    Load,
    PlanRequest,
    StackItem,
    Unload,
    UnloadAll,
    unloads_components,
)

MIB = 1024**2
GIB = 1024**3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("facade"))


@pytest.fixture
def engine():
    events = []
    e = Engine(on_event=events.append)
    e.events = events
    e.run(DetectDevices(DeviceOptions()))
    yield e
    e.close()


def test_requests_before_detection_and_unknown_requests_fail_clearly(files):
    e = Engine()
    with pytest.raises(EngineError, match="not ready"):
        e.run(Load(files["vae"]))
    with pytest.raises(TypeError, match="does not know"):
        e.run(object())
    assert e.snapshot() is None


def test_load_pin_unload_through_the_ledger(engine, files):
    r = engine.run(Load(files["vae"]))
    row = r.snapshot.get("vae")
    assert row is not None and row.path == os.path.abspath(files["vae"])
    assert row.device_bytes == row.full_bytes == r.bytes > 0
    c = engine.components[(os.path.abspath(files["vae"]), "vae")]
    assert c.measured_tiers()["device"] == row.device_bytes  # the ledger says what the tensors hold
    assert engine.pin(files["vae"], "vae").snapshot.get("vae").pinned
    part = engine.run(Unload(files["vae"], "vae", 1 * MIB))
    assert 0 < part.snapshot.get("vae").device_bytes < row.device_bytes
    gone = engine.run(Unload(files["vae"], "vae"))
    assert gone.snapshot.components == () and engine.components == {}
    assert [k for k in ("Loaded", "PartiallyOffloaded", "Unloaded") if k in {ev.kind for ev in engine.events}]
    with pytest.raises(FormatError, match="not loaded"):
        engine.unload(files["vae"], "vae")


def test_a_checkpoint_vae_loads_runnable_and_unload_all_empties_the_ledger(engine, files):
    snap = engine.load(files["ckpt_vae"]).snapshot
    assert [c.name for c in snap.components] == ["vae"]
    c = engine.components[(os.path.abspath(files["ckpt_vae"]), "vae")]
    assert hasattr(c.module, "decode_head")  # the VAE's own forward, over the loaded weights
    assert all(k.startswith("first_stage_model.") for u in c.units for k in u.keys.values())
    engine.load(files["vae"])
    r = engine.run(UnloadAll())
    assert r.snapshot.components == () and r.bytes > 0 and engine.components == {}


def test_set_loras_patches_loaded_components_on_the_fly_and_reverts(engine, files):
    import torch

    engine.configure(DeviceOptions(vram_budget_gb=16 * MIB / GIB))  # mostly left on the mmap: cheap
    with pytest.raises(FormatError, match="Load sd15"):
        engine.set_loras(files["sd1"], (StackItem(files["lora"]),))
    engine.load(files["sd1"], ("clip_l",))
    res = engine.set_loras(files["sd1"], (StackItem(files["lora"], 1.0, 0.5),))
    assert res.patched > 0 and {"unet", "clip_l"} <= set(res.patched_units)  # every built component
    assert res.coverages[0].coverage["mapped"] == res.coverages[0].coverage["modules"]
    c = engine.components[(os.path.abspath(files["sd1"]), "clip_l")]
    u = next(u for u in c.units if u.path in res.patched_units["clip_l"] and u.path.endswith("q_proj"))
    x = torch.ones(1, u.module.weight.shape[1])
    w, _ = u.module.cast_params(x)
    assert w.shape == u.module.weight.shape and u.module.weight_functions
    assert any(ev.kind == "Patched" for ev in engine.events)
    back = engine.set_loras(files["sd1"], ())
    assert back.patched == 0 and back.restored == res.patched and not u.module.weight_functions


def test_bake_writes_a_new_file_and_refuses_to_overwrite_an_input(engine, files, tmp_path):
    from engine.formats.safetensors import read_header
    from tests.support import synth

    hdr = read_header(files["sd1"])
    rows = [(k, "F16", tuple(i.shape)) for k, i in hdr.tensors.items() if k.startswith("cond_stage_model.")]
    base = synth.write(rows, tmp_path / "te.safetensors", dense=True, max_dense_bytes=300 << 20)
    out = tmp_path / "baked.safetensors"
    res = engine.bake(str(base), (StackItem(files["lora"]),), str(out))
    assert res.out == str(out) and res.bytes == out.stat().st_size
    assert "loadout.bake" in read_header(out).metadata
    with pytest.raises(InvalidRequest, match="one of the inputs"):  # exit 2 in the CLI: a usage error
        engine.bake(str(base), (StackItem(files["lora"]),), str(base))


def test_plan_answers_for_the_detected_device(engine, files):
    plan = engine.run(PlanRequest(files["sd1"], (files["lora"],), (512, 512)))
    assert [s["step"] for s in plan["steps"]] == ["load", "patch", "step", "decode"] and isinstance(
        plan["fits"], bool
    )
    assert plan["device"] and plan["budget_bytes"] >= 0


def test_unloads_components_tells_budget_changes_from_placement_changes():
    base = DeviceOptions()
    assert not unloads_components(base, DeviceOptions(vram_budget_gb=2.0, reserve_vram_gb=1.0))
    assert unloads_components(base, DeviceOptions(cpu_vae=True))
    assert unloads_components(base, DeviceOptions(lowvram=True))
    assert unloads_components(base, DeviceOptions(vae_dtype="fp16"))


def test_configure_a_smaller_budget_keeps_the_models_and_evicts_what_no_longer_fits(engine, files):
    engine.load(files["vae"])
    engine.load(files["vae2"])
    held = engine.snapshot().device_bytes
    cap = held // 2
    done = engine.run(Configure(DeviceOptions(vram_budget_gb=cap / GIB)))
    assert done.report.vram_budget_bytes == int(cap / GIB * GIB) and engine.report is done.report
    assert done.unloaded == () and done.evicted_bytes >= held - cap
    assert len(done.snapshot.components) == 2  # still registered, partly or wholly on the mmap now
    assert done.snapshot.device_bytes <= cap
    assert engine.residency.policy.vram_budget == done.report.vram_budget_bytes
    assert any(ev.kind == "Evicted" for ev in engine.events)
    for c in engine.residency.components():
        assert c.measured_tiers() == c.tier_bytes()


def test_configure_a_placement_change_unloads_everything_and_starts_a_new_ledger(engine, files):
    engine.load(files["vae"])
    done = engine.run(Configure(DeviceOptions(cpu_vae=True)))
    assert done.unloaded == ("vae",) and done.snapshot.components == ()
    assert engine.components == {} and done.report.options.cpu_vae
    assert done.report.vae_device == "cpu"
    again = engine.load(files["vae"]).snapshot  # the new ledger works and feeds the sampler
    assert again.get("vae").device == "cpu"
    from engine import memory

    rows = {c.name: c for c in memory.sample().residency}
    assert rows["vae"].device_bytes == again.get("vae").device_bytes
