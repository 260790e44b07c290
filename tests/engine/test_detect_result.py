"""The Detection value: immutable all the way down, and `from_json` reads back exactly what `to_json`
wrote — for every detection the fixtures produce (errors included) and for arbitrary ones (hypothesis)."""

from __future__ import annotations

import copy
import dataclasses
import json
import pickle
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from loadout_test_support import DATA_DIR

from engine.detect import (
    Component,
    Detection,
    Evidence,
    Failure,
    LoraFacts,
    Summary,
    detect_file,
)
from tests.support import synth


def _round_trips(d: Detection) -> None:
    j = d.to_json()
    back = Detection.from_json(j)
    assert back.to_json() == j and back == d
    text = json.dumps(j)  # the cache row
    assert json.dumps(Detection.from_json(json.loads(text)).to_json()) == text
    assert pickle.loads(pickle.dumps(d)) == d  # worker processes send Detections back pickled
    assert copy.deepcopy(d) == d


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory) -> list[Path]:
    """Every synth layout as a sparse file, torch-zip and diffusers variants, metadata-rich files,
    files that are no model (each an error case), and the shared real files when present."""
    root = tmp_path_factory.mktemp("corpus")
    files = [synth.write(n, root / f"{n}.safetensors") for n in synth.names()]
    files += [synth.write_ckpt(n, root / f"{n}.ckpt") for n in ("sd1_checkpoint", "sdxl_checkpoint")]
    files += [synth.write_diffusers(n, root / f"diffusers_{n}") for n in ("sd1", "flux1_dev")]
    md = {
        "ss_network_module": "networks.lora", "ss_network_dim": "16", "ss_network_alpha": "8.0",
        "ss_network_args": json.dumps({"conv_dim": 4, "nested": [1, [2, 3], {"a": None, "b": True}]}),
        "ss_tag_frequency": json.dumps({"ds": {"cat": 3, "dog": 7}}), "ss_steps": "1200",
        "modelspec.title": "A ✓", "modelspec.trigger_phrase": "foo, bar", "notes": "short",
        "modelspec.architecture": "stable-diffusion-v1", "modelspec.prediction_type": "v",
    }  # fmt: skip
    files.append(synth.write("sd1_checkpoint", root / "meta.safetensors", metadata=md))
    (root / "empty.safetensors").write_bytes(b"")
    (root / "text.safetensors").write_text("not a model\n")
    (root / "tiny.safetensors").write_bytes(b"\x01\x02")
    with open(files[0], "rb") as f:  # a header cut short (the file itself is a sparse multi-GB one)
        (root / "truncated.safetensors").write_bytes(f.read(3000))
    (root / "lfs.ckpt").write_text("version https://git-lfs.github.com/spec/v1\n")
    files += [root / f"{n}.safetensors" for n in ("empty", "text", "tiny", "truncated")] + [root / "lfs.ckpt"]
    files += [root / "missing.safetensors", root]  # a file that is not there; a folder that is no model
    if DATA_DIR.is_dir():
        files += sorted(p for p in DATA_DIR.rglob("*") if p.is_file())
    return [Path(f) for f in files]


def test_every_fixture_detection_round_trips_exactly(fixture_files):
    dets = [detect_file(f) for f in fixture_files]
    assert sum(d.error is not None for d in dets) >= 6  # the error cases are really in there
    assert any(d.lora for d in dets) and any(d.summary.training for d in dets)
    for d in dets:
        _round_trips(d)


