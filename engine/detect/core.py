"""detect_index: keys + shapes + metadata -> Detection. A pure function: no file access, no torch."""

from __future__ import annotations

import logging
import math
import operator
from collections import Counter, defaultdict
from itertools import compress, repeat

from ..errors import UnsupportedModel
from . import kinds
from .audio_vaes import AUDIO_WHAT
from .diffusion import Backbone, find_backbone
from .image_vaes import find_hunyuan_image_vaes
from .keys import KeyIndex, as_key_index
from .meta import metadata_architecture, metadata_prediction, summarize
from .parts import Part, container_of, find_clip_vision, find_taesd, find_text_encoders, find_vaes
from .result import COMPONENT_ORDER, Component, Detection, Evidence, Failure, LoraFacts
from .text_encoders import find_llm_encoders, find_umt5
from .unknown_dit import unknown_transformer
from .video_vaes import find_video_vaes

log = logging.getLogger(__name__)

# bitsandbytes 4-bit (diffusers / transformers `quantization_config` saves): the blocks need bnb's
# CUDA kernels or an exact dequantization of NF4's table, which Loadout does not have yet.
BNB_MARKERS = (
    (".quant_state.bitsandbytes__nf4", "4-bit NF4 weights (bitsandbytes)"),
    (".quant_state.bitsandbytes__fp4", "4-bit FP4 weights (bitsandbytes)"),
    (".absmax", "4-bit weights (bitsandbytes blockwise absmax)"),
)
# nunchaku SVDQuant: 4-bit weights with a low-rank branch, computed by nunchaku's CUDA kernels only.
SVDQ_MARKERS = (".wscales", ".smooth_factor", ".proj_down")
_QUANT_SUFFIXES = (
    *(m for m, _ in BNB_MARKERS),
    *SVDQ_MARKERS,
    *(
        f".{c}"
        for c in (
            "scale_weight",
            "scale_input",
            "weight_scale",
            "input_scale",
            "weight_scale_2",
            "comfy_quant",
        )
    ),
)


def _quant_report(ix: KeyIndex) -> tuple[tuple[Evidence, ...], Failure | None]:
    """Evidence naming a quantized file's format, and the failure when Loadout cannot load it.

    Scaled fp8 and comfy_quant fp8 / int8 weights load (engine.quant.scaled applies the scale per op);
    mxfp8, nvfp4, bitsandbytes and SVDQuant files are named and refused with what to use instead."""
    from ..errors import UnsupportedModel
    from ..quant.scaled import COMPANIONS, check_format, format_of, formats_in_metadata

    # Only a file with a quantization marker is looked at further (a library scan asks every file). A
    # model's suffix index exists by now: a bisection per marker says there is none; else (a LoRA) the suffix
    # tests run over the keys in one C loop, in the keys' order.
    markers = _QUANT_SUFFIXES
    if ix.bucketed() and not ix.count_ending(markers):
        hits: list[str] = []
    else:
        keys = ix.tensors
        hits = list(compress(keys, map(str.endswith, keys, repeat(markers))))
    for k in hits:
        for m, what in BNB_MARKERS:
            if k.endswith(m):
                msg = (
                    f"{what}: Loadout cannot load bitsandbytes 4-bit files yet (they need bitsandbytes' "
                    "CUDA kernels). Use the model's GGUF (Q4_K, Q5_K) or fp8 file instead."
                )
                return (Evidence(k, ix.shape(k), what),), Failure("unsupported", msg)
        if k.endswith(SVDQ_MARKERS) and ix.has(k.rsplit(".", 1)[0] + ".qweight"):
            what = "nunchaku SVDQuant 4-bit weights (qweight, wscales, low-rank proj_down / proj_up)"
            msg = f"{what}: these run only on nunchaku's CUDA kernels; Loadout cannot load them. Use a GGUF or fp8 file."
            return (Evidence(k, ix.shape(k), what),), Failure("unsupported", msg)
    modules: dict[str, dict] = {}
    for k in hits:
        path, _, attr = k.rpartition(".")
        if attr in COMPANIONS:
            modules.setdefault(path, {})
    if not modules and "_quantization_metadata" not in ix.metadata:
        return (), None
    counts: dict[str, int] = {}
    first: dict[str, str] = {}
    for path in modules:
        tensors = {
            a: ix.tensors[f"{path}.{a}"] for a in ("weight", *COMPANIONS) if f"{path}.{a}" in ix.tensors
        }
        fmt = format_of(tensors)
        if fmt is None:
            continue
        counts[fmt] = counts.get(fmt, 0) + 1
        first.setdefault(fmt, f"{path}.weight")
    for fmt in sorted(formats_in_metadata(ix.metadata) - set(counts)):
        counts[fmt] = 0
        first.setdefault(fmt, "__metadata__._quantization_metadata")
    ev = []
    for fmt, n in sorted(counts.items(), key=lambda x: -x[1]):
        k = first[fmt]
        layers = f"{n} layers" if n else "named in the metadata"
        ev.append(Evidence(k, ix.shape(k), f"{fmt} weights ({layers}), scaled per op when computed"))
    for fmt in counts:
        try:
            check_format(fmt)
        except UnsupportedModel as e:
            return tuple(ev), Failure("unsupported", e.message)
    return tuple(ev), None


