"""The coverage report: which adapter modules land on which base weights, before anything is applied.

Header-only on both sides. The JSON is DESIGN.md's "LoRA coverage JSON".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import weighted
from .describe import describe_lora, infer_base, target_of
from .keymap import KeyMap, Target
from .naming import classify
from .parts import group_modules, module_facts

_ORDER = ("unet", "transformer", "clip_l", "clip_g", "clip_h", "t5xxl", "other")

# How a user names an architecture id (LoRA bases and Detection ids alike); an id not listed is shown as is.
_LABEL = {
    "sd1": "SD1",
    "sd2": "SD2",
    "sdxl": "SDXL",
    "sdxl_refiner": "the SDXL refiner",
    "sd3": "SD3",
    "sd3.5_medium": "SD3.5 Medium",
    "sd3.5_large": "SD3.5 Large",
    "flux1": "FLUX.1",
    "flux1_dev": "FLUX.1 [dev]",
    "flux1_schnell": "FLUX.1 [schnell]",
    "flux2": "FLUX.2",
    "flux3": "FLUX.3",
    "chroma": "Chroma",
    "wan21": "Wan 2.1",
    "wan22": "Wan 2.2",
    "qwen_image": "Qwen-Image",
    "qwen_image21": "Qwen-Image 2.1",
    "z_image": "Z-Image",
    "lumina2": "Lumina 2",
    "hunyuan_video": "HunyuanVideo",
    "hunyuan_video15": "HunyuanVideo 1.5",
    "hidream": "HiDream-I1",
    "auraflow": "AuraFlow",
    "ltxv": "LTX-Video",
    "ltx2": "LTX-2",
    "mochi": "Mochi 1",
    "minimax_h3": "MiniMax-H3",
    "hunyuan_dit": "Hunyuan-DiT",
    "ernie_image": "ERNIE-Image",
    "bria": "Bria 3.2",
    "bria_fibo": "Bria FIBO",
    "glm_image": "GLM-Image",
    "ideogram4": "Ideogram 4",
    "prx": "PRX",
    "joyimage": "JoyImage",
    "longcat_image": "LongCat-Image",
    "ovis_image": "Ovis-Image",
    "kandinsky5": "Kandinsky 5",
    "sana_video": "SANA-Video",
    "nucleus_image": "NucleusMoE-Image",
    "motif_video": "Motif-Video",
    "cosmos_predict1": "Cosmos 1.0",
    "bria_fibo2": "Bria FIBO 2",
    "kandinsky6": "Kandinsky 6",
    "kandinsky6_sr": "Kandinsky 6 SR",
}


def label(arch: str | None) -> str:
    return _LABEL.get(arch or "", arch or "an unknown")


def fit_warning(cov: Mapping[str, Any], lora_base: str | None, base_architecture: str | None) -> str | None:
    """The one sentence the plan and the LoRA stack panel show when a LoRA does not fit its base
    (None when every module maps). `cov` is the coverage JSON (or anything with mapped / modules)."""
    mapped, modules = int(cov.get("mapped", 0)), int(cov.get("modules", 0))
    if not modules or mapped == modules:
        return None
    model = f"this {label(base_architecture)} model"
    other = lora_base and not same_family(lora_base, base_architecture)
    made = f"made for {label(lora_base)}: " if lora_base and (mapped == 0 or other) else ""
    if mapped == 0:
        return f"{made}0/{modules} modules map onto {model}; it would change nothing"
    lead = f"{made}only" if made else "only"
    return (
        f"{lead} {mapped}/{modules} modules map onto {model}: the other {modules - mapped} would be skipped"
    )


def same_family(lora_base: str, architecture: str | None) -> bool:
    """A LoRA base id (describe_lora: `flux1`, `sd3`, `wan21`) against a Detection id (`flux1_dev`,
    `sd3.5_medium`, `wan21`): the same family, or a release of it."""
    if not architecture:
        return True  # nothing to compare with: say only the counts
    a = architecture
    return (
        a == lora_base
        or a.startswith(lora_base + "_")
        or (lora_base.startswith("sd3") and a.startswith("sd3"))
    )


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
    split: dict[str, list[str]] = field(
        default_factory=dict
    )  # a mapped module placed on several weights -> keys

    def to_json(self) -> dict[str, Any]:
        return {
            "modules": self.modules,
            "mapped": self.mapped,
            "unmatched": self.unmatched,
            "shape_mismatch": self.shape_mismatch,
            **({"split": self.split} if self.split else {}),  # only where a fused module was split
        }


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
    # module -> the weights it is split over, each a row block of its change (a fused module on a split base)
    split: dict[str, tuple[Target, ...]] = field(default_factory=dict)
    lora_base: str | None = None  # the architecture the adapter was made for (describe_lora)
    warning: str | None = None  # fit_warning, when the base's architecture was given

    def to_json(self) -> dict[str, Any]:
        return {
            "lora": self.lora,
            "base": self.base,
            "format": self.format,
            "algos": self.algos,
            "modules": self.modules,
            "mapped": self.mapped,
            "targets": {k: v.to_json() for k, v in self.targets.items()},
            "weights": len(self.placements) + sum(len(v) for v in self.split.values()),
            "lora_base": self.lora_base,
            "warning": self.warning,
            "error": None,
        }


def coverage(
    adapter_index: Any,
    base_shapes: Mapping[str, tuple[int, ...]],
    *,
    lora_path: str = "",
    base_path: str = "",
    keymap: KeyMap | None = None,
    base_architecture: str | None = None,
) -> Coverage:
    """Place every module of an adapter (a header-like index) on a base (key -> shape); with the base's
    `base_architecture` (its Detection id) the result carries `fit_warning`'s sentence."""
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
    split: dict[str, tuple[Target, ...]] = {}
    for name in sorted(modules):
        parts = modules[name]
        t = km.resolve(name)
        comp = t.component if t else target_of(named[name], base_arch, facts[name])
        pieces = km.resolve_split(name) if t is None else None
        if pieces:
            comp = pieces[0].component
        tc = targets.setdefault(comp, TargetCoverage())
        tc.modules += 1
        if pieces:
            why = _split_mismatch(parts, shapes, facts[name].algos, pieces, base_shapes)
            if why:
                tc.shape_mismatch.append(why | {"module": name})
            else:
                tc.mapped += 1
                tc.split[name] = [p.key for p in pieces]
                split[name] = pieces
            continue
        if t is None:
            tc.unmatched.append(name)
            continue
        algo = next((a for a in facts[name].algos if a != "dora"), "")
        try:
            change = change_shape(parts, shapes)
            if algo in weighted.WEIGHTED:  # rotates / scales the weight: its shape says which fit
                got = {p: shapes[k] for p, k in parts.items() if p != "alpha"}
                weighted.check(algo, got)
                if not weighted.fits_weight(algo, got, tuple(t.shape)):
                    raise ValueError
        except (IndexError, TypeError, ValueError, KeyError):  # broken factors (a 0-d down), no fit
            got = {p: list(shapes[k]) for p, k in parts.items() if p != "alpha"}
            tc.shape_mismatch.append(
                {"module": name, "key": t.key, "lora_shape": got, "base_shape": list(t.shape)}
            )
            continue
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
    cov = Coverage(
        lora=lora_path,
        base=base_path,
        format=info.format,
        algos=list(info.algos),
        modules=len(modules),
        mapped=sum(v.mapped for v in ordered.values()),
        targets=ordered,
        placements=placements,
        split=split,
        lora_base=info.base,
    )
    if base_architecture is not None:
        cov.warning = fit_warning(
            {"mapped": cov.mapped, "modules": cov.modules}, info.base, base_architecture
        )
    if "tlora" in info.algos:  # its modules fit, but no fixed weight exists to apply (adapter.py refuses it)
        cov.warning = "a T-LoRA: its change depends on each step's timestep; Loadout cannot apply it yet"
    return cov


