"""The ledger's public face: frozen snapshots other threads (the GUI, the memory sampler) may read."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ..devices import VRAMState

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class Policy:
    """How the manager spends memory. Defaults are ComfyUI's documented facts
    (comfy/model_management.py): 400 MiB reserved for other programs (EXTRA_RESERVED_VRAM; 600 MiB on
    Windows, +100 MiB above 15 GiB), minimum inference memory 0.8 GiB + the reserve — so the reserve is
    counted once, inside it, as in engine.devices.budget_bytes — and pinned host memory capped at 40% of
    RAM (its Windows figure, the floor of its Linux rule)."""

    vram_state: VRAMState = VRAMState.NORMAL_VRAM
    reserve_bytes: int = 400 * MIB
    min_inference_bytes: int | None = None  # None: 0.8 GiB + reserve_bytes
    vram_budget: int | None = None  # --vram-budget: a cap on device bytes held by components
    ram_budget: int | None = None  # a cap on bytes held in the RAM tier (accelerator devices)
    offload_tier: str | None = None  # "ram" | "disk"; None: ram on accelerators, disk on the CPU
    pinned_share: float = 0.40
    disable_smart_memory: bool = False
    auto_top_up: bool = True

    @classmethod
    def from_report(cls, report, **kw) -> Policy:
        """The policy engine.devices chose (VRAM state, reserve, inference floor, --vram-budget,
        --disable-smart-memory); keywords override."""
        o = report.options
        base = dict(
            vram_state=report.vram_state,
            reserve_bytes=report.reserve_bytes,
            min_inference_bytes=report.min_inference_bytes,
            vram_budget=report.vram_budget_bytes,
            disable_smart_memory=o.disable_smart_memory,
        )
        base.update(kw)
        return cls(**base)

    def __post_init__(self) -> None:
        object.__setattr__(self, "vram_state", VRAMState(self.vram_state))  # "NO_VRAM" is accepted too

    @property
    def min_inference(self) -> int:
        if self.min_inference_bytes is not None:
            return self.min_inference_bytes
        return int(0.8 * GIB) + self.reserve_bytes


@dataclass(frozen=True)
class ComponentState:
    """One component's row of the ledger. `device_bytes` are on the component's own compute device
    (on a CPU device: materialised in RAM); `ram_bytes` are offloaded copies in host memory; `disk_bytes`
    stay on the file's mmap. `layers` is (module path, tier, bytes) for the layer map."""

    key: int
    name: str
    path: str
    device: str
    device_bytes: int
    ram_bytes: int
    disk_bytes: int
    full_bytes: int
    last_use: float
    pinned: bool
    layers: tuple[tuple[str, str, int], ...] = field(repr=False, default=())
    streamed_bytes: int = 0  # what its last forward pass streamed per step (engine.stepping)

    @property
    def resident(self) -> float:
        """Fraction of the component on its device (0..1)."""
        return self.device_bytes / self.full_bytes if self.full_bytes else 1.0

    def to_json(self) -> dict:
        d = asdict(self)
        d.pop("layers")
        d["resident"] = self.resident
        return d


@dataclass(frozen=True)
class LedgerSnapshot:
    time: float
    device: str
    components: tuple[ComponentState, ...]

    def get(self, name: str) -> ComponentState | None:
        return next((c for c in self.components if c.name == name), None)

    def total(self, column: str, device: str | None = None) -> int:
        return sum(getattr(c, column) for c in self.components if device is None or c.device == device)

    @property
    def device_bytes(self) -> int:
        """Bytes on the manager's device."""
        return self.total("device_bytes", self.device)

    @property
    def ram_bytes(self) -> int:
        return self.total("ram_bytes") + (self.total("device_bytes", "cpu") if self.device != "cpu" else 0)

    def per_model(self) -> dict[str, tuple[int, int, str]]:
        """label -> (device bytes, RAM bytes, key), the memory sampler's residency provider format. A name
        loaded from two files is labelled with the file name too; the key (file and name) stays the same
        when that relabels a component already shown, so a graph keeps drawing it as one band."""
        from ..memory import component_key, label_with_file

        counts: dict[str, int] = {}
        for c in self.components:
            counts[c.name] = counts.get(c.name, 0) + 1
        out = {}
        for c in self.components:
            key = component_key(c.path, c.name)
            label = c.name if counts[c.name] == 1 else label_with_file(key)
            ram = c.ram_bytes + (c.device_bytes if c.device == "cpu" and self.device != "cpu" else 0)
            dev = 0 if c.device == "cpu" and self.device != "cpu" else c.device_bytes
            out[label] = (dev, ram, key)
        return out

    def to_json(self) -> dict:
        return {
            "time": self.time,
            "device": self.device,
            "components": [c.to_json() for c in self.components],
        }
