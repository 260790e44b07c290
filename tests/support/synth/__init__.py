"""Synthetic model files: the real key layout (every key, shape, dtype) of each architecture, built
from its configuration, written as header-faithful sparse .safetensors (or small dense random ones),
sparse pickled torch-zip checkpoints, or whole diffusers folders.

    from tests.support import synth
    rows = synth.layout("sdxl_checkpoint", dtype="F16")        # [(key, dtype, shape), ...]
    synth.write("sdxl_checkpoint", tmp / "sdxl.safetensors")   # 6.9 GB layout, a few hundred KB on disk
    synth.write("sdxl_unet", p, prefix="model.diffusion_model.", metadata=synth.modelspec("sdxl"))
    synth.write_ckpt("sd1_checkpoint", tmp / "sd15.ckpt")      # pickled, torch.load(mmap=True) reads it
    synth.write_diffusers("flux1_dev", tmp / "FLUX.1-dev")     # model_index.json + sharded components
    synth.info("sdxl_checkpoint").components                   # {"unet": "model.diffusion_model.", ...}

Layout families (see `names()` / `python -m tests.support.synth list`): whole checkpoints (LDM SD1/SD2 and
variants, SGM SDXL / refiner, ComfyUI FLUX.1 all-in-one, SD3 / SD3.5), diffusion models alone (native
and diffusers namings, any prefix), VAEs, TAESD-family approximations, text encoders, ControlNets,
IP-Adapters, CLIP vision towers and textual-inversion embeddings. Optional keys of real files are
layout options; the defaults follow the official releases (tests/support/synth/checkpoints.py says which).
Verification: tests/engine/test_synth_*.py (the three shared manifests exactly; diffusers /
transformers models on the meta device and their single-file converters for everything else).

No torch at import time (only dense writing and .pt embeddings import it).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from . import adapters as _adapters  # noqa: F401  (registers the layouts)
from . import checkpoints as _checkpoints  # noqa: F401
from . import checkpoints_dit as _checkpoints_dit  # noqa: F401
from . import components as _components  # noqa: F401
from ._build import DTypeSpec, Entry
from .adapters import write_a1111_pt
from .diffusers_folder import PIPELINES as DIFFUSERS_PIPELINES
from .diffusers_folder import write_diffusers
from .metadata import comfy_quant, modelspec, scaled_fp8
from .registry import REGISTRY, LayoutInfo, build

__all__ = [
    "layout",
    "write",
    "write_a1111_pt",
    "write_ckpt",
    "write_diffusers",
    "DIFFUSERS_PIPELINES",
    "modelspec",
    "scaled_fp8",
    "comfy_quant",
    "from_manifest",
    "info",
    "names",
    "nbytes",
    "Entry",
    "LayoutInfo",
]


def names() -> list[str]:
    """Every layout name this generator knows."""
    return sorted(REGISTRY)


def layout(name: str, *, dtype: DTypeSpec = "F16", prefix: str = "", **options) -> list[Entry]:
    """The rows (key, dtype, shape) of layout `name`.

    dtype: one safetensors dtype, or a mapping component -> dtype with "*" as the default (e.g.
    {"transformer": "BF16", "*": "F32"}); integer buffers keep their own dtype.
    prefix: prepended to every key (e.g. "model.diffusion_model." for a UNet cut out of a checkpoint).
    options: per-layout switches for optional parts (see tests/support/synth/checkpoints.py).
    """
    return build(name, dtype, prefix, **options)


def info(name: str, *, prefix: str = "", **options) -> LayoutInfo:
    """What detection should report for `layout(name, prefix=prefix, **options)`: components whose
    parts the options leave out (e.g. sd3_medium with clip=False) are not listed."""
    spec = REGISTRY[name].info
    keys = [k for k, _, _ in layout(name, prefix=prefix, **options)]
    comps = {c: prefix + p for c, p in spec.components.items() if any(k.startswith(prefix + p) for k in keys)}
    pred = "v" if options.get("v_pred") or options.get("edm_vpred") else spec.prediction
    return replace(spec, components=comps, prediction=pred)


def nbytes(rows: list[Entry]) -> int:
    """Size of the data region these rows describe."""
    from engine.formats.dtypes import nbytes_for

    return sum(nbytes_for(d, math.prod(s)) or 0 for _, d, s in rows)


def write(
    name: str | list[Entry],
    path: str | os.PathLike,
    *,
    metadata: Mapping[str, str] | None = None,
    dense: bool = False,
    seed: int = 0,
    max_dense_bytes: int = 64 << 20,
    **kw,
) -> Path:
    """Write a layout (a name, or rows) as .safetensors: sparse by default (a hole for the data),
    or dense with deterministic random values (`dense=True`, refused above max_dense_bytes)."""
    rows = layout(name, **kw) if isinstance(name, str) else list(name)
    if not dense:
        from engine.formats.safetensors import write_sparse

        return write_sparse(path, rows, metadata)
    size = nbytes(rows)
    if size > max_dense_bytes:
        raise ValueError(f"a dense file of this layout would take {size} bytes (limit {max_dense_bytes})")
    return _write_dense(rows, path, metadata, seed)


def _write_dense(rows: list[Entry], path, metadata, seed: int) -> Path:
    import torch

    from engine.formats.dtypes import torch_dtype
    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for key, dt, shape in rows:
        tdt = torch_dtype(dt)
        if tdt.is_floating_point:
            # small values, like an initialised layer (fan-in scaled), finite in every float dtype
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else 1
            t = torch.randn(shape, generator=g) * (1.0 / math.sqrt(fan_in))
        elif tdt == torch.bool:
            t = torch.randint(0, 2, shape, generator=g).bool()
        else:
            t = torch.arange(math.prod(shape)).reshape(shape) if shape else torch.zeros(())
        tensors[key] = t.to(tdt)
    return save_tensors(path, tensors, metadata)


def write_ckpt(
    name: str | list[Entry],
    path: str | os.PathLike,
    *,
    wrap: str | None = "state_dict",
    extra: Mapping[str, int | str] | None = None,
    **kw,
) -> Path:
    """Write a layout as a sparse pickled torch-zip checkpoint (.ckpt/.pt/.pth), see tests/support/synth/ckpt.py."""
    from .ckpt import write_ckpt as _write

    rows = layout(name, **kw) if isinstance(name, str) else list(name)
    return _write(rows, path, wrap=wrap, extra=extra)


def from_manifest(path: str | os.PathLike, *, optional: bool = True, dtype: str | None = None) -> list[Entry]:
    """Rows from a manifest JSON ({"tensors": {key: {"shape", "dtype", "optional"?}}}); optional=False
    drops the keys marked optional; dtype overrides every float dtype."""
    data = json.loads(Path(path).read_text())
    rows: list[Entry] = []
    for key, t in data["tensors"].items():
        if t.get("optional") and not optional:
            continue
        dt = t["dtype"]
        if dtype and dt.startswith(("F", "BF")):
            dt = dtype
        rows.append((key, dt, tuple(t["shape"])))
    return rows
