"""`Step` through the Engine: the denoiser placed by the residency manager and run fully or partially
(the rest streamed from the disk tier), with LoRA stacks, cancellation and the ledger's record."""

from __future__ import annotations

import json

import pytest
import torch
from denoise_files import (
    FLUX_SCHNELL_TINY,
    PREFIX,
    SD1_TINY,
    flux_rows,
    random_weights,
    rel_l2,
    unet_rows,
    write,
)

from engine.devices import DeviceOptions
from engine.errors import Cancelled, FormatError
from engine.events import StepFinished
from engine.facade import Engine
from engine.formats.safetensors import SafetensorsFile, save_tensors
from engine.jobs import CancelToken
from engine.requests import Bake, StackItem, Step

MIB = 1024**2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("step")
    sd1 = write(d / "sd1.safetensors", random_weights(unet_rows(SD1_TINY), seed=11))
    flux = write(d / "flux.safetensors", random_weights(flux_rows(FLUX_SCHNELL_TINY), seed=12))
    return {"sd1": sd1, "flux": flux, "lora": _lora(d / "lora.safetensors", sd1), "dir": d}


def _lora(path, base):
    """A kohya LoRA (LoRA on Linears, LoCon on convs) over some of the tiny UNet's modules."""
    g = torch.Generator().manual_seed(7)
    t = {}
    for key, info in SafetensorsFile(base).header.tensors.items():
        mod = key[len(PREFIX) : -len(".weight")]
        if not key.endswith(".weight") or len(info.shape) < 2:
            continue
        # time_embed.0 and emb_layers.1 take one row per image: a batch of 1 is a matrix-vector product,
        # whose CPU kernel rounds by the operands' alignment
        mods = (
            "attn1.to_q",
            "attn2.to_v",
            "ff.net.2",
            "in_layers.2",
            "proj_in",
            "time_embed.0",
            "emb_layers.1",
        )
        if not any(s in mod for s in mods):
            continue
        name, (out, *rest) = "lora_unet_" + mod.replace(".", "_"), info.shape
        t[f"{name}.lora_down.weight"] = 0.1 * torch.randn(4, *rest, generator=g)
        t[f"{name}.lora_up.weight"] = 0.1 * torch.randn(
            out, 4, *([1, 1] if len(rest) == 3 else []), generator=g
        )
        t[f"{name}.alpha"] = torch.tensor(2.0)
    save_tensors(path, t)
    return path


def _engine(budget_gb=None, events=None) -> Engine:
    e = Engine(on_event=events.append if events is not None else None)
    e.detect(DeviceOptions(cpu=True, vram_budget_gb=budget_gb))
    return e


def _out(path) -> torch.Tensor:
    return SafetensorsFile(path).tensor("out").clone()


def _run(files, tmp_path, budget_gb=None, model="sd1", name="o", **kw):
    e = _engine(budget_gb)
    try:
        r = e.run(Step(str(files[model]), size=(64, 64), out=str(tmp_path / f"{name}.safetensors"), **kw))
    finally:
        e.close()
    return r, _out(r.out)


@pytest.mark.parametrize("model", ["sd1", "flux"])
def test_a_partial_run_equals_the_full_run_bit_for_bit(files, tmp_path, model):
    full, want = _run(files, tmp_path, model=model, name="full", steps=2)
    assert full.mode == "full" and full.streamed_bytes_per_step == 0
    total = full.resident_bytes
    for budget, name in ((total / 2 / 1024**3, "half"), (0.0, "none")):
        r, got = _run(files, tmp_path, budget, model=model, name=name, steps=3)
        assert r.mode == "partial" and r.resident_bytes <= max(budget * 1024**3, 0) + 1
        assert r.resident_bytes + r.streamed_bytes_per_step == total  # every byte: resident or streamed
        assert torch.equal(got, want), name
        assert r.output_shape == tuple(want.shape) and got.dtype == torch.float32
        assert len(r.step_seconds) == 3 and r.first_step_s == r.step_seconds[0] > 0


