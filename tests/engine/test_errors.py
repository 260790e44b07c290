"""The error kinds: a cancellation is not a failure (DESIGN.md's `errors` row), so no `except EngineError`
can mistake one for the other, and code that reports failures lets a cancellation through."""

from __future__ import annotations

import pytest

from engine.catalog import LibraryCache, scan
from engine.errors import Cancelled, EngineError, FormatError, OutOfMemory, UnsupportedModel
from tests.support import synth


def test_cancelled_is_not_an_engine_error():
    assert not issubclass(Cancelled, EngineError)
    assert issubclass(Cancelled, Exception)  # a plain exception: `finally` and context managers still run
    for kind in (FormatError, UnsupportedModel, OutOfMemory):
        assert issubclass(kind, EngineError) and not issubclass(kind, Cancelled)


def test_cancelled_speaks_to_the_user_like_the_engine_errors():
    c = Cancelled()
    assert c.message == str(c) == "Cancelled by the user." and c.path is None
    assert c.to_json() == {"type": "cancelled", "message": "Cancelled by the user."}
    assert Cancelled("Hashing stopped.", path="x").message == "Hashing stopped."


def test_except_engine_error_lets_a_cancellation_through():
    def job():
        try:
            raise Cancelled()
        except EngineError:  # the pattern every failure report uses
            return "reported as a failure"

    with pytest.raises(Cancelled):
        job()


def test_a_cancel_inside_a_detector_stops_the_scan_instead_of_becoming_an_error_entry(tmp_path):
    """catalog.parallel.detect_one turns a detector's errors into the file's `error` (and caches it);
    a cancellation raised there must stop the scan and leave nothing cached for that file."""
    lib = tmp_path / "models" / "loras"
    synth.write("embedding_sd1", lib / "a.safetensors")

    def detector(path):
        raise Cancelled("Scan stopped.")

    with LibraryCache(tmp_path / "c.sqlite3") as cache:
        with pytest.raises(Cancelled, match="Scan stopped"):
            scan([tmp_path / "models"], cache=cache, detector=detector, workers=1)
        assert cache.all() == []


def test_an_error_object_becomes_its_exception_again():
    from engine.errors import InvalidRequest, from_json

    for kind in (FormatError, UnsupportedModel, OutOfMemory, InvalidRequest):
        e = from_json(kind("msg").to_json())
        assert type(e) is kind and e.message == "msg"
    assert type(from_json({"type": "error", "message": "a bug"})) is EngineError


def test_an_error_raised_from_a_detection_names_its_file_once(tmp_path):
    """A Detection's message may leave its path out (the path is beside it); the exception a command
    raises from it names the file, and never twice."""
    from engine.detect import detect_file
    from engine.errors import from_json

    text = tmp_path / "notes.safetensors"
    text.write_text("just some words, not a model")
    det = detect_file(text)
    assert str(text) not in det.error.message
    e = from_json(det.error.to_json(), text)
    assert type(e) is FormatError and e.path == str(text)
    assert e.message == f"{text}: {det.error.message}"
    named = from_json({"type": "format", "message": f"{text}: truncated"}, str(text))
    assert named.message == f"{text}: truncated"
    # A reader's own message names the file too (for callers that have nothing else): the Detection
    # keeps it without the path, as every listing shows the path beside it; the command adds it once.
    cut = tmp_path / "cut.safetensors"
    synth.write("sd_vae", tmp_path / "whole.safetensors")
    cut.write_bytes((tmp_path / "whole.safetensors").read_bytes()[:1000])
    msg = detect_file(cut).error.message
    assert "claims" in msg and str(cut) not in msg and not msg.startswith("cut.safetensors")
    assert from_json(detect_file(cut).error.to_json(), cut).message == f"{cut}: {msg}"
