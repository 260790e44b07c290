"""Metadata the way users read it: kohya `ss_*` training facts, `modelspec.*` card fields, other strings.

Field names from kohya sd-scripts (`train_network.py` writes `ss_network_module`, `ss_network_dim`,
`ss_network_alpha`, `ss_network_args` JSON, `ss_tag_frequency` JSON {dataset: {tag: count}}, …) and the
Stability AI model-spec (github.com/Stability-AI/ModelSpec: `modelspec.architecture`, `.title`,
`.trigger_phrase`, `.prediction_type`, …). The raw metadata stays untouched in Detection.metadata.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping

from .result import Summary

MODELSPEC_FIELDS = (
    "title",
    "architecture",
    "implementation",
    "author",
    "description",
    "date",
    "license",
    "resolution",
    "trigger_phrase",
    "prediction_type",
    "usage_hint",
    "tags",
    "merged_from",
)
_LONG = 300  # characters shown of one field in the summary (the raw value stays in metadata)


def _json(value: str):
    try:
        return json.loads(value)
    except (ValueError, TypeError):
        return None


def _num(value: str | None):
    if value is None or value in ("None", ""):
        return None
    try:
        f = float(value)
    except ValueError:
        return value
    return int(f) if f.is_integer() and "." not in value else f


def top_tags(raw: str | None, n: int = 10) -> list[list]:
    """The n most frequent training tags over all datasets of `ss_tag_frequency`: [[tag, count], ...]."""
    data = _json(raw) if raw else None
    if not isinstance(data, dict):
        return []
    total: Counter = Counter()
    for tags in data.values():
        if isinstance(tags, dict):
            for tag, count in tags.items():
                if isinstance(count, (int, float)):
                    total[str(tag).strip()] += int(count)
    return [[t, c] for t, c in total.most_common(n)]


def training_summary(md: dict[str, str]) -> dict | None:
    """kohya sd-scripts facts, or None when the file carries none."""
    if not any(k.startswith("ss_") for k in md):
        return None
    args = _json(md.get("ss_network_args", "")) or None
    out = {
        "base_model": md.get("ss_base_model_version") or md.get("ss_sd_model_name"),
        "base_model_file": md.get("ss_sd_model_name"),
        "network_module": md.get("ss_network_module"),
        "network_args": args if isinstance(args, dict) else None,
        "network_dim": _num(md.get("ss_network_dim")),
        "network_alpha": _num(md.get("ss_network_alpha")),
        "output_name": md.get("ss_output_name"),
        "resolution": md.get("ss_resolution"),
        "epochs": _num(md.get("ss_epoch") or md.get("ss_num_epochs")),
        "steps": _num(md.get("ss_steps") or md.get("ss_max_train_steps")),
        "train_images": _num(md.get("ss_num_train_images")),
        "learning_rate": _num(md.get("ss_learning_rate")),
        "optimizer": md.get("ss_optimizer"),
        "comment": md.get("ss_training_comment"),
        "top_tags": top_tags(md.get("ss_tag_frequency")),
    }
    return {k: v for k, v in out.items() if v not in (None, "", [], "None")}


def modelspec_summary(md: dict[str, str]) -> dict | None:
    out = {}
    for f in MODELSPEC_FIELDS:
        v = md.get(f"modelspec.{f}")
        if v:
            out[f] = v if len(v) <= _LONG else v[:_LONG] + "…"
    return out or None


def summarize(md: Mapping[str, str]) -> Summary:
    """Summary(training=kohya facts, modelspec=card fields, other=remaining short strings); parts the
    metadata says nothing of stay empty."""
    if not md:
        return Summary()
    other = {
        k: v
        for k, v in md.items()
        # comfy.gguf.orig_shape.<key>: one per reshaped GGUF tensor, a layout fact for the loader
        if not k.startswith(("ss_", "sshs_", "modelspec.", "comfy.gguf.orig_shape."))
        and isinstance(v, str)
        and len(v) <= _LONG
    }
    out = {"training": training_summary(md), "modelspec": modelspec_summary(md), "other": other or None}
    return Summary(**{k: v for k, v in out.items() if v})


PREDICTION_WORDS = {
    "epsilon": "eps",
    "eps": "eps",
    "v": "v",
    "v_prediction": "v",
    "v-prediction": "v",
    "flow": "flow",
    "rectified_flow": "flow",
    "flow_matching": "flow",
}


def metadata_prediction(md: dict[str, str]) -> tuple[str, str] | None:
    """(prediction, metadata key) when the metadata states it (modelspec or kohya's v-parameterization)."""
    v = md.get("modelspec.prediction_type")
    if v and v.strip().lower() in PREDICTION_WORDS:
        return PREDICTION_WORDS[v.strip().lower()], "modelspec.prediction_type"
    if md.get("ss_v_parameterization") == "True":
        return "v", "ss_v_parameterization"
    return None


# modelspec.architecture values (Stability AI ModelSpec README, "architecture" examples) -> ours.
MODELSPEC_ARCH = (
    ("stable-diffusion-xl-v1-refiner", "sdxl_refiner"),
    ("stable-diffusion-xl", "sdxl"),
    ("stable-diffusion-v1", "sd1"),
    ("stable-diffusion-v2", "sd2"),
    ("stable-diffusion-v3.5-large", "sd3.5_large"),
    ("stable-diffusion-v3.5-medium", "sd3.5_medium"),
    ("stable-diffusion-v3", "sd3"),
    ("flux-1-dev", "flux1_dev"),
    ("flux-1-schnell", "flux1_schnell"),
)


def metadata_architecture(md: dict[str, str]) -> str | None:
    """The architecture the file's modelspec claims (a claim, not evidence from the weights)."""
    v = (md.get("modelspec.architecture") or "").lower()
    return next((ours for spec, ours in MODELSPEC_ARCH if v.startswith(spec)), None)
