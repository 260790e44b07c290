"""FLUX.3 (Black Forest Labs, 2026) in BFL's naming and diffusers' (`Flux3Transformer2DModel`).

Facts (cited, not copied) from diffusers `models/transformers/transformer_flux3.py` and `loaders/single_file_utils.py`
(`CHECKPOINT_KEY_NAMES["flux3"]`, `["flux3-distilled"]`, `convert_flux3_transformer_checkpoint_to_diffusers`):

* per-mode blocks first — the image's and the reference image's (BFL `content_mode_blocks.{image,image_cond}.N`,
  diffusers `mode_blocks.{image,image_cond}.N`) and the text's (`txt_mode_blocks.N` in both) — then joint single
  blocks (`single_blocks.N` / `single_transformer_blocks.N`). Every block has separate, bias-free q / k / v
  (`q_proj` / `attn.to_q`), an output projection (`attn_out` / `attn.to_out.0`), 128-wide QK norms
  (`norm.query_norm.scale` / `attn.norm_q.weight`) and a SwiGLU MLP (`mlp_in` / `ff.linear_in`, twice its width):
  FLUX.2's single blocks fuse q, k, v and the MLP into one `linear1` (`to_qkv_mlp_proj`), FLUX.1's carry biases.
  No other family names a single block's parts so; a shard of blocks alone names FLUX.3.
* the modulation is per mode, shared by the blocks: `early_stream_modulations.{image,image_cond,txt}.lin` and
  `single_stream_modulations.*.lin` (diffusers `.linear`) — the stem keys diffusers' own detection reads.
* the step-distilled (flow-map) checkpoints carry a second timestep embedder, for the time each step jumps to:
  `ref_time_in` (diffusers `target_timestep_embedder`) -> variant `distilled`.
* default size (diffusers' config): 5 per-mode blocks of each mode, 28 single blocks, 24 heads × 128 (hidden 3072),
  text 20480 wide (8 stacked Qwen3-VL layers × 2560), 128 input channels (2×2 patches of a 32-channel latent).
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view

# (naming, anchor, keys that must sit beside it): blocks first (any shard holds some), then the stem.
_ANCHORS = (
    ("bfl", "single_blocks.#.q_proj.weight", ("single_blocks.#.mlp_in.weight", "single_blocks.#.attn_out.weight")),
    ("bfl", "content_mode_blocks.image.#.q_proj.weight", ("content_mode_blocks.image.#.mlp_in.weight",)),
    ("bfl", "content_mode_blocks.image_cond.#.q_proj.weight", ("content_mode_blocks.image_cond.#.mlp_in.weight",)),
    ("bfl", "txt_mode_blocks.#.q_proj.weight", ("txt_mode_blocks.#.mlp_in.weight",)),
    ("diffusers", "single_transformer_blocks.#.ff.linear_in.weight", ("single_transformer_blocks.#.attn.to_q.weight",)),
    ("diffusers", "mode_blocks.image.#.attn.to_q.weight", ("mode_blocks.image.#.ff.linear_in.weight",)),
    ("diffusers", "mode_blocks.image_cond.#.attn.to_q.weight", ("mode_blocks.image_cond.#.ff.linear_in.weight",)),
    ("diffusers", "txt_mode_blocks.#.attn.to_q.weight", ("txt_mode_blocks.#.ff.linear_in.weight",)),
    ("bfl", "early_stream_modulations.image.lin.weight", ()),
    ("bfl", "single_stream_modulations.image.lin.weight", ()),
    ("diffusers", "early_stream_modulations.image.linear.weight", ()),
    ("diffusers", "single_stream_modulations.image.linear.weight", ()),
)  # fmt: skip
# (naming) -> (per-mode image blocks, text blocks, single blocks, q's suffix, the k norm's suffix)
_BLOCKS = {
    "bfl": ("content_mode_blocks.image.#.", "txt_mode_blocks.#.", "single_blocks.#.", "q_proj.weight",
            "norm.key_norm.scale"),
    "diffusers": ("mode_blocks.image.#.", "txt_mode_blocks.#.", "single_transformer_blocks.#.", "attn.to_q.weight",
                  "attn.norm_k.weight"),
}  # fmt: skip
_STEM = {
    "bfl": ("early_stream_modulations.image.lin.weight", "emb_in.image.weight", "txt_in.weight",
            "ref_time_in.in_layer.weight", "time_in.in_layer.weight"),
    "diffusers": ("early_stream_modulations.image.linear.weight", "x_embedders.image.weight",
                  "context_embedder.weight", "target_timestep_embedder.linear_1.weight",
                  "timestep_embedder.linear_1.weight"),
}  # fmt: skip


def _find(ix: KeyIndex) -> tuple[View, str, str] | None:
    for naming, anchor, also in _ANCHORS:
        v = find_view(ix, anchor, *also)
        if v is not None:
            return v, naming, anchor
    return None


def flux3(ix: KeyIndex) -> Backbone | None:
    found = _find(ix)
    if found is None:
        return None
    v, naming, anchor = found
    b = Backbone(v.prefix, "transformer", "flux", architecture="flux3", variant=None, prediction="flow")
    image, txt, single, q, k_norm = _BLOCKS[naming]
    hidden = _hidden(v, naming)
    head = v.dim(single + k_norm, 0) or v.dim(image + k_norm, 0) or v.dim(txt + k_norm, 0)
    size = f"hidden size {hidden}" + (f", {hidden // head} heads of {head}" if hidden and head else "")
    if "#" in anchor:
        stream = "joint single" if anchor.startswith("single") else "per-mode"
        v.because(b, anchor, f"FLUX.3 {stream} blocks ({v.blocks(anchor)}): separate q / k / v and a SwiGLU "
                             f"MLP in every block, {size}")  # fmt: skip
    for what, suffix in (("per-mode image", image), ("per-mode text", txt), ("joint single", single)):
        if suffix + q != anchor and v.has(suffix + q):
            v.because(b, suffix + q, f"{what} blocks ({v.blocks(suffix + q)})")
    mod, img_in, txt_in, flow_map, time_in = _STEM[naming]
    if v.has(mod):
        v.because(
            b, mod, "a modulation per token mode (image, reference image, text) shared by the blocks → FLUX.3"
        )
    if v.has(img_in) and v.has(txt_in):
        v.because(b, txt_in, f"image tokens {v.dim(img_in, 1)} wide (2×2 patches of the latent), text features "
                             f"{v.dim(txt_in, 1)} wide (stacked Qwen3-VL layers), {size}")  # fmt: skip
    if v.has(flow_map):
        b.variant = "distilled"
        v.because(
            b,
            flow_map,
            "a second timestep embedder (the time each step jumps to: a flow map) → step-distilled",
        )
    elif v.has(time_in):
        v.because(b, time_in, "one timestep embedder, no flow-map embedder → the base (undistilled) model")
    else:
        b.because(v.ix, v.prefix + time_in, "no timestep embedder in this file (a shard?): whether it is the "
                                            "step-distilled model cannot be told")  # fmt: skip
    return b


def _hidden(v: View, naming: str) -> int | None:
    image, txt, single, q, _ = _BLOCKS[naming]
    for suffix in (single + q, image + q, txt + q, _STEM[naming][0]):
        d = v.dim(suffix, 1)
        if d is not None:
            return d
    return None
