"""MiniMax-H3's ViT video VAE (engine.vae.minimax_h3): Loadout's decode against diffusers' own
AutoencoderKLMiniMaxH3.decode (its default: the release's 256-px tiles) on the same weights and latent -- time
and peak RSS above the process before the decode, each side in a fresh process, and the largest difference
between their frames; with the estimate against the measured peak.

The decoder is narrowed (`--dim` wide, `--layers` blocks; the release's is 2048 x 36, 9.7 GB in float32, which a
CI machine cannot hold): its tiles, chunks and stitching are the release's, so the ratios measure the driver
around the blocks (tiles, blends, the chunk cross-fade, what waits where). Threads: 2.

    python benchmarks/bench_vae_vit.py [--dim 512] [--layers 4] [--size 832x480] [--latent-frames 7] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def _write(path: str, dim: int, layers: int) -> None:
    import diffusers
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLMiniMaxH3(block_out_channels=(8,) * 6, norm_num_groups=4, decoder_num_layers=layers,
                                            decoder_num_attention_heads=dim // 64)  # fmt: skip
    sd = {k: (torch.randn_like(v) * (0.5 if k.endswith(("scale1", "scale2")) else 0.02)).contiguous()
          for k, v in ref.state_dict().items()}  # fmt: skip
    save_file(sd, path)


def run_child(cfg: dict) -> dict:
    import psutil
    import torch

    torch.set_num_threads(2)
    z = torch.randn(1, 24, cfg["latent_frames"], cfg["height"] // 16, cfg["width"] // 16,
                    generator=torch.Generator().manual_seed(1))  # fmt: skip
    info = None
    if cfg["side"] == "diffusers":
        import diffusers
        from safetensors.torch import load_file

        ref = diffusers.AutoencoderKLMiniMaxH3(block_out_channels=(8,) * 6, norm_num_groups=4,
                                                decoder_num_layers=cfg["layers"],
                                                decoder_num_attention_heads=cfg["dim"] // 64).eval()  # fmt: skip
        ref.load_state_dict(load_file(cfg["path"]))
        mean = torch.tensor((0.485, 0.456, 0.406))[None, :, None, None, None]
        std = torch.tensor((0.229, 0.224, 0.225))[None, :, None, None, None]
        base = psutil.Process().memory_info().rss
        t0 = time.perf_counter()
        with torch.no_grad():
            out = (((ref.decode(z).sample * std + mean) * 2 - 1).clamp(-1, 1) + 1) / 2  # as Loadout maps it
        seconds = time.perf_counter() - t0
        out = out.transpose(1, 2)
    else:
        from engine.vae import decode
        from engine.vae.estimate import RUNTIME_BYTES
        from engine.vae.loading import load_vae
        from engine.vae.run import RunInfo

        vae = load_vae(cfg["path"])
        for p in vae.parameters():  # mapped from the file: fault the weights in before the baseline, as
            p.sum()  # diffusers' side holds them read
        info = RunInfo()
        base = psutil.Process().memory_info().rss
        t0 = time.perf_counter()
        out = decode(vae, z, info=info)
        seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    torch.save(out, cfg["save"])
    res = {"seconds": seconds, "peak": peak - base, "frames": out.shape[1]}
    if info is not None:
        res["estimate"] = (
            info.tiling_estimate_bytes
            - RUNTIME_BYTES
            - sum(p.numel() * p.element_size() for p in vae.parameters())
        )
        res["tiles"] = info.tiles
    return res


def child(cfg: dict) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True,
                       env=env, check=False)  # fmt: skip
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    from _record import record

    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--size", default="832x480")
    ap.add_argument("--latent-frames", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    import torch

    w, h = (int(v) for v in a.size.split("x"))
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/vae.safetensors"
        _write(path, a.dim, a.layers)
        base = {"path": path, "dim": a.dim, "layers": a.layers, "width": w, "height": h,
                "latent_frames": a.latent_frames}  # fmt: skip
        ours, theirs = [], []
        for _ in range(a.repeat):  # alternated: both sides see the same moments of a busy machine
            ours.append(child({**base, "side": "loadout", "save": f"{d}/ours.pt"}))
            theirs.append(child({**base, "side": "diffusers", "save": f"{d}/theirs.pt"}))
        diff = float((torch.load(f"{d}/ours.pt") - torch.load(f"{d}/theirs.pt")).abs().max())
    mine, ref = min(ours, key=lambda r: r["seconds"]), min(theirs, key=lambda r: r["seconds"])
    name = f"vae_vit_minimax_h3_{w}x{h}x{mine['frames']}_dim{a.dim}x{a.layers}"
    record(f"{name}_vs_diffusers_time", mine["seconds"], "s", baseline="diffusers AutoencoderKLMiniMaxH3.decode (tiled)",
           baseline_value=ref["seconds"], goal=1.1, tiles=mine["tiles"], max_abs_diff=diff)  # fmt: skip
    record(f"{name}_vs_diffusers_peak", min(r["peak"] for r in ours), "B",
           baseline="diffusers AutoencoderKLMiniMaxH3.decode, peak RSS above the process before decoding",
           baseline_value=min(r["peak"] for r in theirs), goal=1.0)  # fmt: skip
    record(f"{name}_estimate_vs_measured", mine["estimate"], "B",
           baseline="measured peak RSS above the process before decoding (less the runtime and weights)",
           baseline_value=min(r["peak"] for r in ours), better="higher")  # fmt: skip


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(run_child(json.loads(sys.argv[2]))))
    else:
        main()
