"""MiniMax-H3 (MiniMax, 2026: one transformer over a packed sequence of video, text and audio rows), in the release's
naming (MiniMaxAI / Comfy-Org single files, bare or under `model.diffusion_model.`) and diffusers'
(`MiniMaxH3Transformer3DModel`).

Facts (cited, not copied) from diffusers `models/transformers/transformer_minimax_h3.py` and `loaders/
single_file_utils.py` (`CHECKPOINT_KEY_NAMES["minimax-h3"]`: `token_refiner.blocks.0.attn.qkv_proj.weight`;
`convert_minimax_h3_transformer_checkpoint_to_diffusers`):

* every block (`blocks.N` / `transformer_blocks.N`) has its own AdaLN projection `adaln_proj.linear` from the timestep
  embedding to 6 x hidden x 3 — six modulations per (timestep, modality), the modalities video, text and audio; no
  other family's block carries one of that name. Beside it a fused `attn.qkv_proj` (diffusers `attn.to_q` / `to_k` /
  `to_v`; heads x head wider than the residual stream), per-head `q_norm` / `k_norm` and a SwiGLU `mlp.fc1` / `fc2`
  (`ff.net.0.proj` / `ff.net.2`).
* the stem: `video_patch_proj` / `audio_patch_proj` / `condition_proj` (`proj_in` / `audio_proj_in` /
  `context_embedder`), a text `token_refiner` of plain blocks, `final_layer.{video_out,audio_out}` (`proj_out` /
  `audio_proj_out`). A pruned checkpoint replaces `time_embedder` by a precomputed `adaln_t_table`, which diffusers'
  model refuses.
* default size (diffusers' config): 50 blocks, hidden 5376, 56 heads of 128, SwiGLU 14336, text 5120 wide, video
  rows 96 wide (1x2x2 patches of 24 channels), audio rows 32 wide: 33.1B parameters.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view

MODALITIES = 3  # video, text, audio: one row of AdaLN parameters per (timestep, modality)
RELEASE_HIDDEN = 5376

# naming -> (block, its AdaLN projection, q (fused or alone), the k norm, SwiGLU in)
_NAMES = {
    "release": ("blocks.#.", "adaln_proj.linear.weight", "attn.qkv_proj.weight", "attn.k_norm.weight",
                "mlp.fc1.weight"),
    "diffusers": ("transformer_blocks.#.", "adaln_proj.linear.weight", "attn.to_q.weight", "attn.norm_k.weight",
                  "ff.net.0.proj.weight"),
}  # fmt: skip
# naming -> (video in, audio in, text in, refiner block q, the pruned table, time embedder)
_STEM = {
    "release": ("video_patch_proj.weight", "audio_patch_proj.weight", "condition_proj.weight",
                "token_refiner.blocks.#.attn.qkv_proj.weight", "time_embedder.proj_in.weight"),
    "diffusers": ("proj_in.weight", "audio_proj_in.weight", "context_embedder.weight",
                  "token_refiner.refiner_blocks.#.attn.to_q.weight", "time_embedder.linear_1.weight"),
}  # fmt: skip


def _find(ix: KeyIndex) -> tuple[View, str, bool] | None:
    """(view, naming, whether blocks were found): blocks first, a stem-only shard by its token refiner."""
    for naming, (blk, ada, q, _, ff) in _NAMES.items():
        v = find_view(ix, blk + ada, blk + q, blk + ff)
        if v is not None:
            return v, naming, True
    for naming, (video, audio, _, refiner, _) in _STEM.items():
        v = find_view(ix, refiner, video, audio)
        if v is not None:
            return v, naming, False
    return None


def minimax_h3(ix: KeyIndex) -> Backbone | None:
    found = _find(ix)
    if found is None:
        return None
    v, naming, has_blocks = found
    blk, ada, q, k_norm, ff = _NAMES[naming]
    video, audio, text, refiner, time_in = _STEM[naming]
    b = Backbone(v.prefix, "transformer", "minimax_h3", architecture="minimax_h3", prediction="flow")
    hidden = v.dim(blk + q, 1) or v.dim(video, 0)
    head = v.dim(blk + k_norm, 0)
    qwidth = v.dim(blk + q, 0)
    if qwidth and naming == "release":
        qwidth //= 3
    heads = f", {qwidth // head} heads of {head}" if qwidth and head else ""
    if has_blocks:
        rows = v.dim(blk + ada, 0)
        v.because(b, blk + ada, f"blocks ({v.blocks(blk + ada)}) each with its own AdaLN projection to "
                                f"{rows} = 6 x {(rows or 0) // (6 * MODALITIES)} x {MODALITIES} modulations "
                                f"(per timestep and modality: video, text, audio) → MiniMax-H3, hidden "
                                f"{hidden}{heads}, SwiGLU {(v.dim(blk + ff, 0) or 0) // 2}")  # fmt: skip
    else:
        v.because(b, refiner, "a text token refiner beside video and audio patch projections → MiniMax-H3 "
                              "(no blocks in this file: part of a sharded model)")  # fmt: skip
    if v.has(video) and v.has(audio):
        v.because(b, video, f"video rows {v.dim(video, 1)} wide, audio rows {v.dim(audio, 1)} wide, text "
                            f"{v.dim(text, 1)} wide, one packed sequence")  # fmt: skip
    if v.has("adaln_t_table"):
        b.variant = None
        v.because(b, "adaln_t_table", "a precomputed AdaLN table in place of the timestep embedder: the pruned "
                                      "checkpoint, which no published forward runs")  # fmt: skip
        return b
    if not v.has(time_in):
        b.because(v.ix, v.prefix + time_in, "no timestep embedder in this file (a shard?)")
    b.variant = "normal" if hidden == RELEASE_HIDDEN else None
    if b.variant is None:
        v.because(b, blk + q if has_blocks else video, f"hidden {hidden}: not the released MiniMax-H3 "
                                                       f"({RELEASE_HIDDEN})")  # fmt: skip
    return b
