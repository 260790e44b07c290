"""Child process for bench_vae.py: one decode/encode in a fresh interpreter, peak RSS measured.

Prints one JSON line: seconds, peak RSS (ru_maxrss) before and after, the run's info, and where asked
the output saved for PSNR comparisons by the parent, or (`count_ops`) the number of torch ops run.
"""

from __future__ import annotations

import contextlib
import json
import resource
import sys
import time


def main() -> None:
    cfg = json.loads(sys.argv[1])
    import torch

    torch.set_num_threads(cfg.get("threads", 2))
    sys.path.insert(0, cfg["tests_dir"])
    from vae_fixtures import small_kl

    from engine.vae import run

    if cfg.get("family") == "hunyuan_image21":  # the release's blocks, widths ch x (1, 2, 4, 4, 8, 8)
        from engine.vae.hunyuan_image import HunyuanImageVAE, HYIConfig

        torch.manual_seed(0)
        ch = cfg.get("ch", 128)
        vae = (
            HunyuanImageVAE(HYIConfig.of(tuple(ch * m for m in (1, 2, 4, 4, 8, 8)), 2))
            .eval()
            .requires_grad_(False)
        )
        f, zc = 32, 64
    else:
        vae, f, zc = small_kl(ch=cfg.get("ch", 128), seed=0), 8, 4
    h, w = cfg["height"] // f, cfg["width"] // f
    z = torch.randn(1, zc, h, w, generator=torch.Generator().manual_seed(1))
    if cfg.get("direction") == "encode":
        z = torch.rand(1, 3, h * f, w * f, generator=torch.Generator().manual_seed(1)) * 2 - 1
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    info = run.RunInfo()
    counter = _counter(cfg) if cfg.get("count_ops") else contextlib.nullcontext()
    t0 = time.perf_counter()
    tiled = cfg["mode"] == "tiled"
    with counter:
        img = (run.encode if cfg.get("direction") == "encode" else run.decode)(
            vae,
            z,
            tiled=tiled,
            tile=cfg.get("tile"),
            overlap=cfg.get("overlap"),
            info=info,
            disk_store=cfg.get("disk_store"),
            budget=cfg.get("budget"),
        )
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est = info.tiling_estimate_bytes  # of what ran: a batch of tiles, states where they waited
    if cfg.get("save"):
        torch.save(img, cfg["save"])
    out = {"seconds": seconds, "peak_rss": peak, "base_rss": base, "estimate": est, **info.to_json()}
    if cfg.get("count_ops"):
        out["ops"] = counter.ops
    print(json.dumps(out))


def _counter(cfg: dict):
    """A dispatch mode counting the torch ops a decode runs (views aside: they launch nothing): on a
    GPU each is a kernel launch or more, and a tiled decode there is bound by launching them. With
    `gpu_bands` the executor's bands are sized as on a GPU (engine.ops.GPU_BAND_BYTES), so the count
    is what a GPU run would dispatch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    if cfg.get("gpu_bands"):
        from engine import ops
        from engine.vae import tiling

        ops.BAND_BYTES = tiling.BAND_BYTES = ops.GPU_BAND_BYTES

    class Count(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not func.is_view:
                self.ops += 1
            return func(*args, **(kwargs or {}))

    return Count()


if __name__ == "__main__":
    main()
