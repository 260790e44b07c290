"""A component (UNet, a text encoder, the VAE): a module tree holding exactly the file's parameters,
each module ("unit") living in one of three tiers and moved between them one at a time.

* ``disk``: the parameters are zero-copy views of the file's mmap — built in milliseconds, costing no
  memory until read; an offloaded op casts / moves them on the fly in forward.
* ``ram``: a materialised copy in (possibly pinned) host memory, in the storage dtype.
* ``device``: on the compute device, in the storage dtype. When the device is the CPU, this tier *is* a
  copy in RAM, and the offload tier is the disk (mmap) tier.

A GGUF file's quantized tensors (ggml block types: Q8_0, Q4_K, ...) are held as their raw blocks in
every tier — a flat uint8 tensor, never converted to the storage dtype — and dequantized per op
(engine.ops, engine.quant), so every tier and the ledger count the quantized bytes.

Each unit is in exactly one tier; ``tier_bytes()`` counts the real bytes of the tensors it holds.
"""

from __future__ import annotations

import math
import os
import time
import weakref
from dataclasses import dataclass, field
from enum import Enum

from ..formats import open_weights
from ..formats.dtypes import torch_dtype
from ..formats.mapping import frombuffer
from ..formats.safetensors import SafetensorsFile, TensorInfo
from ..quant import is_block_type
from ..quant.scaled import is_companion
from . import transfer
from .tree import ModuleSpec, build_tree, module_specs


class Tier(str, Enum):
    """Where a module's tensors are: on the component's device, offloaded to RAM, or on the file's mmap."""

    DEVICE = "device"
    RAM = "ram"
    DISK = "disk"

    def __str__(self) -> str:
        return self.value


TIERS = (Tier.DEVICE, Tier.RAM, Tier.DISK)
DISK = "_disk_tensors"  # Unit.extra key of a unit's disk-tier tensors (other keys cache byte counts)
_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float64": 8}


@dataclass(eq=False)
class Unit:
    """One module with its own tensors: the smallest thing that moves between tiers."""

    path: str
    kind: str
    module: object
    infos: dict[str, TensorInfo]
    keys: dict[str, str]  # attr -> full key in the file
    tier: str = "disk"
    block: object = None  # HostBlock of a ram (or cpu-device) copy
    castable: bool = True
    nbytes_now: int = 0  # real bytes of the tensors it holds now
    extra: dict = field(default_factory=dict)

    def bytes_as(self, storage: str | None) -> int:
        """Bytes this unit takes when stored in `storage` (None: the file's dtypes)."""
        cached = self.extra.get(storage)
        if cached is not None:
            return cached
        n = 0
        for info in self.infos.values():
            float_ = info.dtype.startswith(("F", "BF")) and not is_companion(info.name)
            n += info.numel * _ITEMSIZE[storage] if storage and float_ else info.nbytes
        self.extra[storage] = n
        return n


def _held(info: TensorInfo, storage: str | None) -> tuple:
    """(torch dtype, shape) a tensor is held in: ggml blocks as their flat bytes, floats in the storage
    dtype when there is one, anything else as the file has it."""
    import torch

    if is_block_type(info.dtype):
        return torch.uint8, (info.nbytes,)
    # A scale stays float32: in an fp8 storage dtype it would lose the precision it exists for.
    if storage and info.dtype.startswith(("F", "BF")) and not is_companion(info.name):
        return getattr(torch, storage), info.shape
    return torch_dtype(info.dtype), info.shape


