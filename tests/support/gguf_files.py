"""GGUF files as ComfyUI-GGUF writes them (city96/ComfyUI-GGUF tools/convert.py, facts only): the
original key names, chosen tensors quantized, the rest float32; a tensor whose rows are not whole
blocks, or which has more than the 4 dimensions GGUF stores, is written reshaped with its original
shape recorded under `comfy.gguf.orig_shape.<key>`."""

from __future__ import annotations

from pathlib import Path


def sdcpp_pick(block: int):
    """stable-diffusion.cpp's converter's choice (`sd-cli -M convert --type q8_0`; its
    ModelLoader::tensor_should_be_converted): every tensor but biases and `.scale`s whose rows fill whole
    blocks -- 1-dim norm weights, pad tokens and modulation tables too."""
    return lambda k, t: not k.endswith((".bias", ".scale")) and t.shape[-1] % block == 0


def write_gguf_twin(
    path: Path, weights: dict, arch: str, quantize, qtype: str = "Q8_0", ggml_dims: bool = False
) -> tuple[dict, list[str]]:
    """Write `weights` to a GGUF file, the tensors `quantize(key, t)` picks in `qtype`. Returns (the
    dequantized twin's tensors, float32, as a loader must produce them; the quantized keys).
    `ggml_dims`: shapes as ggml's own GGUF writer stores them (stable-diffusion.cpp, llama.cpp's
    quantize): its n_dims drops leading axes of size 1 ([1, 3840] is stored as [3840])."""
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
        if ggml_dims:
            while x.ndim > 1 and x.shape[0] == 1:
                x = x[0]
        shape = tuple(x.shape)
        pick = quantize(k, t) and x.size % block == 0
        if x.ndim > 4 or (pick and shape[-1] % block):
            x = x.reshape(-1, block) if pick else x.reshape(shape[0], -1)
            w.add_array(f"comfy.gguf.orig_shape.{k}", list(shape))
        if pick:
            raw = quantize_blocks(gguf, x, q, qtype)
            w.add_tensor(k, raw, raw_dtype=q)
            twin[k] = dequantize(torch.from_numpy(raw.reshape(-1).copy()), qtype, shape).reshape(t.shape)
            quantized.append(k)
        else:
            w.add_tensor(k, x)
            twin[k] = t.float()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return twin, quantized


# kvalues_iq4nl (ggml-common.h): the levels an IQ4 nibble indexes
_IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def quantize_blocks(gguf, x, q, qtype: str):
    """gguf-py's quantizer, or for IQ4_NL / IQ4_XS (which it cannot write) a plain one of our own: a
    scale per block from its largest value, each element the nearest level (llama.cpp searches the
    scales with an importance matrix; any valid blocks serve a test that compares with the twin)."""
    import numpy as np

    try:
        return gguf.quants.quantize(x, q)
    except NotImplementedError:
        if qtype not in ("IQ4_NL", "IQ4_XS"):
            raise
    levels = np.array(_IQ4_LEVELS, dtype=np.float32)
    sub = x.reshape(-1, 32).astype(np.float32)
    scale = np.abs(sub).max(axis=1) / 127  # per 32 elements
    if qtype == "IQ4_NL":
        d = scale.astype(np.float16)
        scales = d.astype(np.float32)
    else:  # one fp16 d per 256 elements and a 6-bit signed multiple of it per 32
        sup = scale.reshape(-1, 8)
        d = (sup.max(axis=1) / 31).astype(np.float16)
        dd = np.where(d.astype(np.float32) > 0, d.astype(np.float32), 1)
        ls = np.clip(np.rint(sup / dd[:, None]), -32, 31).astype(np.int8)
        scales = (d.astype(np.float32)[:, None] * ls).reshape(-1)
    safe = np.where(scales > 0, scales, 1)[:, None]
    idx = np.abs(sub[:, :, None] / safe[:, :, None] - levels).argmin(axis=2).astype(np.uint8)
    nib = idx[:, :16] | (idx[:, 16:] << 4)  # element j low nibble, j + 16 high (Q4_0's order)
    if qtype == "IQ4_NL":
        out = np.concatenate([d.reshape(-1, 1).view(np.uint8), nib], axis=1)
    else:
        u = (ls.astype(np.int16) + 32).astype(np.uint16)  # 0..63
        low = (u & 0xF).astype(np.uint8).reshape(-1, 4, 2)
        scales_l = low[:, :, 0] | (low[:, :, 1] << 4)
        scales_h = np.zeros(len(u), dtype=np.uint16)
        for i in range(8):
            scales_h |= (u[:, i] >> 4) << (2 * i)
        out = np.concatenate(
            [d.reshape(-1, 1).view(np.uint8), scales_h.reshape(-1, 1).view(np.uint8), scales_l,
             nib.reshape(-1, 128)], axis=1,
        )  # fmt: skip
    return out.reshape(*x.shape[:-1], -1)
