"""scan(): the library with the real detector — cache hits, changed and deleted files, bad files,
folder hints, sidecars, diffusers folders, cancellation."""

from __future__ import annotations

import os
import struct
import sys

import pytest

import engine.detect
from engine.catalog import LibraryCache, scan
from engine.catalog.demo_weights import write_kohya_lora
from engine.errors import Cancelled
from engine.jobs import CancelToken
from tests.support import synth


@pytest.fixture
def counting(monkeypatch):
    """Count calls of the real engine.detect.detect_file (the scan resolves it per call)."""
    calls: list[str] = []
    real = engine.detect.detect_file

    def detect_file(path, **kw):
        calls.append(os.fspath(path))
        return real(path, **kw)

    monkeypatch.setattr(engine.detect, "detect_file", detect_file)
    return calls


@pytest.fixture
def library(tmp_path):
    """A small ComfyUI tree: sparse SD1 and SDXL checkpoints, a sparse VAE, a dense LoRA."""
    m = tmp_path / "ComfyUI" / "models"
    synth.write("sd1_checkpoint", m / "checkpoints" / "sd15.safetensors")
    synth.write("sdxl_checkpoint", m / "checkpoints" / "sdxl.safetensors")
    synth.write("sd_vae", m / "vae" / "sdvae.safetensors")
    write_kohya_lora(m / "loras" / "style.safetensors")
    (m / "loras" / "style.preview.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    (m / "loras" / "style.civitai.info").write_text('{"baseModel": "SD 1.5", "trainedWords": ["demo style"]}')
    return tmp_path / "ComfyUI"


def by_name(lib):
    return {e.name: e for e in lib.entries}


def test_scan_detects_every_file_and_keeps_the_folder_hint(library, tmp_path):
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        lib = scan([library], cache=cache)
    e = by_name(lib)
    assert sorted(e) == ["sd15.safetensors", "sdvae.safetensors", "sdxl.safetensors", "style.safetensors"]
    assert (e["sd15.safetensors"].kind, e["sd15.safetensors"].architecture) == ("checkpoint", "sd1")
    assert (e["sdxl.safetensors"].kind, e["sdxl.safetensors"].architecture) == ("checkpoint", "sdxl")
    assert e["sdvae.safetensors"].kind == "vae" and e["sdvae.safetensors"].declared_kind == "vae"
    lora = e["style.safetensors"]
    assert lora.kind == "lora" and lora.detection.lora.base == "sd1" and lora.declared_kind == "lora"
    assert lora.preview.endswith("style.preview.png") and lora.notes["trained_words"] == ["demo style"]
    assert not any(x.kind_mismatch for x in lib.entries) and lib.bad == [] and lib.problems == ()
    j = lora.to_json()
    assert j["kind"] == "lora" and j["library"]["declared_kind"] == "lora" and j["library"]["sha256"] is None


def test_rescan_reads_only_what_changed_and_drops_deleted_files(library, tmp_path, counting):
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        first = scan([library], cache=cache)
        assert len(counting) == 4 and first.read == 4 and first.from_cache == 0

        counting.clear()
        again = scan([library], cache=cache)
        assert counting == [] and again.read == 0 and again.from_cache == 4
        assert [e.detection for e in again.entries] == [e.detection for e in first.entries]

        # One file rewritten (new mtime), one deleted, one added.
        sd15 = library / "models" / "checkpoints" / "sd15.safetensors"
        st = os.stat(sd15)
        os.utime(sd15, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        os.remove(library / "models" / "vae" / "sdvae.safetensors")
        synth.write("clip_l", library / "models" / "text_encoders" / "clip_l.safetensors")
        counting.clear()
        third = scan([library], cache=cache)
        assert sorted(os.path.basename(p) for p in counting) == ["clip_l.safetensors", "sd15.safetensors"]
        assert third.read == 2 and third.from_cache == 2 and third.dropped == 1
        assert "sdvae.safetensors" not in by_name(third)
        assert by_name(third)["clip_l.safetensors"].kind == "text_encoder"
        assert cache.get(str(library / "models" / "vae" / "sdvae.safetensors")) is None

        # A new cache connection (another process, the GUI) sees the same rows.
    with LibraryCache(tmp_path / "c.sqlite3") as other:
        counting.clear()
        assert scan([library], cache=other).read == 0 and counting == []


def test_cached_rows_outside_the_scanned_roots_are_kept(library, tmp_path):
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        scan([library], cache=cache)
        only_loras = scan([library / "models" / "loras"], cache=cache)
        assert [e.name for e in only_loras.entries] == ["style.safetensors"] and only_loras.dropped == 0
        assert len(cache.all()) == 4


def test_bad_files_are_reported_in_the_result_not_fatal(library, tmp_path):
    m = library / "models"
    (m / "checkpoints" / "notes.ckpt").write_text("this is not a model")
    full = m / "checkpoints" / "sd15.safetensors"
    with open(full, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        f.seek(0)
        head = f.read(8 + n)
    (m / "checkpoints" / "truncated.safetensors").write_bytes(head + b"\0" * 1000)  # an incomplete download
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        lib = scan([library], cache=cache)
    e = by_name(lib)
    assert len(lib.entries) == 6
    assert {x.name for x in lib.bad} == {"notes.ckpt", "truncated.safetensors"}
    assert "truncated" in e["truncated.safetensors"].error.message
    assert e["sd15.safetensors"].error is None


def test_a_lora_in_the_checkpoints_folder_is_flagged(library, tmp_path):
    os.replace(
        library / "models" / "loras" / "style.safetensors",
        library / "models" / "checkpoints" / "s.safetensors",
    )
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        e = by_name(scan([library], cache=cache))["s.safetensors"]
    assert (e.declared_kind, e.kind, e.kind_mismatch) == ("checkpoint", "lora", True)


def test_diffusers_folder_is_one_entry_and_extra_model_paths_yaml_is_followed(library, tmp_path):
    shared = tmp_path / "shared"
    d = shared / "diffusers" / "my-sd15"
    d.mkdir(parents=True)
    (d / "model_index.json").write_text('{"_class_name": "StableDiffusionPipeline"}')
    synth.write("sd_vae_diffusers", d / "vae" / "diffusion_pytorch_model.safetensors")
    synth.write("clip_l", shared / "te" / "clip_l.safetensors")
    (library / "extra_model_paths.yaml").write_text(
        f"mine:\n  base_path: {shared}\n  diffusers: diffusers\n  text_encoders: |\n    te\n    missing_dir\n"
    )
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        lib = scan([library], cache=cache)
    e = by_name(lib)
    assert e["my-sd15"].is_dir and e["my-sd15"].size > 0
    assert e["clip_l.safetensors"].declared_kind == "text_encoder"
    assert [(os.path.basename(p.path), p.type) for p in lib.problems] == [("missing_dir", "missing")]
    assert len(lib.entries) == 6


def test_cancel_keeps_what_was_read(library, tmp_path, counting):
    token = CancelToken()

    def report(p):
        if p.stage == "Reading headers" and p.done == 2:
            token.cancel()

    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        with pytest.raises(Cancelled):
            scan([library], cache=cache, token=token, report=report)
        assert len(cache.all()) == 2  # the two files read before the cancel are cached, consistently
        counting.clear()
        lib = scan([library], cache=cache)
        assert lib.read == 2 and len(counting) == 2 and len(lib.entries) == 4


def test_a1111_layout_with_a_linked_real_lycoris_file(shared_data, tmp_path):
    """A1111/Forge: models/Stable-diffusion, models/LyCORIS, embeddings at the root. The LyCORIS file is
    the real LoKr from ../shared/data, linked (not copied) in, as users link shared model stores."""
    import torch

    from engine.formats.safetensors import save_tensors

    webui = tmp_path / "stable-diffusion-webui"
    synth.write("sd1_checkpoint", webui / "models" / "Stable-diffusion" / "v1-5.safetensors")
    (webui / "models" / "LyCORIS").mkdir(parents=True)
    os.symlink(
        shared_data("weights/smart_falcon_8_lokr.safetensors"),
        webui / "models" / "LyCORIS" / "falcon.safetensors",
    )
    save_tensors(webui / "embeddings" / "bad-hands.safetensors", {"emb_params": torch.zeros(4, 768)})
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        lib = scan([webui], cache=cache)
    got = {e.name: (e.declared_kind, e.kind, e.architecture) for e in lib.entries}
    assert got == {
        "v1-5.safetensors": ("checkpoint", "checkpoint", "sd1"),
        "falcon.safetensors": ("lora", "lora", "sd1"),
        "bad-hands.safetensors": ("embedding", "embedding", got["bad-hands.safetensors"][2]),
    }
    falcon = by_name(lib)["falcon.safetensors"]
    assert falcon.detection.lora.algos == ("lokr",) and falcon.path.endswith("LyCORIS/falcon.safetensors")


def test_worker_processes_give_the_same_library_and_cancel_cleanly(tmp_path):
    """A big cold scan may read headers in spawned worker processes: same detections, same cache."""
    m = tmp_path / "lib" / "models"
    layouts = ["sd1_checkpoint", "sdxl_unet", "clip_l", "sd_vae", "taesd_decoder", "embedding_sd1"]
    for i in range(36):
        synth.write(
            layouts[i % len(layouts)], m / f"f{i:02d}" / f"{layouts[i % len(layouts)]}_{i}.safetensors"
        )
    (m / "junk.safetensors").write_text("not a model")
    with LibraryCache(tmp_path / "serial.sqlite3") as c1, LibraryCache(tmp_path / "workers.sqlite3") as c2:
        serial = scan([tmp_path / "lib"], cache=c1, workers=1)
        progress = []
        par = scan([tmp_path / "lib"], cache=c2, workers=2, report=progress.append)
        assert [(e.path, e.detection) for e in par.entries] == [(e.path, e.detection) for e in serial.entries]
        assert par.read == 37 and len(par.bad) == 1 and len(c2.all()) == 37
        assert progress[-1].stage == "Reading headers" and progress[-1].done == progress[-1].total == 37

        token = CancelToken()
        with LibraryCache(tmp_path / "cancel.sqlite3") as c3:

            def cancel_early(p):
                if p.stage == "Reading headers" and p.done >= 16:
                    token.cancel()

            with pytest.raises(Cancelled):
                scan([tmp_path / "lib"], cache=c3, workers=2, token=token, report=cancel_early)
            kept = c3.all()
            assert 16 <= len(kept) < 37  # whole chunks finished before the cancel are kept
            assert scan([tmp_path / "lib"], cache=c3, workers=1).read == 37 - len(kept)


def test_scan_workers_run_below_the_app_s_priority():
    import subprocess
    import sys

    code = (
        "import os\n"
        "from engine.catalog.parallel import _lower_priority\n"
        "before = os.nice(0)\n"
        "_lower_priority()\n"
        "print(before, os.nice(0))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    before, after = map(int, r.stdout.split())
    assert after == min(19, before + 5)


_FORKED_SCAN = """
import sys
from engine.catalog import LibraryCache, scan
from engine.catalog.parallel import start_method

lib, d = sys.argv[1], sys.argv[2]
with LibraryCache(d + "/serial.sqlite3") as c1, LibraryCache(d + "/forked.sqlite3") as c2:
    serial = scan([lib], cache=c1, workers=1)
    forked = scan([lib], cache=c2, workers=2)
    same = [(e.path, e.detection) for e in forked.entries] == [(e.path, e.detection) for e in serial.entries]
    print(start_method(), same, forked.read, len(c2.all()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="workers fork on Linux only")
def test_a_one_thread_command_line_forks_its_workers_and_gets_the_same_library(tmp_path):
    import subprocess

    from engine.catalog.parallel import start_method

    assert start_method() == "spawn"  # this process has torch (and its thread pools) loaded
    m = tmp_path / "lib"
    layouts = ["sd1_checkpoint", "clip_l", "sd_vae", "embedding_sd1"]
    for i in range(20):
        synth.write(layouts[i % len(layouts)], m / f"{layouts[i % len(layouts)]}_{i}.safetensors")
    r = subprocess.run(
        [sys.executable, "-c", _FORKED_SCAN, str(m), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["fork", "True", "20", "20"]
