"""Stable Cascade's two namings of the same modules, for LoRAs: the release's (Stability's stage_c / stage_b files) and
diffusers' (StableCascadeUNet) keep every path but two. Facts from diffusers' `loaders/single_file_utils.py`
`convert_stable_cascade_unet_single_file_to_diffusers` (cited, not copied): each attention's torch MultiheadAttention
`attention.attn.out_proj` is diffusers' `attention.to_out.0` (its fused `in_proj` is split into `to_q` / `to_k` /
`to_v`, which no LoRA reaches: the release's in_proj is read from a plain holder, engine.denoise.stable_cascade), and
Stage B's pooled-CLIP mapper `clip_mapper` is diffusers' `clip_txt_pooled_mapper` (Stage C has that name in both)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_OUT = re.compile(r"^(.*\.attention\.)(attn\.out_proj|to_out\.0)$")


def is_cascade(paths: Iterable[str]) -> bool:
    """A Stable Cascade UNet's module paths (its embedding and clf convolutions, its level lists)."""
    ps = set(paths)
    return {"embedding.1", "clf.1"} <= ps and any(p.startswith("down_downscalers.") for p in ps)


def other_names(paths: Iterable[str]) -> dict[str, str]:
    """For a Stable Cascade base's module paths: the other naming's name of each renamed module -> the base's path."""
    ps = set(paths)
    out = {}
    for p in ps:
        m = _OUT.match(p)
        if m:
            out[m.group(1) + ("to_out.0" if m.group(2) == "attn.out_proj" else "attn.out_proj")] = p
    if "clip_mapper" in ps:  # the release's Stage B
        out["clip_txt_pooled_mapper"] = "clip_mapper"
    elif "clip_txt_pooled_mapper" in ps and "clip_txt_mapper" not in ps:  # diffusers' Stage B
        out["clip_mapper"] = "clip_txt_pooled_mapper"
    return out
