"""Would channels-last weights speed up the SD VAE's decode on a GPU? cuDNN's fp16 convolutions compute in
NHWC, so NCHW activations are transposed in and out around every convolution (nchwToNhwc/nhwcToNchw: ~11 of
the tiled decode's 107 ms of GPU work and a third of its convolution launches on an H100). Converting only the
weights makes torch pick channels-last for the convolutions' outputs, so the activations stay in it.
Times full and 512-px tiled decodes (states on the device) with NCHW and channels-last weights, best of 3,
and under a 1 GiB budget (states in pinned host RAM), and the PSNR of each channels-last output against its NCHW one. Run from the repository root:

    python3 benchmarks/gpu/channels_last_probe.py [SIZE] [CH] [DEVICE]
"""

import copy
import sys
import time

sys.path.insert(0, ".")
sys.path.insert(0, "tests/engine")
import torch
from vae_fixtures import psnr, small_kl

from engine.vae import decode


def main() -> None:
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    ch = int(sys.argv[2]) if len(sys.argv) > 2 else 128
    dev = sys.argv[3] if len(sys.argv) > 3 else "cuda"
    dtype = torch.float16 if dev == "cuda" else torch.float32
    nchw = small_kl(ch=ch, seed=5).to(dev, dtype)
    cl = copy.deepcopy(nchw).to(memory_format=torch.channels_last)
    z = torch.randn(1, 4, size // 8, size // 8, generator=torch.Generator().manual_seed(1))

    def run(vae, **kw):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        y = decode(vae, z, device=dev, dtype=dtype, **kw)
        if dev == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0, y

    configs = (("full", {"tiled": False}), ("tiled 512", {"tiled": True, "tile": 512, "overlap": 64}),
               ("tiled, 1 GiB budget (host states)", {"tiled": True, "budget": 1 << 30}))  # fmt: skip
    for name, kw in configs:
        ref = None
        for label, vae in (("nchw", nchw), ("channels_last", cl), ("nchw", nchw), ("channels_last", cl)):
            try:
                times = []
                for _ in range(3):
                    t, y = run(vae, **kw)
                    times.append(round(t, 4))
                ref = y if label == "nchw" and ref is None else ref
                print(
                    name,
                    label,
                    times,
                    f"psnr vs nchw {psnr(y, ref):.1f} dB" if ref is not None else "",
                    flush=True,
                )
            except Exception as e:  # noqa: BLE001 (a probe: report and go on)
                print(name, label, "failed:", type(e).__name__, str(e)[:300], flush=True)


if __name__ == "__main__":
    main()