def test_a_partial_run_with_a_lora_equals_the_full_run_bit_for_bit(files, tmp_path):
    """Streamed modules patch on the fly, resident ones are baked in their file mapping: the patched
    copy sits at the mapping's alignment, so even a single-row linear (the time embedding) computes
    the same bits (a copy at another offset gave 1e-6 apart)."""
    stack = (StackItem(str(files["lora"]), 0.8, 0.8),)
    full, want = _run(files, tmp_path, name="full", loras=stack)
    for budget in (full.resident_bytes / 2 / 1024**3, 0.0):
        r, got = _run(files, tmp_path, budget, name="partial", loras=stack, steps=2)
        assert r.mode == "partial" and torch.equal(got, want), budget


def test_the_ledger_and_the_events_say_what_was_streamed(files, tmp_path):
    events = []
    e = _engine(0.004, events)
    r = e.run(Step(str(files["sd1"]), size=(64, 64), steps=2))
    row = e.snapshot().get("unet")
    assert r.streamed_bytes_per_step > 0 and row.streamed_bytes == r.streamed_bytes_per_step
    assert (
        row.device_bytes == r.resident_bytes and r.snapshot.get("unet").streamed_bytes == row.streamed_bytes
    )
    done = [ev for ev in events if isinstance(ev, StepFinished)]
    assert len(done) == 1 and done[0].bytes_moved == r.streamed_bytes_per_step and done[0].mode == "partial"
    assert done[0].to_json()["kind"] == "StepFinished"
    assert r.peak_device_bytes > 0 and r.architecture == "sd1" and r.naming == "ldm"
    e.close()


class CancelAfter(CancelToken):
    """Cancels itself at its n-th check: a Stop pressed in the middle of a forward."""

    __slots__ = ("left",)

    def __init__(self, n: int):
        super().__init__()
        self.left = n

    def raise_if_cancelled(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.cancel("stopped by the test")
        super().raise_if_cancelled()


def _patch_state(e: Engine):
    """Every op's own tensor objects, patch functions and (absent) fetch hooks."""
    out = {}
    for (_, name), c in e.loaded.items():
        for u in c.units:
            m = u.module
            out[(name, u.path)] = (
                tuple(id(getattr(m, a)) for a in u.infos),
                tuple(id(f) for f in getattr(m, "weight_functions", ())),
                tuple(id(f) for f in getattr(m, "bias_functions", ())),
                "fetch" in m.__dict__,
            )
    return out


def _ledger(e: Engine):
    return [(c.name, c.device_bytes, c.ram_bytes, c.disk_bytes, c.layers, c.streamed_bytes)
            for c in e.snapshot().components]  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.004])
def test_cancelling_mid_step_leaves_the_ledger_and_the_patches_as_they_were(files, tmp_path, budget):
    e = _engine(budget)
    model = str(files["sd1"])
    stack = (StackItem(str(files["lora"]), 0.8, 0.8),)
    first = e.run(Step(model, stack, size=(64, 64), out=str(tmp_path / "a.safetensors")))
    ledger, patches = _ledger(e), _patch_state(e)
    assert any(p[1] for p in patches.values())  # the stack is on
    token = CancelAfter(150)  # about half-way through the first forward
    with pytest.raises(Cancelled):
        e.run(Step(model, size=(64, 64), steps=2), token=token)
    assert token.left == 0 and _ledger(e) == ledger and _patch_state(e) == patches
    again = e.run(Step(model, size=(64, 64), out=str(tmp_path / "b.safetensors")))
    assert again.mode == first.mode and torch.equal(_out(again.out), _out(first.out))
    e.close()


