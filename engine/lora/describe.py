"""LoRA facts from a header alone: naming format, algorithms, rank, alpha, targets, base architecture.

Header-only and torch-free (the detection code calls it for every file of a library scan). The base
architecture is inferred from module names and shapes the way the architectures are built: the
cross-attention context width of a UNet (768 SD1, 1024 SD2, 2048 SDXL, 1280 SDXL refiner — the
`context_dim` of each model's config), the hidden width of a DiT (3072 Flux, 1536 SD3 medium /
SD3.5 medium, 2432 SD3.5 large), and the widths of the text encoders (CLIP-L 768, OpenCLIP-H 1024,
OpenCLIP-G 1280, T5-XXL 4096).
"""

from __future__ import annotations

import functools
import json
import operator
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .describe_dits import _any_line, _family_2026
from .naming import Named, classify
from .parts import ModuleFacts, group_modules, module_facts

_CTX_TO_UNET = {768: "sd1", 1024: "sd2", 2048: "sdxl", 1280: "sdxl_refiner"}
_DIT_HIDDEN = {3072: "flux1", 1536: "sd3", 2432: "sd3.5_large"}
_UNET_FAMILY = ("sd1", "sd2", "sdxl", "sdxl_refiner")
_DIT_FAMILY = (
    "sd3",
    "sd3.5_large",
    "sd3.5_medium",
    "flux1",
    "flux2",
    "flux3",
    "chroma",
    "wan21",
    "wan22",
    "qwen_image",
    "qwen_image21",
    "z_image",
    "lumina2",
    "hunyuan_video",
    "hidream",
    "auraflow",
    "mochi",
    "hunyuan_dit",
    "ernie_image",
    "minimax_h3",
    "prx",
    "joyimage",
    "kandinsky5",
    "longcat_image",
    "ovis_image",
    "sana_video",
    "nucleus_image",
    "motif_video",
    "cosmos_predict1",
    "bria",
    "bria_fibo",
    "glm_image",
    "bria_fibo2",
    "kandinsky6",
    "kandinsky6_sr",
)


@dataclass(frozen=True)
class LoraInfo:
    """What an adapter file is, from its header (DESIGN.md, `lora` of the Detection JSON)."""

    format: str
    algos: tuple[str, ...]
    rank: int | None
    alpha: float | None
    targets: tuple[str, ...]
    base: str | None
    modules: int

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "algos": list(self.algos),
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "base": self.base,
            "modules": self.modules,
        }


@functools.lru_cache(maxsize=1 << 14)  # asked several times per module, of names shared across files
def _dotted(n: Named) -> str:
    # Underscore and dot forms compared alike: "attn2_to_k" and "attn2.to_k".
    return n.inner.replace(".", "_")


_T5 = re.compile(r"(^|_)(encoder_block|SelfAttention|DenseReluDense|EncDecAttention)(_|$)")
_DIT_Q = re.compile(r"(img_attn_qkv|x_block_attn_qkv|attn_to_q|linear1)$")
_DIT_NAMES = re.compile(r"(double_blocks|single_blocks|joint_blocks|transformer_blocks_\d+_attn_add_q_proj)")
_FLUX_NAMES = re.compile(r"(double_blocks|single_blocks|single_transformer_blocks)")
_SD3_NAMES = re.compile(r"(joint_blocks|context_block|ff_context|to_add_out|add_q_proj)")
_UNET_NAMES = re.compile(r"(down_blocks|up_blocks|mid_block|input_blocks|output_blocks|middle_block)")
_TE_WIDTH_PARTS = ("self_attn_q_proj", "self_attn_k_proj", "self_attn_out_proj", "mlp_fc1")


