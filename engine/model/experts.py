"""A mixture of experts' packed weights as one castable op: the experts of a layer stored as two 3-D tensors,
`gate_up_proj` [E, D, 2I] and `down_proj` [E, I, D], input-major (diffusers' `SwiGLUExperts`, NucleusMoE-Image's
release). As a castable op (not a plain holder of tensors) they move between tiers, stream with read-ahead and are
cast, dequantized and patched per forward like any layer's weight: a plain holder must sit on the accelerator whole,
and these are most of such a model's bytes."""

from __future__ import annotations

import torch
from torch import nn

from ..ops import Castable, _prepare, check_cancelled

ATTRS = ("gate_up_proj", "down_proj")


class PackedExperts(Castable, nn.Module):
    """E experts' SwiGLU weights in two tensors; `cast_experts(like)` gives both ready to compute with."""

    weight_attr = (
        "gate_up_proj"  # what LoRA patches (`weight_functions`) and a quantized spec's primary are of
    )

    def __init__(self, experts: int, dim: int, inner: int, device=None, dtype=None):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(experts, dim, 2 * inner, device=device, dtype=dtype))
        self.down_proj = nn.Parameter(torch.empty(experts, inner, dim, device=device, dtype=dtype))
        self.bias = None
        self._castable_init()

    @property
    def weight(self) -> torch.Tensor:
        return self.gate_up_proj

    def cast_experts(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(gate_up_proj, down_proj) on like's device in the compute dtype (like's where none is set): moved,
        dequantized and patched as Castable.cast_params does a layer's weight and bias."""
        check_cancelled()
        got = self.fetch(self) if self.fetch is not None else {}
        dtype = self.compute_dtype or like.dtype
        out = []
        for attr, fns in zip(ATTRS, (self.weight_functions, self.bias_functions), strict=True):
            t = got.get(attr)
            if t is None:
                t = getattr(self, attr)
            spec = self.quantized.get(attr)
            if spec is None and not fns and t.device == like.device and t.dtype == dtype:
                out.append(t)
                continue
            out.append(_prepare(t, like.device, dtype, fns, self.non_blocking, spec))
        return out[0], out[1]