@pytest.mark.parametrize("budget", [None, 0.004, 0.0])
def test_running_with_a_lora_equals_running_the_baked_model(files, tmp_path, budget):
    stack = (StackItem(str(files["lora"]), 0.8, 0.8),)
    baked = tmp_path / "baked_model.safetensors"
    e = _engine()
    e.bake(str(files["sd1"]), stack, str(baked))
    e.close()
    _, plain = _run(files, tmp_path, budget, name="plain")
    # two steps: the second reads the streamed weights again, on the CPU through the mappings the first
    # step used (kept across steps, their pages dropped and read again from the file in between)
    r, with_lora = _run(files, tmp_path, budget, name="lora", loras=stack, steps=2)
    files_b = {**files, "baked": baked}
    _, want = _run(files_b, tmp_path, budget, model="baked", name="baked")
    assert r.mode == ("full" if budget is None else "partial")
    assert not torch.equal(with_lora, plain)
    # Every op computes with exactly the baked file's weight (checked op by op below); the outputs
    # agree to the last bits the matmul kernels leave: the CPU's BLAS picks its kernel by the operands'
    # alignment, and the baked file's tensors sit at other offsets than the patched weights.
    assert rel_l2(with_lora, want) <= 1e-5  # float32 round-off, not a weight that differs
    from engine.model import Component
    from engine.patcher import LoraEntry, ModelPatcher

    def prefix(path):
        return PREFIX if any(k.startswith(PREFIX) for k in SafetensorsFile(path).header.tensors) else ""

    base = Component("unet", files["sd1"], prefix(files["sd1"]))
    patcher = ModelPatcher(dict(SafetensorsFile(files["sd1"]).header.tensors))
    entries = [LoraEntry(stack[0].file, 0.8, 0.8, True, 0)]
    wanted = patcher.plan(entries)
    baked_unet = {u.path: u for u in Component("unet", baked, prefix(baked)).units}
    x = torch.zeros(1, 1)
    patched = 0
    for u in base.units:
        key = u.keys.get("weight")
        if key in wanted and hasattr(u.module, "weight_functions"):
            u.module.weight_functions.append(patcher.weight_function(key, entries))
            w = u.module.cast_params(x)[0]
            assert torch.equal(w, baked_unet[u.path].module.cast_params(x)[0]), u.path
            patched += 1
    assert patched > 0


def test_inputs_from_a_file_in_the_original_names(files, tmp_path):
    _, want = _run(files, tmp_path, name="random", seed=4)
    from engine import denoise
    from engine.model import Component

    den = denoise.bind(Component("unet", files["sd1"], PREFIX), "sd1")
    inputs = den.random_inputs(64, 64, seed=4)
    save_tensors(tmp_path / "in.safetensors", inputs)
    r, got = _run(files, tmp_path, name="fromfile", inputs=str(tmp_path / "in.safetensors"))
    assert torch.equal(got, want) and r.input_shapes["context"] == (1, 77, 768)
    save_tensors(tmp_path / "bad.safetensors", {"x": inputs["x"]})
    with pytest.raises(FormatError, match="missing input"):
        _run(files, tmp_path, inputs=str(tmp_path / "bad.safetensors"))


def test_the_plan_knows_every_family_loadout_steps():
    """engine.plan keeps its own (torch-free) table of steppable families: it must be denoise's list."""
    from engine import denoise
    from engine.catalog.step_families import NATIVE_PX, STEP_KINDS

    assert set(STEP_KINDS) == set(NATIVE_PX) == set(denoise.SUPPORTED)


def test_on_the_cpu_a_partial_run_maps_its_streamed_modules_instead_of_copying_them(
    files, tmp_path, monkeypatch
):
    """Disk-tier modules are computed from the file's own pages (a populated mapping per module, let
    go once its op returns), not copied into the ring; the output stays the full run's."""
    import engine.denoise.stream as stream
    from engine.model import transfer

    mapped, copied = [], []

    class Counting(transfer.FileBlock):
        def __init__(self, fd, start, end):
            super().__init__(fd, start, end)
            mapped.append(end - start)

    real_read = stream.read_into
    full, want = _run(files, tmp_path, name="full")
    monkeypatch.setattr(transfer, "FileBlock", Counting)  # counted from here: the partial run only
    monkeypatch.setattr(stream, "read_into", lambda *a: copied.append(a) or real_read(*a))
    r, got = _run(files, tmp_path, 0.0, name="none")
    assert r.mode == "partial" and torch.equal(got, want)
    assert (
        sum(mapped) >= r.streamed_bytes_per_step > 0
    )  # every streamed module mapped (once: populated each step)
    assert not copied