def infer_base(named: dict[str, Named], facts: dict[str, ModuleFacts]) -> str | None:
    """Architecture from module names and shapes; None when nothing decides (never a guess)."""
    diff = [(n, _dotted(c)) for n, c in named.items() if c.slot == "diffusion"]
    te_widths: dict[str, Counter] = {}
    for n, c in named.items():
        if c.slot.startswith("te") or c.slot in ("clip_l", "clip_g"):
            f = facts[n]
            if f.in_features and _dotted(c).endswith(_TE_WIDTH_PARTS):
                widths = te_widths.get(c.slot)
                if widths is None:  # (setdefault would build a Counter per module)
                    widths = te_widths[c.slot] = Counter()
                widths[f.in_features] += 1

    flat = " ".join(d for _, d in diff)
    decided, base = _family_2026(diff, facts) if diff else (False, None)
    if decided:
        return base
    flux_names = _any_line(_FLUX_NAMES, flat, "double_blocks", "single_blocks", "single_transformer_blocks")
    dit_names = flux_names or _any_line(_DIT_NAMES, flat, "joint_blocks", "_attn_add_q_proj")
    if diff and dit_names:
        hidden = Counter(facts[n].in_features for n, d in diff if _DIT_Q.search(d) and facts[n].in_features)
        if flux_names:
            return "flux1"
        if hidden:
            width = hidden.most_common(1)[0][0]
            base = _DIT_HIDDEN.get(width)
            if base == "sd3" and re.search(r"(x_block_attn2|transformer_blocks_\d+_attn2)", flat):
                return "sd3.5_medium"
            return base
        return "sd3" if _SD3_NAMES.search(flat) else None
    if diff and _UNET_NAMES.search(flat):
        ctx = Counter(
            facts[n].in_features for n, d in diff if d.endswith("attn2_to_k") and facts[n].in_features
        )
        if ctx:
            return _CTX_TO_UNET.get(ctx.most_common(1)[0][0])
    # A T5 as the second text encoder is FLUX.1's pair (CLIP-L, T5-XXL); SD3 names its T5 te3.
    if any(c.slot == "te2" and _T5.search(_dotted(c)) for c in named.values()):
        return "flux1"
    # Text-encoder-only adapters (or UNet adapters without cross-attention layers): the encoders' widths.
    if "te2" in te_widths and te_widths["te2"].most_common(1)[0][0] == 1280:
        return "sdxl"
    if "te" in te_widths:
        return {768: "sd1", 1024: "sd2"}.get(te_widths["te"].most_common(1)[0][0])
    return None


def target_of(c: Named, base: str | None, facts: ModuleFacts) -> str:
    """The component (DESIGN.md names) a module targets, from its name and the inferred base."""
    return _target(c, base)


# Memoised as classify is: a library's LoRAs of one base share their module names, and a text encoder's
# name costs a regular-expression search.
@functools.lru_cache(maxsize=1 << 14)
def _target(c: Named, base: str | None) -> str:
    if c.slot in ("clip_l", "clip_g", "t5xxl"):
        return c.slot
    if c.slot == "diffusion":
        if c.convention == "onetrainer":  # lora_transformer_: OneTrainer's prefix for DiT models only
            return "transformer"
        if base in _DIT_FAMILY or (base is None and _DIT_NAMES.search(_dotted(c))):
            return "transformer"
        return "unet"
    if _T5.search(_dotted(c)) or c.slot == "te3":
        return "t5xxl"
    if c.slot == "te":
        return "clip_h" if base == "sd2" else "clip_l"
    if c.slot == "te1":
        return "clip_l"
    if c.slot == "te2":
        return "t5xxl" if base == "flux1" else "clip_g"
    return "other"


def _format(named: dict[str, Named], metadata: dict[str, str]) -> str:
    conventions = Counter(c.convention for c in named.values())
    fmt = conventions.most_common(1)[0][0] if conventions else "unknown"
    software = (metadata.get("software") or "") + " " + (metadata.get("ss_network_module") or "")
    if fmt in ("diffusers", "peft", "comfyui") and "ai-toolkit" in software.lower():
        return "ai-toolkit"
    if fmt == "ldm":
        return "comfyui"
    if fmt == "bfl" and "xlabs" in software:
        return "xlabs"
    # musubi-tuner writes kohya names and says which of its network modules trained them
    # (`networks.lora_wan`, `lora_hunyuan_video`, `lora_qwen_image`, `lora_framepack`, …).
    module = metadata.get("ss_network_module") or ""
    if fmt == "kohya" and re.match(
        r"networks\.lora_(wan|hunyuan|qwen|framepack|flux_kontext|z_image)", module
    ):
        return "musubi-tuner"
    return fmt


