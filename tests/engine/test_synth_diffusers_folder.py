"""Diffusers pipeline folders: every component's config.json builds (on meta) exactly the model whose
weights the folder's sparse safetensors files describe."""

from __future__ import annotations

import json

import pytest

from engine.formats import read_header
from tests.support import synth

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

from test_synth_reference import assert_same, on_meta, shapes_of  # noqa: E402


def folder_shapes(folder) -> dict:
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out |= {k: tuple(t.shape) for k, t in read_header(f).tensors.items()}
    return out


@pytest.mark.parametrize("name", ["sd1", "sdxl", "flux1_schnell", "sd3_medium"])
def test_diffusers_folder_components_match_their_configs(tmp_path, name):
    root = synth.write_diffusers(name, tmp_path / name, shard_bytes=4 * 1024**3)
    index = json.loads((root / "model_index.json").read_text())
    pipe_cls, _, comps = synth.DIFFUSERS_PIPELINES[name]
    assert index["_class_name"] == pipe_cls
    for comp, (lib, cls, _, _) in comps.items():
        assert index[comp] == [lib, cls]
        cfg = json.loads((root / comp / "config.json").read_text())
        mine = folder_shapes(root / comp)
        if lib == "diffusers":
            model = on_meta(getattr(diffusers, cls).from_config, cfg)
        else:
            conf_cls = transformers.T5Config if cls == "T5EncoderModel" else transformers.CLIPTextConfig
            model = on_meta(getattr(transformers, cls), conf_cls.from_dict(cfg))
        ref = shapes_of(model)
        if cls == "CLIPTextModel" and not any(k.startswith("text_model.") for k in ref):
            ref = {"text_model." + k: s for k, s in ref.items()}  # transformers 5 flattens the bare model
        ref.pop("text_model.embeddings.position_ids", None)
        ref.pop("encoder.embed_tokens.weight", None)  # tied to `shared`, never saved
        assert_same(mine, ref)


def test_big_components_are_sharded_with_an_index(tmp_path):
    root = synth.write_diffusers("flux1_dev", tmp_path / "flux", shard_bytes=10 * 1024**3)
    idx = json.loads((root / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    files = sorted((root / "transformer").glob("diffusion_pytorch_model-*.safetensors"))
    assert len(files) == 3 and {f.name for f in files} == set(idx["weight_map"].values())
    assert idx["metadata"]["total_size"] == sum(read_header(f).data_size for f in files)
    assert sum(f.stat().st_blocks for f in root.rglob("*.safetensors")) * 512 < 32 << 20  # sparse
