"""A tiled pass's GroupNorm statistics: the whole image's, gathered from the tiles' cores.

Each tile's core gives per-channel moments (count, mean, M2 = the sum of squared deviations); when
the pass ends, all of them are combined at once into each group's, in float64, by the parallel
formula of Chan et al. over every (tile, channel) of the group -- the law of total variance over the
channels in the same step. Per tile that is three kernels: a sum, and per band of rows a difference
and a norm. Combining is a fixed dozen per pass, whatever the number of tiles (it was two dozen with
the channels' statistics formed first: with the scale and shift, 30 of a 1024^2 decode's ~130 kernels
a pass in 9 tiles). On a GPU, where a
tiled decode is bound by launching kernels, this matters: combining pairwise, tile by tile, and
forming groups per tile cost ~20 kernels a tile at every GroupNorm (225 calls, ~4,500 of the ~14,700
kernels of a 1024^2 SD-VAE decode, benchmarks/gpu/2026-11-26-h100-kl-tiled-profile.txt).
"""

from __future__ import annotations

import torch

from .. import ops


def channel_moments(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Per-(N, C) sum and centred norm (float32) of x (N, C, H, ...) — the norm's square is the M2 —
    and the count per channel. Two passes: the sum, then the norm of the distances from the mean, a
    band of rows at a time, so a non-contiguous crop of x is never copied whole (a band's difference
    is its one float32 temporary: x's dtype is promoted, and the mean taken from the sum, in the
    subtraction itself). As stable as Welford's var_mean (the second pass is centred) and 5x sooner
    on the CPU: 16 ms against 94 ms for 32 x 1028^2 in float32, 2 threads. Three kernels for a core in
    one band (squares and means are taken once per pass, in Moments.stats)."""
    n, c = x.shape[:2]
    dims = tuple(range(2, x.dim()))
    m = x[0, 0].numel()
    total = x.sum(dim=dims, dtype=torch.float32)
    shift = total.view(n, c, *([1] * len(dims)))
    rows = max(1, ops.band_bytes(x.device) // max(1, n * c * x[0, 0, 0].numel() * 4))
    norms = [
        torch.linalg.vector_norm(torch.sub(x[:, :, r : r + rows], shift, alpha=1 / m), dim=dims)
        for r in range(0, x.shape[2], rows)
    ]
    norm = norms[0] if len(norms) == 1 else torch.linalg.vector_norm(torch.stack(norms), dim=0)
    return total, norm, m


class Moments:
    """The per-channel moments of one pass's cores, for a batch of n items (each part's rows are one
    or more tiles' n items), turned into the whole image's per-group statistics at the pass's end."""

    def __init__(self, n: int):
        self.n = n
        self.parts: list[tuple[torch.Tensor, torch.Tensor, int]] = []

    def add(self, core: torch.Tensor) -> None:
        """A core, or several tiles' cores stacked along the batch (the same region of each)."""
        self.parts.append(channel_moments(core))

    def stats(self, num_groups: int) -> ops.GroupStats:
        n, parts = self.n, self.parts
        c = parts[0][0].shape[1]
        g, per = num_groups, c // num_groups
        # every part's sums, then every part's norms, in one tensor: (sum | norm, tile, n, group, channel)
        both = torch.cat([p[0] for p in parts] + [p[1] for p in parts]).double().view(2, -1, n, g, per)
        sum_p, norm_p = both[0], both[1]
        per_part = [m for total, _, m in parts for _ in range(total.shape[0] // n)]
        count = torch.tensor(per_part, dtype=torch.float64).view(-1, 1, 1, 1)
        if sum_p.is_cuda:  # from pinned memory: a copy from pageable memory would wait for the GPU
            count = count.pin_memory().to(sum_p.device, non_blocking=True)
        total = float(sum(per_part)) * per  # elements per (item, group)
        # Chan et al. over every (part, channel) of a group at once: the parts' M2 plus each one's count
        # times its mean's squared distance from the group's mean (the law of total variance, in one)
        mean = sum_p.sum(dim=(0, 3)) / total  # (n, G)
        dev = (sum_p / count - mean.unsqueeze(2)).square_() * count
        m2 = norm_p.square_().sum(dim=(0, 3)) + dev.sum(dim=(0, 3))
        return ops.GroupStats(mean, m2 / total)
