"""The SD1.5 UNet's 2-D convolutions on the CPU: Loadout's Conv2d (which runs a convolution over few
output positions with many channels as unfold + GEMM, engine.ops.conv_as_gemm) against torch's own
conv2d (oneDNN), on the same inputs and weights, float32.

The convolutions are every Conv2d call of the SD1.5 UNet at a 64×64 latent (512² pixels), batch 1 and
batch 2 (classifier-free guidance), as diffusers' model makes them, in its order: the calls are
collected from a forward on the meta device (no weights, no arithmetic), then replayed with random
weights (1.7 GB) — in order, because oneDNN's choice and cost for one call depends on what ran before
it (timed alone, 1280->1280 at 8×8 takes 14 or 30 ms). Each side replays the whole sequence per round,
rounds interleaved; the best round counts. SDXL is not timed: at its sizes no call reaches the rule's
threshold (`gemm_calls` says how many would at 1024²).

Lines: conv_<sd15|sd15_cfg>_gemm_vs_onednn, the ratio of the sequence's times (goal <= 1), with the
calls the rule sent to the GEMM.

Usage: bench_conv_gemm.py [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import record  # noqa: E402

# diffusers' configs (runwayml/stable-diffusion-v1-5 and stabilityai/stable-diffusion-xl-base-1.0
# unet/config.json values)
SD15 = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3, cross_attention_dim=768, attention_head_dim=8,
)  # fmt: skip
SDXL = dict(
    sample_size=128, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(320, 640, 1280),
    down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
    up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"), transformer_layers_per_block=(1, 2, 10),
    attention_head_dim=(5, 10, 20), cross_attention_dim=2048, use_linear_projection=True,
    addition_embed_type="text_time", addition_time_embed_dim=256, projection_class_embeddings_input_dim=2816,
)  # fmt: skip


def conv_calls(config: dict, latent: int, batch: int) -> list[tuple]:
    """(weight shape, stride, padding, input shape) of every Conv2d call of diffusers' UNet, in order."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        unet = UNet2DConditionModel(**config)
    calls: list[tuple] = []

    def hook(mod, inp):
        calls.append((tuple(mod.weight.shape), tuple(mod.stride), tuple(mod.padding), tuple(inp[0].shape)))

    for mod in unet.modules():
        if isinstance(mod, torch.nn.Conv2d):
            mod.register_forward_pre_hook(hook)
    with torch.device("meta"), torch.inference_mode():
        x = torch.empty(batch, 4, latent, latent)
        t = torch.empty(batch)
        ctx = torch.empty(batch, 77, config["cross_attention_dim"])
        extra = {}
        if config.get("addition_embed_type") == "text_time":
            extra = {
                "added_cond_kwargs": {
                    "text_embeds": torch.empty(batch, 1280),
                    "time_ids": torch.empty(batch, 6),
                }
            }
        unet(x, t, ctx, **extra)
    return calls


def best_ms(fn, repeat: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    import torch

    from engine import ops

    g = torch.Generator().manual_seed(0)
    sdxl_gemm = 0
    for wshape, stride, padding, xshape in conv_calls(SDXL, 128, 1):
        w = torch.empty(wshape, device="meta")
        sdxl_gemm += ops.conv_as_gemm(_Shape(xshape), w, stride, padding, (1, 1), 1)
    for name, batch in (("sd15", 1), ("sd15_cfg", 2)):
        calls = conv_calls(SD15, 64, batch)
        best, gemm = replay(calls, g, a.repeat)
        record(
            f"conv_{name}_gemm_vs_onednn",
            best["ours"],
            "s",
            baseline="torch conv2d (oneDNN), the same convolutions in the same order",
            baseline_value=best["onednn"],
            goal=1.0,
            latent=64,
            batch=batch,
            calls=len(calls),
            gemm_calls=sum(gemm.values()),
            gemm_shapes=[
                {"input": list(k[0]), "weight": list(k[1]), "stride": k[2], "calls": n}
                for k, n in gemm.items()
            ],
            sdxl_1024_gemm_calls=sdxl_gemm,
        )


def replay(calls: list[tuple], g, repeat: int) -> tuple[dict, Counter]:
    """The calls with random weights, through torch's conv2d and through Loadout's Conv2d, interleaved:
    the best time of each, and which calls went to the GEMM."""
    import torch
    import torch.nn.functional as F

    from engine import ops

    convs, inputs, gemm = [], [], Counter()
    with torch.inference_mode():
        for wshape, stride, padding, xshape in calls:
            op = ops.Conv2d(wshape[1], wshape[0], wshape[2:], stride=stride, padding=padding)
            op.weight = torch.nn.Parameter(
                torch.randn(wshape, generator=g) / wshape[1] ** 0.5, requires_grad=False
            )
            op.bias = torch.nn.Parameter(torch.randn(wshape[0], generator=g) * 0.1, requires_grad=False)
            x = torch.randn(xshape, generator=g)
            convs.append(op)
            inputs.append(x)
            if ops.conv_as_gemm(x, op.weight, stride, padding, op.dilation, op.groups):
                gemm[(tuple(xshape), tuple(wshape), stride[0])] += 1

        def onednn():
            for op, x in zip(convs, inputs, strict=True):
                F.conv2d(x, op.weight, op.bias, op.stride, op.padding)

        def ours():
            for op, x in zip(convs, inputs, strict=True):
                op(x)

        onednn(), ours()  # warm: oneDNN's primitive cache, the first touch of every weight
        best = {"onednn": float("inf"), "ours": float("inf")}
        for _ in range(repeat):
            for side, fn in (("onednn", onednn), ("ours", ours)):
                t0 = time.perf_counter()
                fn()
                best[side] = min(best[side], time.perf_counter() - t0)
    return best, gemm


class _Shape:
    """Just enough of a CPU float32 tensor for ops.conv_as_gemm to decide on a shape."""

    def __init__(self, shape):
        import torch

        self.shape, self.device, self.dtype = shape, torch.device("cpu"), torch.float32

    def dim(self) -> int:
        return len(self.shape)


if __name__ == "__main__":
    main()
