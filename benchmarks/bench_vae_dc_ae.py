"""The DC-AE's (engine.vae.dc_ae) full-decode memory against its estimate (estimate.K_ACT_DC and K_HEAD_DC):
peak RSS above the process before the decode, each size in a fresh process, the f32c32 release's layout at
a reduced width (`--ch`: the first stage's; the release's is 128) with random weights.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_vae_dc_ae.py --ch 32 --sizes 512 768 1024
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _vae(ch: int):
    import diffusers
    import torch

    from engine.vae.dc_ae_loading import build
    from engine.vae.loading import _made, strict_load

    widths = (ch, 2 * ch, 4 * ch, 4 * ch, 8 * ch, 8 * ch)
    cfg = dict(latent_channels=32, encoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
               decoder_block_types=("ResBlock",) * 3 + ("EfficientViTBlock",) * 3,
               encoder_block_out_channels=widths, decoder_block_out_channels=widths,
               encoder_layers_per_block=(2, 2, 2, 3, 3, 3), decoder_layers_per_block=(3, 3, 3, 3, 3, 3),
               encoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
               decoder_qkv_multiscales=((), (), (), (5,), (5,), (5,)),
               downsample_block_type="conv", upsample_block_type="interpolate")  # fmt: skip
    torch.manual_seed(0)
    sd = {k: v.clone() for k, v in diffusers.AutoencoderDC(**cfg).state_dict().items()}
    return build(sd, "bench", strict_load, _made)


def run_child(cfg: dict) -> dict:
    import psutil
    import torch

    torch.set_num_threads(2)
    from engine.vae import decode
    from engine.vae.estimate import activation_bytes, spec_of

    vae = _vae(cfg["ch"])
    s = cfg["size"]
    z = torch.randn(1, 32, s // 32, s // 32, generator=torch.Generator().manual_seed(1))
    base = psutil.Process().memory_info().rss
    t0 = time.perf_counter()
    decode(vae, z, tiled=False)
    seconds = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    est = activation_bytes(spec_of(vae), "decode", s * s, 4)
    return {"size": s, "seconds": seconds, "measured": peak - base, "estimate": est}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ch", type=int, default=32)
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 768, 1024])
    ap.add_argument("--child")
    a = ap.parse_args()
    if a.child:
        print(json.dumps(run_child(json.loads(a.child))))
        return
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for s in a.sizes:
        r = subprocess.run([sys.executable, __file__, "--child", json.dumps({"ch": a.ch, "size": s})],
                           capture_output=True, text=True, env=env, check=True)  # fmt: skip
        r = json.loads(r.stdout.strip().splitlines()[-1])
        print(
            f"{s}px ch{a.ch}: measured {r['measured'] / 2**20:.0f} MiB, estimate {r['estimate'] / 2**20:.0f} MiB "
            f"({r['estimate'] / max(1, r['measured']):.2f}x), {r['seconds']:.1f} s"
        )


if __name__ == "__main__":
    main()
