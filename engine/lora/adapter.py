"""Adapter files parsed into modules, each able to patch the weight (and bias) it targets, in fp32.

An `AdapterModule` holds its parts as zero-copy views of the file's mmap; nothing is materialised
until a patch is computed. `patch_weight(w, strength)` and `patch_bias(b, strength)` take and return
fp32 tensors: the patcher bakes with them and the on-the-fly path of offloaded modules calls the same
functions during forward, so both give the same numbers.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ..errors import FormatError, UnsupportedModel
from . import algos, weighted
from .describe import LoraInfo, describe_lora
from .parts import group_modules, module_facts


@dataclass(eq=False)
class AdapterModule:
    """One adapted module: its parts (part name -> tensor), alpha, and the algorithms found."""

    name: str
    parts: dict[str, Any]
    algos: tuple[str, ...]
    alpha: float | None = None
    # A row block of another module's change (row_block): the rows its parts could not be cut to (LoKr, OFT)
    take: tuple[int, int] | None = None
    _blocks: dict = field(default_factory=dict, repr=False)

    @property
    def algo(self) -> str:
        return next((a for a in self.algos if a != "dora"), "dora")

    @property
    def rank(self) -> int | None:
        p = self.parts
        if "down" in p:
            return int(p["down"].shape[0])
        if "hada_w1_b" in p:
            return int(p["hada_w1_b"].shape[0])
        if self.algo == "glora":
            return weighted.facts("glora", self._shapes())[0]
        if self.algo == "lokr":
            return algos.lokr_rank(
                p.get("lokr_w1_a"), p.get("lokr_w1_b"), p.get("lokr_w2_a"), p.get("lokr_w2_b")
            )
        return None

    def _shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.parts.items()}

    @property
    def scale(self) -> float:
        """alpha / rank (1 without alpha, and for LoKr stored as two whole halves; OFT's alpha is its
        constraint, no scale)."""
        rank = self.rank
        if self.alpha is None or not rank or self.algo in ("oft", "boft"):
            return 1.0
        return float(self.alpha) / rank

    @property
    def patches_weight(self) -> bool:
        return any(
            k in self.parts
            for k in (
                "up",
                "hada_w1_a",
                "lokr_w1",
                "lokr_w1_a",
                "diff",
                "set_weight",
                "w_norm",
                "oft_blocks",
                "glora_a1",
                "ia3",
            )
        )

    @property
    def patches_bias(self) -> bool:
        return any(k in self.parts for k in ("diff_b", "b_norm", "up_bias"))

    def delta(self, device=None):
        """ΔW in fp32 with alpha/rank applied (strength not applied), in the adapter's own shape."""
        p = self._parts_on(device)
        a = self.algo
        if a in ("lora", "locon"):
            d = algos.lora_delta(p["up"], p["down"], p.get("mid"))
        elif a == "loha":
            d = algos.loha_delta(
                p["hada_w1_a"],
                p["hada_w1_b"],
                p["hada_w2_a"],
                p["hada_w2_b"],
                p.get("hada_t1"),
                p.get("hada_t2"),
            )
        elif a == "lokr":
            d = algos.lokr_delta(
                p.get("lokr_w1"),
                p.get("lokr_w1_a"),
                p.get("lokr_w1_b"),
                p.get("lokr_w2"),
                p.get("lokr_w2_a"),
                p.get("lokr_w2_b"),
                p.get("lokr_t2"),
            )
        elif "diff" in p:
            return algos._f32(p["diff"])
        elif "w_norm" in p:
            return algos._f32(p["w_norm"])
        else:
            raise UnsupportedModel(
                f"{self.name}: the {a!r} algorithm's change depends on the weight it patches "
                "(patch_weight computes it)"
            )
        if self.take:
            d = d[self.take[0] : self.take[0] + self.take[1]]
        scale = self.scale
        return d * scale if scale != 1.0 else d

    def row_block(self, start: int, rows: int) -> AdapterModule:
        """The module whose change (and bias change) is rows [start, start + rows) of this one's: a fused module's
        share of one split weight (engine.lora.fused_names). Its parts are views cut where the change's rows are
        their rows (LoRA's up, LoHa's w_a, full diffs, an (IA)³ vector on the output rows, GLoRA's B, a DoRA
        magnitude per output row); LoKr's change is computed whole and cut, OFT's blocks rotate their own rows."""
        key = (start, rows)
        block = self._blocks.get(key)
        if block is None:
            parts, take = _row_parts(self.parts, self.algo, start, rows)
            block = self._blocks[key] = AdapterModule(self.name, parts, self.algos, self.alpha, take)
        return block

    def _parts_on(self, device):
        if device is None or all(t.device == device for t in self.parts.values()):
            return self.parts
        return {k: v.to(device) for k, v in self.parts.items()}

    def patch_weight(self, weight, strength: float, *, owned: bool = False):
        """The patched weight (fp32) for `weight` (any float dtype), at `strength`. `owned`: the caller
        hands over `weight` (a float32 copy of its own), which the common plain-LoRA case then updates in
        place instead of allocating a second weight-sized tensor."""
        import torch

        w = algos._f32(weight)
        if strength == 0.0:
            return w
        p = self._parts_on(w.device)
        if "set_weight" in p:
            s = algos.fit(algos._f32(p["set_weight"]), w.shape)
            return w + strength * (s - w)
        mag = p.get("dora_scale", p.get("magnitude"))
        if self.algo in weighted.WEIGHTED:
            try:
                if mag is None:  # w may be updated in place when it is ours: handed over, or our copy
                    return self._weighted(w, p, strength, in_place=owned or w is not weight)
                d = self._weighted(w, p, 1.0) - w
            except ValueError as e:  # coverage placed it by a header-only reckoning; the weight disagrees
                raise FormatError(f"{self.name}: {e}") from None
        elif mag is None and "up" in p and "mid" not in p and self._plain_lora_fits(w):
            # The common case in one fused BLAS call: W + (strength * alpha / rank) * up @ down.
            up, down = algos._f32(p["up"]), algos._f32(p["down"])
            flat = w.reshape(w.shape[0], -1)
            a, b = up.reshape(up.shape[0], -1), down.reshape(down.shape[0], -1)
            if owned and w is weight and flat.is_contiguous():
                # The same BLAS call on the same contiguous matrix as addmm's copy of it: the same bits,
                # without the copy (a first apply of a LoRA over SDXL's blocks faults in a third less).
                return flat.addmm_(a, b, alpha=strength * self.scale).reshape(w.shape)
            return torch.addmm(flat, a, b, alpha=strength * self.scale).reshape(w.shape)
        else:
            d = algos.fit(self.delta(w.device), w.shape)
        if mag is not None:
            try:
                return algos.dora_apply(w, d, mag, strength, peft="magnitude" in p)
            except ValueError as e:  # a broken file (coverage placed it by the change's shape)
                raise FormatError(f"{self.name}: {e}") from None
        return w + strength * d

    def _weighted(self, w, p, strength: float, *, in_place: bool = False):
        """The patched weight of a weight-dependent algorithm (engine/lora/weighted.py) at `strength`
        (`in_place`: w may be overwritten with it, where the algorithm can)."""
        import torch

        a = self.algo
        if a in ("oft", "boft"):
            constraint = float(self.alpha or 0.0)
            make = weighted.oft_weight if a == "oft" else weighted.boft_weight
            if a == "oft":
                return make(w, p["oft_blocks"], p.get("rescale"), constraint, strength, rows=self.take)
            if self.take:  # the butterfly mixes rows across the whole fused weight
                raise ValueError("a row block of a BOFT's weight is no rotation of its own")
            return make(w, p["oft_blocks"], p.get("rescale"), constraint, strength)
        if a == "ia3":
            flag = p.get("on_input")
            on_input = bool(flag is not None and float(flag.reshape(-1)[0]) != 0)
            return weighted.ia3_weight(w, p["ia3"], on_input, strength, in_place=in_place)
        d = weighted.glora_delta(
            w, p["glora_a1"], p["glora_a2"], p["glora_b1"], p["glora_b2"], p.get("glora_bm")
        )
        c = strength * self.scale  # one kernel either way (the same bits in place or not)
        return w.add_(d, alpha=c) if in_place else torch.add(w, d, alpha=c)

    def _plain_lora_fits(self, w) -> bool:
        up, down = self.parts["up"], self.parts["down"]
        return (
            up.shape[0] == w.shape[0]
            and math.prod(down.shape[1:]) * up.shape[0] == w.numel()
            and math.prod(up.shape[1:]) == down.shape[0]
        )

    def patch_bias(self, bias, strength: float):
        """The patched bias (fp32) at `strength`."""
        b = algos._f32(bias)
        p = self._parts_on(b.device)
        if "diff_b" in p:
            return b + strength * algos.fit(algos._f32(p["diff_b"]), b.shape)
        if "b_norm" in p:
            return b + strength * algos.fit(algos._f32(p["b_norm"]), b.shape)
        if "up_bias" in p:
            return b + (strength * self.scale) * algos.fit(algos._f32(p["up_bias"]), b.shape)
        return b


