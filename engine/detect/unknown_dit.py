"""A diffusion transformer no rule knows: named for what its keys show — repeated attention blocks, their
width, a timestep embedding, the patch of its input embedding — with architecture null, never a guess.

A timestep embedding is what makes a stack of attention blocks a denoiser rather than a text or vision
encoder (every family of diffusion.py embeds the timestep: `t_embedder`, `time_in`, `time_embed`,
`adaln_single`, `time_text_embed`...), so it is required here.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View

# Leaf modules that hold an attention's query (or fused q/k/v) projection, across the namings we know.
_QUERY = (
    "q", "to_q", "qkv", "q_proj", "wq", "to_qkv", "q_linear", "qkv_x", "Wqkv", "img_attn_qkv",
    "to_query",  # Kandinsky 5 / 6 (diffusers transformer_kandinsky*.py)
    "img_qkv_proj",  # PRX (diffusers transformer_prx.py)
)  # fmt: skip
_TIME = (
    "t_embedder",
    "time_embed",
    "time_in",
    "timestep",
    "adaln_single",
    "t_block",
    "time_proj",
    "tmlp",
    "temb",
    "t_embedding",  # Ideogram 4 (diffusers transformer_ideogram4.py)
)
_STEMS = (
    "x_embedder",
    "img_in",
    "patch_embed",
    "patchify_proj",
    "patch_embedding",
    "proj_in",
    "first",
    "pos_embed",
)


def unknown_transformer(ix: KeyIndex) -> Backbone | None:
    if not any(t in p for p in ix.by_pattern for t in _TIME):
        return None
    best: tuple[int, str, str] | None = None  # (blocks, container pattern, a query key)
    for pattern, keys in ix.by_pattern.items():
        segs = pattern.split(".")
        if "#" not in segs or len(segs) < 3 or segs[-1] != "weight" or segs[-2] not in _QUERY:
            continue
        cut = segs.index("#")
        container = ".".join(segs[: cut + 1])
        n = len({k.split(".")[cut] for k in keys})
        if best is None or n > best[0]:
            best = (n, container, min(keys, key=lambda k: (len(k), k)))
    if best is None or best[0] < 2:
        return None
    n, container, q = best
    segs = container.split(".")
    prefix = ".".join(segs[:-2]) + "." if len(segs) > 2 else ""
    v = View(ix, prefix)
    b = Backbone(prefix, "transformer", "unknown")
    b.architecture = None
    b.variant = None
    hidden = ix.dim(q, -1)
    suffix = q[len(prefix) :].split(".")
    suffix[1] = "#"
    blocks = v.blocks(".".join(suffix))
    patch = _patch(v)
    b.because(ix, q, f"transformer, {blocks}, hidden {hidden}{patch}: no known release")
    return b


def _patch(v: View) -> str:
    for stem in _STEMS:
        for leaf in (f"{stem}.weight", f"{stem}.proj.weight", f"{stem}.proj.1.weight"):
            shape = v.shape(leaf)
            if shape is None:
                continue
            if len(shape) >= 4:
                return ", patch " + "×".join(str(s) for s in shape[2:])
            if len(shape) == 2:
                return f", {shape[1]} input features per token"
    return ""