def _split_mismatch(
    parts: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    algos: tuple[str, ...],
    pieces: tuple[Target, ...],
    base_shapes: Mapping[str, tuple[int, ...]],
) -> dict | None:
    """Why a fused module cannot be split by rows over `pieces` (a shape_mismatch entry, with a reason), or None.
    Its change must have the pieces' rows stacked; an algorithm that mixes rows across the fused weight cannot be
    cut: a BOFT's butterfly, an OFT whose blocks straddle a boundary, a DoRA normalised per input channel."""
    got = {p: list(shapes[k]) for p, k in parts.items() if p != "alpha"}
    total = sum(t.change_rows[1] for t in pieces)
    fused = (total, *pieces[0].shape[1:])
    algo = next((a for a in algos if a != "dora"), "")

    def bad(reason: str, key: str | None = None, base: Any = fused) -> dict:
        keys = [t.key for t in pieces]
        return {
            "key": key or keys[0],
            "keys": keys,
            "lora_shape": got,
            "base_shape": list(base),
            "reason": reason,
        }

    try:
        change = change_shape(parts, shapes)
        if algo in weighted.WEIGHTED:
            weighted.check(algo, {p: tuple(v) for p, v in got.items()})
            if not weighted.fits_weight(algo, {p: tuple(v) for p, v in got.items()}, fused):
                return bad("its change does not fit the fused weight")
    except (IndexError, TypeError, ValueError, KeyError):
        return bad("its parts make no change")
    if algo == "boft":
        return bad("a BOFT's butterfly mixes rows across its blocks: Loadout does not split it")
    if algo == "oft":
        size = got["oft_blocks"][-1]
        if any(t.change_rows[0] % size or t.change_rows[1] % size for t in pieces):
            return bad(f"its {size}-row OFT blocks straddle the split weights' boundaries")
    mag = parts.get("dora_scale", parts.get("magnitude"))
    if mag is not None and shapes[mag][0] != total:
        return bad("a DoRA normalised per input channel mixes the rows of the fused weight")
    if change is not None and (change[0] != total or not fits(change, fused)):
        return bad("its change's rows are not the split weights' rows stacked")
    for bp in ("diff_b", "b_norm", "up_bias"):
        if bp in parts:
            want = math.prod(shapes[parts[bp]])
            for t in pieces:
                b = base_shapes.get(t.bias_key) if t.bias_key else None
                if b is None or math.prod(b) != t.change_rows[1]:
                    return bad("a bias change for a weight without that bias", t.bias_key, b or ())
            if want != total:
                return bad("its bias change is not the split biases stacked", pieces[0].bias_key, (total,))
    return None


def _bias_view(shape: tuple[int, ...], t: Target) -> tuple[int, ...]:
    if t.view and t.view[0] == "rows":
        return (t.view[2],)
    return shape