def _float(s: str | None) -> float | None:
    try:
        return float(s) if s not in (None, "", "None") else None
    except ValueError:
        return None


def _alpha_from_metadata(metadata: dict[str, str]) -> float | None:
    alpha = _float(metadata.get("ss_network_alpha"))
    if alpha is not None:
        return alpha
    # diffusers writes the PEFT config per component under "lora_adapter_metadata".
    raw = metadata.get("lora_adapter_metadata")
    if raw:
        try:
            cfg = json.loads(raw)
        except ValueError:
            return None
        for v in cfg.values() if isinstance(cfg, dict) else ():
            if isinstance(v, dict) and isinstance(v.get("lora_alpha"), (int, float)):
                return float(v["lora_alpha"])
        if isinstance(cfg, dict) and isinstance(cfg.get("lora_alpha"), (int, float)):
            return float(cfg["lora_alpha"])
    return None


_SHAPE_OF = operator.attrgetter("shape")


class _Shapes:
    """Tensor shapes, looked up one by one, for a caller's mapping whose infos may lack a shape (then ())."""

    def __init__(self, tensors) -> None:
        self.tensors = tensors

    def __getitem__(self, key: str) -> tuple[int, ...]:
        return getattr(self.tensors[key], "shape", ())


def describe_lora(index: Any, alphas: dict[str, float] | None = None) -> LoraInfo | None:
    """LoRA facts for a safetensors-like index (`.tensors`: name -> info with `.shape`; `.metadata`).

    Returns None when the file is not an adapter. Header-only: `alpha` comes from the training
    metadata unless the caller passes the `alpha` tensors' values it has read (`alphas`: key -> value).
    """
    tensors = index.tensors
    names = getattr(index, "text", None)  # detection's KeyIndex joins the keys once for every rule
    if not isinstance(names, str):
        names = "\n".join(tensors)
    modules, other = group_modules(tensors, names)
    if not modules or len(other) > sum(len(p) for p in modules.values()):
        return None  # a model with a few adapter-looking names is still a model
    try:  # every tensor's shape in one C pass: module_facts' lookups are then a dict's
        shapes = dict(zip(tensors, map(_SHAPE_OF, tensors.values()), strict=True))
    except AttributeError:  # infos without a shape (a caller's own mapping)
        shapes = _Shapes(tensors)
    named = {m: classify(m) for m in modules}
    facts = {m: module_facts(p, shapes) for m, p in modules.items()}
    base = infer_base(named, facts)
    algos = sorted({a for f in facts.values() for a in f.algos})
    ranks = Counter(f.rank for f in facts.values() if f.rank)
    rank = ranks.most_common(1)[0][0] if ranks else None
    metadata = dict(getattr(index, "metadata", {}) or {})
    if ".processor.qkv_lora" in names or ".processor.proj_lora" in names:
        metadata.setdefault("software", "xlabs")
    if alphas:
        vals = Counter(
            round(float(alphas[p["alpha"]]), 6) for p in modules.values() if p.get("alpha") in alphas
        )
        alpha = vals.most_common(1)[0][0] if vals else None
    else:
        alpha = _alpha_from_metadata(metadata)
    if rank is None:
        rank = int(_float(metadata.get("ss_network_dim")) or 0) or None
    order = ("unet", "transformer", "clip_l", "clip_g", "clip_h", "t5xxl", "other")
    targets = {target_of(named[m], base, facts[m]) for m in modules}
    return LoraInfo(
        format=_format(named, metadata),
        algos=tuple(algos),
        rank=rank,
        alpha=alpha,
        targets=tuple(t for t in order if t in targets),
        base=base,
        modules=len(modules),
    )