def build_components(
    ix: KeyIndex, claims: list[tuple[str, str]], rest: str = "other"
) -> dict[str, Component]:
    """Assign every key to the component of the longest claimed prefix that matches, else `rest`.

    claims: (prefix, component). The bytes of all components add up to the tensors' bytes."""
    # Keys are grouped by their first segment (one pass); a group then tries only the claims that begin
    # with that segment, longest first, and a group that one claim covers whole is assigned at once —
    # a checkpoint's 2,500 keys fall into a handful of groups (model., first_stage_model., …).
    buckets: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for p, c in sorted(set(claims), key=lambda c: -len(c[0])):
        buckets[p.split(".", 1)[0] if "." in p else ""].append((p, c))
    anywhere = buckets.pop("", [])
    keys_of: dict[str, list[str]] = defaultdict(list)
    matched: set[tuple[str, str]] = set()
    for head, keys in ix.heads.items() if claims else [("", list(ix.tensors))]:
        tried = (*buckets.get(head, ()), *anywhere)
        if not tried:
            keys_of[rest].extend(keys)
            continue
        first = tried[0]
        if all(map(str.startswith, keys, repeat(first[0]))):
            keys_of[first[1]].extend(keys)  # e.g. `model.diffusion_model.`: every key of the group
            matched.add(first)
            continue
        for k in keys:
            comp = rest
            for claim in tried:
                if k.startswith(claim[0]):
                    comp = claim[1]
                    matched.add(claim)
                    break
            keys_of[comp].append(k)
    prefix_of: dict[str, str] = {}  # the longest claimed prefix that matched: the component's own root
    for p, c in sorted(matched, key=lambda c: len(c[0])):
        prefix_of[c] = p
    out = {}
    tensors, prod = ix.tensors, math.prod
    for comp in sorted(keys_of, key=lambda c: COMPONENT_ORDER.index(c) if c in COMPONENT_ORDER else 99):
        keys = keys_of[comp]
        infos = list(map(tensors.__getitem__, keys))
        params = sum(map(prod, map(_SHAPE, infos)))
        sizes = list(map(_NBYTES, infos))
        nbytes = sum(sizes)
        dtypes = list(map(_DTYPE, infos))
        if len(set(dtypes)) == 1:
            dtype = dtypes[0]
        else:  # the dtype holding the most bytes (a tensor of none counted as one byte)
            by_dtype: Counter = Counter()
            for dt, n in zip(dtypes, sizes, strict=True):
                by_dtype[dt] += n or 1
            dtype = by_dtype.most_common(1)[0][0]
        prefix = prefix_of.get(comp, "")
        if comp == rest and comp not in prefix_of:
            prefix = _common_prefix(keys)
        out[comp] = Component(prefix, len(keys), params, nbytes, dtype)
    return out


_SHAPE, _NBYTES, _DTYPE = (operator.attrgetter(a) for a in ("shape", "nbytes", "dtype"))


