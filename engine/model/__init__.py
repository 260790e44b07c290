"""Components as module trees over a checkpoint's own tensors (see component.py and tree.py)."""

from __future__ import annotations

from .component import TIERS, Component, Unit
from .dtypes import Placement, computes, place, role_of

__all__ = ["TIERS", "Component", "Placement", "Unit", "build_components", "computes", "place", "role_of"]


def build_components(
    path, prefixes: dict[str, str], *, device: str = "cpu", **place_kw
) -> dict[str, Component]:
    """One Component per (name -> key prefix) — the prefixes detection found — with the dtypes and
    device the placement rules choose for this device (overridable through `place_kw`)."""
    from collections import Counter

    from ..formats.dtypes import DTYPES
    from ..formats.safetensors import SafetensorsFile

    f = SafetensorsFile(path)
    out = {}
    for name, prefix in prefixes.items():
        infos = [i for k, i in f.header.tensors.items() if k.startswith(prefix)]
        counts = Counter(i.dtype for i in infos if i.dtype.startswith(("F", "BF")))
        file_dtype = DTYPES[counts.most_common(1)[0][0]][1] if counts else "float32"
        size = sum(i.nbytes for i in infos)
        p = place(name, file_dtype, device, size_bytes=size, **place_kw)
        out[name] = Component(
            name, f, prefix, device=p.device, storage_dtype=p.storage_dtype, compute_dtype=p.compute_dtype
        )
    return out
