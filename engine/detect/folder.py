"""Diffusers folders as one model: `model_index.json` names the components (unet/, transformer/,
text_encoder*/, vae/, …); each component's weight headers are read (shards included) and detected
together, with the scheduler's `prediction_type` taken as the stated prediction.

Layout facts: diffusers `DiffusionPipeline.save_pretrained` writes model_index.json ({component:
[library, class]}), one sub-folder per component with config.json and `diffusion_pytorch_model*.
safetensors` / `model*.safetensors`, and `scheduler/scheduler_config.json` with `prediction_type`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

from ..errors import FormatError
from .core import build_components, detect_index, find_encoders
from .keys import KeyIndex, TensorMeta, as_key_index
from .meta import PREDICTION_WORDS
from .result import Detection, Evidence

_BACKBONES = ("unet", "transformer", "prior", "decoder")


_VARIANT = re.compile(r"\.(fp16|bf16|fp32|non_ema|ema)(-\d+-of-\d+)?\.(safetensors|bin)$")


def _weight_files(folder: str) -> list[str]:
    """The weight files of one component: safetensors (else .bin), all shards, one variant only."""
    listing = sorted(os.listdir(folder))
    names = [n for n in listing if n.endswith(".safetensors")] or [
        n for n in listing if n.endswith(".bin") and n != "training_args.bin"
    ]
    plain = [n for n in names if not _VARIANT.search(n)]
    fp16 = [n for n in names if (m := _VARIANT.search(n)) and m.group(1) == "fp16"]
    chosen = plain or fp16 or names
    return [os.path.join(folder, n) for n in chosen]


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            obj = json.load(f)
    except (OSError, ValueError) as e:
        raise FormatError(f"{path}: cannot read this JSON file ({e})") from e
    return obj if isinstance(obj, dict) else {}


def _merged(files_by_prefix: dict[str, list[str]]) -> tuple[KeyIndex, int]:
    from ..formats import open_index

    tensors: dict[str, TensorMeta] = {}
    metadata: dict[str, str] = {}
    data = size = 0
    for prefix, files in files_by_prefix.items():
        for path in files:
            ix = as_key_index(open_index(path))
            size += ix.file_size or 0
            data += ix.data_size or 0
            metadata.update(ix.metadata)
            for k, t in ix.tensors.items():
                tensors[prefix + k] = t
    return KeyIndex(tensors, metadata, "diffusers", size, data), size


def detect_folder(path: str) -> Detection:
    """A diffusers pipeline folder, or one component folder (config.json + weights)."""
    index_json = os.path.join(path, "model_index.json")
    if not os.path.exists(index_json):
        if not os.path.exists(os.path.join(path, "config.json")):
            raise FormatError(
                "a folder that is no diffusers model (no model_index.json or config.json): "
                "inspect its files one by one, or scan it as a library with `loadout scan`"
            )
        files = _weight_files(path)
        if not files:
            raise FormatError("this diffusers component folder holds no .safetensors / .bin weights")
        ix, size = _merged({"": files})
        d = detect_index(ix, path=path)
        return dataclasses.replace(d, file_bytes=size)
    model_index = _read_json(index_json)
    subs = [k for k, v in model_index.items() if not k.startswith("_") and isinstance(v, list)]
    files = {
        f"{s}.": _weight_files(os.path.join(path, s)) for s in subs if os.path.isdir(os.path.join(path, s))
    }
    files = {k: v for k, v in files.items() if v}
    if not files:
        raise FormatError("model_index.json names no component with .safetensors / .bin weights")
    ix, size = _merged(files)
    d = detect_index(ix, path=path)
    evidence = [
        Evidence("model_index.json", None, f"diffusers pipeline {model_index.get('_class_name', '?')}")
    ]
    claims = []
    for prefix in files:
        name = prefix[:-1]
        if name in _BACKBONES and d.components:
            comp = next(
                (
                    c
                    for c in ("unet", "transformer")
                    if c in d.components and d.components[c].prefix == prefix
                ),
                None,
            )
            if comp:
                claims.append((prefix, comp))
                continue
        if name == "vae":
            claims.append((prefix, "vae"))
        elif name.startswith("text_encoder"):
            sub = KeyIndex({k[len(prefix) :]: t for k, t in ix.tensors.items() if k.startswith(prefix)})
            found = find_encoders(sub)
            claims.append((prefix, found[0].component if found else "other"))
    prediction = d.prediction
    sched = os.path.join(path, "scheduler", "scheduler_config.json")
    if os.path.exists(sched):
        word = str(_read_json(sched).get("prediction_type", "")).lower()
        if word in PREDICTION_WORDS:
            prediction = PREDICTION_WORDS[word]
            evidence.append(
                Evidence("scheduler/scheduler_config.json", None, f"prediction_type {word} → {prediction}")
            )
    kind = d.kind if d.kind not in ("diffusion_model",) else "checkpoint"
    return dataclasses.replace(
        d,
        kind=kind,
        format="diffusers",
        file_bytes=size,
        prediction=prediction,
        components=build_components(ix, claims),
        evidence=tuple(evidence) + d.evidence,
    )
