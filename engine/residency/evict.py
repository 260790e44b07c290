"""Freeing memory: eviction by policy, partial and full unloads, top-ups and explicit moves — the half of
the residency manager that takes modules off the device (a mixin of Residency; see manager.py)."""

from __future__ import annotations

import bisect
import time

from ..events import Evicted, Moved, PartiallyOffloaded, Tiers, Unloaded
from ..jobs import CancelToken, no_report
from ..model.component import Component, Unit
from .ledger import LedgerSnapshot


def _must_place(c: Component, u: Unit) -> bool:
    """Plain tensors (no castable op to move them in forward) must be on an accelerator to be used;
    on a CPU device the mmap views serve as they are."""
    return not u.castable and c.device != "cpu"


class Unloading:
    """free / unload / unload_all / after_job / top_up / move, over Residency's ledger and steps."""

    def free(self, amount: int, *, keep: set | None = None, token: CancelToken | None = None) -> int:
        """Free `amount` device bytes by policy; returns the bytes freed (may be less: pinned ones stay)."""
        keep = keep or set()
        with self._lock:
            cands = [
                (key, e, c)
                for key, e in self._entries.items()
                if (c := e.ref()) is not None and key not in keep and not e.pinned and c.device == self.device
            ]
        cands = [x for x in cands if x[2].tier_bytes()["device"] > 0]
        # partially offloaded first (most offloaded first), then least recently used
        cands.sort(key=lambda x: (-self._offloaded(x[2]), x[1].last_use))
        freed = 0
        for _key, _e, c in cands:
            if freed >= amount:
                break
            freed += self._offload(c, amount - freed, Evicted, keep, token)
        if freed:
            self._empty_cache()
        return freed

    @staticmethod
    def _offloaded(c: Component) -> int:
        t = c.tier_bytes()
        return t["ram"] + t["disk"] if t["device"] else 0

    def _pick(self, c: Component, amount: int | None) -> list[Unit]:
        """Modules to take off the device to free `amount` bytes (None: all). The plan: as few modules
        as possible with the least overshoot — the smallest module that covers what is left, else the
        largest — since a streamed module costs its bytes plus a fixed per-module transfer latency each
        forward; the bytes are the same whichever are chosen, so fewer, larger modules stream faster."""
        on = [u for u in c.units if u.tier == "device"]
        if amount is None:
            return on
        pool = sorted((u for u in on if not _must_place(c, u)), key=lambda u: u.nbytes_now)
        sizes = [u.nbytes_now for u in pool]
        chosen, rem = [], amount
        while rem > 0 and pool:
            i = bisect.bisect_left(sizes, rem)
            j = i if i < len(pool) else len(pool) - 1
            chosen.append(pool.pop(j))
            rem -= sizes.pop(j)
        if rem > 0:  # only modules that cannot stream remain: the component leaves the device entirely
            chosen += [u for u in on if _must_place(c, u)]
        return chosen

    def _offload(self, c: Component, amount: int | None, kind: type, keep: set, token) -> int:
        t0 = time.perf_counter()
        freed = moved = 0
        targets: set[str] = set()
        try:
            for u in self._pick(c, amount):
                n = u.nbytes_now
                tier = self._offload_tier(c, c.unit_bytes(u, "ram"), keep | {id(c)})
                targets.add(tier)
                moved += self._step(c, u, tier, token)
                freed += n
        finally:
            self._refresh()
            tiers = Tiers.of(c.tier_bytes())
            dur = time.perf_counter() - t0
            if kind is Evicted:
                self.events.emit(
                    Evicted(
                        c.name, freed, dur, target="+".join(sorted(targets)), requested=amount, tiers=tiers
                    )
                )
            else:
                self.events.emit(
                    PartiallyOffloaded(c.name, freed, dur, device=c.device, requested=amount, tiers=tiers)
                )
        return freed

    def unload(
        self, component: Component | str, nbytes: int | None = None, *, token: CancelToken | None = None
    ) -> int:
        """Free `nbytes` of the component's device memory (None: unload it completely — every module
        back onto the mmap, the ledger entry gone). Returns the bytes freed on the device (and, for a
        full unload, in RAM). Unloading something not loaded is a no-op returning 0."""
        found = self._find(component)
        if found is None:
            return 0
        e, c = found
        key = id(c)
        if nbytes is not None:
            e.want_full = False
            freed = self._offload(c, int(nbytes), PartiallyOffloaded, set(), token)
        else:
            t0 = time.perf_counter()
            before = c.tier_bytes()
            try:
                for u in list(c.units):
                    if u.tier != "disk":
                        self._step(c, u, "disk", token)
            finally:
                done = all(u.tier == "disk" for u in c.units)
                if done:
                    with self._lock:
                        self._entries.pop(key, None)
                self._refresh()
            freed = before["device"] + before["ram"]
            self.events.emit(Unloaded(c.name, freed, time.perf_counter() - t0, tiers=Tiers.of(before)))
        self._empty_cache()
        if self.policy.auto_top_up:
            self.top_up(exclude={key}, token=token)
        return freed

    def unload_all(self, *, token: CancelToken | None = None) -> int:
        """Unload every component (pinned ones too: this is an explicit request)."""
        freed = 0
        for c in self.components():
            freed += self.unload(c, token=token)
        return freed

    def rebudget(self, policy, *, token: CancelToken | None = None) -> int:
        """Adopt a new policy (a changed reserve or --vram-budget) keeping what is loaded, then evict by
        policy whatever no longer fits: device bytes above the new cap, or the shortfall when free
        memory is now below the minimum inference memory. Returns the bytes freed."""
        self.policy = policy
        over = 0
        if policy.vram_budget is not None:
            over = self._held(self.device, "device") - policy.vram_budget
        over = max(over, policy.min_inference - self.probe())
        freed = self.free(over, token=token) if over > 0 else 0
        self._refresh()
        return freed

    def after_job(self) -> None:
        """Call when a job ends: with disable_smart_memory everything is unloaded (ComfyUI's flag)."""
        if self.policy.disable_smart_memory:
            self.unload_all()

    def top_up(self, *, exclude: set | None = None, token: CancelToken | None = None) -> int:
        """Put partially offloaded components (most recently used first) back on the device as far as
        the budget now allows; returns the bytes placed."""
        if self.policy.vram_state == "NO_VRAM":
            return 0
        exclude = exclude or set()
        with self._lock:
            todo = sorted(
                ((k, e, c) for k, e in self._entries.items() if (c := e.ref()) is not None),
                key=lambda x: -x[1].last_use,
            )
        placed = 0
        for key, e, c in todo:
            if key in exclude or not e.want_full or c.device != self.device:
                continue
            if all(u.tier == "device" for u in c.units):
                continue
            if c.tier_bytes()["device"] == 0:
                continue  # evicted completely: it comes back when it is next used
            placed += self._fill(c, self.budget(), {key}, token, no_report, [0], 0, quiet=True)
        return placed

    def move(self, component: Component, where: str, *, token: CancelToken | None = None) -> LedgerSnapshot:
        """Explicit control: put the whole component on `where` now — "cpu" (runs on the CPU, weights in
        RAM), the manager's device (loaded there, by policy if it does not all fit), "ram" (kept for
        this device but offloaded to RAM) or "disk" (back on the mmap, still registered)."""
        from ..model.dtypes import compute_rule, inference_dtypes, role_of  # the rule for a new device

        e = self._register(component)
        c = component
        t0 = time.perf_counter()
        before = dict(c.tier_bytes(), device_name=c.device)
        if where in ("ram", "disk"):
            e.want_full = False
            for u in list(c.units):
                if u.tier != where and not (where == "ram" and c.device == "cpu" and u.tier == "device"):
                    self._step(c, u, where if c.device != "cpu" or where == "disk" else "disk", token)
        else:
            if where != c.device:
                for u in list(c.units):  # leave the old device first
                    if u.tier == "device":
                        self._step(c, u, "disk", token)
                c.device = where
                role = role_of(c.name)
                order = inference_dtypes(c.architecture if role == "diffusion" else None)
                c.compute_dtype = compute_rule(role, c.storage_dtype or _file_dtype(c), where, order=order)
                c.apply_dtypes()
            self.load([c], token=token)
        self._refresh()
        after = c.tier_bytes()
        moved = sum(abs(after[k] - before[k]) for k in after)
        self.events.emit(
            Moved(c.name, moved, time.perf_counter() - t0, source=before["device_name"], target=where,
                  tiers=Tiers.of(after))
        )  # fmt: skip
        return self.snapshot()


def _file_dtype(c: Component) -> str:
    from ..formats.dtypes import dominant_float_dtype

    return dominant_float_dtype(i.dtype for u in c.units for i in u.infos.values())