def _common_prefix(keys: list[str]) -> str:
    if not keys:
        return ""
    first, last = min(keys), max(keys)
    n = 0
    while n < min(len(first), len(last)) and first[n] == last[n]:
        n += 1
    cut = first[:n]
    return cut[: cut.rfind(".") + 1] if "." in cut else ""


def _lora_facts(ix: KeyIndex):
    """LoRA facts (an engine.lora LoraInfo) from engine.lora, the owner of LoRA naming; None when absent."""
    try:
        from ..lora import describe_lora
    except ImportError:
        return None
    try:
        return describe_lora(ix)
    except Exception:  # a bug there must not cost the user the rest of the detection
        log.debug("describe_lora failed on %s", ix.path or "an index", exc_info=True)
        return None


def detect_index(index, *, path: str = "") -> Detection:
    """What these keys, shapes and metadata are (kind, architecture, variant, prediction, components).

    `index` is a safetensors header, an engine.formats ModelIndex or a KeyIndex; no tensor data is read."""
    ix = as_key_index(index, path=path)
    base = {
        "path": path or ix.path,
        "file_bytes": ix.file_size,
        "format": ix.format,
        "metadata": ix.metadata,  # frozen (copied) by Detection
        "summary": summarize(ix.metadata),
    }
    if not ix.tensors:
        return Detection(**base, error=Failure("format", "the file holds no tensors: not a model"))
    d = _classify(ix, base)
    if d.variant is None and d.kind not in ("unknown", "checkpoint", "diffusion_model"):
        d = _replace(d, variant="normal")
    quant_ev, quant_error = _quant_report(ix)
    if quant_ev or quant_error:
        d = _replace(d, evidence=d.evidence + quant_ev)
    if quant_error and d.error is None:
        d = _replace(d, error=quant_error)
    if ix.format == "gguf" and d.error is None:
        d = _gguf_types(ix, d)
    return d


def _gguf_types(ix: KeyIndex, d: Detection) -> Detection:
    """A GGUF model loads when engine.quant reads every tensor's type; else the first one it cannot read
    is the error, by name. Text encoders in llama.cpp's names are read under transformers' names
    (engine.formats.gguf_names); one whose names stay llama.cpp's is refused, saying why."""
    from ..formats.dtypes import DTYPES
    from ..formats.gguf_names import is_llama_cpp_naming
    from ..quant import SUPPORTED, check_supported

    if is_llama_cpp_naming(ix.tensors):
        arch = ix.metadata.get("general.architecture")
        msg = (
            "a GGUF text encoder in llama.cpp's tensor names (Loadout has no map from llama.cpp's names for "
            f"general.architecture {arch!r}): use a safetensors copy of it"
        )
        return _replace(d, error=Failure("unsupported", msg))
    for key, t in ix.tensors.items():
        if t.dtype not in SUPPORTED and t.dtype not in DTYPES:
            try:
                check_supported(t.dtype)
            except UnsupportedModel as e:
                msg = f"{key}: {e.message}"
                ev = Evidence(key, ix.shape(key), f"GGUF type {t.dtype}")
                return _replace(d, error=Failure("unsupported", msg), evidence=d.evidence + (ev,))
    return d


def _replace(d: Detection, **kw) -> Detection:
    import dataclasses

    return dataclasses.replace(d, **kw)


