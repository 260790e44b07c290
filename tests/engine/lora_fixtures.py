"""Shared builders for the LoRA tests: sparse layouts from the reference manifests and key dumps."""

from __future__ import annotations

import json
from pathlib import Path

from loadout_test_support import data_file

from engine.formats.safetensors import write_sparse


def _st_dtype(d: str) -> str:
    # The InvokeAI key dump spells dtypes as torch does ("torch.bfloat16").
    return {
        "torch.bfloat16": "BF16",
        "torch.float16": "F16",
        "torch.float32": "F32",
    }.get(d, d)


def manifest_entries(rel: str) -> list[tuple[str, str, tuple[int, ...]]]:
    obj = json.loads(data_file(rel).read_text())
    tensors = obj.get("tensors", obj)
    return [(k, _st_dtype(v["dtype"]), tuple(v["shape"])) for k, v in tensors.items()]


def sparse_from_manifest(rel: str, out: Path, metadata: dict | None = None) -> Path:
    """A header-faithful sparse .safetensors with every key and shape of a manifest."""
    return write_sparse(out, manifest_entries(rel), metadata)
