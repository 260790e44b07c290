"""ERNIE-Image (Baidu, 2026): one stack of single-stream blocks sharing one AdaLN modulation.

Facts (cited, not copied) from diffusers `models/transformers/transformer_ernie_image.py`
(`ErnieImageTransformer2DModel`) and `loaders/single_file_utils.py`
(`convert_ernie_image_transformer_checkpoint_to_diffusers`):

* the release's single files hold diffusers' own names, at most under `model.diffusion_model.` (the converter only
  strips that prefix), so one rule reads both namings.
* every block (`layers.N.`) has Megatron-style names no other family uses: RMSNorms `adaLN_sa_ln` / `adaLN_mlp_ln`
  (weights only: the modulation is not per block), separate bias-free `self_attention.to_q/k/v`, per-head QK
  RMSNorms (`self_attention.norm_q`, head-wide) and a GELU-gated MLP `mlp.gate_proj` / `mlp.up_proj` /
  `mlp.linear_fc2`. The model's one `adaLN_modulation.1` (6 × hidden) serves every block.
* stem: `x_embedder.proj` (a patch convolution over 128 channels: FLUX.2's 32-channel latent in 2×2 patches),
  `text_proj` (text features, absent when they are as wide as the model), `time_embedding.linear_1/2`, and a head
  `final_norm.linear` (2 × hidden) + `final_linear`.
* default size (diffusers' config): 24 layers, 24 heads of 128 (hidden 3072), MLP 8192, text 2560; trained for
  rectified flow (the pipeline's FlowMatchEulerDiscreteScheduler). No released variant differs in layout.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view

_BLOCK = "layers.#."
_ANCHORS = (
    (
        _BLOCK + "self_attention.to_q.weight",
        (_BLOCK + "adaLN_sa_ln.weight", _BLOCK + "mlp.linear_fc2.weight"),
    ),
    (_BLOCK + "mlp.linear_fc2.weight", (_BLOCK + "adaLN_mlp_ln.weight", _BLOCK + "mlp.gate_proj.weight")),
    (
        "final_norm.linear.weight",
        ("adaLN_modulation.1.weight", "x_embedder.proj.weight", "final_linear.weight"),
    ),
)


def _find(ix: KeyIndex) -> tuple[View, str] | None:
    for anchor, also in _ANCHORS:
        v = find_view(ix, anchor, *also)
        if v is not None:
            return v, anchor
    return None


def ernie_image(ix: KeyIndex) -> Backbone | None:
    found = _find(ix)
    if found is None:
        return None
    v, anchor = found
    b = Backbone(
        v.prefix, "transformer", "ernie_image", architecture="ernie_image", variant=None, prediction="flow"
    )
    q, norm_k, gate = (
        _BLOCK + "self_attention.to_q.weight",
        _BLOCK + "self_attention.norm_k.weight",
        _BLOCK + "mlp.gate_proj.weight",
    )
    hidden = v.dim(q, 0) or v.dim("adaLN_modulation.1.weight", 1)
    head = v.dim(norm_k, 0)
    size = f"hidden size {hidden}" + (f", {hidden // head} heads of {head}" if hidden and head else "")
    if "#" in anchor:
        v.because(b, anchor, f"ERNIE-Image blocks ({v.blocks(anchor)}): adaLN_sa_ln / adaLN_mlp_ln norms, separate "
                             f"q / k / v and a GELU-gated mlp.linear_fc2 in every block, {size}")  # fmt: skip
    if v.has(gate):
        v.because(b, gate, f"MLP {v.dim(gate, 0)} wide")
    mod = "adaLN_modulation.1.weight"
    if v.has(mod):
        v.because(
            b, mod, "one AdaLN modulation (shift, scale, gate for attention and MLP) shared by every block"
        )
    emb = "x_embedder.proj.weight"
    if v.has(emb):
        s = v.shape(emb)
        patch = f", patch {s[2]}×{s[3]}" if len(s) == 4 else ""
        txt = v.dim("text_proj.weight", 1) or hidden
        v.because(b, emb, f"{s[1]} latent channels{patch} (FLUX.2's 32-channel latent packed 2×2), text features "
                          f"{txt} wide, {size}")  # fmt: skip
    elif "#" in anchor:
        b.because(
            v.ix, v.prefix + emb, "no patch embedding in this file (a shard?): its input width cannot be told"
        )
    return b
