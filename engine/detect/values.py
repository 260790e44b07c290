"""The one opt-in look at weight values: SD2's v-prediction, which no header states.

Fact (cited, not copied): ComfyUI `comfy/supported_models.py` class SD20 `model_type` (and the older
`sd.py` load path) reads `output_blocks.11.1.transformer_blocks.0.norm1.bias` of a 4-input-channel SD2
UNet and calls it v-prediction when the population standard deviation of those values exceeds 0.09.
We read exactly that tensor's bytes (a few hundred values) and nothing else.
"""

from __future__ import annotations

import os

from ..errors import FormatError

SD2_V_KEY = "output_blocks.11.1.transformer_blocks.0.norm1.bias"
SD2_V_THRESHOLD = 0.09
_MAX_BYTES = 1 << 20


def read_small_tensor(path: str, name: str):
    """The values of one small tensor of a .safetensors file as float64 numpy, read by offset only."""
    import numpy as np

    from ..formats import read_header

    header = read_header(path)
    info = header.tensors.get(name)
    if info is None:
        raise KeyError(name)
    if info.nbytes > _MAX_BYTES:
        raise FormatError(f"{path}: {name} is too large to read for a value check")
    with open(path, "rb") as f:
        f.seek(header.data_start + info.begin)
        raw = f.read(info.nbytes)
    if len(raw) != info.nbytes:
        raise FormatError(f"{path}: {name} is cut short: the file is truncated")
    if info.dtype == "BF16":
        return (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    kinds = {"F16": "<f2", "F32": "<f4", "F64": "<f8"}
    if info.dtype not in kinds:
        raise FormatError(f"{path}: {name} has dtype {info.dtype}, not a float the check can read")
    return np.frombuffer(raw, dtype=kinds[info.dtype]).astype(np.float64)


def read_zip_tensor(path: str, name: str):
    """One tensor of a torch-zip checkpoint as float64 numpy. The checkpoint is memory-mapped
    (engine.formats' restricted loader), so only the pages of this tensor are read from disk."""
    from ..formats.pickles import load_state_dict

    t = load_state_dict(path).get(name)
    if t is None:
        raise KeyError(name)
    if t.numel() * t.element_size() > _MAX_BYTES:
        raise FormatError(f"{path}: {name} is too large to read for a value check")
    return t.detach().float().numpy().astype("float64")


def sd2_is_v(path: str | os.PathLike, prefix: str, fmt: str = "safetensors") -> tuple[bool, float, str]:
    """(is v-prediction, the standard deviation measured, the key read) for an SD2 UNet."""
    key = prefix + SD2_V_KEY
    reader = read_zip_tensor if fmt == "torch-zip" else read_small_tensor
    values = reader(os.fspath(path), key)
    std = float(values.std()) if values.size else 0.0  # numpy's default ddof=0 is the population std
    return std > SD2_V_THRESHOLD, std, key
