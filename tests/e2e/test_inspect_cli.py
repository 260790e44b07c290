"""`loadout inspect` run as a user runs it: a subprocess, text and --json, good and bad files together."""

from __future__ import annotations

import json

from loadout_test_support import data_file

from tests.support import synth


def test_one_file_json_is_an_object(cli):
    r = cli("inspect", str(data_file("weights/smart_falcon_8_lokr.safetensors")), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert isinstance(d, dict)
    assert (d["kind"], d["architecture"], d["error"]) == ("lora", "sd1", None)
    assert d["lora"]["algos"] == ["lokr"] and set(d["lora"]["targets"]) == {"unet", "clip_l"}
    assert d["metadata"]["ss_network_module"] == "lycoris.kohya"
    assert d["summary"]["training"]["network_dim"] == 8


def test_several_files_json_is_an_array_and_a_bad_one_exits_3(cli, tmp_path):
    ckpt = synth.write("sdxl_checkpoint", tmp_path / "sdxl.safetensors")
    junk = tmp_path / "readme.safetensors"
    junk.write_text("not a model\n")
    r = cli("inspect", str(ckpt), str(junk), str(data_file("weights/taef2_decoder.pth")), "--json")
    assert r.returncode == 3
    assert "Traceback" not in r.stderr + r.stdout
    out = json.loads(r.stdout)
    assert [d["kind"] for d in out] == ["checkpoint", "unknown", "vae_approx"]
    assert out[0]["architecture"] == "sdxl"
    assert set(out[0]["components"]) == {"unet", "clip_l", "clip_g", "vae"}
    assert out[1]["error"]["type"] == "format" and "text file" in out[1]["error"]["message"]
    assert out[2]["architecture"] == "flux2" and out[2]["error"] is None


def test_text_output(cli, tmp_path):
    ckpt = synth.write("flux1_schnell", tmp_path / "flux.safetensors")
    r = cli("inspect", str(ckpt), str(data_file("weights/smart_falcon_8_lokr.safetensors")))
    assert r.returncode == 0, r.stderr
    text = r.stdout
    assert "flux.safetensors" in text and "flux1_schnell" in text and "checkpoint" in text
    for comp in ("transformer", "clip_l", "t5xxl", "vae"):
        assert f"\n    {comp} " in text
    assert "no guidance embedding" in text  # the evidence, readable
    assert "LoRA          format kohya · algos LoKr · rank 8" in text
    assert "targets unet, clip_l · base sd1" in text
    assert "top tags      smart falcon" in text


def test_a_diffusers_file_is_named_by_its_folders(cli, tmp_path):
    """diffusers names every component's weights alike: the text names the model by its folders (the JSON
    keeps the path as it is)."""
    unet = tmp_path / "sdxl" / "unet"
    unet.mkdir(parents=True)
    f = synth.write("sdxl_unet", unet / "diffusion_pytorch_model.fp16.safetensors")
    r = cli("inspect", str(f))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("sdxl/unet (fp16)  (")
    assert json.loads(cli("inspect", "--json", str(f)).stdout)["path"] == str(f)


def test_missing_and_empty_files_exit_3_without_traceback(cli, tmp_path):
    empty = tmp_path / "e.ckpt"
    empty.write_bytes(b"")
    r = cli("inspect", str(empty), str(tmp_path / "missing.safetensors"))
    assert r.returncode == 3
    assert "Traceback" not in r.stderr + r.stdout
    assert "empty" in r.stdout and "missing.safetensors" in r.stdout


def test_usage_error(cli):
    r = cli("inspect")
    assert r.returncode == 2


def test_hostile_pickle_is_refused_and_never_runs(cli, tmp_path):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    bad = tmp_path / "model.ckpt"
    bad.write_bytes(pickle.dumps({"state_dict": Evil()}, protocol=2))
    r = cli("inspect", str(bad), "--json")
    assert r.returncode == 3
    d = json.loads(r.stdout)
    assert d["error"]["type"] == "format" and d["kind"] == "unknown"
    assert not marker.exists()
    assert "Traceback" not in r.stderr


def test_read_values_flag(cli, tmp_path):
    path = synth.write("sd2_unet", tmp_path / "sd2.safetensors", dtype="F16")
    plain = json.loads(cli("inspect", str(path), "--json").stdout)
    checked = json.loads(cli("inspect", str(path), "--json", "--read-values").stdout)
    assert (plain["architecture"], plain["prediction"]) == ("sd2", None)
    assert checked["prediction"] == "eps"  # the hole reads as zeros: no spread, so not v-prediction
    assert any("std of these weights" in e["reason"] for e in checked["evidence"])


def test_text_output_on_an_ascii_console(cli):
    r = cli("inspect", str(data_file("weights/taef2_encoder.pth")), env={"PYTHONIOENCODING": "ascii"})
    assert r.returncode == 0, r.stderr
    assert "vae_approx" in r.stdout and "3 image channels ? 32 latent channels" in r.stdout


def test_a_reader_bug_is_reported_without_a_traceback(cli, tmp_path):
    import zipfile

    path = tmp_path / "odd.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    raw = bytearray(path.read_bytes())
    for sig, off in ((b"PK\x01\x02", 6), (b"PK\x03\x04", 4)):
        at = raw.find(sig) + off
        raw[at : at + 2] = (64).to_bytes(2, "little")  # zip "version needed": 6.4, which zipfile refuses
    path.write_bytes(bytes(raw))
    r = cli("inspect", str(path))
    assert r.returncode == 3
    assert "Traceback" not in r.stdout + r.stderr
    assert "odd.pt" in r.stdout and "error" in r.stdout


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`loadout inspect --json FILE | head -1`: the pipe closes before we write; exit as a killed-by-
    SIGPIPE program would (141), with nothing on stderr."""
    import os
    import subprocess
    import sys

    from loadout_test_support import ROOT

    f = synth.write("sd1_checkpoint", tmp_path / "sd15.safetensors")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.Popen([sys.executable, "-m", "app.launch", "inspect", "--json", str(f)], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # fmt: skip
    p.stdout.close()  # the reader is gone before the first byte
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141, err
    assert "Traceback" not in err and err.strip() == "", err