class Component:
    """A component built from the file's header, its parameters bound to the mmap (disk tier)."""

    architecture: str | None = None  # the file's (engine.detect's name): which dtypes a denoiser runs in

    @staticmethod
    def _in_file(info: TensorInfo) -> bool:
        """Whether a move off the disk tier reads this tensor from the file by offset (a ModuleComponent
        copies from the bound tensor where it cannot say where the tensor lies in the file)."""
        return True

    def __init__(
        self,
        name: str,
        file: SafetensorsFile | str | os.PathLike,
        prefix: str,
        *,
        device: str = "cpu",
        storage_dtype: str | None = None,
        compute_dtype: str = "float32",
        architecture: str | None = None,
    ):
        self.name = name
        self.architecture = architecture
        self.file = file if isinstance(file, SafetensorsFile) else open_weights(file)
        self.path = self.file.path
        self.prefix = prefix
        self.device = device
        self.storage_dtype = storage_dtype
        self.compute_dtype = compute_dtype
        header = self.file.header
        rel = [(k[len(prefix) :], info) for k, info in header.tensors.items() if k.startswith(prefix)]
        if not rel:
            from ..errors import FormatError

            raise FormatError(f"{self.path}: no tensors start with {prefix!r}: not a {name} in this file")
        specs: list[ModuleSpec] = module_specs(rel)
        self.module, by_path = build_tree(specs)
        self.units: list[Unit] = []
        interleaved = getattr(header, "interleaved", None) or {}
        for spec in specs:
            keys = {a: prefix + (f"{spec.path}." if spec.path else "") + a for a in spec.tensors}
            m = by_path[spec.path]
            if interleaved:
                _interleave(m, spec, keys, interleaved, self.path)
            self.units.append(
                Unit(spec.path, spec.kind, m, spec.tensors, keys, castable=spec.kind != "plain")
            )
        self._fd = os.open(self.path, os.O_RDONLY)
        weakref.finalize(self, os.close, self._fd)
        self.data_start = header.data_start
        for u in self.units:
            self._bind_disk(u)  # sets each unit's flags too

    # -- facts -------------------------------------------------------------------------------------
    @property
    def file_bytes(self) -> int:
        return sum(u.bytes_as(None) for u in self.units)

    def unit_bytes(self, u: Unit, tier: str) -> int:
        """Bytes `u` takes in `tier` (the disk tier keeps the file's dtypes)."""
        return u.bytes_as(None if tier == "disk" else self.storage_dtype)

    def full_bytes(self, tier: str = "device") -> int:
        return sum(self.unit_bytes(u, tier) for u in self.units)

    def tier_bytes(self) -> dict[str, int]:
        out = dict.fromkeys(TIERS, 0)
        for u in self.units:
            out[u.tier] += u.nbytes_now
        return out

    def measured_tiers(self) -> dict[str, int]:
        """Bytes per tier read from the tensors themselves (device, mmap or not) — the ledger's check."""
        mm_base = self.file._mm
        out = dict.fromkeys(TIERS, 0)
        for u in self.units:
            for attr in u.infos:
                t = getattr(u.module, attr)
                n = t.numel() * t.element_size()
                if t.device.type != "cpu":
                    out["device"] += n
                elif mm_base is not None and _in_mmap(t, self.file):
                    out["disk"] += n
                else:
                    out["device" if self.device == "cpu" else "ram"] += n
        return out

    # -- binding -----------------------------------------------------------------------------------
    def _set(self, u: Unit, tensors: dict) -> None:
        from torch import nn

        n = 0
        for attr, t in tensors.items():
            if attr in u.module._parameters:
                u.module._parameters[attr] = nn.Parameter(t, requires_grad=False)
            else:
                u.module._buffers[attr] = t
            n += t.numel() * t.element_size()
        u.nbytes_now = n

    def _disk_tensors(self, u: Unit) -> dict:
        """The unit's tensors on the disk tier: zero-copy views of the file's mapping, made once and
        kept (Unit.extra[DISK]) — an unload rebinds them instead of making ~1,100 views again, which was
        two thirds of unloading SD1.5 (36 of 55 ms). A kept view is the very memory a new one would
        be: the file is mapped once and nothing writes into a disk-tier tensor."""
        views = u.extra.get(DISK)
        if views is None:
            views = u.extra[DISK] = {a: self.file.tensor(k) for a, k in u.keys.items()}
        return views

    def _bind_disk(self, u: Unit) -> None:
        self._set(u, self._disk_tensors(u))
        old, u.block = u.block, None
        if old is not None:
            old.release()
        u.tier = "disk"
        self._flags(u)

    def _flags(self, u: Unit) -> None:
        import torch

        if u.castable:
            # Plain attributes, set in the instance dict: nn.Module.__setattr__ checks parameters,
            # buffers and submodules first, which was half of building a component's disk tier.
            d = u.module.__dict__
            d["offload"] = u.tier != "device"
            d["compute_dtype"] = getattr(torch, self.compute_dtype)
            # pinned RAM copies stream to the device asynchronously in forward (ordered on its stream)
            d["non_blocking"] = bool(u.block is not None and getattr(u.block, "pinned", False))

    def apply_dtypes(self) -> None:
        for u in self.units:
            self._flags(u)

    # -- moves -------------------------------------------------------------------------------------
    def move_unit(self, u: Unit, tier: str, *, copier=None, pinned=None) -> int:
        """Move one unit to `tier`; returns the bytes copied (0 for a rebind onto the mmap)."""
        if tier == u.tier:
            return 0
        if tier == "disk":
            self._bind_disk(u)
            return 0
        if tier == "ram" or self.device == "cpu":
            return self._to_host(u, tier, pinned)
        return self._to_device(u, copier)

    def _sources(self, u: Unit) -> dict:
        return {a: getattr(u.module, a) for a in u.infos}

    def _to_host(self, u: Unit, tier: str, pinned) -> int:
        import torch

        held = [_held(i, self.storage_dtype) for i in u.infos.values()]
        if (
            u.tier == "disk"
            and not (tier == "ram" and pinned is not None)
            and all(self._in_file(i) for i in u.infos.values())
            and all(dt == _held(i, None)[0] for (dt, _), i in zip(held, u.infos.values(), strict=True))
        ):
            return self._map_host(u, tier, held)
        sizes = [math.prod(shape) * dt.itemsize for dt, shape in held]
        offsets, total = transfer.layout(sizes)
        block = transfer.HostBlock(total, pinned if tier == "ram" else None)
        out, src = {}, self._sources(u)
        for (attr, info), off, (dt, shape) in zip(u.infos.items(), offsets, held, strict=True):
            dst = transfer.view_in(block, off, dt, shape)
            file_dt, _ = _held(info, None)
            if u.tier == "disk" and self._in_file(info) and dt == file_dt:
                transfer.read_into(self._fd, self.data_start + info.begin, dst)
            elif u.tier == "disk" and self._in_file(info):
                tmp = torch.empty(shape, dtype=file_dt)
                transfer.read_into(self._fd, self.data_start + info.begin, tmp)
                dst.copy_(tmp)
                del tmp
            else:
                dst.copy_(src[attr])
            out[attr] = dst
        del src
        old = u.block
        self._set(u, out)
        u.block, u.tier = block, tier
        if old is not None:
            old.release()
        self._flags(u)
        return total

    def file_block(self, u: Unit) -> transfer.FileBlock:
        """The unit's span of the file as a populated private mapping (transfer.FileBlock): a RAM copy
        that keeps the file's dtype (a streamed batch maps its own spans: engine.denoise.stream)."""
        start = self.data_start + min(i.begin for i in u.infos.values())
        end = self.data_start + max(i.end for i in u.infos.values())
        return transfer.FileBlock(self._fd, start, end)

    def _map_host(self, u: Unit, tier: str, held) -> int:
        """The unit's RAM copy as a populated private mapping of its bytes in the file (see
        transfer.FileBlock): its tensors keep the file's dtype, so nothing needs converting."""
        block = self.file_block(u)
        out = {
            attr: block.view(self.data_start + info.begin, dt, shape)
            for (attr, info), (dt, shape) in zip(u.infos.items(), held, strict=True)
        }
        old = u.block
        self._set(u, out)
        u.block, u.tier = block, tier
        if old is not None:
            old.release()
        self._flags(u)
        return sum(v.numel() * v.element_size() for v in out.values())

    def _to_device(self, u: Unit, copier) -> int:
        import torch

        out, src, moved = {}, self._sources(u), 0
        for attr, info in u.infos.items():
            dt, shape = _held(info, self.storage_dtype)
            file_dt, _ = _held(info, None)
            dst = torch.empty(shape, dtype=dt, device=self.device)
            if (
                u.tier == "disk"
                and self._in_file(info)
                and dt == file_dt
                and copier is not None
                and copier.cuda
            ):
                copier.from_file(self._fd, self.data_start + info.begin, dst)
            elif u.tier == "disk" and self._in_file(info):
                tmp = torch.empty(shape, dtype=file_dt)
                transfer.read_into(self._fd, self.data_start + info.begin, tmp)
                dst.copy_(tmp.to(dt))
                del tmp
            elif copier is not None:
                copier.copy(dst, src[attr])
            else:
                dst.copy_(src[attr])
            out[attr] = dst
            moved += dst.numel() * dst.element_size()
        if copier is not None:
            copier.sync()
        del src
        old = u.block
        self._set(u, out)
        u.block, u.tier = None, "device"
        if old is not None:
            old.release()
        self._flags(u)
        return moved

    def touch(self) -> float:
        self.last_use = time.monotonic()
        return self.last_use

    def __repr__(self) -> str:
        t = self.tier_bytes()
        return f"<Component {self.name} {self.device} device={t['device']} ram={t['ram']} disk={t['disk']}>"