def _classify(ix: KeyIndex, base: dict) -> Detection:
    lora_ev = kinds.lora_evidence(ix)
    if lora_ev is not None:
        info = _lora_facts(ix)
        arch = info.base if info else None
        ev = [lora_ev]
        facts = None
        if info:
            algos = ", ".join(info.algos) or "?"
            targets = ", ".join(info.targets) or "?"
            modules = f"{info.modules} modules of " if info.modules else ""
            why = (
                f"{algos} adapters on {modules}{targets}: module names and shapes → base {arch or 'unknown'}"
            )
            ev.append(Evidence("", None, why))
            facts = LoraFacts(info.format, info.algos, info.rank, info.alpha, info.targets, info.base)
        return Detection(
            **base,
            kind="lora",
            architecture=arch,
            components=build_components(ix, []),
            lora=facts,
            evidence=tuple(ev),
        )
    emb = kinds.embedding(ix)
    if emb is not None:
        return Detection(
            **base,
            kind="embedding",
            architecture=emb[0],
            components=build_components(ix, []),
            evidence=tuple(emb[1]),
        )
    cn = kinds.controlnet(ix)
    if cn is not None:
        arch, ev, claims = cn
        comps = build_components(ix, claims)
        return Detection(**base, kind="controlnet", architecture=arch, components=comps, evidence=tuple(ev))
    ip = kinds.ip_adapter(ix)
    if ip is not None:
        comps = build_components(ix, [])
        return Detection(
            **base, kind="ip_adapter", architecture=ip[0], components=comps, evidence=tuple(ip[1])
        )

    backbone = find_backbone(ix)
    encoders = find_encoders(ix)
    # both before an AutoencoderKL rule claims theirs
    video = find_video_vaes(ix) + find_hunyuan_image_vaes(ix)
    vaes = video + [v for v in find_vaes(ix) if v.prefix not in {p.prefix for p in video}]
    vaes = [v for v in vaes if backbone is None or v.prefix != backbone.prefix]
    if backbone is not None:
        return _diffusion(ix, base, backbone, encoders, vaes)
    if vaes:
        arch = _vae_arch(vaes[0])
        if arch == "flux2" and not vaes[0].also:  # FLUX.3 and ERNIE-Image decode with the FLUX.2 VAE
            why = "FLUX.3's pipelines decode with this very VAE (diffusers' AutoencoderKLFlux2) → also flux3"
            ernie = "ERNIE-Image's pipeline decodes with it too (pipelines/ernie_image) → also ernie_image"
            notes = (Evidence("", None, why), Evidence("", None, ernie))
            return _single(ix, base, "vae", vaes, arch, ("flux3", "ernie_image"), notes)
        return _single(ix, base, "vae", vaes, arch, vaes[0].also)
    taesd = find_taesd(ix)
    if taesd:
        z = taesd[0].channels
        return _single(ix, base, "vae_approx", taesd, "flux2" if z == 32 else None)
    if any(e.component not in _CLIP_AND_T5 for e in encoders):
        # a decoder LLM or umT5: a multimodal LLM's vision tower is part of the text encoder, not CLIP vision
        return _single(ix, base, "text_encoder", encoders, None)
    vision = find_clip_vision(ix)
    if vision:
        claims = [
            c for e in encoders for c in ((e.prefix, e.component), (container_of(e.prefix), e.component))
        ]
        ev = [e for p in vision + encoders for e in p.evidence]
        return Detection(
            **base, kind="clip_vision", components=build_components(ix, claims), evidence=tuple(ev)
        )
    if encoders:
        return _single(ix, base, "text_encoder", encoders, None)
    up = kinds.upscaler(ix)
    if up is not None:
        return Detection(**base, kind="upscaler", components=build_components(ix, []), evidence=tuple(up))
    dit = unknown_transformer(ix)  # a denoiser no rule knows: architecture null, with what its keys show
    if dit is not None:
        return _diffusion(ix, base, dit, [], [])
    ev: tuple[Evidence, ...] = tuple(kinds.motion_modules(ix) or kinds.redux(ix) or ())
    if ix.has("latent_tensor"):  # ComfyUI's .latent: a safetensors file with one latent in it
        why = "a ComfyUI latent, not a model (decode it with `loadout decode`)"
        ev = (Evidence("latent_tensor", ix.shape("latent_tensor"), why),)
    return Detection(**base, kind="unknown", components=build_components(ix, []), evidence=ev)


_CLIP_AND_T5 = ("clip_l", "clip_g", "clip_h", "t5xxl", "other")


def find_encoders(ix: KeyIndex) -> list[Part]:
    """CLIP / T5 encoders (parts.py), decoder LLMs and umT5 (text_encoders.py); umT5 replaces the plain T5
    reading of the same keys."""
    newer = find_llm_encoders(ix) + find_umt5(ix)
    taken = {p.prefix for p in newer}
    return [p for p in find_text_encoders(ix) if p.prefix not in taken] + newer


