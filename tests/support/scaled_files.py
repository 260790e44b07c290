"""Scaled-fp8 files as ComfyUI writes them (facts of its `scaled_fp8` checkpoints): the chosen layer
weights in float8_e4m3fn, each with a float32 `scale_weight` beside it (weight ≈ stored · scale), the
rest unchanged, and an empty `scaled_fp8` marker tensor."""

from __future__ import annotations


def scaled_fp8_twin(weights: dict, pick) -> tuple[dict, dict]:
    """(the scaled-fp8 file's tensors, its dequantized float32 twin) for the tensors `pick(key, t)`
    chooses; one scale per weight, its largest magnitude mapped to fp8's largest."""
    import torch

    q, twin = {}, {}
    for k, t in weights.items():
        if pick(k, t):
            scale = (t.abs().max() / torch.finfo(torch.float8_e4m3fn).max).float()
            f8 = (t / scale).to(torch.float8_e4m3fn)
            q[k], twin[k] = f8, f8.float() * scale
            q[k[: -len("weight")] + "scale_weight"] = scale.reshape(())
        else:
            q[k] = twin[k] = t
    q["scaled_fp8"] = torch.zeros(0, dtype=torch.float8_e4m3fn)
    return q, twin
