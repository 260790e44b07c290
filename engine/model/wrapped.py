"""A component over a module that already exists — a VAE built by engine.vae, with its own forward — so
the residency manager can place, offload and unload it like any component built from a header.

Its units are the module's submodules that hold tensors of their own; the disk tier is the tensors as
the loader left them (zero-copy views of the file's mmap for safetensors and torch zip files), so
unloading rebinds those views and returns every copied byte. A tensor found in a safetensors header
under its own name (after the key prefix) is read from the file by offset, as Component does — reading
through the mmap would leave the file's pages mapped in the process and count them twice in its RSS;
other tensors (renamed or reshaped by the loader: diffusers VAEs, TAESD, .pth files) are copied from
the bound views.
"""

from __future__ import annotations

import os
import weakref
from collections import Counter

from ..formats.dtypes import DTYPES
from ..formats.safetensors import TensorInfo
from .component import DISK, TIERS, Component, Unit

_CODE = {torch_name: code for code, (_bits, torch_name) in DTYPES.items() if torch_name}


class ModuleComponent(Component):
    """`module`'s tensors as a component named `name` of the file `path`. A tensor's key (for LoRA
    lookups and the file offsets) is `key_prefix` + its qualified name in the module."""

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
        self.data_start = 0
        where = _file_offsets(path, key_prefix, module)
        self._fd = os.open(path, os.O_RDONLY) if where else -1
        if where:
            weakref.finalize(self, os.close, self._fd)
        for mpath, m in module.named_modules():
            own = {**dict(m.named_parameters(recurse=False)), **dict(m.named_buffers(recurse=False))}
            if not own:
                continue
            infos, keys = {}, {}
            for attr, t in own.items():
                full = f"{mpath}.{attr}" if mpath else attr
                n = t.numel() * t.element_size()
                code = _CODE.get(str(t.dtype).removeprefix("torch."), "F32")
                begin = where.get(full, -1)  # -1: not read from the file (see _in_file)
                infos[attr] = TensorInfo(key_prefix + full, code, tuple(t.shape), begin, begin + n)
                keys[attr] = key_prefix + full
            u = Unit(mpath, type(m).__name__, m, infos, keys, castable=isinstance(m, Castable))
            u.extra[DISK] = {a: t.detach() for a, t in own.items()}  # the base's _bind_disk rebinds these
            self.units.append(u)
        for u in self.units:
            self._bind_disk(u)
        self.apply_dtypes()

    @staticmethod
    def _in_file(info: TensorInfo) -> bool:
        return info.begin >= 0

    def measured_tiers(self) -> dict[str, int]:
        """Bytes per tier read from the tensors: the loader's own tensors count as disk."""
        out = dict.fromkeys(TIERS, 0)
        for u in self.units:
            for attr in u.infos:
                t = getattr(u.module, attr)
                n = t.numel() * t.element_size()
                if t.device.type != "cpu":
                    out["device"] += n
                elif t.data_ptr() == u.extra[DISK][attr].data_ptr():
                    out["disk"] += n
                else:
                    out["device" if self.device == "cpu" else "ram"] += n
        return out


def _file_offsets(path: str, prefix: str, module) -> dict[str, int]:
    """Qualified tensor name -> byte offset in the file, for the tensors a safetensors header holds
    under `prefix` + that name with the same size, and which are views of one mapping of that file
    (every view's address minus its file offset gives the same base: that proves where it lies)."""
    if not str(path).endswith((".safetensors", ".sft")):
        return {}
    from ..formats.safetensors import read_header

    header = read_header(path)
    found = {}
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        info = header.tensors.get(prefix + name)
        n = t.numel() * t.element_size()
        if info is None or info.nbytes != n or n == 0 or t.device.type != "cpu" or not t.is_contiguous():
            continue
        off = header.data_start + info.begin
        found[name] = (off, t.data_ptr() - off)
    if not found:
        return {}
    base, _ = Counter(b for _, b in found.values()).most_common(1)[0]
    return {name: off for name, (off, b) in found.items() if b == base}
