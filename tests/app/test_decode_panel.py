"""The Decode panel as a user drives it: drop a latent, read the estimate, decode (tiles drawn as they
finish), zoom, save; Stop during a decode cancels it and the panel and engine stay usable."""

from __future__ import annotations

import pytest
from app_test_support import drop, wait_job

from engine.requests import Decode, Encode


@pytest.fixture(scope="module")
def decode_files(tmp_path_factory, files):
    import torch

    from engine.formats.latent import write_latent
    from tests.support import synth

    d = tmp_path_factory.mktemp("decode")
    taesd = synth.write("taesd_decoder", d / "taesd_decoder.safetensors", dense=True, seed=7)
    g = torch.Generator().manual_seed(0)
    small = d / "small.latent"
    write_latent(small, torch.randn(1, 4, 32, 32, generator=g))
    big = d / "big.latent"
    write_latent(big, torch.randn(1, 4, 64, 64, generator=g))
    return {"taesd": str(taesd), "small": str(small), "big": str(big), "kl": files["vae"]}


def _library(qtbot, w, paths):
    w.library.add_paths(paths, select_first=False)
    qtbot.waitUntil(lambda: all(w.decode.vae_box.findData(p) >= 0 for p in paths), timeout=30_000)


def test_decode_a_dropped_latent_shows_estimate_tiles_result_and_saves(qtbot, window, decode_files, tmp_path):
    w, dec = window, window.decode
    _library(qtbot, w, [decode_files["taesd"]])
    assert dec.set_vae(decode_files["taesd"])
    drop(w, [decode_files["small"]])  # a latent dropped on the window becomes Decode's input
    assert dec.input_edit.text() == decode_files["small"]
    qtbot.waitUntil(lambda: "decode: full" in dec.estimate.text(), timeout=10_000)  # read off the GUI thread
    assert (
        dec.estimate.text().startswith("256×256 decode: full ≈")
        and "tiled at 512 px (one tile: the image is smaller)" in dec.estimate.text()
    )
    dec.mode_box.setCurrentIndex(dec.mode_box.findData("tiled"))
    dec.tile_spin.setValue(128)
    dec.overlap_spin.setValue(32)
    dec.run_button.click()
    res = wait_job(qtbot, w, Decode)
    assert (res.width, res.height) == (256, 256) and len(res.rgb) == 256 * 256 * 3
    assert res.info["mode"] == "tiled" and res.info["tiles"] == len(dec.tile_items) > 1
    assert dec.tiles_done == len(dec.tile_items)  # every tile was drawn as finished
    dec.tiles_box.setChecked(False)  # the outlines can be hidden to look at the picture alone
    assert not any(it.isVisible() for it in dec.tile_items)
    dec.tiles_box.setChecked(True)
    assert all(it.isVisible() for it in dec.tile_items)
    assert any(kind == "DecodeFinished" for _, kind, _ in w.graph.events)
    dec.view.resetTransform()
    dec.view.scale(2, 2)
    assert dec.view.zoom() == 2
    out = tmp_path / "out.png"
    dec.save(str(out))
    from PIL import Image

    assert Image.open(out).size == (256, 256)


def test_stop_during_a_decode_cancels_it_and_state_stays_consistent(qtbot, window, decode_files):
    w, dec = window, window.decode
    _library(qtbot, w, [decode_files["kl"], decode_files["taesd"]])
    dec.set_vae(decode_files["kl"])
    dec.set_input(decode_files["big"])
    dec.mode_box.setCurrentIndex(dec.mode_box.findData("tiled"))
    dec.tile_spin.setValue(128)
    dec.overlap_spin.setValue(32)
    cancelled = []
    w.client.job_cancelled.connect(lambda job: cancelled.append(type(job.request)))
    progressed = []
    # the VAE's load through the ledger reports progress too: wait for the tiles themselves
    w.client.job_progress.connect(
        lambda job, p: (
            progressed.append(p.done) if isinstance(job.request, Decode) and p.stage == "VAE decode" else None
        )
    )
    dec.run_button.click()
    qtbot.waitUntil(lambda: any(d >= 1 for d in progressed), timeout=60_000)
    assert w.stop_action.isEnabled()
    w.stop_action.trigger()
    qtbot.waitUntil(lambda: Decode in cancelled, timeout=60_000)
    assert dec.job_id is None and dec.run_button.isEnabled()
    assert "stopped" in dec.eta.text() and "stopped" in w.messages.text
    assert dec.tiles_done < len(dec.tile_items)
    assert any(kind == "Cancelled" for _, kind, _ in w.graph.events)
    qtbot.waitUntil(lambda: not w.client.busy, timeout=10_000)
    assert not w.stop_action.isEnabled()
    # the engine goes on: the next decode runs to the end
    dec.set_vae(decode_files["taesd"])
    dec.set_input(decode_files["small"])
    dec.mode_box.setCurrentIndex(dec.mode_box.findData("full"))
    dec.run_button.click()
    res = wait_job(qtbot, w, Decode)
    assert res.info["mode"] == "full" and (res.width, res.height) == (256, 256)