def _vae_arch(v: Part) -> str | None:
    if v.architecture is not None:  # video VAEs name their family (video_vaes.py)
        return v.architecture
    # 4 channels: SD1, SD2 and SDXL VAEs share one layout; 16: SD3 and FLUX.1 do — only 32 is one family,
    # and only for an AutoencoderKL (a DC-AE decodes 32 channels too)
    return "flux2" if v.channels == 32 and v.what == "AutoencoderKL" else None


def _single(
    ix: KeyIndex,
    base: dict,
    kind: str,
    parts: list[Part],
    arch: str | None,
    also: tuple[str, ...] = (),
    notes: tuple[Evidence, ...] = (),
) -> Detection:
    """A file that is one kind of part (a VAE, text encoders, a tiny autoencoder); `notes`: evidence for `also`."""
    by_comp: dict[str, list[str]] = defaultdict(list)
    for p in parts:
        by_comp[p.component].append(p.prefix)
    claims = []
    for comp, prefixes in by_comp.items():
        if len(prefixes) == 1:
            claims += [(prefixes[0], comp), (container_of(prefixes[0]), comp)]
        else:  # e.g. a tiny autoencoder's encoder.layers. and decoder.layers.: the component is both
            claims.append((_common_prefix(prefixes), comp))
    if len(by_comp) == 1 and kind in ("vae", "vae_approx"):
        comp = next(iter(by_comp))
        # A VAE file is all VAE (quant_conv, a latent batch-norm, …), under its parts' common prefix.
        claims = [(min((c[0] for c in claims), key=len), comp), ("", comp)]
        # …except what training checkpoints keep beside it (the GAN loss, EMA copies).
        claims += [("loss.", "other"), ("model_ema.", "other")]
    ev = tuple(e for p in parts for e in p.evidence) + notes
    return Detection(
        **base,
        kind=kind,
        architecture=arch,
        also=also if arch else (),
        components=build_components(ix, claims),
        evidence=ev,
    )


def _diffusion(ix: KeyIndex, base: dict, b: Backbone, encoders: list[Part], vaes: list[Part]) -> Detection:
    claims = [(b.prefix, b.component)]
    for part in encoders + vaes:
        if part.prefix != b.prefix:
            # beside a denoiser the checkpoint's "vae" is the picture's: its sound decoders' bytes are "other"
            comp = "other" if part.what in AUDIO_WHAT else part.component
            claims += [(part.prefix, comp), (container_of(part.prefix), comp)]
    evidence = list(b.evidence)
    for part in encoders + vaes:
        evidence.extend(part.evidence)
    kind = "checkpoint" if (encoders or vaes) else "diffusion_model"
    prediction = b.prediction
    stated = metadata_prediction(ix.metadata)
    if stated is not None and (prediction is None or b.architecture in ("sd2", None)):
        prediction = stated[0]
        evidence.append(
            Evidence(f"__metadata__.{stated[1]}", None, f"the metadata states {stated[0]} prediction")
        )
    elif b.architecture == "sd2" and prediction is None:
        evidence.append(
            Evidence(
                b.prefix + "output_blocks.11.1.transformer_blocks.0.norm1.bias",
                None,
                "SD2 is eps (512-base) or v (768-v); only weight values tell: use read_values",
            )
        )
    claimed = metadata_architecture(ix.metadata)
    if claimed is not None and claimed != b.architecture:
        what = (
            "not confirmed by the weights"
            if b.architecture is None
            else f"but the weights say {b.architecture}"
        )
        why = f"the metadata claims {claimed} ({ix.metadata['modelspec.architecture']}), {what}"
        evidence.append(Evidence("__metadata__.modelspec.architecture", None, why))
    return Detection(
        **base,
        kind=kind,
        architecture=b.architecture,
        also=tuple(b.also) if b.architecture else (),
        variant=b.variant if b.architecture else None,
        prediction=prediction,
        components=build_components(ix, claims, rest="other"),
        evidence=tuple(evidence),
    )
