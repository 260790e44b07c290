"""The Inspect request: `loadout inspect`'s detections through the Engine facade, header-only."""

from __future__ import annotations

import pytest

import engine.detect.file
from engine.errors import Cancelled
from engine.facade import Engine
from engine.jobs import CancelToken
from engine.requests import Inspect
from tests.support import synth


def test_one_detection_per_path_in_order_and_a_bad_file_has_an_error(tmp_path, shared_data):
    lokr = shared_data("weights/smart_falcon_8_lokr.safetensors")
    vae = synth.write("sd_vae", tmp_path / "vae.safetensors")
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a model")
    got = Engine().run(Inspect((str(lokr), str(junk), str(vae))))
    assert [d.path for d in got] == [str(lokr), str(junk), str(vae)]
    assert [d.kind for d in got] == ["lora", "unknown", "vae"]
    assert list(got[0].lora.algos) == ["lokr"] and got[1].error.type == "format" and got[2].error is None


def test_a_bug_in_detection_still_answers_for_that_file(tmp_path, monkeypatch):
    def broken(path, **kw):
        raise RuntimeError("a bug")

    monkeypatch.setattr(engine.detect.file, "detect_file", broken)
    (d,) = Engine().run(Inspect((str(tmp_path / "x.safetensors"),)))
    assert d.error.type == "error" and "RuntimeError: a bug" in d.error.message


def test_inspect_stops_between_files_when_cancelled(tmp_path):
    files = [str(synth.write("embedding_sd1", tmp_path / f"e{i}.safetensors")) for i in range(3)]
    token = CancelToken()
    seen = []

    def report(p):
        seen.append(p.done)
        if p.done == 1:
            token.cancel()

    with pytest.raises(Cancelled):
        Engine().run(Inspect(tuple(files)), token=token, report=report)
    assert seen == [0, 1]
