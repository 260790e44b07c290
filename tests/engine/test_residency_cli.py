"""`loadout load` run as a user runs it: the ledger and events of a real load under --vram-budget."""

from __future__ import annotations

import json

import pytest
from residency_files import SD15_MANIFEST

from engine.errors import OutOfMemory
from engine.formats.safetensors import write_sparse


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    from loadout_test_support import data_file

    manifest = json.loads(data_file(SD15_MANIFEST).read_text())["tensors"]
    p = tmp_path_factory.mktemp("cli") / "sd15.safetensors"
    write_sparse(
        p, [(k, "F16" if v["dtype"] == "F32" else v["dtype"], tuple(v["shape"])) for k, v in manifest.items()]
    )
    return p


def test_load_under_a_budget_json(cli, sd15):
    r = cli(
        "load",
        str(sd15),
        "--component",
        "vae",
        "--vram-budget",
        "0.05",
        "--unload-bytes",
        "1000000",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    (row,) = out["ledger"]
    assert row["name"] == "vae" and 0 < row["device_bytes"] <= int(0.05 * 1024**3) - 1000000
    assert row["device_bytes"] + row["disk_bytes"] == row["full_bytes"]
    kinds = [e["kind"] for e in out["events"]]
    assert kinds == ["PartiallyOffloaded", "PartiallyOffloaded"]
    assert out["events"][1]["bytes_moved"] >= 1000000


def test_load_text_in_process(sd15, capsys):
    from engine.cli import main

    assert main(["load", str(sd15), "--component", "vae", "--vram-budget", "0.05"]) == 0
    text = capsys.readouterr().out
    assert "vae" in text and "resident" in text and "PartiallyOffloaded" in text


def test_load_errors(cli, sd15, tmp_path):
    r = cli("load", str(sd15), "--component", "transformer")
    assert r.returncode == 2 and "no component transformer" in r.stderr
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\xff" * 7)
    r = cli("load", str(bad), "--json")
    assert r.returncode == 3 and "error" in json.loads(r.stdout) and "Traceback" not in r.stderr


def _no_room(self, components, extra_memory=0, *, token=None, report=None):
    """What Residency.load raises when tensors that must sit on the device do not fit (see _fill)."""
    raise OutOfMemory(
        "clip_l: 616 bytes of tensors that must stay on the device do not fit in the 0 bytes left"
    )


def test_load_out_of_memory_exits_4(sd15, capsys, monkeypatch):
    """DESIGN.md: exit 4 on out of memory (`load` used to catch every EngineError itself and exit 3)."""
    from engine.cli import main
    from engine.residency import Residency

    monkeypatch.setattr(Residency, "load", _no_room)
    assert main(["load", str(sd15), "--component", "vae", "--json"]) == 4
    out, err = capsys.readouterr()
    assert json.loads(out)["error"]["type"] == "oom" and "do not fit" in err
    assert main(["load", str(sd15), "--component", "vae"]) == 4


@pytest.mark.cuda
def test_load_that_cannot_fit_the_device_exits_4(cli, sd15):
    """For real: CLIP-L's embeddings are plain tensors that must sit on the GPU; a zero budget has no
    room for them."""
    r = cli("load", str(sd15), "--component", "clip_l", "--vram-budget", "0", "--json")
    assert r.returncode == 4, r.stderr
    assert json.loads(r.stdout)["error"]["type"] == "oom" and "Traceback" not in r.stderr