def test_a_file_that_is_no_latent_or_image_is_refused_with_a_message(qtbot, window, files):
    assert not window.decode.set_input(files["txt"])
    assert "neither a latent" in window.messages.text


def test_a_dropped_photo_picks_an_encoder_and_shows_the_round_trip(qtbot, window, tmp_path):
    """With the demo's preview pair and a sparse (header-only) VAE in the library, a dropped latent gets
    the decoder and a dropped photo the encoder, without the user choosing; encoding writes the latent
    beside the photo and shows it decoded back."""
    from PIL import Image

    from engine.catalog import demo_preview as PV
    from tests.support import synth

    d = tmp_path / "vae_approx"
    d.mkdir()
    dec_file, enc_file = (
        d / "taesd_preview_decoder_demo.safetensors",
        d / "taesd_preview_encoder_demo.safetensors",
    )
    PV.write_decoder(dec_file)
    PV.write_encoder(enc_file)
    sparse = synth.write("sd_vae", tmp_path / "sparse_vae.safetensors")  # header-faithful: a hole for data
    PV.write_photo(tmp_path / "big.png")
    photo = tmp_path / "photo.png"
    # 130x100: not whole latent pixels, so the encode crops it to 128x96 and says so
    Image.open(tmp_path / "big.png").convert("RGB").resize((130, 100), Image.Resampling.BOX).save(photo)
    PV.write_latent(tmp_path / "scene.latent")
    w, dec = window, window.decode
    _library(qtbot, w, [str(sparse), str(dec_file), str(enc_file)])
    drop(w, [str(tmp_path / "scene.latent")])
    assert dec.vae_box.currentData() == str(dec_file)  # holds weights, can decode; the sparse VAE cannot
    drop(w, [str(photo)])
    assert dec.vae_box.currentData() == str(enc_file) and dec.run_button.text() == "Encode"
    dec.run_button.click()
    res = wait_job(qtbot, w, Encode)
    assert res.info["shown"] == "round trip" and (res.width, res.height) == (128, 96)
    assert (tmp_path / "photo.latent").is_file() and "wrote photo.latent" in dec.eta.text()
    assert "130×100 cropped to 128×96" in dec.eta.text()


def test_opening_the_demo_library_puts_its_latent_in_decode(qtbot, window, tmp_path):
    """First run's demo library: one press of Decode shows the picture (the latent is set, and the
    preview decoder is chosen as the scan finds it)."""
    from engine.catalog import demo_preview as PV
    from engine.catalog.demo import DEMO_CURRENT, DEMO_LATENT

    demo = tmp_path / "demo-library"
    (demo / DEMO_CURRENT).parent.mkdir(parents=True)
    (demo / DEMO_LATENT).parent.mkdir(parents=True)
    PV.write_decoder(demo / DEMO_CURRENT)
    PV.write_latent(demo / DEMO_LATENT)
    w, dec = window, window.decode
    w.first_run.open_chosen([demo])  # what the first-run dialog's "Open the demo library" leads to
    assert dec.input_edit.text() == str(demo / DEMO_LATENT)
    qtbot.waitUntil(lambda: dec.vae_box.currentData() == str(demo / DEMO_CURRENT), timeout=30_000)
    assert dec.run_button.text() == "Decode" and dec.run_button.isEnabled()