def test_a_detection_is_immutable_all_the_way_down():
    comps = {"unet": Component("model.", 1, 2, 4, "F16")}
    md = {"a": "1"}
    ev = [Evidence("k", [1, 2], "why")]
    d = Detection(
        "/x", 1, "safetensors", components=comps, metadata=md, evidence=ev,
        lora=LoraFacts("kohya", ["lora"], 4, 1.0, ["unet"], "sd1"),
        summary=Summary(training={"top_tags": [["cat", 3]], "network_args": {"x": [1]}}),
    )  # fmt: skip
    comps["vae"] = comps["unet"]
    md["b"] = "2"
    ev.append(ev[0])
    assert list(d.components) == ["unet"] and dict(d.metadata) == {"a": "1"} and len(d.evidence) == 1
    assert d.evidence[0].shape == (1, 2) and d.lora.algos == ("lora",) and d.lora.targets == ("unet",)
    assert d.summary.training["top_tags"] == (("cat", 3),)
    with pytest.raises(TypeError):
        d.components["vae"] = comps["unet"]  # type: ignore[index]
    with pytest.raises(TypeError):
        d.summary.training["network_args"]["y"] = 2  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.kind = "lora"  # type: ignore[misc]
    # replace() keeps the frozen parts; the JSON is still the plain lists and objects
    assert dataclasses.replace(d, kind="lora").to_json()["summary"]["training"]["network_args"] == {"x": [1]}


@pytest.mark.parametrize(
    "field, value",
    [("error", {"type": "format", "message": "x"}), ("lora", {"base": "sd1"}), ("summary", None)],
)
def test_parts_must_be_typed_not_json(field, value):
    with pytest.raises(TypeError, match=field):
        Detection("/x", 1, None, **{field: value})


def _good() -> dict:
    return Detection(
        "/x", 10, "safetensors", "lora", "sd1", "normal", None,
        {"other": Component("", 1, 1, 2, "F16")}, LoraFacts("kohya", ("lora",), 4, 4.0, ("unet",), "sd1"),
        {"k": "v"}, Summary(modelspec={"title": "t"}), (Evidence("k", (4,), "why"),), Failure("unsupported", "m"),
    ).to_json()  # fmt: skip


def _without(key):
    return lambda d: d.pop(key)


def _set(path, value):
    def f(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value

    return f


@pytest.mark.parametrize(
    "damage",
    [
        _without("summary"),  # an older error row had none
        _without("components"),
        _set(("file_bytes",), "10"),
        _set(("file_bytes",), True),  # JSON true is no size
        _set(("components", "other", "params"), 1.5),
        _set(("components", "other"), [1]),
        _set(("lora", "algos"), "lora"),
        _set(("lora", "algos"), [1]),
        _set(("lora",), "kohya"),
        _set(("summary",), {"modelspec": {}}),  # to_json never writes an empty part
        _set(("summary",), {"card": {"a": "b"}}),
        _set(("evidence",), [{"key": "k", "shape": ["4"], "reason": "r"}]),
        _set(("evidence",), {"key": "k"}),
        _set(("error",), {"type": "format"}),
        _set(("error",), "format"),
    ],
)
def test_from_json_refuses_what_to_json_never_wrote(damage):
    d = _good()
    Detection.from_json(d)
    damage(d)
    with pytest.raises(ValueError):
        Detection.from_json(d)
    with pytest.raises(ValueError):
        Detection.from_json([d])


# Arbitrary detections: names, JSON-like summary values, sizes up to what a file could hold.
_name = st.text(max_size=12)
_opt = st.none() | _name
_int = st.integers(0, 2**62)
_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | _name,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_name, kids, max_size=3),
    max_leaves=8,
)
_components = st.dictionaries(_name, st.builds(Component, _name, _int, _int, _int, _opt), max_size=4)
_lora = st.none() | st.builds(
    LoraFacts, _opt, st.lists(_name, max_size=3), st.none() | _int,
    st.none() | st.integers(0, 512) | st.floats(allow_nan=False, allow_infinity=False),
    st.lists(_name, max_size=3), _opt,
)  # fmt: skip
_summary = st.builds(
    Summary,
    st.dictionaries(_name, _json, max_size=4),
    st.dictionaries(_name, _name, max_size=3),
    st.dictionaries(_name, _name, max_size=3),
)
_evidence = st.lists(
    st.builds(Evidence, _name, st.none() | st.lists(_int, max_size=4).map(tuple), _name), max_size=4
)
_detections = st.builds(
    Detection, _name, st.none() | _int, _opt, _name, _opt, _opt, _opt, _components, _lora,
    st.dictionaries(_name, _name, max_size=4), _summary, _evidence, st.none() | st.builds(Failure, _name, _name),
)  # fmt: skip


@given(_detections)
def test_any_detection_round_trips_through_json_and_pickle(d):
    _round_trips(d)
