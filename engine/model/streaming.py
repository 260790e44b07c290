"""What a partial forward's streaming holds beside the resident weights: the one rule the streamer sizes
itself by (engine.denoise.stream, engine.denoise.device_copies) and `loadout plan` predicts a step's
peak with. Pure arithmetic, no torch.

Streamed modules go in batches: runs of consecutive modules of up to the largest module's bytes, and
at least BATCH_MIN. On the CPU a batch passes through a ring of host memory (staged copies, or mapped
file pages counted against it) of `ring_bytes`; on a GPU the card holds at most FLIGHT_BATCHES
batches of streamed weights at once (copied, being computed from, or not yet passed by the GPU).
"""

from __future__ import annotations

MIN_RING = 64 * 1024 * 1024
# A batch gathers modules up to the largest module's bytes, and at least this many: the memory in flight
# stays what one large module would hold, while a model of many small ones (Wan's 30 blocks of ~12 modules
# each, a tiny-width test model) hands over tens of them at a time.
BATCH_MIN = 4 * 1024 * 1024
# GPU: double buffering, in batch caps. Batches counted ahead of the CPU's position (which runs ahead of
# the GPU) bounded nothing. On an H100 (benchmarks/gpu/*-flight-probe*), against no bound: SD1.5 at 10 %
# peaked 366 MB (463), FLUX.1 at 50 % 908 MB (1149), at 10 % 411 MB (581), in the same time within
# noise; 3 and 4 caps held more, no faster.
FLIGHT_BATCHES = 2


def batch_cap(largest: int, batch_min: int = BATCH_MIN) -> int:
    """The most bytes a batch gathers, for modules of at most `largest` bytes."""
    return max(largest, batch_min)


def ring_bytes(largest_batch: int, step_total: int, want: int | None = None) -> int:
    """The CPU ring: two of the largest batches at least (one computing, the next arriving), MIN_RING
    (or `want`) if more, never more than one step's worth (a small model streams whole without holding
    more than it reads), and always room for the largest batch."""
    return max(largest_batch, min(max(want or MIN_RING, 2 * largest_batch), step_total))


def in_flight_bytes(largest: int, streamed: int, accelerator: bool) -> int:
    """The most streamed bytes a partial step holds at once beside the resident weights, for modules of
    at most `largest` bytes and `streamed` bytes streamed per step: the card's bound on a GPU, the
    ring on the CPU."""
    if streamed <= 0:
        return 0
    cap = min(batch_cap(largest), streamed)
    if accelerator:
        return min(streamed, FLIGHT_BATCHES * cap)
    return ring_bytes(cap, streamed)
