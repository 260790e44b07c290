"""Scaled low-precision weights, as ComfyUI stores them: a weight in fp8 (or int8) beside a float32
scale, applied per op, on the fly (the weight keeps its one byte per element in every tier).

Layouts (facts from ComfyUI `comfy/model_detection.py`, `comfy/ops.py` and `comfy/quant_ops.py`, and
the files it writes; cited, not copied):

* **scaled fp8** (legacy): `<layer>.weight` F8_E4M3 (or F8_E5M2), `<layer>.scale_weight` F32 (a scalar,
  or one value per output row), optionally `<layer>.scale_input` (used only by fp8 matmuls), and a
  marker tensor `scaled_fp8` at the model's root whose dtype names the format. Value = weight · scale.
* **comfy_quant** (per layer): `<layer>.comfy_quant`, a U8 tensor holding a JSON config such as
  `{"format": "float8_e4m3fn"}`, with `<layer>.weight_scale` (and `input_scale`); or the same per-layer
  formats in the header's `_quantization_metadata`. The formats seen in the field:
  - `float8_e4m3fn`, `float8_e5m2`: an fp8 weight and a per-tensor F32 `weight_scale` — loaded here;
  - int8 tensorwise: an I8 weight and an F32 `weight_scale` — loaded here;
  - `mxfp8` (OCP MX: fp8 values with one E8M0 power-of-two scale per 32 values, U8 `weight_scale`
    blocks) and `nvfp4` (two E2M1 values per byte, fp8 E4M3 scales per 16 values and an F32
    `weight_scale_2`): named, and refused (see `check_format`).

Header-only: the format is told from the tensors' dtypes and shapes; the JSON in `comfy_quant` is data
and is not needed to decide.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from ..errors import UnsupportedModel

# Tensors that travel with a quantized weight and are not module parameters of their own.
COMPANIONS = frozenset(
    {"scale_weight", "scale_input", "weight_scale", "input_scale", "weight_scale_2", "comfy_quant"}
)
_FP8 = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2"}
LOADED_FORMATS = ("scaled_fp8", "float8_e4m3fn", "float8_e5m2", "int8_tensorwise")


def is_companion(name: str) -> bool:
    """Whether a tensor (a key or attribute name) is a quantized weight's companion: kept in its own
    dtype in every tier, never cast to the storage dtype."""
    return name.rsplit(".", 1)[-1] in COMPANIONS


def format_of(tensors: Mapping[str, object]) -> str | None:
    """The scaled format of one module from its tensors (attr -> info with .dtype and .shape), or None
    when its weight is not scaled. Formats Loadout cannot compute are returned by name too."""
    w = tensors.get("weight")
    if w is None:
        return None
    if "scale_weight" in tensors:
        return "scaled_fp8" if w.dtype in _FP8 else f"scaled {w.dtype}"
    scale = tensors.get("weight_scale")
    if scale is None and "comfy_quant" not in tensors:
        return None
    if "weight_scale_2" in tensors or w.dtype == "U8":
        return "nvfp4"
    if scale is not None and scale.dtype == "U8":
        return "mxfp8"
    if w.dtype in _FP8:
        return _FP8[w.dtype]
    if w.dtype == "I8":
        return "int8_tensorwise"
    return f"comfy_quant {w.dtype}"


def check_format(fmt: str, where: str = "") -> str:
    """`fmt` when Loadout loads it, else UnsupportedModel naming it with what to use instead."""
    if fmt in LOADED_FORMATS:
        return fmt
    why = {
        "nvfp4": "nvfp4 (4-bit E2M1 values with fp8 block scales) is computed by Blackwell GPUs' kernels",
        "mxfp8": "mxfp8 (fp8 values with power-of-two scales per 32) needs block-scaled kernels",
    }.get(fmt, f"{fmt} weights")
    raise UnsupportedModel(
        f"{where}{why}; Loadout cannot load this format yet. Use the model's fp8 (float8_e4m3fn), "
        "scaled-fp8, GGUF or 16-bit file instead."
    )


def formats_in_metadata(metadata: Mapping[str, str]) -> set[str]:
    """Formats named in a header's `_quantization_metadata` (ComfyUI's per-layer configs), if any."""
    raw = metadata.get("_quantization_metadata")
    if not raw:
        return set()
    try:
        obj = json.loads(raw)
    except ValueError:
        return set()
    found: set[str] = set()

    def walk(x) -> None:
        if isinstance(x, dict):
            f = x.get("format")
            if isinstance(f, str):
                found.add(f)
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(obj)
    return found


@dataclass(frozen=True)
class ScaledSpec:
    """How an op computes with a scaled weight: value = stored · scale, the scale in `scale_attr`."""

    fmt: str
    scale_attr: str
    shape: tuple[int, ...]

    def bind(self, op) -> _Bound:
        return _Bound(self, getattr(op, self.scale_attr))


@dataclass(frozen=True)
class _Bound:
    spec: ScaledSpec
    scale: object  # torch.Tensor

    def dequantize(self, raw, dtype=None):
        """The stored values times the scale, computed in float32 (fp8 and int8 are exact there) and
        rounded once to `dtype`. A scale with one value per output row broadcasts over the rest."""
        import torch

        s = self.scale.to(device=raw.device, dtype=torch.float32)
        w = raw.to(torch.float32)
        if s.numel() > 1 and s.numel() == w.shape[0]:
            s = s.reshape(-1, *([1] * (w.dim() - 1)))
        else:
            s = s.reshape(())
        out = w * s
        return out if dtype is None or dtype == torch.float32 else out.to(dtype)


def spec_for(tensors: Mapping[str, object], where: str = "") -> ScaledSpec | None:
    """The ScaledSpec of a module's weight (None when it is not scaled); UnsupportedModel for a
    format Loadout cannot compute."""
    fmt = format_of(tensors)
    if fmt is None:
        return None
    check_format(fmt, where)
    attr = "scale_weight" if fmt == "scaled_fp8" else "weight_scale"
    if attr not in tensors:
        raise UnsupportedModel(f"{where}a {fmt} weight without its {attr}: the file is incomplete")
    return ScaledSpec(fmt, attr, tuple(tensors["weight"].shape))


# -- baking into a scaled file -------------------------------------------------------------------------
# The largest finite value of each stored dtype (float8 e4m3fn: 448, e5m2: 57344; int8: 127).
_MAX = {"float8_e4m3fn": 448.0, "float8_e5m2": 57344.0, "int8": 127.0}


def scaled_weights(weights: Mapping[str, object]) -> dict[str, str]:
    """weight key -> its scale's key, for every scaled weight among `weights` (key -> torch tensor, a
    whole state dict): the keys a bake must dequantize before patching and requantize after."""
    from types import SimpleNamespace

    from ..formats.dtypes import dtype_name

    modules: dict[str, dict[str, object]] = {}
    for k, t in weights.items():
        prefix, _, attr = k.rpartition(".")
        modules.setdefault(prefix, {})[attr] = SimpleNamespace(
            dtype=dtype_name(t.dtype), shape=tuple(t.shape)
        )
    out = {}
    for prefix, tensors in modules.items():
        spec = spec_for(tensors, f"{prefix}: ")
        if spec is not None:
            dot = f"{prefix}." if prefix else ""
            out[f"{dot}weight"] = f"{dot}{spec.scale_attr}"
    return out


def dequantize_stored(raw, scale):
    """A stored scaled weight's values in float32 (stored · scale, per row or per tensor)."""
    return _Bound(ScaledSpec("", "", tuple(raw.shape)), scale).dequantize(raw)


def requantize(value, like, scale):
    """A patched float32 weight back into `like`'s dtype with a scale of `scale`'s shape: (stored, scale).

    The scale is kept wherever the values still fit — so every weight a LoRA left alone is stored as
    before, as ComfyUI does when it patches a scaled weight — and grown only where the patch pushed a
    value past the dtype's largest finite one (per row for a per-row scale), so nothing saturates.
    Rounding is to nearest (ComfyUI rounds stochastically; a bake should be reproducible)."""
    import torch

    name = str(like.dtype).removeprefix("torch.")
    fmax = _MAX[name]
    s = scale.to(torch.float32)
    per_row = s.numel() > 1 and s.numel() == value.shape[0]
    amax = value.abs().flatten(1).amax(1) if per_row else value.abs().amax()
    new = torch.maximum(s.reshape(amax.shape), amax / fmax)
    b = new.reshape(-1, *([1] * (value.dim() - 1))) if per_row else new
    q = (value / b).clamp(-fmax, fmax)
    if name == "int8":
        q = q.round()
    return q.to(like.dtype), new.reshape(scale.shape).to(scale.dtype)
