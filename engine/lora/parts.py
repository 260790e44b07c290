"""Split adapter tensor names into (module, part) and read each module's algorithm, rank and shape.

Torch-free and header-only: the detection code on the GUI thread uses it. The part names are the
vocabulary adapter trainers write (facts from kohya sd-scripts `networks/lora.py`, LyCORIS
`lycoris/modules/*.py`, diffusers `loaders/lora_pipeline.py` and PEFT `tuners/lora/layer.py`):

* LoRA / LoCon: `lora_up.weight`, `lora_down.weight`, `lora_mid.weight` (Tucker), `lora_B/lora_A.weight`
  (PEFT, diffusers), `lora.up/.down.weight` (old diffusers), `lora_linear_layer.up/.down.weight`
  (diffusers text encoders), `alpha`;
* LoHa: `hada_w1_a/b`, `hada_w2_a/b`, `hada_t1/t2`; LoKr: `lokr_w1`, `lokr_w1_a/b`, `lokr_w2`,
  `lokr_w2_a/b`, `lokr_t2`;
* DoRA: `dora_scale` (LyCORIS, kohya) or `lora_magnitude_vector` (PEFT);
* full diffs `diff` / `diff_b`, `set_weight` (replace), LyCORIS norm diffs `w_norm` / `b_norm`;
* OFT / BOFT `oft_blocks` (+ `rescale`), GLoRA `a1/a2/b1/b2(.weight)` (+ `bm`), (IA)³ `weight` +
  `on_input` (LyCORIS `lycoris/modules/{diag_oft,boft,glora,ia3}.py`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from . import weighted

# suffix -> canonical part name. Longer suffixes first so ".lora_linear_layer.up.weight" wins over
# ".up.weight" style endings.
_SUFFIXES: tuple[tuple[str, str], ...] = (
    ("lora_linear_layer.up.weight", "up"),
    ("lora_linear_layer.down.weight", "down"),
    ("lora.up.weight", "up"),
    ("lora.down.weight", "down"),
    ("lora_up.weight", "up"),
    ("lora_down.weight", "down"),
    ("lora_mid.weight", "mid"),
    ("lora_B.weight", "up"),
    ("lora_A.weight", "down"),
    ("lora_B.bias", "up_bias"),
    ("lora_magnitude_vector.weight", "magnitude"),
    ("lora_magnitude_vector", "magnitude"),
    ("dora_scale", "dora_scale"),
    ("alpha", "alpha"),
    ("hada_w1_a", "hada_w1_a"),
    ("hada_w1_b", "hada_w1_b"),
    ("hada_w2_a", "hada_w2_a"),
    ("hada_w2_b", "hada_w2_b"),
    ("hada_t1", "hada_t1"),
    ("hada_t2", "hada_t2"),
    ("lokr_w1_a", "lokr_w1_a"),
    ("lokr_w1_b", "lokr_w1_b"),
    ("lokr_w2_a", "lokr_w2_a"),
    ("lokr_w2_b", "lokr_w2_b"),
    ("lokr_w1", "lokr_w1"),
    ("lokr_w2", "lokr_w2"),
    ("lokr_t2", "lokr_t2"),
    ("diff_b", "diff_b"),
    ("diff", "diff"),
    ("set_weight", "set_weight"),
    ("w_norm", "w_norm"),
    ("b_norm", "b_norm"),
    # Weight-dependent algorithms (engine/lora/weighted.py): OFT (3-D blocks) and BOFT (4-D) share
    # `oft_blocks` (LyCORIS 1 named OFT's `oft_diag`), with an optional `rescale`; GLoRA's four factors
    # and Tucker core; (IA)³'s flag (its vector is the module's bare `.weight`, paired in group_modules).
    ("oft_blocks", "oft_blocks"),
    ("oft_diag", "oft_blocks"),
    ("rescale", "rescale"),
    ("a1.weight", "glora_a1"),
    ("a2.weight", "glora_a2"),
    ("b1.weight", "glora_b1"),
    ("b2.weight", "glora_b2"),
    ("bm.weight", "glora_bm"),
    ("on_input", "on_input"),
    # T-LoRA (LyCORIS `modules/tlora.py`): recognised to be named; its change depends on the timestep
    ("q_layer.weight", "tlora_q"),
    ("p_layer.weight", "tlora_p"),
    ("lambda_layer", "tlora_lambda"),
)

# Old diffusers attention-processor LoRAs: "...attn1.processor.to_q_lora.up.weight".
_PROCESSOR = re.compile(r"^(.*)\.processor\.(to_q|to_k|to_v|to_out)_lora\.(up|down)\.weight$")
# XLabs Flux LoRAs: "double_blocks.N.processor.qkv_lora1.down.weight"; lora1 is the image stream, lora2
# the text stream (diffusers `_convert_xlabs_flux_lora_to_diffusers`): BFL img_attn / txt_attn.
# Single blocks carry one stream: `single_blocks.N.processor.qkv_lora.down.weight` (kept by that name;
# the key map places it on linear1's q/k/v rows).
_XLABS = re.compile(r"^(.*)\.processor\.(qkv|proj)_lora([12]?)\.(up|down)\.weight$")

# Parts that carry a weight change (a module with only `alpha` is no adapter module).
WEIGHT_PARTS = frozenset(
    {
        "up",
        "down",
        "hada_w1_a",
        "hada_w1_b",
        "lokr_w1",
        "lokr_w1_a",
        "lokr_w2",
        "lokr_w2_a",
        "diff",
        "diff_b",
        "set_weight",
        "w_norm",
        "b_norm",
        "oft_blocks",
        "glora_a1",
        "ia3",
        "tlora_lambda",
    }
)


# The suffixes by their number of dotted segments: a key is split by looking its last three, two and
# one segments up, longest first (the same answer as testing each suffix in the order above: no
# shorter suffix matches a key that a longer one matches).
_BY_SEGMENTS = tuple({s: part for s, part in _SUFFIXES if s.count(".") == n - 1} for n in (3, 2, 1))
_NORM_SCALES = ("_norm.scale", "query_norm.scale", "key_norm.scale")
_FLUX_ROOTS = ("double_blocks.", "single_blocks.", "diffusion_model.")


def split_key(key: str) -> tuple[str, str] | None:
    """'lora_unet_x.lora_up.weight' -> ('lora_unet_x', 'up'); None when the key is no adapter part."""
    if ".processor." in key:
        m = _XLABS.match(key)
        if m and not m.group(3):
            return f"{m.group(1)}.processor.{m.group(2)}_lora", m.group(4)
        if m:
            stream = "img_attn" if m.group(3) == "1" else "txt_attn"
            return f"{m.group(1)}.{stream}.{m.group(2)}", m.group(4)
        m = _PROCESSOR.match(key)
        if m:
            mod = f"{m.group(1)}.{m.group(2)}" + (".0" if m.group(2) == "to_out" else "")
            return mod, m.group(3)
    if key.endswith(_NORM_SCALES) and key.startswith(_FLUX_ROOTS):
        # BFL's Flux control LoRAs ship whole RMSNorm scales: a replacement (ComfyUI `lora_convert.py`
        # turns them into set_weight).
        return key[: -len(".scale")], "set_weight"
    rest1, dot1, last = key.rpartition(".")
    if not dot1:
        return None
    if last != "weight" and last != "bias":  # every longer suffix ends in .weight or .bias
        part = _BY_SEGMENTS[2].get(last)
        return (rest1, part) if part is not None else None
    rest2, dot2, mid = rest1.rpartition(".")
    if dot2:
        three, two, one = _BY_SEGMENTS
        rest3, dot3, first = rest2.rpartition(".")
        if dot3:
            part = three.get(f"{first}.{mid}.{last}")
            if part is not None:
                return rest3, part
        part = two.get(f"{mid}.{last}")
        if part is not None:
            return rest2, part
    part = _BY_SEGMENTS[2].get(last)
    return (rest1, part) if part is not None else None


def _nested(n: int) -> dict[str, dict]:
    """The n-segment suffixes as nested dicts from the last segment back: {last: {mid: part}} for two,
    {last: {mid: {first: part}}} for three, looked up without building the joined string."""
    out: dict = {}
    for suffix, part in _BY_SEGMENTS[3 - n].items():
        *outer, innermost = reversed(suffix.split("."))
        d = out
        for seg in outer:
            d = d.setdefault(seg, {})
        d[innermost] = part
    return out


_ONE, _TWO, _THREE = _BY_SEGMENTS[2], _nested(2), _nested(3)
assert not _ONE.keys() & {"weight", "bias"} and set(_TWO) | set(_THREE) <= {"weight", "bias"}


# Each plain key's split, remembered across files: the LoRAs of one trainer and base name the same keys
# (every kohya SD1.5 LoRA the same 792), so a library scan splits each name once — a lookup instead of
# three partitions and four dictionary probes a key. Bounded: emptied when full.
_SPLITS: dict[str, tuple[str, str] | None] = {}
_SPLITS_MAX = 1 << 15
_MISS = object()


def _split_plain(key: str) -> tuple[str, str] | None:
    """split_key's answer for a key of no special form, by dictionary lookups of its last segments."""
    mod, dot, last = key.rpartition(".")
    if not dot:
        return None
    by_mid = _TWO.get(last)
    if by_mid is None:  # not .weight / .bias: a one-segment suffix or nothing
        part = _ONE.get(last)
        return None if part is None else (mod, part)
    rest, dot, mid = mod.rpartition(".")
    if not dot:
        return None
    by_first = _THREE[last].get(mid) if last in _THREE else None
    if by_first is not None:
        head, dot3, first = rest.rpartition(".")
        if dot3:
            part = by_first.get(first)
            if part is not None:
                return head, part
    part = by_mid.get(mid)
    return None if part is None else (rest, part)