# Parts whose first axis is the change's output rows (a Tucker LoHa's w_a holds them second).
_ROW_PARTS = (
    "up",
    "hada_w1_a",
    "hada_w2_a",
    "diff",
    "set_weight",
    "w_norm",
    "rescale",
    "diff_b",
    "b_norm",
    "up_bias",
)


def _row_parts(
    parts: dict[str, Any], algo: str, start: int, rows: int
) -> tuple[dict[str, Any], tuple | None]:
    """(parts cut to rows [start, start + rows) of the change, the rows still to take from the change)."""
    out = dict(parts)
    end = start + rows
    tucker = "hada_t1" in parts
    for k in _ROW_PARTS:
        if k not in parts or (tucker and k.startswith("hada_")):
            continue
        t = parts[k]
        out[k] = t.reshape(-1)[start:end] if k in ("diff_b", "b_norm", "up_bias", "rescale") else t[start:end]
    if tucker:
        out["hada_w1_a"], out["hada_w2_a"] = (
            parts["hada_w1_a"][:, start:end],
            parts["hada_w2_a"][:, start:end],
        )
    mag = parts.get("dora_scale", parts.get("magnitude"))
    if mag is not None:  # one per output row (coverage refuses one per input channel: it mixes the rows)
        name = "dora_scale" if "dora_scale" in parts else "magnitude"
        out[name] = (
            mag.reshape(-1)[start:end].reshape(rows, *mag.shape[1:]) if mag.dim() <= 2 else mag[start:end]
        )
    if algo == "ia3":
        flag = parts.get("on_input")
        if flag is None or float(flag.reshape(-1)[0]) == 0:  # it scales the output rows: its own share
            out["ia3"] = parts["ia3"].reshape(-1)[start:end]
    elif algo == "glora":
        up = (
            "glora_b1"
            if weighted.glora_layout({k: tuple(v.shape) for k, v in parts.items()}) == "new"
            else "glora_b2"
        )
        out[up] = parts[up][start:end]
    return out, ((start, rows) if algo in ("lokr", "oft", "boft") else None)


