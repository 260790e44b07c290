"""Bake: merge a LoRA stack into a new .safetensors checkpoint. The one implementation behind the
window's Bake button and `loadout bake` (both reach it through the facade's Bake request).

The base may be a .safetensors file (zero-copy mmap views) or a pickled .ckpt / .pt / .bin (through
engine.formats.pickles' restricted loader). The output is written atomically and never over an input.
Runs in the engine thread; torch is imported by the call, not by importing this module.
"""

from __future__ import annotations

import hashlib
import json
import os

from .errors import FormatError, InvalidRequest, UnsupportedModel
from .jobs import CancelToken, Progress, Report, no_report
from .requests import Baked

COVERAGE_STAGE = "LoRA coverage"  # one Progress per LoRA, detail "FILE: M/N modules placed"


def bake(base: str, stack, out: str, token: CancelToken | None = None, report: Report = no_report) -> Baked:
    """Merge the enabled items of `stack` (engine.requests.StackItem) into `base` and write `out`.

    The output keeps the base's metadata and adds `loadout.bake`: JSON with the base's file name, one
    object per merged LoRA (file name, SHA-256, strengths, modules and how many were placed) and the
    number of weights patched.
    """
    from .patcher import LoraEntry, ModelPatcher

    token = token or CancelToken()
    items = [i for i in stack if i.enabled]
    _check_paths(base, [i.file for i in stack], [i.file for i in items], out)
    weights, metadata = _load_base(base)
    from .quant.scaled import dequantize_stored, requantize, scaled_weights

    # Scaled fp8 / int8 weights (ComfyUI's layouts) hold value / scale: a patch applies to the value,
    # so the weights the stack patches are dequantized first and stored back in their format after.
    scaled = scaled_weights(weights)
    patcher = ModelPatcher(weights)
    loras = []
    for n, item in enumerate(items):
        token.raise_if_cancelled()
        cov = patcher.coverage(item.file)
        loras.append(
            {
                "file": os.path.basename(item.file),
                "sha256": _sha256(item.file, token),
                "strength_model": item.strength_model,
                "strength_clip": item.strength_clip,
                "modules": cov.modules,
                "mapped": cov.mapped,
            }
        )
        report(
            Progress(
                COVERAGE_STAGE, n + 1, len(items), f"{item.file}: {cov.mapped}/{cov.modules} modules placed"
            )
        )
    entries = [LoraEntry(i.file, i.strength_model, i.strength_clip, True, n) for n, i in enumerate(items)]
    for key in scaled.keys() & patcher.plan(entries).keys():
        patcher.weights[key] = dequantize_stored(weights[key], weights[scaled[key]])
    applied = patcher.apply(entries, token=token, report=report)
    for key in scaled.keys() & set(applied.patched):
        patcher.weights[key], patcher.weights[scaled[key]] = requantize(
            patcher.weights[key], weights[key], weights[scaled[key]]
        )
    meta = dict(metadata)
    meta["loadout.bake"] = json.dumps(
        {"base": os.path.basename(base), "loras": loras, "patched_keys": len(applied.patched)}
    )
    token.raise_if_cancelled()
    from .formats.safetensors import save_tensors

    save_tensors(out, patcher.weights, meta)
    return Baked(os.path.abspath(out), os.path.getsize(out), len(applied.patched), tuple(loras))


def _check_paths(base: str, all_loras: list[str], used: list[str], out: str) -> None:
    """Refuse before reading anything: a missing input, an output that is not .safetensors, or one that
    is an input (the same path, a symlink to it or a hard link: writing would destroy it)."""
    for p in [base, *used]:
        if not os.path.isfile(p):
            raise FormatError(f"{p}: no such file", path=p)
    if not out.endswith(".safetensors"):
        raise InvalidRequest("Bake writes a .safetensors file: choose a name ending in .safetensors.")
    if os.path.exists(out) or os.path.islink(out):
        for p in [base, *all_loras]:
            if _same_file(out, p):
                raise InvalidRequest(f"{out} is one of the inputs ({p}): choose another file.")


def _same_file(a: str, b: str) -> bool:
    """True if the paths name one file: the same resolved path, or (hard link) the same inode."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _sha256(path: str, token: CancelToken) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            token.raise_if_cancelled()
    return h.hexdigest()


def _load_base(path: str) -> tuple[dict, dict]:
    """name -> tensor (zero-copy mmap views for safetensors) and the base's metadata ({} for a pickle)."""
    from .formats import sniff

    kind = sniff(path)
    if kind == "safetensors":
        from .formats.safetensors import SafetensorsFile

        f = SafetensorsFile(path)
        return {k: f.tensor(k) for k in f.header.tensors}, dict(f.header.metadata)
    if kind in ("torch-zip", "pickle"):
        from .formats.pickles import load_state_dict

        return load_state_dict(path), {}
    if kind == "gguf":
        raise UnsupportedModel(
            f"{path}: Loadout does not bake into GGUF files (it would have to quantize again); load the "
            "GGUF model with the LoRA stack instead (it is patched on the fly), or bake into its "
            "safetensors version",
            path=path,
        )
    raise FormatError(f"{path}: not a checkpoint Loadout can bake into (found: {kind})", path=path)
