"""DESIGN.md's exit codes come from one table in engine.cli (0 success, 2 usage, 3 bad or unsupported
input file, 4 out of memory, 130 cancelled), whatever sub-command raised."""

from __future__ import annotations

import pytest

import engine.cli.hw
from engine.cli import main
from engine.errors import Cancelled, EngineError, FormatError, InvalidRequest, OutOfMemory, UnsupportedModel


@pytest.mark.parametrize(
    ("raised", "code"),
    [
        (Cancelled(), 130),
        (KeyboardInterrupt(), 130),
        (OutOfMemory("no room"), 4),
        (FormatError("corrupt"), 3),
        (UnsupportedModel("bnb 4-bit"), 3),
        (EngineError("cannot"), 3),
        (InvalidRequest("--device 9: no such device"), 2),
    ],
)
def test_an_exception_from_any_sub_command_maps_to_its_exit_code(monkeypatch, capsys, raised, code):
    def run(args):
        raise raised

    monkeypatch.setattr(engine.cli.hw, "run", run)
    assert main(["hw"]) == code
    err = capsys.readouterr().err
    assert err.startswith("loadout: ") and "Traceback" not in err


def test_a_bug_is_not_mapped_to_an_exit_code(monkeypatch):
    def run(args):
        raise ValueError("a bug")

    monkeypatch.setattr(engine.cli.hw, "run", run)
    with pytest.raises(ValueError):
        main(["hw"])


def test_a_device_that_is_not_there_is_a_usage_error_for_every_command(cli, tmp_path):
    """`--device 99` was 2 for hw, plan and load but 3 for decode and encode."""
    import torch

    from engine.formats.latent import write_latent
    from tests.support import synth

    vae = synth.write("taesd_decoder", tmp_path / "taesd_decoder.safetensors")
    write_latent(tmp_path / "z.latent", torch.zeros(1, 4, 8, 8))
    for args in (
        ["hw"],
        [
            "decode",
            "--vae",
            str(vae),
            "--latent",
            str(tmp_path / "z.latent"),
            "--out",
            str(tmp_path / "x.png"),
        ],
        ["load", str(vae)],
    ):
        r = cli(*args, "--device", "99")
        assert r.returncode == 2, (args, r.stderr)
        assert "--device 99" in r.stderr and "Traceback" not in r.stderr
