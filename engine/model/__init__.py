"""Components as module trees over a checkpoint's own tensors (see component.py and tree.py)."""

from __future__ import annotations

from .component import TIERS, Component, Unit
from .dtypes import Placement, computes, place, role_of

__all__ = ["TIERS", "Component", "Placement", "Unit", "build_components", "computes", "place", "role_of"]


def build_components(
    path, prefixes: dict[str, str] | None = None, *, device: str = "cpu", report=None, **place_kw
) -> dict[str, Component]:
    """`path`: a file name or an open SafetensorsFile / GGUFFile (its header already read; a GGUF
    file's quantized tensors stay quantized, see engine.quant). One Component per
    (name -> key prefix) — by default the prefixes engine.detect finds (its
    `other` bucket is skipped) — with the device and dtypes the placement rules choose. `report` (an
    engine.devices.DeviceReport) supplies the device, its dtype facts, VRAM state and the user's
    dtype / --cpu-vae flags; `place_kw` overrides everything."""
    from ..formats import open_weights
    from ..formats.safetensors import SafetensorsFile

    f = path if isinstance(path, SafetensorsFile) else open_weights(path)
    path = f.path
    if prefixes is None:
        from ..detect.core import detect_index

        det = detect_index(f.index(), path=path)
        if det.error is not None and not det.components:
            from ..errors import FormatError

            raise FormatError(f"{path}: {det.error.message}")
        prefixes = {n: c.prefix for n, c in det.components.items() if n != "other"}
        place_kw.setdefault("architecture", det.architecture)
    info = None
    if report is not None:
        device = report.selected.torch_device
        info = report.selected
        place_kw.setdefault("vram_state", report.vram_state.value)
        if info.is_accelerator:  # the text-encoder rule compares free device and CPU memory
            import psutil

            from ..memory import default_probe

            place_kw.setdefault("free_device", default_probe(device)())
            place_kw.setdefault("free_cpu", int(psutil.virtual_memory().available))
    from ..gcpause import gc_paused

    with gc_paused():  # thousands of modules and parameters: no collections while they are made
        return {n: _build_one(f, n, p, device, info, report, place_kw) for n, p in prefixes.items()}


def _build_one(f, name: str, prefix: str, device: str, info, report, place_kw: dict) -> Component:
    """One component of the open file `f`: its placement from the rules, then its module tree."""
    from ..formats.dtypes import dominant_float_dtype

    infos = [i for k, i in f.header.tensors.items() if k.startswith(prefix)]
    file_dtype = dominant_float_dtype(i.dtype for i in infos)
    size = sum(i.nbytes for i in infos)
    kw = dict(place_kw)
    if report is not None:
        from .dtypes import overrides_from_options

        kw = {**overrides_from_options(name, report.options), **kw}
        if report.vae_device and name == "vae":
            kw.setdefault("force_device", report.vae_device)
    p = place(name, file_dtype, device, size_bytes=size, info=info, **kw)
    return Component(name, f, prefix, device=p.device, storage_dtype=p.storage_dtype,
                     compute_dtype=p.compute_dtype, architecture=kw.get("architecture"))  # fmt: skip