def _in_mmap(t, file: SafetensorsFile) -> bool:
    import torch

    mm = file._mm
    if mm is None:
        return False
    base = frombuffer(mm, torch.uint8, 1, 0).data_ptr()
    return base <= t.data_ptr() < base + len(mm)


def _interleave(op, spec, keys: dict, interleaved: dict, path: str) -> None:
    """Mark the op's tensors whose rows a GGUF keeps in llama.cpp's rotary order (engine.quant.Interleaved):
    its forward dequantizes them in transformers' order."""
    import types

    from ..quant import Interleaved

    found = {a: interleaved[k] for a, k in keys.items() if k in interleaved}
    if not found:
        return
    if spec.kind != "linear":
        from ..errors import FormatError

        raise FormatError(f"{path}: {next(iter(found))} of {spec.path} is not a linear layer's: corrupt file")
    q = dict(op.quantized)
    for attr, heads in found.items():
        shape = tuple(spec.tensors[attr].shape)
        if shape[0] % (2 * heads):
            from ..errors import FormatError

            raise FormatError(
                f"{path}: {keys[attr]} has {shape[0]} rows, not whole heads of {heads}: corrupt file"
            )
        q[attr] = Interleaved(q.get(attr), heads, shape)
    op.quantized = types.MappingProxyType(q)
