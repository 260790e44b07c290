"""Small real (dense) checkpoints for the model / residency tests, written into a test's tmp dir."""

from __future__ import annotations

import json
from pathlib import Path

SD15_MANIFEST = "manifests/sd15_ldm_single_file.json"
SD15_PREFIXES = {
    "unet": "model.diffusion_model.",
    "clip_l": "cond_stage_model.transformer.",
    "vae": "first_stage_model.",
}


def write_components(path: Path, sizes: dict[str, list[int]], width: int = 256, seed: int = 0) -> Path:
    """One component per name ("a" -> keys "a.l0.weight", ...): Linear layers of width × rows (fp16),
    each with a bias, plus a LayerNorm and a plain integer buffer that can never stream."""
    import torch

    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(seed)
    t = {}
    for comp, rows in sizes.items():
        for i, r in enumerate(rows):
            t[f"{comp}.l{i}.weight"] = torch.randn(r, width, generator=g).half()
            t[f"{comp}.l{i}.bias"] = torch.randn(r, generator=g).half()
        t[f"{comp}.final_layer_norm.weight"] = torch.randn(width, generator=g).half()
        t[f"{comp}.final_layer_norm.bias"] = torch.randn(width, generator=g).half()
        t[f"{comp}.ids.position_ids"] = torch.arange(77).reshape(1, 77)
    return save_tensors(path, t)


def sd15_entries(manifest: Path, prefix: str = "model.diffusion_model.", limit_bytes: int | None = None):
    """(name, dtype, shape) of the SD1.5 manifest's keys under `prefix` in fp16, up to `limit_bytes`."""
    import math

    tensors = json.loads(Path(manifest).read_text())["tensors"]
    out, total = [], 0
    for k, v in tensors.items():
        if not k.startswith(prefix):
            continue
        n = math.prod(v["shape"]) * 2
        if limit_bytes is not None and total + n > limit_bytes:
            continue
        dtype = "F16" if v["dtype"] == "F32" else v["dtype"]
        out.append((k, dtype, tuple(v["shape"])))
        total += n
    return out, total


def write_dense(path: Path, entries, seed: int = 0) -> Path:
    """A dense safetensors file of random fp16 tensors with these (name, dtype, shape) entries."""
    import torch

    from engine.formats.dtypes import torch_dtype
    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(seed)
    t = {}
    for name, dtype, shape in entries:
        dt = torch_dtype(dtype)
        if dt.is_floating_point:
            t[name] = torch.randn(shape, generator=g, dtype=dt if dt.itemsize >= 2 else torch.float16).to(dt)
        else:
            t[name] = torch.zeros(shape, dtype=dt)
    return save_tensors(path, t)
