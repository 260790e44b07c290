"""Child process for bench_vae.py: one decode/encode in a fresh interpreter, peak RSS measured.

Prints one JSON line: seconds, peak RSS (ru_maxrss) before and after, the run's info, and where asked
the output saved for PSNR comparisons by the parent.
"""

from __future__ import annotations

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

    vae = small_kl(ch=cfg.get("ch", 128), seed=0)
    h, w = cfg["height"] // 8, cfg["width"] // 8
    z = torch.randn(1, 4, h, w, generator=torch.Generator().manual_seed(1))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    info = run.RunInfo()
    t0 = time.perf_counter()
    tiled = cfg["mode"] == "tiled"
    img = run.decode(
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
    print(json.dumps(out))


if __name__ == "__main__":
    main()