def test_a_partial_run_equals_the_full_run_with_convolutions_as_gemms(files, tmp_path, monkeypatch):
    """The tiny UNet's convolutions are far under the GEMM rule's threshold; lowered to 1, every 3×3
    convolution runs as unfold + GEMM, streamed weights included, and the partial run still gives the
    full run's bits."""
    from engine import ops

    calls = []
    gemm = ops.gemm_conv2d
    monkeypatch.setattr(ops, "GEMM_CONV_MIN_WEIGHT_PER_POSITION", 1)
    monkeypatch.setattr(ops, "gemm_conv2d", lambda *a: calls.append(1) or gemm(*a))
    full, want = _run(files, tmp_path, name="full", steps=1)
    assert calls and full.mode == "full"
    r, got = _run(files, tmp_path, 0.0, name="none", steps=2)
    assert r.mode == "partial" and r.streamed_bytes_per_step > 0
    assert torch.equal(got, want)


def test_the_step_says_how_each_lora_fits_its_model(files, capsys):
    """`step --lora` reports each LoRA's coverage: a LoRA made for another family changes nothing, and
    the user is told so instead of reading a timing as if the LoRA had run. FILE:S:C keeps both strengths."""
    from engine.cli import main

    lora = str(files["lora"])
    n = sum(k.endswith(".lora_down.weight") for k in SafetensorsFile(lora).header.tensors)
    for model, mapped in (("sd1", n), ("flux", 0)):
        argv = ["step", "--model", str(files[model]), "--size", "64x64", "--cpu", "--lora", f"{lora}:0.8:0.5"]
        assert main([*argv, "--json"]) == 0
        (got,) = json.loads(capsys.readouterr().out)["loras"]
        assert (got["file"], got["strength_model"], got["strength_clip"]) == (lora, 0.8, 0.5)
        assert (got["modules"], got["mapped"]) == (n, mapped)
        if mapped:
            assert got["warning"] is None
        else:
            assert f"0/{n} modules map onto this FLUX.1" in got["warning"]
        assert main(argv) == 0
        line = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("LoRA ")]
        assert line == [f"  LoRA lora.safetensors at 0.8/0.5: {got['warning'] or f'{n}/{n} modules placed'}"]


def test_a_lora_given_as_the_model_is_a_usage_error_that_says_what_runs_it(files, capsys):
    """`step --model LORA` (or a VAE) is refused before anything loads, saying where that file goes;
    `load LORA` says a LoRA is applied, not loaded alone. Both are usage errors (exit 2)."""
    from engine.cli import main

    lora = str(files["lora"])
    assert main(["step", "--model", lora, "--cpu"]) == 2
    assert (
        f"{lora}: this is a LoRA: it patches a model (give it with --lora beside the model"
        in capsys.readouterr().err
    )
    assert main(["load", lora, "--cpu"]) == 2
    assert "lora.safetensors is a LoRA: it patches a model" in capsys.readouterr().err


def test_baked_patches_take_only_the_room_the_device_has_and_give_the_same_bits(files, tmp_path):
    """A baked patch is a second copy of its weight for the run, unless the weight is a view of the
    file's mapping (the CPU's resident copies): that one is baked in place and the file's bytes come
    back afterwards. A second copy takes only the room beside the weights and the activations, and the
    modules beyond it patch on the fly -- the same numbers either way."""
    from engine.denoise.patches import baked_resident

    stack = (StackItem(str(files["lora"]), 0.8, 0.8),)
    roomy, want = _run(files, tmp_path, name="roomy", loras=stack)
    # a budget of exactly the weights: no room for a second copy of any of them
    tight, got = _run(files, tmp_path, roomy.resident_bytes / 1024**3, name="tight", loras=stack)
    assert roomy.mode == tight.mode == "full"
    assert torch.equal(got, want)

    # stored as float16 (the file is float32): RAM copies, not the file's mapping -- the room decides
    e = Engine()
    e.detect(DeviceOptions(cpu=True, unet_dtype="fp16"))
    try:
        e.run(Step(str(files["sd1"]), stack, size=(64, 64)))
        (comp,) = [c for (_, name), c in e.loaded.items() if name == "unet"]
        before = _patch_state(e)
        patched = [
            (u.module, u.module.weight) for u in comp.units if getattr(u.module, "weight_functions", None)
        ]
        assert patched[0][1].dtype == torch.float16
        first = patched[0][1].numel() * patched[0][1].element_size()
        with baked_resident(comp, room=0) as n:
            assert n == 0 and all(m.weight is w for m, w in patched)
        with baked_resident(comp, room=first) as n:
            assert n == 1 and patched[0][0].weight is not patched[0][1] and not patched[0][0].weight_functions
        with baked_resident(comp) as n:
            assert n >= len(patched)
        assert _patch_state(e) == before  # every op has its own tensor and its functions back
    finally:
        e.close()


