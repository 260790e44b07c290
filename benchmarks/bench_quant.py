"""Dequantization throughput per ggml type: engine.quant (torch) vs gguf-py's numpy dequantization.

For each type ComfyUI-GGUF loads, the same valid random blocks (random quants, finite random
scales) are dequantized to float32 by `engine.quant.dequantize` and by `gguf.quants.dequantize`, the
baseline measured in the same run, and the two results are checked bit-equal. Two sizes by default
(BENCH_QUANT_ELEMENTS=N for one): a Flux-sized 3072 x 3072 weight, whose 36 MiB float32 result is
above glibc's largest mmap threshold (32 MiB), so every call of either side writes into fresh pages
and the page faults weigh as much as the decoding; and 3072 x 1024, whose result is reused heap
memory after the first call, which shows the decoding itself. F32 is a zero-copy view on both sides. Each line gives MB/s of *quantized* bytes read
(what a forward pass decodes per op), the wall-time ratio ours / baseline (below 1: faster) and
process CPU seconds (torch may use several threads, numpy one). On a CUDA machine a second line per
type times the decode on the GPU (synchronised), against the same numpy baseline.

Times are medians over BENCH_REPS repetitions; this machine is shared and noisy, so read ratios,
not absolute figures, and rerun before believing a small difference.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# Byte offsets of each block's ggml_half scales (ggml-common.h), given finite values.
HALVES = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
    "MXFP4": (),
    **dict.fromkeys(("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S"), (0,)),
    "NVFP4": (),  # E4M3 scale bytes: every value finite
    "IQ1_M": (),  # its half scale is spread over the top nibbles of the scale words (set in _blocks)
}


def _median(fn, reps: int, sync=None) -> tuple[float, float]:
    """Median wall and process-CPU seconds per call."""
    fn()  # warm up: first-call allocations and kernel selection
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        if sync is not None:
            sync()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return statistics.median(wall), statistics.median(cpu)


def _blocks(name: str, elements: int, rng):
    import numpy as np

    from engine.quant import block_layout

    block, size = block_layout(name)
    if block == 1:
        x = rng.standard_normal(elements).astype(np.float32)
        if name == "F32":
            return x.view(np.uint8)
        import gguf

        return gguf.quants.quantize(x, gguf.GGMLQuantizationType[name]).view(np.uint8)
    raw = rng.integers(0, 256, size=(elements // block, size), dtype=np.uint8)
    for off in HALVES[name]:
        raw[:, off : off + 2] = (
            (rng.standard_normal((raw.shape[0], 1)) * 0.05).astype(np.float16).view(np.uint8)
        )
    if name == "MXFP4":  # exponents up to 2^122: every value finite
        raw[:, 0] %= 250
    if name == "IQ1_M":  # a finite d: its 16 bits as the top nibbles of the four scale words (bytes 48..55)
        d = (rng.standard_normal(raw.shape[0]) * 0.05).astype(np.float16).view(np.uint16)
        for k in range(4):
            raw[:, 49 + 2 * k] = (raw[:, 49 + 2 * k] & 0x0F) | (((d >> (4 * k)) & 0xF) << 4).astype(np.uint8)
    return raw.reshape(-1)


def bench(elements: int, reps: int) -> int:
    import gguf
    import numpy as np
    import torch

    from engine.quant import SUPPORTED, block_layout, dequantize

    rng = np.random.default_rng(0)
    cuda = torch.cuda.is_available()
    for name in SUPPORTED:
        block, _ = block_layout(name)
        rows = elements // 3072 if elements % 3072 == 0 and 3072 % block == 0 else 1
        shape = (rows, elements // rows)
        raw_np = _blocks(name, elements, rng)
        raw = torch.from_numpy(raw_np)
        qtype = gguf.GGMLQuantizationType[name]
        ref = gguf.quants.dequantize(raw_np.reshape(rows, -1), qtype)
        ours = dequantize(raw, name, shape)
        if not torch.equal(
            ours.view(torch.int32), torch.from_numpy(np.ascontiguousarray(ref)).view(torch.int32)
        ):
            print(json.dumps({"name": f"dequantize_{name}", "error": "results differ"}), flush=True)
            return 1
        del ref, ours
        by_rows = raw_np.reshape(rows, -1)
        base = _median(lambda a=by_rows, t=qtype: gguf.quants.dequantize(a, t), reps)
        runs = [("cpu", _median(lambda r=raw, n=name, s=shape: dequantize(r, n, s), reps))]
        if cuda:
            dev = raw.cuda()
            sync = torch.cuda.synchronize
            runs.append(("cuda", _median(lambda r=dev, n=name, s=shape: dequantize(r, n, s), reps, sync)))
        mb = raw.numel() / 1e6
        for device, (wall, cpu) in runs:
            rec = {
                "name": f"dequantize_{name}_{device}",
                "ours_s": wall,
                "baseline": "gguf.quants.dequantize (numpy, cpu)",
                "baseline_s": base[0],
                "ratio": wall / base[0],
                "ours_MBps": mb / wall,
                "baseline_MBps": mb / base[0],
                "ours_cpu_s": cpu,
                "baseline_cpu_s": base[1],
                "quantized_bytes": raw.numel(),
                "elements": elements,
                "torch_threads": torch.get_num_threads(),
                "reps": reps,
            }
            if name == "F32":
                rec["note"] = "a zero-copy view on both sides: nothing to decode"
            print(json.dumps(rec), flush=True)
    return 0


def main() -> int:
    reps = int(os.environ.get("BENCH_REPS", "7"))
    sizes = os.environ.get("BENCH_QUANT_ELEMENTS")
    for elements in [int(sizes)] if sizes else [3072 * 3072, 3072 * 1024]:
        if bench(elements, reps):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
