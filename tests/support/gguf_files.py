"""GGUF files as ComfyUI-GGUF writes them (city96/ComfyUI-GGUF tools/convert.py, facts only): the
original key names, chosen tensors quantized, the rest float32; a tensor whose rows are not whole
blocks, or which has more than the 4 dimensions GGUF stores, is written reshaped with its original
shape recorded under `comfy.gguf.orig_shape.<key>`."""

from __future__ import annotations

from pathlib import Path


def write_gguf_twin(
    path: Path, weights: dict, arch: str, quantize, qtype: str = "Q8_0"
) -> tuple[dict, list[str]]:
    """Write `weights` to a GGUF file, the tensors `quantize(key, t)` picks in `qtype`. Returns (the
    dequantized twin's tensors, float32, as a loader must produce them; the quantized keys)."""
    import gguf
    import numpy as np
    import torch

    from engine.quant import dequantize

    q = getattr(gguf.GGMLQuantizationType, qtype)
    block = gguf.GGML_QUANT_SIZES[q][0]
    w = gguf.GGUFWriter(str(path), arch=arch)
    twin, quantized = {}, []
    for k, t in weights.items():
        x = t.float().numpy().astype(np.float32)
        shape = tuple(x.shape)
        pick = quantize(k, t) and x.size % block == 0
        if x.ndim > 4 or (pick and shape[-1] % block):
            x = x.reshape(-1, block) if pick else x.reshape(shape[0], -1)
            w.add_array(f"comfy.gguf.orig_shape.{k}", list(shape))
        if pick:
            raw = gguf.quants.quantize(x, q)
            w.add_tensor(k, raw, raw_dtype=q)
            twin[k] = dequantize(torch.from_numpy(raw.reshape(-1).copy()), qtype, shape)
            quantized.append(k)
        else:
            w.add_tensor(k, x)
            twin[k] = t.float().reshape(shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return twin, quantized