def _file_weights(comp, path) -> dict[str, torch.Tensor]:
    f = SafetensorsFile(path)
    return {f"{u.path}.{a}": f.tensor(key).clone() for u in comp.units for a, key in u.keys.items()}


def _weights(comp) -> dict[str, torch.Tensor]:
    return {f"{u.path}.{a}": getattr(u.module, a).detach().clone() for u in comp.units for a in u.keys}


def test_resident_weights_of_the_file_bake_in_place_and_get_the_files_bytes_back(files):
    """On the CPU the resident weights are views of the file's private mapping: a step bakes the LoRA
    into them in place (no second copy, so no room is needed), and afterwards -- finished or cancelled
    mid-bake -- every byte is the file's again, and the ops have their own tensors and functions."""
    from engine.denoise.patches import baked_resident

    stack = (StackItem(str(files["lora"]), 0.8, 0.8),)
    e = _engine()
    try:
        e.run(Step(str(files["sd1"]), stack, size=(64, 64)))
        (comp,) = [c for (_, name), c in e.loaded.items() if name == "unet"]
        before, disk = _patch_state(e), _file_weights(comp, files["sd1"])
        assert all(torch.equal(v, disk[k]) for k, v in _weights(comp).items())
        patched = [(u.module, u.module.weight) for u in comp.units if u.module.weight_functions]
        want = [w.detach().clone() for w in (fn(w) for m, w in patched for fn in m.weight_functions[:1])]
        with baked_resident(comp, room=0) as n:
            assert n >= len(patched)
            assert all(m.weight is w and not m.weight_functions for m, w in patched)  # the same tensors...
            assert all(torch.equal(w, x) for (_, w), x in zip(patched, want, strict=True))  # ...patched
        assert _patch_state(e) == before
        assert all(torch.equal(v, disk[k]) for k, v in _weights(comp).items())
        with pytest.raises(Cancelled), baked_resident(comp, CancelAfter(5), room=0):
            pass
        assert _patch_state(e) == before
        assert all(torch.equal(v, disk[k]) for k, v in _weights(comp).items())
    finally:
        e.close()


def test_a_step_and_a_bake_give_their_freed_heap_back_when_they_end(files, tmp_path, monkeypatch):
    """glibc keeps freed heap pages: once a step (finished or cancelled) or a bake has ended the engine
    trims the heap, or the memory graph shows a job's working memory as the app's long after it."""
    import engine.memory

    events, trims = [], []
    real = engine.memory.trim_heap
    # a spy: the real trim runs; each call notes how many events had been emitted by then
    monkeypatch.setattr(
        engine.memory, "trim_heap", lambda *a, **k: (trims.append(len(events)), real(*a, **k))
    )
    stack = (StackItem(str(files["lora"]), 0.8, 0.8),)
    e = _engine(events=events)
    try:
        e.run(Step(str(files["sd1"]), stack, size=(64, 64)))
        done = max(i for i, ev in enumerate(events) if isinstance(ev, StepFinished))
        assert trims and trims[-1] > done, "no trim once the step had finished"
        with pytest.raises(Cancelled):
            e.run(Step(str(files["sd1"]), size=(64, 64), steps=2), token=CancelAfter(50))
        stopped = max(i for i, ev in enumerate(events) if type(ev).__name__ == "JobCancelled")
        assert trims[-1] > stopped, "no trim once the step was cancelled"
        trims.clear()
        e.run(Bake(str(files["sd1"]), stack, str(tmp_path / "baked.safetensors")))
        assert trims, "no trim after a bake"
    finally:
        e.close()