@dataclass
class Adapter:
    """A parsed adapter file: its modules and header facts."""

    path: str
    info: LoraInfo
    modules: dict[str, AdapterModule]
    metadata: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)  # every tensor of the file

    def index(self) -> SimpleNamespace:
        """A header-like view (`.tensors` name -> object with `.shape`, `.metadata`) for coverage()."""
        return SimpleNamespace(
            tensors={k: SimpleNamespace(shape=s) for k, s in self.shapes.items()}, metadata=self.metadata
        )


def _alpha_value(t, key: str, where: str) -> float | None:
    if t.numel() != 1:
        raise FormatError(f"{where}{key} holds {t.numel()} values: an alpha is one number")
    v = float(t.float().reshape(-1)[0])
    if not math.isfinite(v):
        raise FormatError(f"{where}{key} is {v}: {_BROKEN}")
    return v if v else None  # alpha 0 means "unset" in LyCORIS and kohya


# what a NaN or an infinity in an adapter most often means (kohya and LyCORIS save whatever the
# optimiser left; a diverged run leaves NaN, and a NaN patch turns every output it reaches into NaN)
_BROKEN = "the file is broken (a LoRA saved from a training run that diverged?); it would ruin every output"


def adapter_from_tensors(
    tensors: dict[str, Any], metadata: dict[str, str] | None = None, path: str = ""
) -> Adapter:
    """Build an Adapter from name -> tensor (a loaded file or tensors made in a test)."""

    idx = SimpleNamespace(tensors=tensors, metadata=dict(metadata or {}))
    where = f"{path}: " if path else ""
    alphas = {k: _alpha_value(v, k, where) for k, v in tensors.items() if k.endswith(".alpha")}
    info = describe_lora(idx, alphas={k: v for k, v in alphas.items() if v is not None})
    if info is None:
        raise FormatError(
            f"{where}no adapter modules found (no lora_up/lora_down, lora_A/lora_B, hada_*, lokr_*, diff "
            f"or dora_scale keys): this is not a LoRA or LyCORIS file"
        )
    if "tlora" in info.algos:
        raise UnsupportedModel(
            f"{where}this is a T-LoRA (LyCORIS tlora): its change depends on each sampling step's "
            "timestep (ranks masked by the noise level), so it is no fixed weight to bake or patch. "
            "Loadout cannot apply it yet"
        )
    groups, _ = group_modules(tensors)
    shapes = {k: tuple(v.shape) for k, v in tensors.items()}
    modules: dict[str, AdapterModule] = {}
    for name, parts in groups.items():
        facts = module_facts(parts, shapes)
        if ("up" in parts) != ("down" in parts):  # half a pair (module_facts then names no algorithm)
            raise FormatError(f"{where}module {name!r} has a LoRA part but lacks its up/down partner")
        _check_ranks(name, parts, shapes, where)
        _check_shapes(name, parts, shapes, where, next((a for a in facts.algos if a != "dora"), ""))
        tensors_by_part = {part: tensors[key] for part, key in parts.items() if part != "alpha"}
        alpha = alphas.get(parts["alpha"]) if "alpha" in parts else None
        if alpha is None and "alpha" not in parts and info.format in ("peft", "diffusers", "ai-toolkit"):
            alpha = info.alpha  # PEFT keeps lora_alpha in its config (diffusers saves it as metadata)
        modules[name] = AdapterModule(name, tensors_by_part, facts.algos, alpha)
    _check_finite(modules, where)
    return Adapter(path, info, modules, dict(metadata or {}), shapes)


