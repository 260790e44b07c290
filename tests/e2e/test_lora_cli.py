"""`loadout lora inspect` and `loadout bake` as a user runs them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from lora_fixtures import sparse_from_manifest  # noqa: E402


def test_inspect_real_lokr_on_sd15_layout(cli, shared_data, tmp_path):
    lokr = shared_data("weights/smart_falcon_8_lokr.safetensors")
    base = sparse_from_manifest("manifests/sd15_ldm_single_file.json", tmp_path / "sd15.safetensors")
    r = cli("lora", "inspect", str(lokr), "--base", str(base), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["format"] == "kohya" and j["algos"] == ["lokr"]
    assert (j["modules"], j["mapped"]) == (350, 350)
    assert j["targets"]["unet"] == {"modules": 278, "mapped": 278, "unmatched": [], "shape_mismatch": []}
    assert j["targets"]["clip_l"]["mapped"] == 72
    assert j["error"] is None
    human = cli("lora", "inspect", str(lokr), "--base", str(base))
    assert human.returncode == 0 and "350/350 modules mapped (100.0%)" in human.stdout


def test_inspect_sdxl_dump_on_sd15_reports_mismatches(cli, tmp_path):
    lora = sparse_from_manifest(
        "manifests/sdxl_kohya_lora_alien_style.keys.json", tmp_path / "alien.safetensors"
    )
    base = sparse_from_manifest("manifests/sd15_ldm_single_file.json", tmp_path / "sd15.safetensors")
    r = cli("lora", "inspect", str(lora), "--base", str(base), "--json")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    assert j["mapped"] < j["modules"]
    assert j["targets"]["clip_g"]["unmatched"]  # SD1 has no OpenCLIP-G
    assert j["targets"]["unet"]["shape_mismatch"] or j["targets"]["unet"]["unmatched"]


def test_inspect_refuses_a_non_adapter(cli, tmp_path):
    base = sparse_from_manifest("manifests/sd15_ldm_single_file.json", tmp_path / "sd15.safetensors")
    r = cli("lora", "inspect", str(base), "--base", str(base), "--json")
    assert r.returncode == 3
    assert json.loads(r.stdout)["error"]["type"] == "format"
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not a model at all")
    r = cli("lora", "inspect", str(junk), "--base", str(base))
    assert r.returncode == 3 and "loadout:" in r.stderr
