"""Baking LyCORIS' weight-dependent algorithms (OFT, BOFT, GLoRA, IA³) into an SDXL UNet's attention and
feed-forward layers, against LyCORIS' own merge of the same modules.

Weights: as bench_patch (the real SDXL shapes of every `transformer_blocks.*.attn1/attn2.to_q/k/v/out.0`
and `ff.net.0.proj/ff.net.2` weight, random fp16; `--fraction` keeps whole blocks evenly spread, default
0.07: 50 layers, ~0.3 GiB). Per algorithm, one lycoris-lora module per layer (its own classes, their
parameters randomised as a trained file's), saved under kohya names as LyCORIS saves a network:

  lycoris_<algo>   ModelPatcher.apply([file])  vs  a loop, per layer, of: the module's float32 weight set
                   from the stored fp16 one, LyCORIS' `get_merged_weight(1.0)` (its own math), the
                   result copied into the fp16 weight in place

Best of --repeat (default 3) each, interleaved, after a warm-up; the two results are checked to agree
(float32 round-off in fp16). Below 1: we bake faster than the reference merges.
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import record  # noqa: E402
from bench_patch import PREFIX, layer_keys, sdxl_shapes  # noqa: E402

from engine.lora.adapter import adapter_from_tensors  # noqa: E402
from engine.lora.keymap import KeyMap  # noqa: E402
from engine.memory import trim_heap  # noqa: E402
from engine.patcher import LoraEntry, ModelPatcher  # noqa: E402

ALGOS = {  # algorithm -> (lycoris module class name, its arguments as a trainer sets them)
    "oft": ("diag_oft.DiagOFTModule", {"lora_dim": 32, "constraint": 1e-4, "rescaled": True}),
    "boft": ("boft.ButterflyOFTModule", {"lora_dim": 16}),
    "glora": ("glora.GLoRAModule", {"lora_dim": 16, "alpha": 8}),
    "ia3": ("ia3.IA3Module", {}),
}


def modules(algo: str, keys, base, seed: int):
    import importlib

    path, kw = ALGOS[algo]
    mod_name, cls_name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(f"lycoris.modules.{mod_name}"), cls_name)
    g = torch.Generator().manual_seed(seed)
    out, tensors = {}, {}
    for k in keys:
        w = base[k]
        org = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta")
        org.weight = torch.nn.Parameter(w.float(), requires_grad=False)
        m = cls("x", org, 1.0, **kw)
        with torch.no_grad():
            for n, p in m.named_parameters():
                if not n.startswith("org"):
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02 + (1.0 if n == "rescale" else 0.0))
        name = "lora_unet_" + k[len(PREFIX) : -len(".weight")].replace(".", "_")
        tensors.update({f"{name}.{n}": t.detach().clone() for n, t in m.state_dict().items()})
        out[k] = m
    return out, tensors


def lycoris_merge(weights, base, mods) -> None:
    """LyCORIS merges in its weight's dtype: each module's float32 weight is first set from the stored
    fp16 one (the conversion pass our bake makes too), then merged and copied into the result."""
    with torch.no_grad():
        for k, m in mods.items():
            m.org_weight = base[k]
            weights[k].copy_(m.get_merged_weight(multiplier=1.0)[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fraction", type=float, default=0.07)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--algos", default=",".join(ALGOS), help="comma-separated subset of " + ", ".join(ALGOS))
    args = ap.parse_args()
    try:
        import lycoris  # noqa: F401
    except ImportError:
        print("bench_lycoris: lycoris-lora is not installed (pip install lycoris-lora)", file=sys.stderr)
        sys.exit(2)
    logging.getLogger("LyCORIS").setLevel(logging.WARNING)
    shapes = sdxl_shapes()
    _, keys = layer_keys(shapes, args.fraction)
    g = torch.Generator().manual_seed(0)
    base = {k: (torch.randn(*shapes[k], generator=g) * 0.02).half() for k in keys}
    common = {
        "layers": len(keys),
        "weights_gib": round(sum(math.prod(shapes[k]) * 2 for k in keys) / 2**30, 3),
        "threads": torch.get_num_threads(),
        "device": "cpu",
    }
    km = KeyMap(shapes)
    for i, algo in enumerate(ALGOS):
        if algo not in args.algos.split(","):
            continue
        mods, tensors = modules(algo, keys, base, seed=10 + i)
        adapter = adapter_from_tensors(tensors, path=algo)
        p = ModelPatcher(base, loader={algo: adapter}.__getitem__, keymap=km)
        assert p.coverage(algo).mapped == len(keys)
        ref = {k: v.clone() for k, v in base.items()}
        ours, theirs = [], []
        for r in range(args.repeat + 1):
            trim_heap()
            t0 = time.perf_counter()
            p.apply([LoraEntry(algo)])
            t_ours = time.perf_counter() - t0
            got = {k: p.weights[k] for k in keys}
            p.restore()
            trim_heap()
            t0 = time.perf_counter()
            lycoris_merge(ref, base, mods)
            t_theirs = time.perf_counter() - t0
            if r:
                ours.append(t_ours)
                theirs.append(t_theirs)
        worst = max(float((got[k].float() - ref[k].float()).abs().max()) for k in keys)
        assert worst < 2e-3, (algo, worst)  # fp16 rounding of the same float32 values
        record(
            f"lycoris_{algo}",
            min(ours),
            "s",
            baseline="lycoris-lora get_merged_weight per layer (fp32 weight set from the fp16 one), copied back",
            baseline_value=min(theirs),
            max_abs_diff=worst,
            **common,
        )


if __name__ == "__main__":
    main()
