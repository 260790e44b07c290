"""The safetensors dtype vocabulary: size in bits and the matching torch dtype name.

Source: the safetensors format spec (huggingface/safetensors, `Dtype` enum): BOOL, U8, I8, F8_E5M2,
F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, and the sub-byte F4 / F6 kinds.
"""

from __future__ import annotations

# name -> (bits per element, torch dtype attribute or None when torch has no such dtype)
DTYPES: dict[str, tuple[int, str | None]] = {
    "BOOL": (8, "bool"),
    "U8": (8, "uint8"),
    "I8": (8, "int8"),
    "F8_E5M2": (8, "float8_e5m2"),
    "F8_E4M3": (8, "float8_e4m3fn"),
    "F8_E8M0": (8, "float8_e8m0fnu"),
    "I16": (16, "int16"),
    "U16": (16, "uint16"),
    "F16": (16, "float16"),
    "BF16": (16, "bfloat16"),
    "I32": (32, "int32"),
    "U32": (32, "uint32"),
    "F32": (32, "float32"),
    "F64": (64, "float64"),
    "I64": (64, "int64"),
    "U64": (64, "uint64"),
    "F4": (4, None),
    "F6_E2M3": (6, None),
    "F6_E3M2": (6, None),
}

FLOAT_DTYPES = frozenset(
    {"F8_E5M2", "F8_E4M3", "F8_E8M0", "F16", "BF16", "F32", "F64", "F4", "F6_E2M3", "F6_E3M2"}
)


def nbytes_for(dtype: str, numel: int) -> int | None:
    """Bytes a tensor of `numel` elements takes, or None if sub-byte elements do not fill whole bytes."""
    bits = DTYPES[dtype][0] * numel
    return bits // 8 if bits % 8 == 0 else None


def torch_dtype(dtype: str):
    """The torch dtype for a safetensors dtype name (imports torch: engine thread only)."""
    import torch

    name = DTYPES[dtype][1]
    if name is None or not hasattr(torch, name):
        from ..errors import UnsupportedModel

        raise UnsupportedModel(f"Tensors of dtype {dtype} cannot be loaded by this version of torch.")
    return getattr(torch, name)


def dtype_name(torch_dt) -> str:
    """The safetensors name of a torch dtype."""
    s = str(torch_dt).removeprefix("torch.")
    for k, (_, v) in DTYPES.items():
        if v == s:
            return k
    raise ValueError(f"no safetensors dtype for {torch_dt}")


def dominant_float_dtype(dtypes) -> str:
    """The torch name of the floating-point dtype most tensors have ('float32' when none is): the
    dtype a component is said to be stored in. `dtypes` are safetensors names (F16, BF16, ...), one
    per tensor."""
    counts: dict[str, int] = {}
    for d in dtypes:
        if d.startswith(("F", "BF")):
            counts[d] = counts.get(d, 0) + 1
    if not counts:
        return "float32"
    return DTYPES[max(counts, key=counts.__getitem__)][1] or "float32"
