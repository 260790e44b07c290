"""The residency manager: where every module of every loaded component lives, and the policy that
decides it under a budget. ComfyUI's load_models_gpu / free_memory done as an inspectable ledger.

One thread (the engine worker) calls load / unload / move; any thread may call snapshot(). Components
are held weakly: one nobody references any more is collected and leaves the ledger by itself.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..devices import VRAMState
from ..errors import Cancelled, OutOfMemory
from ..events import EventLog, Evicted, JobCancelled, Loaded, PartiallyOffloaded, Tiers, Unloaded
from ..gcpause import gc_paused
from ..jobs import CancelToken, Progress, Report, no_report
from ..memory import default_probe
from ..model import transfer
from ..model.component import Component, Unit
from .evict import Unloading, _must_place
from .ledger import ComponentState, LedgerSnapshot, Policy
from .placement import place_modules

Probe = Callable[[], int]


@dataclass(eq=False)
class _Entry:
    ref: weakref.ref
    name: str
    path: str
    pinned: bool = False
    last_use: float = field(default_factory=time.monotonic)
    want_full: bool = True
    streamed: int = 0


class Residency(Unloading):
    """Loads components onto `device` under a budget; evicts, offloads and tops up by policy.

    `probe()` returns the device's free bytes (injectable: tests drive exact budgets with it)."""

    def __init__(
        self,
        device: str = "cpu",
        *,
        probe: Probe | None = None,
        policy: Policy | None = None,
        events: EventLog | None = None,
    ):
        import psutil

        self.device = device
        self.probe = probe or default_probe(device)
        self.policy = policy or Policy(
            vram_state=VRAMState.DISABLED if device == "cpu" else VRAMState.NORMAL_VRAM
        )
        self.events = events or EventLog()
        self._entries: dict[int, _Entry] = {}
        self._lock = threading.RLock()
        self._snapshot = LedgerSnapshot(time.time(), device, ())
        self._copier = None
        self._last_refresh = 0.0
        from ..model.transfer import PinnedAccount

        self.pinned = PinnedAccount(int(psutil.virtual_memory().total * self.policy.pinned_share))

    # -- reading -----------------------------------------------------------------------------------
    def snapshot(self) -> LedgerSnapshot:
        """The ledger now (thread-safe; a frozen copy)."""
        with self._lock:
            return self._snapshot

    def subscribe(self, fn) -> Callable[[], None]:
        return self.events.subscribe(fn)

    def components(self) -> list[Component]:
        with self._lock:
            return [c for e in self._entries.values() if (c := e.ref()) is not None]

    @classmethod
    def from_report(cls, report, *, events: EventLog | None = None, **policy_kw) -> Residency:
        """A manager for the device engine.devices selected, with its policy (keywords override);
        `events`: the log its events go to (the engine's own)."""
        return cls(
            report.selected.torch_device, policy=Policy.from_report(report, **policy_kw), events=events
        )

    def register_with_sampler(self) -> Callable[[], None]:
        """Feed engine.memory.sample()'s per-model residency from this ledger; returns the remover."""
        from .. import memory

        return memory.register_residency_provider(lambda: self.snapshot().per_model())

    def budget(self, extra_memory: int = 0) -> int:
        """Bytes that may still be placed on the device: free − minimum inference memory (which holds
        the reserve) − extra, capped by vram_budget minus what components already hold there."""
        p = self.policy
        b = self.probe() - p.min_inference - int(extra_memory)
        if p.vram_budget is not None:
            b = min(b, p.vram_budget - self._held(self.device, "device"))
        return max(0, int(b))

    def _held(self, device: str, tier: str) -> int:
        return sum(
            u.nbytes_now for c in self.components() if c.device == device for u in c.units if u.tier == tier
        )

    # -- bookkeeping -------------------------------------------------------------------------------
    def _register(self, c: Component) -> _Entry:
        key = id(c)
        e = self._entries.get(key)
        if e is not None and e.ref() is c:
            return e
        mgr = weakref.ref(self)

        def collected(_ref, key=key, name=c.name):
            m = mgr()
            if m is not None:
                m._forget(key, name)

        e = _Entry(weakref.ref(c, collected), c.name, c.path)
        with self._lock:
            self._entries[key] = e
        return e

    def _forget(self, key: int, name: str) -> None:
        # may run in any thread (the garbage collector's): touch no component, only the ledger
        with self._lock:
            e = self._entries.pop(key, None)
            old = self._snapshot
            rows = tuple(r for r in old.components if r.key != key)
            self._snapshot = LedgerSnapshot(time.time(), old.device, rows)
        if e is not None:
            self.events.emit(Unloaded(name, collected=True))
            self._empty_cache()

    def _refresh(self) -> None:
        """Rebuild the frozen snapshot from the components' real unit tiers."""
        rows = []
        with self._lock:
            for key, e in list(self._entries.items()):
                c = e.ref()
                if c is None:
                    continue
                t = c.tier_bytes()
                layers = tuple((u.path, u.tier, u.nbytes_now) for u in c.units)
                rows.append(
                    ComponentState(
                        key,
                        c.name,
                        c.path,
                        c.device,
                        t["device"],
                        t["ram"],
                        t["disk"],
                        c.full_bytes("device"),
                        e.last_use,
                        e.pinned,
                        layers,
                        e.streamed,
                    )
                )
            self._snapshot = LedgerSnapshot(time.time(), self.device, tuple(rows))

    def _find(self, component: Component | str) -> tuple[_Entry, Component] | None:
        with self._lock:
            for e in self._entries.values():
                c = e.ref()
                if c is not None and (c is component or (isinstance(component, str) and c.name == component)):
                    return e, c
        return None

    def pin(self, component: Component | str, pinned: bool = True) -> None:
        """Keep in VRAM: a pinned component is never evicted by the policy (only an explicit unload)."""
        found = self._find(component)
        if found is None and isinstance(component, Component):
            self._register(component)
            found = self._find(component)
        if found is not None:
            found[0].pinned = pinned
            self._refresh()

    def note_streamed(self, component: Component, nbytes: int) -> None:
        """Record what a forward pass of `component` streamed per step (the ledger shows it)."""
        e = self._register(component)
        e.streamed = int(nbytes)
        e.last_use = time.monotonic()
        self._refresh()

    # -- moving units ------------------------------------------------------------------------------
    def _copier_for(self, c: Component):
        if c.device == "cpu":
            return None
        if self._copier is None or str(self._copier.device) != str(c.device):
            from ..model.transfer import CopyEngine

            self._copier = CopyEngine(c.device)
        return self._copier

    def _offload_tier(self, c: Component, nbytes: int, keep: set) -> str:
        """Where a module leaving the device goes: the disk tier on a CPU device (RAM *is* the device);
        RAM on an accelerator while the RAM budget allows (evicting other RAM copies to disk first)."""
        if c.device == "cpu" or self.policy.offload_tier == "disk":
            return "disk"
        cap = self.policy.ram_budget
        if cap is None:
            return "ram"
        held = self._held(c.device, "ram")
        if held + nbytes <= cap:
            return "ram"
        self._evict_ram(held + nbytes - cap, keep | {id(c)})
        return "ram" if self._held(c.device, "ram") + nbytes <= cap else "disk"

    def _evict_ram(self, amount: int, keep: set) -> int:
        """Drop RAM copies of least-recently-used components back to the mmap until `amount` is free."""
        freed = 0
        with self._lock:
            order = sorted(self._entries.items(), key=lambda kv: kv[1].last_use)
        for key, e in order:
            c = e.ref()
            if c is None or key in keep:
                continue
            t0, n = time.perf_counter(), 0
            for u in sorted((u for u in c.units if u.tier == "ram"), key=lambda u: -u.nbytes_now):
                n += u.nbytes_now
                c.move_unit(u, "disk")
                if freed + n >= amount:
                    break
            if n:
                freed += n
                self._refresh()
                self.events.emit(
                    Evicted(
                        c.name,
                        n,
                        time.perf_counter() - t0,
                        source="ram",
                        target="disk",
                        tiers=Tiers.of(c.tier_bytes()),
                    )
                )
            if freed >= amount:
                break
        return freed

    def _move(self, c: Component, u: Unit, tier: str) -> int:
        moved = c.move_unit(u, tier, copier=self._copier_for(c), pinned=self.pinned)
        return moved

    # -- load ----------------------------------------------------------------------------------------
    def load(
        self,
        components: Iterable[Component],
        extra_memory: int = 0,
        *,
        token: CancelToken | None = None,
        report: Report = no_report,
    ) -> LedgerSnapshot:
        """Make `components` resident on their devices: free what is needed first (never a pinned
        component; partially offloaded, then least recently used first; stop once enough is free), then
        load fully, or module by module up to the budget with the rest on the offload tier."""
        comps = list(dict.fromkeys(components))
        keep = {id(c) for c in comps}
        for c in comps:
            e = self._register(c)
            e.last_use = time.monotonic()
            e.want_full = True
        state = self.policy.vram_state
        on_dev = [c for c in comps if c.device == self.device]
        need = sum(c.unit_bytes(u, "device") for c in on_dev for u in c.units if u.tier != "device")
        if state == "NO_VRAM":
            need = sum(c.unit_bytes(u, "device") for c in on_dev for u in c.units if _must_place(c, u))
        if state != "HIGH_VRAM" and need > self.budget(extra_memory):
            self.free(need - self.budget(extra_memory), keep=keep, token=token)
        budget = self.budget(extra_memory)
        total = sum(c.full_bytes("device") for c in comps)
        done = [0]
        try:
            with gc_paused():  # a tier move per module: no collections in between
                for c in comps:
                    budget -= self._fill(
                        c, budget if c.device == self.device else None, keep, token, report, done, total
                    )
        finally:
            self._refresh()
        return self.snapshot()

    def _fill(self, c, budget, keep, token, report, done, total, quiet=False) -> int:
        """Place c's units on its device within `budget` (None: no limit); returns device bytes added."""
        t0 = time.perf_counter()
        rest = [u for u in c.units if u.tier != "device"]
        sizes = [c.unit_bytes(u, "device") for u in rest]
        p = place_modules(sizes, [_must_place(c, u) for u in rest], budget, self.policy.vram_state)
        if p.short is not None:  # decided before anything moves, so an OOM leaves the ledger as it was
            raise OutOfMemory(
                f"{c.name}: {p.short[0]:,} bytes of tensors that must stay on the device do not fit in "
                f"the {p.short[1]:,} bytes left; free memory or raise --vram-budget."
            )
        chosen = [rest[i] for i in p.chosen]
        offloaded: list[Unit] = [rest[i] for i in p.offloaded]
        placed = moved = 0
        # then move in file order: sequential reads keep the kernel's readahead working on a cold file
        chosen.sort(key=lambda u: min(i.begin for i in u.infos.values()))
        full = False
        # RAM copies that map the file are populated on worker threads, all done before this returns
        # (cancelled or not), so the ledger below says what the process holds
        with transfer.populating():
            for u in chosen:
                size = c.unit_bytes(u, "device")
                if full:
                    offloaded.append(u)
                    continue
                try:
                    self._step(c, u, "device", token)
                except _DeviceFull:
                    offloaded.append(u)
                    full = True
                    continue
                placed += size
                moved += size
                done[0] += size
                report(Progress("load", done[0], total, c.name))
            for u in offloaded:
                tier = self._offload_tier(c, c.unit_bytes(u, "ram"), keep)
                if tier != u.tier:
                    moved += self._step(c, u, tier, token)
        self._refresh()
        dur = time.perf_counter() - t0
        t = c.tier_bytes()
        kind = Loaded if not any(u.tier != "device" for u in c.units) else PartiallyOffloaded
        if moved or not quiet:  # a top-up that found nothing to do is not an event
            self.events.emit(kind(c.name, moved, dur, device=c.device, tiers=Tiers.of(t)))
        return placed

    def _step(self, c: Component, u: Unit, tier: str, token: CancelToken | None) -> int:
        """One unit, between two cancel checks; a device OOM becomes _DeviceFull (the rest offloads)."""
        if token is not None and token.cancelled:
            self._refresh()
            t = c.tier_bytes()
            self.events.emit(JobCancelled(c.name, at=u.path, tiers=Tiers.of(t)))
            token.raise_if_cancelled()
        try:
            return self._move(c, u, tier)
        except Exception as e:
            import torch  # loaded already: a unit was just being moved

            if isinstance(e, torch.OutOfMemoryError):
                self._empty_cache()
                raise _DeviceFull() from e
            raise
        finally:
            self._refresh_unit_quick()

    def _refresh_unit_quick(self) -> None:
        # other threads see a load progress at least 20 times a second; every operation ends with a
        # full refresh, so the snapshot is exact whenever no operation is running
        now = time.monotonic()
        if now - self._last_refresh > 0.05:
            self._last_refresh = now
            self._refresh()

    def _empty_cache(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.empty_cache()


class _DeviceFull(Exception):
    pass


__all__ = ["Cancelled", "Residency"]
