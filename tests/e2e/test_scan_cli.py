"""`loadout scan` and `loadout demo` as a user runs them (subprocesses, private cache folder)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from engine.catalog.demo_weights import write_kohya_lora
from tests.support import synth


@pytest.fixture
def env(tmp_path):
    return {"LOADOUT_CACHE_DIR": str(tmp_path / "cache")}


@pytest.fixture
def comfy(tmp_path):
    m = tmp_path / "ComfyUI" / "models"
    synth.write("sd1_checkpoint", m / "checkpoints" / "sd15.safetensors")
    write_kohya_lora(m / "loras" / "style.safetensors")
    return tmp_path / "ComfyUI"


def test_scan_json_lists_every_model_and_caches(cli, comfy, env, tmp_path):
    r = cli("scan", str(comfy), "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(os.path.basename(e["path"]), e["kind"], e["architecture"]) for e in out] == [
        ("sd15.safetensors", "checkpoint", "sd1"),
        ("style.safetensors", "lora", "sd1"),
    ]
    assert all(e["library"]["from_cache"] is False for e in out)
    assert (tmp_path / "cache" / "library.sqlite3").exists()
    again = json.loads(cli("scan", str(comfy), "--json", env=env).stdout)
    assert all(e["library"]["from_cache"] for e in again)
    human = cli("scan", str(comfy), env=env)
    assert human.returncode == 0 and "2 model files (2 from cache, 0 read)" in human.stdout


def test_scan_hash_computes_sha256_and_autov2_but_not_for_sparse_fixtures(cli, comfy, env):
    lora = comfy / "models" / "loras" / "style.safetensors"
    listed = hashlib.sha256(lora.read_bytes()).hexdigest().upper()  # as Civitai writes it
    (lora.parent / "style.civitai.info").write_text(
        json.dumps({"files": [{"name": lora.name, "hashes": {"SHA256": listed}}]})
    )
    r = cli("scan", str(comfy), "--json", "--hash", env=env)
    assert r.returncode == 0, r.stderr
    out = {os.path.basename(e["path"]): e["library"] for e in json.loads(r.stdout)}
    want = hashlib.sha256((comfy / "models" / "loras" / "style.safetensors").read_bytes()).hexdigest()
    assert out["style.safetensors"]["sha256"] == want and out["style.safetensors"]["autov2"] == want[:10]
    assert out["sd15.safetensors"]["sha256"] is None  # 2 GiB of hole: skipped, never read
    assert out["style.safetensors"]["matches_civitai"] is True
    assert "Hashing" in r.stderr
    # cached: a plain scan now shows the hash without reading the file again
    plain = json.loads(cli("scan", str(comfy), "--json", env=env).stdout)
    assert [e["library"]["autov2"] for e in plain if e["kind"] == "lora"] == [want[:10]]
    old_hash = out["style.safetensors"]["model_hash_old"]  # A1111's old hash, from the same read
    assert old_hash and [e["library"]["model_hash_old"] for e in plain if e["kind"] == "lora"] == [old_hash]


def test_a_bad_file_makes_the_scan_exit_3_and_the_rest_is_still_listed(cli, comfy, env):
    (comfy / "models" / "checkpoints" / "broken.safetensors").write_bytes(b"<!DOCTYPE html><html>404</html>")
    r = cli("scan", str(comfy), "--json", env=env)
    assert r.returncode == 3
    out = {os.path.basename(e["path"]): e for e in json.loads(r.stdout)}
    assert out["broken.safetensors"]["error"]["type"] == "format"
    assert out["sd15.safetensors"]["error"] is None and out["style.safetensors"]["kind"] == "lora"
    human = cli("scan", str(comfy), env=env)
    assert human.returncode == 3 and "1 bad" in human.stdout and "broken.safetensors" in human.stdout


def test_scan_missing_folder_is_exit_3(cli, env, tmp_path):
    r = cli("scan", str(tmp_path / "nope"), env=env)
    assert r.returncode == 3 and "no such file or folder" in r.stderr


def test_scan_follows_an_extra_model_paths_yaml(cli, comfy, env, tmp_path):
    y = tmp_path / "extra_model_paths.yaml"
    y.write_text(f"comfy:\n  base_path: {comfy}\n  loras: models/loras\n")
    r = cli("scan", str(y), "--json", env=env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert [(e["kind"], e["library"]["declared_kind"]) for e in out] == [("lora", "lora")]


def test_demo_then_scan(cli, env, tmp_path):
    d = tmp_path / "demo"
    r = cli("demo", str(d), env=env)
    assert r.returncode == 0, r.stderr
    assert "README.md" in r.stdout and (d / "README.md").exists()
    s = cli("scan", str(d), "--json", env=env)
    assert s.returncode == 0, s.stderr
    kinds = sorted(e["kind"] for e in json.loads(s.stdout))
    assert kinds == sorted(["checkpoint", "checkpoint", "diffusion_model", "text_encoder", "text_encoder",
                            "vae", "vae", "vae_approx", "vae_approx", "lora", "lora", "embedding"])  # fmt: skip


def test_an_unsupported_real_model_is_listed_without_failing_the_scan(cli, comfy, env):
    """A GGUF Flux (header-faithful, sparse) quantized to Q1_0, a type Loadout cannot read yet, is
    a real model Loadout cannot load: listed as what it is with error.type 'unsupported', and the
    scan still exits 0 (see engine/cli/scan.py)."""
    from engine.formats.gguf import write_sparse_gguf

    rows = [
        (k, "Q1_0" if len(s) == 2 and s[-1] % 128 == 0 else "F32", s)
        for k, _, s in synth.layout("flux1_dev_transformer")
    ]
    write_sparse_gguf(
        comfy / "models" / "unet" / "flux1-dev-Q1_0.gguf", {"general.architecture": "flux"}, rows
    )
    r = cli("scan", str(comfy), "--json", env=env)
    assert r.returncode == 0, r.stderr
    g = next(e for e in json.loads(r.stdout) if e["path"].endswith(".gguf"))
    assert (g["kind"], g["architecture"], g["error"]["type"]) == (
        "diffusion_model",
        "flux1_dev",
        "unsupported",
    )
    assert g["library"]["declared_kind"] == "diffusion_model" and g["library"]["kind_mismatch"] is False


def test_a_long_scan_shows_its_counts_on_stderr(capsys):
    """The progress line of `loadout scan`: files read out of files to read, then the share; bytes
    while hashing; while walking, how many were found so far."""
    from engine.cli.scan import _StderrProgress
    from engine.jobs import Progress

    for p, want in (
        (
            Progress("Reading headers", 480, 1000, "lora_7.safetensors"),
            "Reading headers: 480/1000 files (48%) lora_7.safetensors",
        ),
        (Progress("Finding model files", 12, 0, "/models"), "Finding model files: 12 so far in /models"),
        (
            Progress("Hashing", 1 << 30, 4 << 30, "sd.safetensors"),
            "Hashing:  25.0% 1.0 GiB of 4.0 GiB sd.safetensors",
        ),
    ):
        _StderrProgress()(p)
        assert capsys.readouterr().err.strip("\r\n").strip() == want
