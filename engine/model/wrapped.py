"""A component over a module that already exists — a VAE built by engine.vae, with its own forward — so
the residency manager can place, offload and unload it like any component built from a header.

Its units are the module's submodules that hold tensors of their own; the disk tier is the tensors as
the loader left them (zero-copy views of the file's mmap for safetensors and torch zip files), so
unloading rebinds those views and returns every copied byte. Moves copy from the bound tensors instead
of reading the file by offset, which also covers renamed or reshaped tensors (diffusers VAEs, TAESD).
"""

from __future__ import annotations

from ..formats.dtypes import DTYPES
from ..formats.safetensors import TensorInfo
from .component import TIERS, Component, Unit

_DISK = "_disk_tensors"  # Unit.extra key of the loader's own tensors (other keys cache byte counts)
_CODE = {torch_name: code for code, (_bits, torch_name) in DTYPES.items() if torch_name}


class ModuleComponent(Component):
    """`module`'s tensors as a component named `name` of the file `path`. `keys` maps a tensor's
    qualified name in the module to its key in the file (for LoRA lookups); by default the name itself."""

    reads_file = False

    def __init__(
        self,
        name: str,
        path: str,
        module,
        *,
        device: str = "cpu",
        storage_dtype: str | None = None,
        compute_dtype: str = "float32",
        key_prefix: str = "",
    ):
        from ..ops import Castable

        self.name = name
        self.file = None
        self.path = path
        self.prefix = key_prefix
        self.device = device
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        self.module = module
        self.units: list[Unit] = []
        for mpath, m in module.named_modules():
            own = {**dict(m.named_parameters(recurse=False)), **dict(m.named_buffers(recurse=False))}
            if not own:
                continue
            infos, keys = {}, {}
            for attr, t in own.items():
                full = f"{mpath}.{attr}" if mpath else attr
                n = t.numel() * t.element_size()
                code = _CODE.get(str(t.dtype).removeprefix("torch."), "F32")
                infos[attr] = TensorInfo(key_prefix + full, code, tuple(t.shape), 0, n)
                keys[attr] = key_prefix + full
            u = Unit(mpath, type(m).__name__, m, infos, keys, castable=isinstance(m, Castable))
            u.extra[_DISK] = {a: t.detach() for a, t in own.items()}
            self.units.append(u)
        for u in self.units:
            self._bind_disk(u)
        self.apply_dtypes()

    def _bind_disk(self, u: Unit) -> None:
        self._set(u, dict(u.extra[_DISK]))
        old, u.block = u.block, None
        if old is not None:
            old.release()
        u.tier = "disk"
        self._flags(u)

    def measured_tiers(self) -> dict[str, int]:
        """Bytes per tier read from the tensors: the loader's own tensors count as disk."""
        out = dict.fromkeys(TIERS, 0)
        for u in self.units:
            for attr in u.infos:
                t = getattr(u.module, attr)
                n = t.numel() * t.element_size()
                if t.device.type != "cpu":
                    out["device"] += n
                elif t.data_ptr() == u.extra[_DISK][attr].data_ptr():
                    out["disk"] += n
                else:
                    out["device" if self.device == "cpu" else "ram"] += n
        return out
