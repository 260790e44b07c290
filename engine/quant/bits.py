"""What the ggml decoders (`kernels`, `lattice`) share: reading bit fields and half floats out of block
bytes, and lookup tables built once per device."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch

F32 = torch.float32
_TABLES: dict[tuple[Hashable, torch.device], torch.Tensor] = {}


def split_planes(b: torch.Tensor, step: int, *, axis: int = -2) -> torch.Tensor:
    """(..., L) uint8 -> (..., 8 // step, L): plane i holds bits [i*step, (i+1)*step) of every byte
    (with axis=-1, (..., L, 8 // step): each byte's planes after it).

    A shift and a mask by a Python int per plane: torch's CPU kernels vectorise a shift by a scalar
    but not one broadcast from a tensor of shift amounts (measured ~100x slower). The bytes are made
    contiguous first: elementwise ops over a block-strided slice run ~10x slower than over a copy."""
    b = b.contiguous()
    mask = (1 << step) - 1
    top = 8 - step
    planes = [b & mask] + [(b >> i) & mask for i in range(step, top, step)] + [b >> top]
    return torch.stack(planes, dim=axis)


def halves(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) uint8 little-endian ggml_half bytes -> (n, 1) float32."""
    return b.contiguous().view(torch.float16).to(F32)


def table(key: Hashable, device: torch.device, build: Callable[[], torch.Tensor]) -> torch.Tensor:
    """The lookup table `key` on `device`: `build()` (on the CPU) the first time, moved there, kept."""
    t = _TABLES.get((key, device))
    if t is None:
        t = _TABLES[(key, device)] = build().to(device)
    return t
