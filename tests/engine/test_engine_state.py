"""The engine's one registry and typed messages: unloading one component keeps the rest of a base's LoRA
stack, a decode reports the tiling it really runs (also after an out-of-memory retry), a failing event
listener is logged, and --disable-smart-memory unloads after a job that ran a model."""

from __future__ import annotations

import logging
import os

import pytest
from facade_files import write_files

from engine.devices import DeviceOptions
from engine.events import (
    DecodeFinished,
    DecodeStarted,
    EventKind,
    EventLog,
    Loaded,
    TilingChanged,
    Unpatched,
)
from engine.facade import Engine
from engine.requests import Decode, DetectDevices, Load, SetLoras, StackItem, Unload

MIB = 1024**2
GIB = 1024**3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("state"))


def _engine(options: DeviceOptions | None = None):
    seen: list = []
    e = Engine(on_event=seen.append)
    e.run(DetectDevices(options or DeviceOptions()))
    return e, seen


def test_unloading_one_component_keeps_the_stack_of_the_others_and_says_what_it_unpatched(files):
    e, seen = _engine(DeviceOptions(vram_budget_gb=16 * MIB / GIB))
    try:
        sd1 = files["sd1"]
        e.run(Load(sd1, ("unet", "clip_l")))
        applied = e.run(SetLoras(sd1, (StackItem(files["lora"], 1.0, 1.0),)))
        clip_units = len(applied.patched_units["clip_l"])
        unet = e.components[(os.path.abspath(sd1), "unet")]
        unet_patched = [
            u for u in unet.units if u.module.weight_functions if hasattr(u.module, "weight_functions")
        ]
        assert clip_units > 0 and unet_patched
        seen.clear()

        e.run(Unload(sd1, "clip_l"))

        unpatched = [ev for ev in seen if isinstance(ev, Unpatched)]
        assert [(ev.component, ev.modules) for ev in unpatched] == [("clip_l", clip_units)]
        assert all(u.module.weight_functions for u in unet_patched)  # the UNet keeps its patches
        assert e.loaded.patched_units(sd1).keys() == {"unet"}
        # the stack is still known: applying it again changes nothing on the UNet
        again = e.run(SetLoras(sd1, (StackItem(files["lora"], 1.0, 1.0),)))
        assert again.patched_units["unet"] == applied.patched_units["unet"]
    finally:
        e.close()


def test_unload_all_sends_unpatched_for_every_patched_component(files):
    e, seen = _engine(DeviceOptions(vram_budget_gb=16 * MIB / GIB))
    try:
        e.run(Load(files["sd1"], ("unet", "clip_l")))
        applied = e.run(SetLoras(files["sd1"], (StackItem(files["lora"]),)))
        seen.clear()
        e.unload_all()
        got = {ev.component: ev.modules for ev in seen if isinstance(ev, Unpatched)}
        assert got == {k: len(v) for k, v in applied.patched_units.items()}
        assert e.components == {}
    finally:
        e.close()


def _tile_rects(progress):
    return {p.tile.rect for p in progress if p.tile is not None}


def test_decode_started_carries_the_tiling_that_runs(files, monkeypatch):
    from engine.vae import run

    e, seen = _engine()
    try:
        monkeypatch.setattr(run, "memory_budget", lambda device: 4 * MIB)  # auto must tile
        progress: list = []
        res = e.run(Decode(files["vae"], files["latent"], mode="auto"), report=progress.append)
        started = next(ev for ev in seen if isinstance(ev, DecodeStarted))
        finished = next(ev for ev in seen if isinstance(ev, DecodeFinished))
        assert started.kind is EventKind.DECODE_STARTED and started.tiling.tiled
        assert _tile_rects(progress) == set(started.tiling.rects)
        assert finished.tiling == started.tiling
        assert res.info["tiles"] == len(started.tiling.rects)
    finally:
        e.close()


def test_an_out_of_memory_retry_announces_the_new_tiling_and_runs_it(files, monkeypatch):
    import torch

    from engine.vae import run

    e, seen = _engine()
    try:
        monkeypatch.setattr(run, "memory_budget", lambda device: 64 * MIB)
        monkeypatch.setattr(run, "can_retry_after_oom", lambda device: True)  # as on a GPU
        real = run._attempt
        calls = []

        def attempt(*a):
            calls.append(a[3])
            if len(calls) == 1:
                raise torch.OutOfMemoryError("test: the first pass does not fit")
            return real(*a)

        monkeypatch.setattr(run, "_attempt", attempt)
        progress: list = []
        e.run(Decode(files["vae"], files["latent"], mode="full"), report=progress.append)
        started = next(ev for ev in seen if isinstance(ev, DecodeStarted))
        changed = [ev for ev in seen if isinstance(ev, TilingChanged)]
        finished = next(ev for ev in seen if isinstance(ev, DecodeFinished))
        assert not started.tiling.tiled and len(changed) == 1 and changed[0].tiling.tiled
        assert calls == [started.tiling, changed[0].tiling]  # each attempt ran what was announced
        assert finished.tiling == changed[0].tiling and finished.oom_retries == 1
        assert _tile_rects(progress) == set(changed[0].tiling.rects)
    finally:
        e.close()


def test_a_failing_listener_is_logged_and_the_others_still_hear(caplog):
    log = EventLog()
    heard = []
    log.subscribe(lambda ev: 1 / 0)
    log.subscribe(heard.append)
    with caplog.at_level(logging.ERROR, logger="loadout.events"):
        log.emit(Loaded("unet", 10))
    assert [ev.component for ev in heard] == ["unet"]
    rec = [r for r in caplog.records if r.name == "loadout.events"]
    assert rec and rec[0].exc_info and rec[0].exc_info[0] is ZeroDivisionError


def test_events_are_immutable_and_serialise_with_their_fields():
    ev = Unpatched("clip_l", base="/m.safetensors", modules=3)
    with pytest.raises(AttributeError):
        ev.modules = 4  # type: ignore[misc]
    j = ev.to_json()
    assert j["kind"] == "Unpatched" and j["detail"] == {"base": "/m.safetensors", "modules": 3}


def test_disable_smart_memory_unloads_after_a_decode(files):
    e, seen = _engine(DeviceOptions(disable_smart_memory=True))
    try:
        e.run(Decode(files["vae"], files["latent"], mode="full"))
        assert e.snapshot().components == () and e.components == {}
        assert any(ev.kind == "Unloaded" for ev in seen)
    finally:
        e.close()
    e, _ = _engine()
    try:
        e.run(Decode(files["vae"], files["latent"], mode="full"))
        assert len(e.snapshot().components) == 1  # smart memory keeps the VAE for the next decode
    finally:
        e.close()
