"""The memory graph's sample history: preallocated numpy columns the graph plots as views, so adding a
sample costs a few scalar stores and drawing never converts Python lists (the graph's old cost)."""

from __future__ import annotations

import numpy as np

from engine.memory import label_with_file

GIB = 1024**3
LINES = ("used", "total", "allocated", "reserved", "ram")


class SampleHistory:
    """At most `capacity` samples, oldest dropped first. Columns live in buffers of twice the capacity:
    appends fill the buffer and, when it is full, the newest `capacity` samples move to its front once
    (amortised O(1) per sample), so every column is always one contiguous view — no copy to plot it."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._size = 2 * capacity
        self._start = 0
        self._end = 0
        self._t = np.empty(self._size)
        self._lines = np.full((len(LINES), self._size), np.nan)
        self._areas: dict[str, np.ndarray] = {}  # component key -> device GiB per sample (0 when absent)
        self.labels: dict[str, str] = {}  # component key -> its newest label
        self.stack_max = 0.0  # highest stacked-area top kept (sum of components), in GiB
        self.line_max = dict.fromkeys(LINES, 0.0)  # highest finite value kept per line, in GiB

    def __len__(self) -> int:
        return self._end - self._start

    @property
    def t(self) -> np.ndarray:
        return self._t[self._start : self._end]

    def line(self, key: str) -> np.ndarray:
        return self._lines[LINES.index(key), self._start : self._end]

    @property
    def lines(self) -> dict[str, np.ndarray]:
        return {k: self._lines[i, self._start : self._end] for i, k in enumerate(LINES)}

    @property
    def areas(self) -> dict[str, np.ndarray]:
        """Component bands by their label, in the order they first appeared (the stacking order)."""
        return {label: col for _, label, col in self.bands()}

    def bands(self) -> list[tuple[str, str, np.ndarray]]:
        """(key, label, column) of each component band, in stacking order. The label is the newest the
        engine gave; where two bands would read the same (a component unloaded, another of its name loaded
        from another file) each says its file."""
        seen: dict[str, int] = {}
        for label in self.labels.values():
            seen[label] = seen.get(label, 0) + 1
        return [(k, label_with_file(k) if seen[self.labels[k]] > 1 else self.labels[k], col[self._start : self._end])
                for k, col in self._areas.items()]  # fmt: skip

    def append(
        self,
        t: float,
        values: dict[str, float],
        components: dict[str, float],
        labels: dict[str, str] | None = None,
    ) -> None:
        """One sample: `values` per line in GiB (NaN = unknown), `components` device GiB per component key,
        `labels` the keys' labels now (default: the key)."""
        if self._end == self._size:
            self._compact()
        i = self._end
        self._t[i] = t
        for j, k in enumerate(LINES):
            v = values[k]
            self._lines[j, i] = v
            if v > self.line_max[k]:  # NaN compares false: unknown values never raise the maximum
                self.line_max[k] = v
        for name in components:
            if name not in self._areas:
                self._areas[name] = np.zeros(self._size)
            self.labels[name] = labels.get(name, name) if labels else name
        stack = 0.0
        for name, col in self._areas.items():
            v = components.get(name, 0.0)
            col[i] = v
            stack += v
        self.stack_max = max(self.stack_max, stack)
        self._end = i + 1
        if len(self) > self.capacity:
            self._start += 1

    def _compact(self) -> None:
        """Move the kept samples to the front of each buffer; maxima are recomputed over what is kept."""
        n = len(self)
        s, e = self._start, self._end
        self._t[:n] = self._t[s:e]
        self._lines[:, :n] = self._lines[:, s:e]
        for col in self._areas.values():
            col[:n] = col[s:e]
        self._start, self._end = 0, n
        for j, k in enumerate(LINES):
            vals = self._lines[j, :n]
            finite = vals[np.isfinite(vals)]
            self.line_max[k] = max(0.0, float(finite.max())) if len(finite) else 0.0
        self.stack_max = float(sum(col[:n] for col in self._areas.values()).max()) if self._areas else 0.0