def _check_shapes(name: str, parts: dict[str, str], shapes: dict[str, tuple], where: str, algo: str) -> None:
    """Refuse, from the shapes alone, parts that hold nothing; factors whose weight change does not
    compute (algos.delta_shape, the math's shape rules: computing it on torch's meta device cost 0.85 s
    the first time, a LoKr's first load) or has another size than coverage's reckoning (change_shape,
    which decides where the module may go); and a DoRA magnitude that is neither one per output nor
    one per input channel of that change. Each failed mid-patch with torch's error before."""
    from .coverage import change_shape

    got = {p: tuple(shapes[k]) for p, k in parts.items() if p != "alpha"}
    listed = ", ".join(f"{p} {list(sh)}" for p, sh in got.items())
    for part, sh in got.items():
        if 0 in sh:
            raise FormatError(f"{where}module {name!r}: {part} has shape {list(sh)}: it holds no values")
    try:
        if algo in weighted.WEIGHTED:
            weighted.check(algo, got)
        change = change_shape(parts, shapes)
        d_shape = algos.delta_shape(got, algo) if change is not None else None
    except (IndexError, TypeError, ValueError, KeyError) as e:
        why = f"no {e}" if isinstance(e, KeyError) else str(e)
        raise FormatError(
            f"{where}module {name!r}: its parts ({listed}) make no weight change ({why})"
        ) from None
    if d_shape is not None and math.prod(d_shape) != math.prod(change):
        raise FormatError(
            f"{where}module {name!r}: its parts make a change of shape {list(d_shape)}, not {list(change)}"
        )
    mag = parts.get("dora_scale", parts.get("magnitude"))
    if mag is not None and change is not None and len(change) >= 2:
        n = math.prod(shapes[mag])
        if n not in (change[0], change[1]):
            raise FormatError(
                f"{where}module {name!r}: its DoRA magnitude holds {n} values, for a change of shape "
                f"{list(change)} (one per output or per input channel)"
            )


