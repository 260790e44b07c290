"""What the 2026 backbone rules share: one model's keys under its prefix, looked up by exact name or by a
`#` pattern (any block number), so a rule reads a shard that holds blocks 20-29 as well as the whole file.

Rules decide from per-block keys (present in every shard) wherever the architecture allows, and from the
stem keys (patch embedding, head) only for what nothing else tells; a shard without them says so in its
evidence rather than guessing.
"""

from __future__ import annotations

from .backbone import PREFERRED_PREFIXES, Backbone
from .keys import KeyIndex

_NOT_BACKBONE = ("model_ema.", "control_model.", "first_stage_model.", "cond_stage_model.", "conditioner.")


class View:
    """One model's keys under `prefix`."""

    def __init__(self, ix: KeyIndex, prefix: str):
        self.ix = ix
        self.prefix = prefix

    def key(self, suffix: str) -> str | None:
        """The full key of prefix + suffix (`#` = any block number, lowest first), or None."""
        if "#" not in suffix:
            k = self.prefix + suffix
            return k if self.ix.has(k) else None
        return self.ix.locate(suffix).get(self.prefix)

    def has(self, suffix: str) -> bool:
        return self.key(suffix) is not None

    def shape(self, suffix: str) -> tuple[int, ...] | None:
        k = self.key(suffix)
        return None if k is None else self.ix.shape(k)

    def dim(self, suffix: str, i: int) -> int | None:
        s = self.shape(suffix)
        return s[i] if s is not None and -len(s) <= i < len(s) else None

    def numbers(self, suffix: str) -> list[int]:
        """The block numbers present for a per-block suffix with one `#` (`blocks.#.attn.q.weight`)."""
        pos = len(self.prefix.split(".")) - 1 + suffix.split(".").index("#")
        return sorted({int(k.split(".")[pos]) for p, k in self.ix.matches(suffix) if p == self.prefix})

    def blocks(self, suffix: str) -> str:
        """How many blocks the file holds, for evidence: "40 blocks", or "blocks 8-15 (part of a sharded
        model)" when the numbers do not start at 0."""
        nums = self.numbers(suffix)
        if not nums:
            return "no blocks"
        if nums[0] == 0 and nums[-1] == len(nums) - 1:
            return f"{len(nums)} blocks"
        return f"blocks {nums[0]}-{nums[-1]} (part of a sharded model)"

    def because(self, b: Backbone, suffix: str, reason: str) -> None:
        key = self.key(suffix) or self.prefix + suffix
        b.because(self.ix, key, reason)


def find_view(ix: KeyIndex, suffix: str, *also: str) -> View | None:
    """The model whose keys hold `suffix` (and every `also` suffix), under the usual prefix if several."""
    cands = [
        p
        for p in ix.locate(suffix)
        if not p.startswith(_NOT_BACKBONE) and all(View(ix, p).has(a) for a in also)
    ]
    if not cands:
        return None
    for p in PREFERRED_PREFIXES:
        if p in cands:
            return View(ix, p)
    return View(ix, min(cands, key=len))


def variant(task: str | None, size: str | None) -> str | None:
    """The variant string of the README's contract: `<task>-<size>`, a part the header cannot tell left out."""
    parts = [p for p in (task, size) if p]
    return "-".join(parts) if parts else None
