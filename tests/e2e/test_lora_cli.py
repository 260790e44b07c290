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
    # `--model`, as `step` and `plan` name the base, is the same option
    alias = cli("lora", "inspect", str(lokr), "--model", str(base), "--json")
    assert alias.returncode == 0 and json.loads(alias.stdout) == j


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


# --- bake ---------------------------------------------------------------------------------------------

P = "model.diffusion_model."
TE = "cond_stage_model.transformer.text_model.encoder.layers."
SMALL_BASE = {
    P + "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight": (320, 320),
    P + "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight": (320, 768),
    P + "input_blocks.1.1.proj_in.weight": (320, 320, 1, 1),
    P + "input_blocks.1.1.proj_in.bias": (320,),
    P + "input_blocks.2.0.in_layers.2.weight": (320, 320, 3, 3),
    P + "input_blocks.2.0.in_layers.2.bias": (320,),
    TE + "0.self_attn.q_proj.weight": (768, 768),
    TE + "0.self_attn.q_proj.bias": (768,),
    TE + "5.mlp.fc1.weight": (3072, 768),
    "first_stage_model.decoder.conv_in.weight": (512, 4, 3, 3),
}


def _small_base(path):
    import torch

    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(0)
    t = {k: (torch.randn(*s, generator=g) * 0.05).half() for k, s in SMALL_BASE.items()}
    save_tensors(path, t, {"modelspec.title": "tiny"})
    return t


def test_bake_merges_the_real_lokr_with_recorded_metadata(cli, shared_data, tmp_path):
    import hashlib

    import torch

    from engine.formats.safetensors import SafetensorsFile
    from engine.lora.adapter import load_adapter
    from engine.lora.keymap import KeyMap

    lokr = shared_data("weights/smart_falcon_8_lokr.safetensors")
    base_path = tmp_path / "base.safetensors"
    base = _small_base(base_path)
    base_bytes = base_path.read_bytes()
    out = tmp_path / "merged.safetensors"
    r = cli("bake", "--base", str(base_path), "--lora", f"{lokr}:0.8:0.5", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["patched_keys"] == 6  # every dense weight the LoKr reaches (biases untouched)
    assert base_path.read_bytes() == base_bytes  # the input is untouched
    merged = SafetensorsFile(out)
    meta = json.loads(merged.header.metadata["loadout.bake"])
    assert merged.header.metadata["modelspec.title"] == "tiny"
    (entry,) = meta["loras"]
    assert entry["sha256"] == hashlib.sha256(lokr.read_bytes()).hexdigest()
    assert (entry["strength_model"], entry["strength_clip"]) == (0.8, 0.5)
    adapter = load_adapter(lokr)
    km = KeyMap({k: tuple(v) for k, v in SMALL_BASE.items()})
    patched = set()
    for name, m in adapter.modules.items():
        t = km.resolve(name)
        if t is None:
            continue
        s = 0.8 if t.component == "unet" else 0.5
        want = (base[t.key].float() + s * m.delta().reshape(base[t.key].shape)).half()
        assert torch.equal(merged.tensor(t.key), want), name
        patched.add(t.key)
    assert len(patched) == 6
    for k in SMALL_BASE:
        if k not in patched:
            assert torch.equal(merged.tensor(k), base[k]), k
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".part")]  # no temporary left behind


def test_bake_refuses_to_write_over_an_input(cli, shared_data, tmp_path):
    import os

    lokr = shared_data("weights/smart_falcon_8_lokr.safetensors")
    base_path = tmp_path / "base.safetensors"
    _small_base(base_path)
    before = base_path.read_bytes()
    link = tmp_path / "link.safetensors"
    link.symlink_to(lokr)
    hard = tmp_path / "hard.safetensors"
    os.link(base_path, hard)
    for out in (base_path, link, hard):
        flag = "--model" if out is hard else "--base"  # --model: the base under the name step and plan use
        r = cli("bake", flag, str(base_path), "--lora", str(lokr), "--out", str(out))
        assert r.returncode == 2, (out, r.stderr)
        assert "is one of the inputs" in r.stderr
    assert base_path.read_bytes() == before and os.readlink(link) == str(lokr)


def test_bake_strength_parsing_keeps_colons_of_the_path(cli, shared_data, tmp_path):
    import shutil

    lokr = shared_data("weights/smart_falcon_8_lokr.safetensors")
    odd = tmp_path / "odd:name.safetensors"
    shutil.copyfile(lokr, odd)
    base_path = tmp_path / "base.safetensors"
    _small_base(base_path)
    out = tmp_path / "o.safetensors"
    r = cli("bake", "--base", str(base_path), "--lora", f"{odd}:0.25", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    (entry,) = json.loads(r.stdout)["loras"]
    assert entry["file"] == "odd:name.safetensors"
    assert (entry["strength_model"], entry["strength_clip"]) == (0.25, 0.25)
    r = cli(
        "bake", "--base", str(base_path), "--lora", str(tmp_path / "missing.safetensors:1"), "--out", str(out)
    )
    assert r.returncode == 3 and "missing.safetensors: no such file" in r.stderr


def test_bake_reads_a_pickled_base(cli, shared_data, tmp_path):
    import torch

    from engine.formats.safetensors import SafetensorsFile

    lokr = shared_data("weights/smart_falcon_8_lokr.safetensors")
    g = torch.Generator().manual_seed(3)
    sd = {k: (torch.randn(*s, generator=g) * 0.05).half() for k, s in SMALL_BASE.items()}
    ckpt = tmp_path / "base.ckpt"
    torch.save({"state_dict": sd, "global_step": 10}, ckpt)
    out = tmp_path / "merged.safetensors"
    r = cli("bake", "--base", str(ckpt), "--lora", f"{lokr}:1", "--out", str(out), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["patched_keys"] == 6
    merged = SafetensorsFile(out)
    assert set(merged.keys()) == set(SMALL_BASE)
    q = P + "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight"
    assert not torch.equal(merged.tensor(q), sd[q])
    assert torch.equal(
        merged.tensor("first_stage_model.decoder.conv_in.weight"),
        sd["first_stage_model.decoder.conv_in.weight"],
    )
