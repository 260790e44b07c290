"""Decode and encode through the facade place the VAE through the residency ledger: it shows up as an
entry with its bytes, stays loaded, unloads like any component, evicts others when memory is short,
and a cancelled decode leaves the ledger truthful with the decode's temporary memory returned."""

from __future__ import annotations

import os

import psutil
import pytest
from facade_files import write_files

from engine.devices import DeviceOptions
from engine.errors import Cancelled, FormatError
from engine.facade import Engine
from engine.jobs import CancelToken
from engine.requests import Decode, DetectDevices, Encode, Unload, UnloadAll

MIB = 1024**2
GIB = 1024**3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_files(tmp_path_factory.mktemp("facade_vae"))


def _engine(options: DeviceOptions | None = None) -> Engine:
    events = []
    e = Engine(on_event=events.append)
    e.events = events
    e.run(DetectDevices(options or DeviceOptions()))
    return e


@pytest.fixture
def engine():
    e = _engine()
    yield e
    e.close()


def _direct(vae_path: str, latent_path: str):
    """The same decode straight through engine.vae (no ledger), for comparison."""
    import torch

    from engine.formats.latent import read_latent
    from engine.vae import decode, load_vae

    img = decode(load_vae(vae_path), read_latent(latent_path), tiled=False, dtype=torch.float32)
    return (img[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy().tobytes()


def test_decode_places_the_vae_in_the_ledger_and_it_stays_loaded(engine, files):
    res = engine.run(Decode(files["vae"], files["latent"], mode="full"))
    assert (res.width, res.height) == (128, 128) and res.info["vae_component"] == "vae"
    assert res.rgb == _direct(files["vae"], files["latent"])  # the ledger's copy decodes the same pixels
    row = engine.snapshot().get("vae")
    assert row is not None and row.path == os.path.abspath(files["vae"])
    assert row.device_bytes == row.full_bytes > 0  # fully placed, and still there after the decode
    c = engine.components[(row.path, "vae")]
    assert c.measured_tiers() == c.tier_bytes()
    assert all(i.begin >= 0 for u in c.units for i in u.infos.values())  # read by offset, not via the mmap
    kinds = [ev.kind for ev in engine.events]
    assert kinds.index("Loaded") < kinds.index("DecodeStarted") < kinds.index("DecodeFinished")
    # a second decode reuses the loaded VAE: nothing is copied again
    engine.run(Decode(files["vae"], files["latent"], mode="full"))
    assert [ev.bytes_moved > 0 for ev in engine.events if ev.kind == "Loaded"] == [True, False]
    assert len(engine.snapshot().components) == 1

    gone = engine.run(Unload(files["vae"], "vae"))
    assert gone.snapshot.components == () and gone.bytes == row.device_bytes


def test_taesd_entry_is_named_after_its_half_and_unload_all_removes_it(engine, files, tmp_path):
    from PIL import Image

    engine.run(Decode(files["taesd"], files["latent"], mode="full"))
    assert [c.name for c in engine.snapshot().components] == ["taesd_decoder"]
    img = tmp_path / "in.png"
    Image.new("RGB", (64, 64)).save(img)
    with pytest.raises(FormatError, match="no encoder"):
        engine.run(Encode(files["taesd"], str(img), str(tmp_path / "x.latent")))
    assert engine.run(UnloadAll()).snapshot.components == ()


def test_a_loaded_checkpoint_vae_is_reused_by_decode(engine, files):
    engine.load(files["ckpt_vae"])
    comp = engine.components[(os.path.abspath(files["ckpt_vae"]), "vae")]
    moved = sum(ev.bytes_moved for ev in engine.events if ev.kind == "Loaded")
    res = engine.run(Decode(files["ckpt_vae"], files["latent"], mode="full"))
    assert engine.components[(os.path.abspath(files["ckpt_vae"]), "vae")] is comp  # the very same weights
    assert sum(ev.bytes_moved for ev in engine.events if ev.kind == "Loaded") == moved  # not loaded twice
    assert [c.name for c in engine.snapshot().components] == ["vae"]
    assert res.rgb == _direct(files["vae"], files["latent"])  # same weights as the standalone file


def test_encode_writes_a_latent_and_keeps_the_vae_loaded(engine, files, tmp_path):
    from PIL import Image

    from engine.formats.latent import read_latent

    img = tmp_path / "in.png"
    Image.new("RGB", (64, 48), (200, 30, 90)).save(img)
    out = tmp_path / "out.latent"
    res = engine.run(Encode(files["vae"], str(img), str(out), mode="full"))
    assert tuple(res.info["latent_shape"]) == (1, 4, 6, 8) and tuple(read_latent(out).shape) == (1, 4, 6, 8)
    assert engine.snapshot().get("vae").device_bytes > 0
    # marked on the graph as a decode is, named an encode; what it made is the latent's float32 bytes
    start, end = (ev for ev in engine.events if ev.kind in ("DecodeStarted", "DecodeFinished"))
    assert (start.kind, start.direction, start.media, start.tiling.mode) == (
        "DecodeStarted",
        "encode",
        "image",
        "full",
    )
    assert (end.kind, end.direction, end.bytes_moved) == ("DecodeFinished", "encode", 1 * 4 * 6 * 8 * 4)


def _rss() -> int:
    return psutil.Process().memory_info().rss


def test_a_decode_cancelled_mid_tiles_leaves_the_ledger_truthful_and_frees_its_memory(engine, files):
    from engine.memory import release_memory

    req = Decode(files["taesd"], files["latent"], mode="tiled", tile=64, overlap=16)
    full = engine.run(Decode(files["taesd"], files["latent"], mode="full"))  # warm: the VAE is loaded
    release_memory()
    before_rss = _rss()
    before = engine.snapshot()
    token = CancelToken()
    seen = []

    def report(p):
        seen.append(p)
        if p.stage == "VAE decode" and p.total > 1 and p.done >= 2:
            token.cancel("test")

    with pytest.raises(Cancelled):
        engine.run(req, token=token, report=report)
    started = next(ev for ev in engine.events if ev.kind == "DecodeStarted" and ev.requested_mode == "tiled")
    assert 2 <= max(p.done for p in seen if p.stage == "VAE decode") < len(started.tiling.rects)
    assert any(ev.kind == "Cancelled" for ev in engine.events)
    after = engine.snapshot()
    row = after.get("taesd_decoder")
    assert row.device_bytes == before.get("taesd_decoder").device_bytes == row.full_bytes
    c = engine.components[(row.path, "taesd_decoder")]
    assert c.measured_tiers() == c.tier_bytes()
    # the tile store and activations went back to the system (the ledger's weights stay)
    assert _rss() - before_rss < 48 * MIB, (_rss() - before_rss) / MIB
    again = engine.run(Decode(files["taesd"], files["latent"], mode="full"))  # still usable, same pixels
    assert again.rgb == full.rgb


def test_a_short_budget_evicts_another_model_to_place_the_vae(files):
    probe = _engine()
    probe.load(files["vae"])
    one = probe.snapshot().get("vae").device_bytes
    probe.close()
    e = _engine(DeviceOptions(vram_budget_gb=1.5 * one / GIB))  # room for one small VAE, not two
    try:
        e.load(files["vae2"])
        assert e.snapshot().device_bytes == one
        e.run(Decode(files["vae"], files["latent"], mode="full"))
        evicted = [ev for ev in e.events if ev.kind == "Evicted"]
        assert evicted and evicted[0].bytes_moved > 0
        snap = e.snapshot()
        rows = {c.path: c for c in snap.components}
        assert rows[os.path.abspath(files["vae"])].device_bytes == one  # the VAE is fully placed
        assert rows[os.path.abspath(files["vae2"])].device_bytes < one  # the other model made room
        assert snap.device_bytes <= 1.5 * one
    finally:
        e.close()


def test_loading_a_checkpoint_after_decoding_with_it_reuses_the_decode_vae(engine, files):
    engine.run(Decode(files["ckpt_vae"], files["latent"], mode="full"))
    comp = engine.components[(os.path.abspath(files["ckpt_vae"]), "vae")]
    snap = engine.load(files["ckpt_vae"]).snapshot
    assert [c.name for c in snap.components] == ["vae"]  # one entry: not a second copy of the same weights
    assert engine.components == {(os.path.abspath(files["ckpt_vae"]), "vae"): comp}


def test_a_torch_pickle_taesd_goes_through_the_ledger_too(engine, files, tmp_path):
    import torch
    from vae_fixtures import small_taesd

    sd = small_taesd("taesd", 4).state_dict()
    pth = tmp_path / "taesd_decoder.pth"
    torch.save({k.removeprefix("decoder."): v for k, v in sd.items() if k.startswith("decoder.")}, pth)
    res = engine.run(Decode(str(pth), files["latent"], mode="full"))
    assert (res.width, res.height) == (128, 128)
    row = engine.snapshot().get("taesd_decoder")
    c = engine.components[(str(pth), "taesd_decoder")]
    assert row.device_bytes == row.full_bytes == c.measured_tiers()["device"] > 0  # copied from its views
    engine.unload(str(pth), "taesd_decoder")
    assert engine.snapshot().components == () and c.measured_tiers()["device"] == 0


def test_encode_shows_the_round_trip_a_model_would_get(engine, tmp_path):
    """The demo's preview encoder brings its decoder: the result is the latent decoded back, close to the
    photo (the pair inverts the SD1 preview colour map), and says so."""
    import numpy as np
    from PIL import Image

    from engine.catalog import demo_preview as PV

    d = tmp_path / "vae_approx"
    d.mkdir()
    PV.write_decoder(d / "taesd_preview_decoder_demo.safetensors")
    enc = d / "taesd_preview_encoder_demo.safetensors"
    PV.write_encoder(enc)
    PV.write_photo(tmp_path / "photo.png")
    small = tmp_path / "small.png"
    Image.open(tmp_path / "photo.png").convert("RGB").resize((256, 256), Image.Resampling.BOX).save(small)
    res = engine.run(Encode(str(enc), str(small), str(tmp_path / "x.latent"), mode="full"))
    assert res.info["shown"] == "round trip" and (res.width, res.height) == (256, 256)
    got = np.frombuffer(res.rgb, np.uint8).reshape(256, 256, 3).astype(np.float64)
    want = np.asarray(Image.open(small), dtype=np.float64)
    explained = 1 - ((got - want) ** 2).mean() / want.var()
    assert explained > 0.8, explained  # the image itself would be shown as 1.0; a blank one as < 0
    assert not np.array_equal(got, want)  # decoded, not the input passed through
