"""The SQLite library cache: location, WAL, concurrent readers, notes sidecars."""

from __future__ import annotations

import json
import os
import threading

import pytest

from engine.catalog import LibraryCache, cache_dir
from engine.catalog.notes import read_notes
from engine.detect import Detection
from engine.errors import EngineError


def _det(path: str, **kw) -> Detection:
    return Detection(path, 1, "safetensors", **kw)


def test_cache_lives_in_loadout_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    with LibraryCache() as cache:
        cache.put_detections([("/x/a.safetensors", 1, 2, 0, 0, "d", _det("/x/a.safetensors", kind="lora"))])
    assert (tmp_path / "c" / "library.sqlite3").exists()
    monkeypatch.delenv("LOADOUT_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if os.name == "posix" and os.uname().sysname != "Darwin":
        assert cache_dir() == tmp_path / "xdg" / "loadout"


def test_gui_thread_reads_while_engine_thread_writes(tmp_path):
    cache = LibraryCache(tmp_path / "c.sqlite3")
    with cache:
        assert cache._conn().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        stop = threading.Event()
        errors = []

        def writer():
            try:
                for batch in range(40):
                    rows = [
                        (
                            f"/lib/{batch}/{i}.safetensors",
                            i,
                            batch,
                            0,
                            0,
                            "d",
                            _det(f"/lib/{batch}/{i}.safetensors"),
                        )
                        for i in range(50)
                    ]
                    cache.put_detections(rows)
            except Exception as e:  # surfaced below
                errors.append(e)
            finally:
                stop.set()

        t = threading.Thread(target=writer)
        t.start()
        counts = []
        while not stop.is_set():
            counts.append(len(cache.all()))  # this thread's own connection, never blocked by the writer
        t.join()
        assert not errors
        assert counts == sorted(counts)  # readers see whole committed batches only
        assert all(c % 50 == 0 for c in counts)
        assert len(cache.all()) == 2000
        assert len(cache.paths_under("/lib/3")) == 50 and cache.paths_under("/li") == []


def test_a_cache_of_another_schema_is_started_afresh(tmp_path):
    import sqlite3

    p = tmp_path / "c.sqlite3"
    c = sqlite3.connect(p)
    c.execute("CREATE TABLE files (x)")
    c.execute("PRAGMA user_version=99")
    c.commit()
    c.close()
    with LibraryCache(p) as cache:
        cache.put_detections([("/a", 1, 2, 0, 0, "d", _det("/a"))])
        assert cache.get("/a").size == 1


def test_civitai_info_and_a1111_json_notes(tmp_path):
    info = tmp_path / "x.civitai.info"
    info.write_text(
        json.dumps(
            {
                "id": 128713,
                "modelId": 4384,
                "name": "8",
                "baseModel": "SD 1.5",
                "trainedWords": ["dreamy, soft light", "portrait"],
                "description": "<p>Version <b>8</b> &amp; more</p>",
                "model": {"name": "DreamShaper", "type": "Checkpoint", "nsfw": False},
                "files": [
                    {"name": "x-pruned.safetensors", "hashes": {"SHA256": "AB" * 32}},
                    {
                        "name": "x.safetensors",
                        "primary": True,
                        "hashes": {"SHA256": "CD" * 32, "AutoV2": "CDCDCDCDCD"},
                    },
                ],
            }
        )
    )
    user = tmp_path / "x.json"
    user.write_text(json.dumps({"description": "mine", "sd version": "SD1", "activation text": "ds8",
                                "preferred weight": 0.7, "notes": "good at faces"}))  # fmt: skip
    n = read_notes([str(info), str(user)], "x.safetensors")
    assert n["civitai_sha256"] == "cd" * 32  # the entry for this file, lower-case
    assert read_notes([str(info)], "x-pruned.safetensors")["civitai_sha256"] == "ab" * 32
    assert n["model_name"] == "DreamShaper" and n["version_name"] == "8"
    assert n["base_model"] == "SD 1.5"  # civitai.info first: it wins over the user's "sd version"
    assert n["trained_words"] == ["dreamy", "soft light", "portrait"]
    assert n["description"] == "Version 8 & more"
    assert (n["civitai_model_id"], n["civitai_version_id"], n["model_type"]) == (4384, 128713, "Checkpoint")
    assert n["preferred_weight"] == 0.7 and n["notes"] == "good at faces"
    assert n["sources"] == [str(info), str(user)]

    broken = tmp_path / "y.json"
    broken.write_text("{not json")
    n = read_notes([str(broken)])
    assert n["sources"] == [] and "y.json" in n["problems"][0]
    assert read_notes([]) is None


def test_a_damaged_cache_file_is_set_aside_and_replaced(tmp_path):
    p = tmp_path / "c.sqlite3"
    p.write_bytes(b"this is not an SQLite database, just junk bytes " * 100)
    with LibraryCache(p) as cache:
        cache.put_detections([("/a", 1, 2, 0, 0, "d", _det("/a"))])
        assert cache.get("/a").size == 1
    assert (tmp_path / "c.sqlite3.damaged").read_bytes().startswith(b"this is not")


def test_an_unwritable_cache_location_is_an_engine_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with pytest.raises(EngineError, match="LOADOUT_CACHE_DIR"):
        LibraryCache(blocker / "sub" / "c.sqlite3").get("/a")


def test_a_row_the_cache_cannot_read_back_is_detected_again_not_misread(tmp_path):
    from engine.catalog import scan
    from tests.support import synth

    (tmp_path / "lib").mkdir()
    p = str(synth.write("sd_vae", tmp_path / "lib" / "vae.safetensors"))
    st = os.stat(p)
    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        cache.put_detections(
            [(p, st.st_size, st.st_mtime_ns, st.st_dev, st.st_ino, "d", _det(p, kind="lora"))]
        )
        assert cache.get(p).detection == _det(p, kind="lora")  # stored and read back as it was
        # the same row in a form this version did not write (here: a partial object)
        cache._conn().execute("UPDATE files SET detection = ?", (json.dumps({"kind": "lora"}),))
        assert cache.get(p).detection is None and cache.get(p).size == st.st_size
        lib = scan([tmp_path / "lib"], cache=cache, detector_id="d")
        (e,) = lib.entries
        assert (lib.read, e.kind, e.from_cache) == (1, "vae", False)
        assert cache.get(p).detection == e.detection
        assert scan([tmp_path / "lib"], cache=cache, detector_id="d").entries[0].from_cache
