"""The coverage report: which adapter modules land on which base weights, before anything is applied.

Header-only on both sides. The JSON is DESIGN.md's "LoRA coverage JSON".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .describe import describe_lora, infer_base, target_of
from .keymap import KeyMap, Target
from .naming import classify
from .parts import UNSUPPORTED_ALGOS, group_modules, module_facts

_ORDER = ("unet", "transformer", "clip_l", "clip_g", "clip_h", "t5xxl", "other")


def change_shape(parts: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...] | None:
    """The shape of the weight change a module produces, from its parts' shapes (None: bias-only)."""

    def s(p: str) -> tuple[int, ...] | None:
        return tuple(shapes[parts[p]]) if p in parts else None

    if "up" in parts and "down" in parts:
        up, down, mid = s("up"), s("down"), s("mid")
        kernel = mid[2:] if mid else down[2:]
        return (up[0], down[1], *kernel)
    if "hada_w1_a" in parts:
        w1a, w1b, t1 = s("hada_w1_a"), s("hada_w1_b"), s("hada_t1")
        return (w1a[1], w1b[1], *t1[2:]) if t1 else (w1a[0], *w1b[1:])
    if "lokr_w1" in parts or "lokr_w1_a" in parts:
        w1 = s("lokr_w1") or (s("lokr_w1_a")[0], s("lokr_w1_b")[1])
        w2 = s("lokr_w2")
        if w2 is None:
            a, b, t = s("lokr_w2_a"), s("lokr_w2_b"), s("lokr_t2")
            w2 = (a[1], b[1], *t[2:]) if t else (a[0], *b[1:])
        w1 = w1 + (1,) * (len(w2) - len(w1))
        return tuple(x * y for x, y in zip(w1, w2, strict=True))
    for p in ("diff", "set_weight", "w_norm"):
        if p in parts:
            return s(p)
    return None


def fits(change: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """A change fits a weight when the element counts and the output dims agree (it is reshaped)."""
    return math.prod(change) == math.prod(target) and (not change or change[0] == target[0])


@dataclass
class TargetCoverage:
    modules: int = 0
    mapped: int = 0
    unmatched: list[str] = field(default_factory=list)
    shape_mismatch: list[dict] = field(default_factory=list)
    unsupported: list[dict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        d = {
            "modules": self.modules,
            "mapped": self.mapped,
            "unmatched": self.unmatched,
            "shape_mismatch": self.shape_mismatch,
        }
        if self.unsupported:
            d["unsupported"] = self.unsupported
        return d


@dataclass
class Coverage:
    lora: str
    base: str
    format: str
    algos: list[str]
    modules: int
    mapped: int
    targets: dict[str, TargetCoverage]
    placements: dict[str, Target] = field(default_factory=dict)  # module -> target (shape-checked)

    def to_json(self) -> dict[str, Any]:
        return {
            "lora": self.lora,
            "base": self.base,
            "format": self.format,
            "algos": self.algos,
            "modules": self.modules,
            "mapped": self.mapped,
            "targets": {k: v.to_json() for k, v in self.targets.items()},
            "error": None,
        }


def coverage(
    adapter_index: Any,
    base_shapes: Mapping[str, tuple[int, ...]],
    *,
    lora_path: str = "",
    base_path: str = "",
    keymap: KeyMap | None = None,
) -> Coverage:
    """Place every module of an adapter (a header-like index) on a base (key -> shape)."""
    info = describe_lora(adapter_index)
    if info is None:
        from ..errors import FormatError

        raise FormatError(
            f"{lora_path or 'the file'}: no adapter modules found: this is not a LoRA or LyCORIS file"
        )
    shapes = {k: tuple(getattr(v, "shape", ())) for k, v in adapter_index.tensors.items()}
    modules, _ = group_modules(adapter_index.tensors)
    km = keymap or KeyMap(base_shapes)
    named = {m: classify(m) for m in modules}
    facts = {m: module_facts(p, shapes) for m, p in modules.items()}
    base_arch = infer_base(named, facts)
    targets: dict[str, TargetCoverage] = {}
    placements: dict[str, Target] = {}
    for name in sorted(modules):
        parts = modules[name]
        t = km.resolve(name)
        comp = t.component if t else target_of(named[name], base_arch, facts[name])
        tc = targets.setdefault(comp, TargetCoverage())
        tc.modules += 1
        if t is None:
            tc.unmatched.append(name)
            continue
        bad = [a for a in facts[name].algos if a in UNSUPPORTED_ALGOS]
        if bad:
            tc.unsupported.append({"module": name, "algo": bad[0]})
            continue
        change = change_shape(parts, shapes)
        ok = True
        if change is not None and not fits(change, t.shape):
            ok = False
            tc.shape_mismatch.append(
                {"module": name, "key": t.key, "lora_shape": list(change), "base_shape": list(t.shape)}
            )
        for bp in ("diff_b", "b_norm", "up_bias"):
            if ok and bp in parts:
                bshape = base_shapes.get(t.bias_key) if t.bias_key else None
                want = tuple(shapes[parts[bp]])
                if bshape is None or math.prod(want) != math.prod(_bias_view(bshape, t)):
                    ok = False
                    tc.shape_mismatch.append(
                        {
                            "module": name,
                            "key": t.bias_key,
                            "lora_shape": list(want),
                            "base_shape": list(bshape) if bshape else None,
                        }
                    )
        if ok:
            tc.mapped += 1
            placements[name] = t
    ordered = {k: targets[k] for k in _ORDER if k in targets}
    return Coverage(
        lora=lora_path,
        base=base_path,
        format=info.format,
        algos=list(info.algos),
        modules=len(modules),
        mapped=sum(v.mapped for v in ordered.values()),
        targets=ordered,
        placements=placements,
    )


def _bias_view(shape: tuple[int, ...], t: Target) -> tuple[int, ...]:
    if t.view and t.view[0] == "rows":
        return (t.view[2],)
    return shape