def test_the_outline_is_the_engines_tiling_also_after_an_out_of_memory_retry(qtbot, window):
    """The panel draws the tiles the engine announces (DecodeStarted), not a guess of its own, and
    redraws them when a retry changes the tiling (TilingChanged): before, it computed its own tiles at
    4 bytes per element (wrong on an fp16 device) and kept them after a retry."""
    from engine.events import DecodeStarted, Tiling, TilingChanged
    from engine.jobs import Progress, TileDone

    dec = window.decode
    first = Tiling("tiled", 256, 64, ((0, 256, 0, 256), (0, 256, 256, 512)), 0)
    dec.job_id = 99  # as while a decode of ours runs
    dec.on_event(DecodeStarted("vae", latent_shape=(1, 4, 32, 64), tiling=first))
    rects = lambda: [tuple(int(v) for v in (r.top(), r.bottom(), r.left(), r.right()))  # noqa: E731
                     for r in (it.rect() for it in dec.tile_items)]  # fmt: skip
    assert rects() == [(y0, y1, x0, x1) for y0, y1, x0, x1 in first.rects]
    retry = Tiling("tiled", 128, 32, tuple((0, 256, x, x + 128) for x in range(0, 512, 128)), 0)
    dec.on_event(TilingChanged("vae", tiling=retry, reason="out of memory"))
    assert rects() == list(retry.rects) and dec.tiles_done == 0
    # a sound's decode and an encode announce themselves too (the graph marks them): no outline of theirs
    dec.on_event(DecodeStarted("audio_vae", latent_shape=(1, 20, 128), downscale=0, media="sound"))
    dec.on_event(DecodeStarted("vae", direction="encode", tiling=first))
    assert rects() == list(retry.rects) and dec.scene.sceneRect().width() == 512
    job = type("J", (), {"id": 99})()
    dec.on_progress(job, Progress("VAE decode", 4, 4, "", TileDone(1, 1, 3, 4, retry.rects[3])))
    assert dec.tiles_done == 4
    dec.job_id = None


def test_a_video_latent_plays_in_the_panel_and_saves_as_mp4_and_frames(qtbot, window, tmp_path):
    """A Wan VAE and a 5-D latent: the estimate counts frames, the decode runs in chunks (progress with an
    ETA), the clip plays with the slider and Play, Stop mid-decode leaves the panel usable, and Save writes
    an MP4 and a folder of PNGs through the engine's IO thread."""
    pytest.importorskip("diffusers")
    import torch

    from engine.formats.latent import write_latent
    from tests.support.wan_vae import write_wan_vae

    vae = write_wan_vae(tmp_path / "wan_2.1_vae_small.safetensors")
    latent = tmp_path / "clip.latent"
    write_latent(latent, torch.randn(1, 16, 3, 6, 8, generator=torch.Generator().manual_seed(0)))
    w, dec = window, window.decode
    _library(qtbot, w, [vae])
    assert dec.set_vae(vae)
    dec.set_input(str(latent))
    qtbot.waitUntil(lambda: "×9 frames decode" in dec.estimate.text(), timeout=10_000)
    dec.mode_box.setCurrentIndex(dec.mode_box.findData("tiled"))
    dec.tile_spin.setValue(64)
    dec.overlap_spin.setValue(16)
    dec.run_button.click()
    res = wait_job(qtbot, w, Decode)
    assert len(res.frames) == 9 and res.fps == 16 and (res.width, res.height) == (64, 48)
    assert dec.player.isVisible() and dec.player.frame_slider.maximum() == 8
    assert dec.tiles_done == len(dec.tile_items) > 1
    assert "9 frames in chunks of" in dec.eta.text() and "snapshots" not in dec.eta.text()  # a CPU keeps none
    # a GPU run that kept its retry snapshots in host RAM (choice.snapshot_for) says so
    import dataclasses
    from types import MappingProxyType

    dec._on_done(dataclasses.replace(res, info=MappingProxyType({**res.info, "snapshot": "host"})))
    assert dec.eta.text().endswith("latent frames, retry snapshots in host RAM)")
    dec._on_done(res)
    first = dec.pixmap_item.pixmap().toImage().copy()
    dec.player.frame_slider.setValue(8)
    assert dec.player.frame_label.text().startswith("9/9") and dec.pixmap_item.pixmap().toImage() != first
    dec.player.play_button.setChecked(True)  # plays at the clip's frame rate, looping
    assert dec.player.timer.isActive() and dec.player.timer.interval() == round(1000 / 16)
    qtbot.waitUntil(
        lambda: dec.player.frame_slider.value() == 1, timeout=5_000
    )  # wrapped round from the last
    dec.player.play_button.setChecked(False)
    assert not dec.player.timer.isActive()
    saved = []
    dec.message.connect(lambda text, level: saved.append(text))
    dec.save(str(tmp_path / "clip.mp4"))
    dec.save(str(tmp_path / "frames") + "/")
    qtbot.waitUntil(lambda: len([s for s in saved if s.startswith("Saved")]) == 2, timeout=30_000)
    assert (tmp_path / "clip.mp4").stat().st_size > 0
    assert len(list((tmp_path / "frames").glob("*.png"))) == 9