def _check_finite(modules: dict[str, AdapterModule], where: str) -> None:
    """Every float part finite: one norm per tensor, all in one call per width (a norm is NaN or infinite
    if its tensor holds a NaN or an infinity; taken in float32, or float64 for float64 parts, so that
    large finite halves do not overflow; a norm that overflows anyway is settled by the tensor itself),
    19 ms for an SDXL LoRA of rank 32 (174 MB, 2,229 tensors; its whole load: 45 ms), warm, two cores."""
    import torch

    owned = [(m.name, t) for m in modules.values() for t in m.parts.values() if t.is_floating_point()]
    bad: set[str] = set()
    for wide in (False, True):
        group = [(n, t) for n, t in owned if (t.dtype == torch.float64) == wide]
        if not group:
            continue
        dtype = torch.float64 if wide else torch.float32
        norms = torch.stack(torch._foreach_norm([t for _, t in group], 2, dtype=dtype))
        for i in (~torch.isfinite(norms)).nonzero().flatten().tolist():
            if not bool(torch.isfinite(group[i][1]).all()):
                bad.add(group[i][0])
    if bad:
        names = sorted(bad)
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        raise FormatError(
            f"{where}{len(names)} module(s) hold NaN or infinite values ({', '.join(names[:3])}{more}): {_BROKEN}"
        )


def _check_ranks(name: str, parts: dict[str, str], shapes: dict[str, tuple], where: str) -> None:
    """Refuse factor pairs whose inner (rank) dims disagree: a broken or mislabelled file."""
    pairs = [
        ("up", "down", 1, 0),
        ("hada_w1_a", "hada_w1_b", 1, 0),
        ("hada_w2_a", "hada_w2_b", 1, 0),
        ("lokr_w1_a", "lokr_w1_b", 1, 0),
    ]
    if "lokr_t2" not in parts:
        pairs.append(("lokr_w2_a", "lokr_w2_b", 1, 0))
    if "hada_t1" in parts:
        pairs = [p for p in pairs if not p[0].startswith("hada")]
    for a, b, ia, ib in pairs:
        if a in parts and b in parts:
            sa, sb = shapes[parts[a]], shapes[parts[b]]
            if len(sa) <= ia or len(sb) <= ib or sa[ia] != sb[ib]:
                raise FormatError(
                    f"{where}module {name!r}: {a} {list(sa)} and {b} {list(sb)} do not share a rank; "
                    "the file is broken or not an adapter Loadout knows"
                )


def load_adapter(path: str | os.PathLike) -> Adapter:
    """Parse an adapter file (.safetensors: tensors stay mmap views until a patch needs them; older
    pickled .pt/.ckpt adapters through the formats package's safe loader)."""
    from ..formats import sniff

    p = os.fspath(path)
    kind = sniff(p)
    if kind in ("torch-zip", "pickle"):
        from ..formats.pickles import load_state_dict

        return adapter_from_tensors(load_state_dict(p), {}, p)
    if kind != "safetensors":
        from ..formats.magic import what_file_is

        what = {"empty": "an empty file", "gguf": "a GGUF file", "directory": "a folder"}.get(
            kind
        ) or what_file_is(p)
        raise FormatError(f"{p}: this is {what}, not a LoRA: LoRAs are .safetensors or pickled .pt files")
    from ..formats.safetensors import SafetensorsFile

    f = SafetensorsFile(p)
    tensors = {k: f.tensor(k) for k in f.header.tensors}
    return adapter_from_tensors(tensors, f.header.metadata, p)