def group_modules(
    keys: Iterable[str], text: str | None = None
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Group tensor names by adapter module: ({module: {part: key}}, keys that are no adapter part).

    Modules holding no weight-carrying part (a stray `alpha`) are returned among the other keys.

    split_key's answer for every key: a library scan groups every key of every LoRA, so a plain key's
    split is found by dictionary lookups of its last segments (_split_plain) and remembered across
    files. Keys split_key treats specially (attention processors, Flux norm scales) go through it.
    `text`: the keys already joined by newlines, where the caller has them (detection's KeyIndex.text).
    """
    modules: dict[str, dict[str, str]] = {}
    other: list[str] = []
    keys = list(keys)
    if text is None:
        text = "\n".join(keys)  # one search for the special names instead of two tests per key
    special = ".processor." in text or "_norm.scale" in text
    splits, miss = _SPLITS, _MISS
    for key in keys:
        if special and (".processor." in key or key.endswith(_NORM_SCALES)):
            sp = split_key(key)
        else:
            sp = splits.get(key, miss)
            if sp is miss:
                sp = _split_plain(key)
                if len(splits) >= _SPLITS_MAX:
                    splits.clear()
                splits[key] = sp
        if sp is None:
            other.append(key)
            continue
        mod, part = sp
        parts = modules.get(mod)
        if parts is None:
            modules[mod] = parts = {}
        parts[part] = key
    pair_ia3(modules, other)
    for name in [n for n, parts in modules.items() if WEIGHT_PARTS.isdisjoint(parts)]:
        other.extend(modules.pop(name).values())
    return modules, other


def pair_ia3(modules: dict[str, dict[str, str]], other: list[str]) -> None:
    """An (IA)³ module stores its vector as `<module>.weight` beside `<module>.on_input` (LyCORIS
    `modules/ia3.py`): a bare `.weight` no suffix names, so it joins the module that holds the flag."""
    flagged = [n for n, parts in modules.items() if "on_input" in parts]
    if not flagged:
        return
    left = set(other)
    for name in flagged:
        key = name + ".weight"
        if key in left:
            modules[name]["ia3"] = key
            left.discard(key)
    other[:] = [k for k in other if k in left]


class ModuleFacts(NamedTuple):
    """What a module's header says: its algorithms, rank and the weight shape it would change.

    A NamedTuple: a library scan builds one per module of every LoRA (a frozen dataclass costs
    several times as much to build)."""

    algos: tuple[str, ...]
    rank: int | None
    out_features: int | None
    in_features: int | None  # for convolutions: input channels (kernel excluded) where knowable


_NEW_FACTS = tuple.__new__  # a ModuleFacts from its four fields in one C call


def _at(shape, i: int) -> int | None:
    return shape[i] if shape is not None and len(shape) > i else None


def _dims(shape) -> tuple[int, ...]:
    return shape if type(shape) is tuple else tuple(int(s) for s in shape)


def module_facts(parts: Mapping[str, str], shapes: Mapping[str, tuple[int, ...]]) -> ModuleFacts:
    """Algorithms, rank and (out, in) features of one module from the shapes of its parts."""
    down_key, up_key = parts.get("down"), parts.get("up")
    if down_key is not None and up_key is not None:  # LoRA / LoCon: nearly every module a scan sees
        # (inlined: a library scan runs this once per module of every LoRA; the Python calls it saves —
        # _dims twice, the NamedTuple's own __new__ — cost a kohya SD1.5 LoRA 0.9M of its 11M description)
        down, up = shapes[down_key], shapes[up_key]
        if type(down) is not tuple:
            down = _dims(down)
        if type(up) is not tuple:
            up = _dims(up)
        algo = "locon" if "mid" in parts or (len(down) == 4 and down[2:] != (1, 1)) else "lora"
        facts = (
            (algo, "dora") if "dora_scale" in parts or "magnitude" in parts else (algo,),
            down[0] if down else None,
            up[0] if up else None,
            down[1] if len(down) > 1 else None,
        )
        return _NEW_FACTS(ModuleFacts, facts)

    def sh(part: str) -> tuple[int, ...] | None:
        key = parts.get(part)
        return _dims(shapes[key]) if key is not None else None

    algos: list[str] = []
    rank = out_f = in_f = None
    # Hostile or broken shapes (a 0-d factor, a missing partner) give None where a dim is not there:
    # this runs on headers only (scans, `lora inspect`), and must describe what it cannot use.
    if "hada_w1_a" in parts:
        algos.append("loha")
        w1b, w1a = sh("hada_w1_b"), sh("hada_w1_a")
        rank = _at(w1b, 0)
        if "hada_t1" in parts:  # Tucker: w1_a is (rank, out), w1_b is (rank, in)
            out_f, in_f = _at(w1a, 1), _at(w1b, 1)
        else:
            out_f, in_f = _at(w1a, 0), _at(w1b, 1)
    elif "lokr_w1" in parts or "lokr_w1_a" in parts:
        algos.append("lokr")
        w1 = sh("lokr_w1")
        if w1 is None:
            a, b = sh("lokr_w1_a"), sh("lokr_w1_b")
            w1 = (_at(a, 0), _at(b, 1))
            rank = _at(b, 0)
        w2 = sh("lokr_w2")
        if w2 is None:
            a, b = sh("lokr_w2_a"), sh("lokr_w2_b")
            rank = _at(b, 0) if b else rank
            if "lokr_t2" in parts:  # Tucker: w2_a (rank, out), w2_b (rank, in)
                w2 = (_at(a, 1), _at(b, 1))
            else:
                w2 = (_at(a, 0), _at(b, 1))
        if None not in (_at(w1, 0), _at(w1, 1), _at(w2, 0), _at(w2, 1)):
            out_f = w1[0] * w2[0]
            # Linear: `in`; a conv LoKr without Tucker folds the kernel into w2's columns.
            in_f = w1[1] * w2[1]
    elif "diff" in parts:
        algos.append("norm" if len(sh("diff")) == 1 else "full")
        d = sh("diff")
        out_f = d[0] if d else None
        in_f = d[1] if d and len(d) > 1 else None
    elif "set_weight" in parts:
        algos.append("set")
        d = sh("set_weight")
        out_f = d[0] if d else None
        in_f = d[1] if d and len(d) > 1 else None
    elif "w_norm" in parts or "b_norm" in parts:
        algos.append("norm")
        d = sh("w_norm") or sh("b_norm")
        out_f = d[0] if d else None
    elif "oft_blocks" in parts:
        algo = "boft" if len(sh("oft_blocks")) == 4 else "oft"
        algos.append(algo)
        rank, out_f, in_f = weighted.facts(algo, {"oft_blocks": sh("oft_blocks")})
    elif "glora_a1" in parts:
        algos.append("glora")
        rank, out_f, in_f = weighted.facts("glora", {p: sh(p) for p in parts if p.startswith("glora_")})
    elif "ia3" in parts:
        algos.append("ia3")
    elif "tlora_lambda" in parts:  # P (out, r) · diag(λ · mask(t)) · Q (r, in)
        algos.append("tlora")
        rank, out_f, in_f = _at(sh("tlora_lambda"), 1), _at(sh("tlora_p"), 0), _at(sh("tlora_q"), 1)
    elif "diff_b" in parts:
        algos.append("full")
    if "dora_scale" in parts or "magnitude" in parts:
        algos.append("dora")
    return ModuleFacts(tuple(algos), rank, out_f, in_f)