def test_a_result_that_arrives_while_the_tab_is_hidden_fills_the_view_when_shown(qtbot, window, decode_files):
    # The round trip (or a decode) can finish while another tab of the dock area is in front: the view
    # was then fitted into a viewport of no real size, and the picture showed as a thumbnail until Fit.
    w, dec = window, window.decode
    _library(qtbot, w, [decode_files["taesd"]])
    dec.set_vae(decode_files["taesd"])
    dec.set_input(decode_files["small"])
    w.docks["inspector"].raise_()  # the tab that shares its place, in front of Decode
    dec.run_button.click()
    wait_job(qtbot, w, Decode)
    w.docks["decode"].raise_()
    qtbot.waitUntil(dec.view.isVisible, timeout=5_000)
    vp = dec.view.viewport().size()
    fitted = min(vp.width() / 256, vp.height() / 256)
    qtbot.waitUntil(lambda: abs(dec.view.zoom() - fitted) < 0.05 * fitted, timeout=5_000)
    assert dec.view.fitted
    # once the user zooms, a resize keeps the zoom; 100 % is the image's own pixels
    dec.view.actual_size()
    dec.view.resize(dec.view.width() + 40, dec.view.height())
    qtbot.wait(50)
    assert dec.view.zoom() == 1 and not dec.view.fitted
    dec.fit()
    assert dec.view.fitted


def test_a_dropped_clip_encodes_with_the_video_vae_and_plays_the_round_trip(qtbot, window, tmp_path):
    """An MP4 dropped on the panel with a Wan VAE in the library: the estimate counts its frames, Encode
    writes a 5-D latent beside it, the round trip plays, and the frames left out are said."""
    pytest.importorskip("diffusers")
    import numpy as np

    from engine.formats.video_out import write_mp4
    from tests.support.wan_vae import write_wan_vae

    vae = write_wan_vae(tmp_path / "wan_2.1_vae_small.safetensors")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (32, 48, 3), dtype=np.uint8).tobytes() for _ in range(6)]
    write_mp4(str(tmp_path / "walk.mp4"), frames, 48, 32, 16)
    w, dec = window, window.decode
    _library(qtbot, w, [vae])
    said = []
    dec.message.connect(lambda text, level: said.append(text))
    drop(w, [str(tmp_path / "walk.mp4")])
    assert dec.vae_box.currentData() == vae and dec.run_button.text() == "Encode"
    qtbot.waitUntil(lambda: "×5 frames encode" in dec.estimate.text(), timeout=10_000)
    dec.run_button.click()
    res = wait_job(qtbot, w, Encode)
    assert list(res.info["latent_shape"]) == [1, 16, 2, 4, 6] and res.info["shown"] == "round trip"
    assert len(res.frames) == 5 and dec.player.frame_slider.maximum() == 4
    assert (
        (tmp_path / "walk.latent").is_file() and "5 frames" in dec.eta.text() and "None" not in dec.eta.text()
    )
    assert any("first 5 of 6 frames" in s for s in said)


