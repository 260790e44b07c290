"""engine.bake, the one bake behind the window's Bake button and `loadout bake`: every base the command
line accepted (.safetensors and pickled .ckpt), one metadata format, nothing written over an input."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
import torch

from engine.errors import Cancelled, FormatError, InvalidRequest
from engine.facade import Engine
from engine.formats.safetensors import SafetensorsFile, save_tensors
from engine.jobs import CancelToken
from engine.requests import Bake, StackItem

P = "model.diffusion_model.input_blocks.1.1."
BASE = {
    P + "transformer_blocks.0.attn1.to_q.weight": (320, 320),
    P + "transformer_blocks.0.attn2.to_k.weight": (320, 768),
    P + "proj_in.weight": (320, 320, 1, 1),
    P + "proj_in.bias": (320,),
    "cond_stage_model.transformer.text_model.encoder.layers.0.self_attn.q_proj.weight": (768, 768),
}


@pytest.fixture
def lokr(shared_data):
    return shared_data("weights/smart_falcon_8_lokr.safetensors")


@pytest.fixture
def base_sd():
    g = torch.Generator().manual_seed(1)
    return {k: (torch.randn(*s, generator=g) * 0.05).half() for k, s in BASE.items()}


def test_the_engine_bakes_a_pickled_base_with_the_command_lines_metadata(tmp_path, lokr, base_sd):
    ckpt = tmp_path / "base.ckpt"
    torch.save({"state_dict": base_sd, "global_step": 3}, ckpt)
    out = tmp_path / "out.safetensors"
    disabled = StackItem(str(tmp_path / "gone.safetensors"), enabled=False)  # never read, never listed
    res = Engine().run(Bake(str(ckpt), (StackItem(str(lokr), 0.8, 0.5), disabled), str(out)))
    assert res.out == str(out) and res.bytes == out.stat().st_size and res.patched_keys == 4
    f = SafetensorsFile(out)
    assert set(f.keys()) == set(BASE)
    meta = json.loads(f.header.metadata["loadout.bake"])
    assert meta == {
        "base": "base.ckpt",
        "loras": [
            {
                "file": lokr.name,
                "sha256": hashlib.sha256(lokr.read_bytes()).hexdigest(),
                "strength_model": 0.8,
                "strength_clip": 0.5,
                "modules": 350,
                "mapped": 4,
            }
        ],
        "patched_keys": 4,
    }
    assert list(res.loras) == meta["loras"]
    assert torch.equal(f.tensor(P + "proj_in.bias"), base_sd[P + "proj_in.bias"])
    assert not torch.equal(f.tensor(P + "proj_in.weight"), base_sd[P + "proj_in.weight"])


def test_the_base_metadata_is_kept(tmp_path, lokr, base_sd):
    base = tmp_path / "base.safetensors"
    save_tensors(base, base_sd, {"modelspec.title": "tiny"})
    out = tmp_path / "out.safetensors"
    Engine().bake(str(base), (StackItem(str(lokr)),), str(out))
    meta = SafetensorsFile(out).header.metadata
    assert (
        meta["modelspec.title"] == "tiny" and json.loads(meta["loadout.bake"])["base"] == "base.safetensors"
    )


def test_refusals_come_before_anything_is_read_or_written(tmp_path, lokr, base_sd):
    base = tmp_path / "base.safetensors"
    save_tensors(base, base_sd)
    before = base.read_bytes()
    os.link(base, tmp_path / "hard.safetensors")
    (tmp_path / "link.safetensors").symlink_to(lokr)
    e = Engine()
    for out in ("base.safetensors", "hard.safetensors", "link.safetensors"):
        with pytest.raises(InvalidRequest, match="is one of the inputs"):
            e.bake(str(base), (StackItem(str(lokr)),), str(tmp_path / out))
    with pytest.raises(InvalidRequest, match=r"\.safetensors"):
        e.bake(str(base), (StackItem(str(lokr)),), str(tmp_path / "out.ckpt"))
    with pytest.raises(FormatError, match="missing.safetensors: no such file"):
        e.bake(
            str(base), (StackItem(str(tmp_path / "missing.safetensors")),), str(tmp_path / "o.safetensors")
        )
    (tmp_path / "junk.safetensors").write_bytes(b"not a model")
    with pytest.raises(FormatError, match="not a checkpoint Loadout can bake into"):
        e.bake(str(tmp_path / "junk.safetensors"), (StackItem(str(lokr)),), str(tmp_path / "o.safetensors"))
    assert base.read_bytes() == before and not (tmp_path / "o.safetensors").exists()


def test_a_cancelled_bake_writes_nothing(tmp_path, lokr, base_sd):
    base = tmp_path / "base.safetensors"
    save_tensors(base, base_sd)
    token = CancelToken()

    def report(p):
        if p.stage != "LoRA coverage":
            token.cancel()

    with pytest.raises(Cancelled):
        Engine().bake(
            str(base), (StackItem(str(lokr)),), str(tmp_path / "o.safetensors"), token=token, report=report
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base.safetensors"]
