"""Quantized weights: GGUF (ggml) blocks kept as their raw bytes and dequantized per op, on the fly.

A quantized tensor is its raw uint8 blocks plus a `QuantSpec` (ggml type name and logical, torch-order
shape). The bytes are what a module holds and what the ledger counts; `dequantize` turns them into a
float tensor when an op runs (engine.ops). The decoders (`kernels`) are vectorised torch, on whatever
device the bytes are, bit-exact in float32 against the `gguf` package's numpy dequantization.

Supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, the non-linear
4-bit IQ4_NL and IQ4_XS, the ternary TQ1_0 and TQ2_0, MXFP4, NVFP4 and the lattice types IQ1_S, IQ1_M,
IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS and IQ3_S (`lattice`: their codebooks read from the `gguf` package), all
decoded by torch. Any other ggml type (Q8_1, Q8_K: llama.cpp's intermediates) is an UnsupportedModel
that names it.

Torch-free at import (the byte counts are used by `loadout plan` and the library scan); `dequantize`
imports torch when called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import FormatError, UnsupportedModel
from ..formats.gguf import GGML_TYPES

__all__ = [
    "BLOCK_TYPES",
    "FLOAT_TYPES",
    "Interleaved",
    "SUPPORTED",
    "LATTICE",
    "QuantSpec",
    "block_layout",
    "check_supported",
    "dequantize",
    "is_block_type",
]

# ggml type name -> (elements per block, bytes per block), from the header reader's table (gguf-py
# constants.py GGML_QUANT_SIZES).
_BY_NAME: dict[str, tuple[int, int]] = {name: (blk, size) for name, blk, size in GGML_TYPES.values()}

FLOAT_TYPES = ("F32", "F16", "BF16")
# Lattice types: torch decoders (engine.quant.lattice) over codebooks the `gguf` package holds.
LATTICE = ("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
BLOCK_TYPES = (
    "Q8_0",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "TQ1_0",
    "TQ2_0",
    "MXFP4",
    "NVFP4",
    *LATTICE,
)
SUPPORTED = (*FLOAT_TYPES, *BLOCK_TYPES)


def _name(ggml_type: str | int) -> str:
    if isinstance(ggml_type, int) and not isinstance(ggml_type, bool):
        entry = GGML_TYPES.get(ggml_type)
        return entry[0] if entry else f"ggml type {ggml_type}"
    return str(getattr(ggml_type, "name", ggml_type))  # a gguf.GGMLQuantizationType works too


def check_supported(ggml_type: str | int) -> str:
    """The type's name if Loadout can dequantize it, else UnsupportedModel naming it."""
    name = _name(ggml_type)
    if name not in SUPPORTED:
        raise UnsupportedModel(
            f"GGUF tensors of type {name} cannot be loaded by Loadout yet (it reads "
            f"{', '.join(SUPPORTED)}): use a file quantized to one of these, e.g. Q8_0, Q5_K or Q4_K"
        )
    return name


def is_block_type(dtype: str) -> bool:
    """Whether a tensor of this dtype name (safetensors or ggml) is held as raw ggml blocks: one of
    the supported quantized types. (ggml's F32 / F16 / BF16 / I8 … share safetensors' names.)"""
    return dtype in BLOCK_TYPES


def block_layout(ggml_type: str | int) -> tuple[int, int]:
    """(elements per block, bytes per block) of a supported type."""
    return _BY_NAME[check_supported(ggml_type)]


@dataclass(frozen=True)
class QuantSpec:
    """How to read one quantized tensor's raw bytes: its ggml type and logical (torch-order) shape."""

    ggml_type: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        name = check_supported(self.ggml_type)
        object.__setattr__(self, "ggml_type", name)
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        block, _ = _BY_NAME[name]
        if self.numel % block:
            raise FormatError(
                f"a {name} tensor of shape {self.shape} does not fill whole blocks of {block} "
                "elements: corrupt file"
            )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the raw blocks (what the tensor costs in memory while quantized)."""
        block, size = _BY_NAME[self.ggml_type]
        return self.numel // block * size

    def dequantize(self, raw, dtype=None):
        """The raw bytes as a float tensor of this spec's shape (see `dequantize`)."""
        return dequantize(raw, self.ggml_type, self.shape, dtype)


def dequantize(raw, ggml_type: str | int, shape, dtype=None):
    """raw: a uint8 tensor holding whole ggml blocks (any shape, CPU or CUDA) -> a tensor of `shape` on
    the same device, float32 unless `dtype` says otherwise (values are computed in float32 and rounded
    once). Bit-exact in float32 against `gguf.quants.dequantize`."""
    from .kernels import dequantize as _dequantize

    return _dequantize(raw, check_supported(ggml_type), tuple(shape), dtype)


@dataclass(frozen=True)
class Interleaved:
    """A q or k projection whose rows a GGUF file keeps in llama.cpp's rotary-interleaved order (see
    engine.formats.gguf_names): dequantized (`inner`, None for a float tensor held as it is), then each
    head's rows put back in transformers' order — file row 2i + j of a head of width d is row j·d/2 + i.
    Patches (LoRAs, in transformers' order) apply after; the stored bytes never change."""

    inner: QuantSpec | None
    heads: int
    shape: tuple[int, ...]

    def dequantize(self, raw, dtype=None):
        import torch

        w = self.inner.dequantize(raw, torch.float32) if self.inner is not None else raw.to(torch.float32)
        rows = w.shape[0]
        out = w.reshape(self.heads, rows // self.heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)
        return out if dtype is None or dtype == torch.float32 else out.to(dtype)