def test_a_sound_latent_decodes_through_the_audio_vae_and_saves_as_wav(qtbot, window, tmp_path):
    """LTX-2's diffusers folders in the library (audio_vae/ and vocoder/, beside an image VAE): a dropped audio latent
    picks the audio VAE (never the vocoder alone, never the image VAE), decodes to its waveform, and saves a WAV;
    that WAV dropped encodes to a latent (the audio VAE's encoder), which decodes back."""
    diffusers = pytest.importorskip("diffusers")
    import wave

    import torch
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder

    from engine.formats.safetensors import save_tensors
    from engine.requests import DecodeAudio, EncodeAudio
    from tests.support import synth

    g = torch.Generator().manual_seed(0)
    vae = diffusers.AutoencoderKLLTX2Audio(base_channels=128, ch_mult=(1, 1, 2)).eval()
    voc = LTX2Vocoder(hidden_channels=64).eval()
    with torch.no_grad():
        for m in (vae, voc):
            for p in m.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.7 / p[0].numel() ** 0.5)
    vae.save_pretrained(tmp_path / "ltx2" / "audio_vae")
    voc.save_pretrained(tmp_path / "ltx2" / "vocoder")
    audio = str(tmp_path / "ltx2" / "audio_vae" / "diffusion_pytorch_model.safetensors")
    image = str(synth.write("taesd_decoder", tmp_path / "taesd_decoder.safetensors", dense=True, seed=7))
    latent = tmp_path / "sound.safetensors"
    save_tensors(latent, {"audio_latent": torch.randn(1, 20, 128, generator=g)})
    w, dec = window, window.decode
    vocoder = str(tmp_path / "ltx2" / "vocoder" / "diffusion_pytorch_model.safetensors")
    w.library.add_paths([image, audio, vocoder], select_first=False)
    qtbot.waitUntil(
        lambda: dec.vae_box.findData(audio) >= 0 and dec.vae_box.findData(image) >= 0, timeout=30_000
    )
    assert dec.vae_box.findData(vocoder) < 0  # a vocoder alone decodes no latent
    # diffusers names every component's file alike: the folders name it, in the box and the library
    assert dec.vae_box.itemText(dec.vae_box.findData(audio)) == "ltx2/audio_vae (ltx2)"
    names = {e.path: e.name for e in w.library.model.entries}
    assert (names[audio], names[vocoder]) == ("ltx2/audio_vae", "ltx2/vocoder")
    assert dec.set_vae(image)
    drop(w, [str(latent)])
    assert dec.vae_box.currentData() == audio and isinstance(dec.request(), DecodeAudio)
    assert dec.estimate.text().startswith("A sound's latent") and not dec.mode_box.isEnabled()
    qtbot.waitUntil(
        lambda: " ≈ " in dec.estimate.text(), timeout=30_000
    )  # its memory, built from the headers
    assert "MiB" in dec.estimate.text() and ("fits" in dec.estimate.text() or dec.free_bytes is None)
    dec.run_button.click()
    res = wait_job(qtbot, w, DecodeAudio)
    assert (res.channels, res.sample_rate) == (
        2,
        24000,
    ) and "0.77 s of stereo at 24000 Hz, hifigan" in dec.eta.text()
    assert dec.pixmap_item.pixmap().width() == 1200 and dec.save_button.isEnabled()
    marks = [label for _, kind, label in w.graph.events if kind in ("DecodeStarted", "DecodeFinished")]
    assert marks[-2].startswith("DecodeStarted audio_vae (sound)") and marks[-1].startswith(
        "DecodeFinished audio_vae"
    )
    saved = []
    dec.message.connect(lambda text, level: saved.append(text))
    dec.save(str(tmp_path / "sound"))
    qtbot.waitUntil(lambda: any(s.startswith("Saved") for s in saved), timeout=30_000)
    with wave.open(str(tmp_path / "sound.wav")) as f:
        assert (f.getnchannels(), f.getframerate(), f.getnframes()) == (2, 24000, 77 * 240)
    w.grab().save(str(tmp_path / "shot.png"))

    # the saved sound, dropped: encoded by the same file's encoder to a latent beside it, which becomes the input
    drop(w, [str(tmp_path / "sound.wav")])
    assert dec.vae_box.currentData() == audio and isinstance(dec.request(), EncodeAudio)
    assert dec.run_button.text() == "Encode" and not dec.mode_box.isEnabled()
    assert dec.estimate.text().startswith("A sound: encoded whole") and "sound.latent" in dec.estimate.text()
    assert (
        dec.set_vae(image) and "this VAE cannot encode it" in dec.estimate.text()
    )  # an image VAE: said before
    assert dec.set_vae(audio)
    dec.run_button.click()
    enc = wait_job(qtbot, w, EncodeAudio)
    assert enc.out == str(tmp_path / "sound.latent") and tuple(enc.info["latent_shape"][:2]) == (1, 8)
    assert (
        "0.77 s of stereo at 24000 Hz to a latent 1×8×" in dec.eta.text() and not dec.save_button.isEnabled()
    )
    assert dec.input_edit.text() == enc.out and isinstance(dec.request(), DecodeAudio)  # Decode plays it back
    marks = [label for _, kind, label in w.graph.events if kind in ("DecodeStarted", "DecodeFinished")]
    assert marks[-2].startswith("EncodeStarted audio_vae_encoder (sound)") and marks[-1].startswith(
        "EncodeFinished"
    )
    dec.run_button.click()
    back = wait_job(qtbot, w, DecodeAudio)
    assert back.sample_rate == 24000 and dec.pixmap_item.pixmap().width() == 1200
