"""Image transformers on FLUX.1's double- and single-stream blocks without its pooled text vector, in diffusers'
naming (what their releases ship; diffusers has no single-file converter for them): LongCat-Image, Bria 3.2,
Bria FIBO, Ovis-Image and Motif-Video. All of them step: LongCat-Image and Ovis-Image in engine.denoise.longcat_image,
Bria 3.2 and FIBO in engine.denoise.bria, Motif-Video in engine.denoise.motif_video.

Facts (cited, not copied; diffusers 0.42 classes, built on the meta device by the tests):
* FLUX.1 (transformer_flux.py) conditions the time embedding on a pooled CLIP vector:
  `time_text_embed.timestep_embedder` and `time_text_embed.text_embedder`. The families below have no pooled
  vector, so their time embedding stands alone.
* LongCat-Image (transformer_longcat_image.py, meituan-longcat/LongCat-Image and LongCat-Image-Edit, whose
  pipeline runs the same class) and Bria 3.2 (transformer_bria.py, briaai/BRIA-3.2): `time_embed.
  timestep_embedder` and FLUX's blocks, key for key the same modules; the text they read tells them apart:
  `context_embedder` from Qwen2.5-VL 7B's 3584-wide states (LongCat) or T5-XXL's 4096 (Bria).
* Bria FIBO (transformer_bria_fibo.py, briaai/FIBO): Bria 3.2's layout plus a `caption_projection.N` per block
  (the text encoder's layers projected into each block).
* Ovis-Image (transformer_ovis_image.py, AIDC-AI/Ovis-Image-7B): a bare `timestep_embedder`, an RMS
  `context_embedder_norm`, and gated feed-forwards: `ff.net.0.proj` and the single blocks' `proj_mlp` are
  8 x hidden (SwiGLU over 4 x hidden), FLUX's 4 x.
* Motif-Video (transformer_motif_video.py, Motif-Technologies/Motif-Video-2B): the same blocks on video, a 3-D
  `x_embedder.proj`, the text through an MLP (`context_embedder.linear_1/2`) where HunyuanVideo has a token
  refiner, and `time_text_embed` holding a timestep embedder only; its pipelines sample flow sigmas from 1 with
  FLUX's resolution-dependent shift.
* Every other pipeline samples with FlowMatchEulerDiscreteScheduler.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view

_Q = "transformer_blocks.#.attn.add_q_proj.weight"
_FF = "transformer_blocks.#.ff.net.0.proj.weight"
_SINGLE = "single_transformer_blocks.#.proj_mlp.weight"
# the width of the text states each reads (context_embedder's input) -> (architecture, name)
_TEXT = {
    3584: ("longcat_image", "LongCat-Image (Qwen2.5-VL 7B text)"),
    4096: ("bria", "Bria 3.2 (T5-XXL text)"),
}


def flux_likes(ix: KeyIndex) -> Backbone | None:
    v = find_view(ix, _Q, _FF)
    if v is None:
        return None
    if v.has("time_text_embed.text_embedder.linear_1.weight"):
        return None  # FLUX.1's pooled text vector
    hidden = v.dim(_Q, 1)
    if len(v.shape("x_embedder.proj.weight") or ()) == 5 and v.has("context_embedder.linear_1.weight"):
        b = _backbone(v, "motif_video", hidden)
        why = "a video (3-D) patch embedding and the text through an MLP, no token refiner → Motif-Video"
        v.because(b, "x_embedder.proj.weight", why)
        return b
    if hidden and v.dim(_FF, 0) == 8 * hidden:
        return _ovis(v, hidden)
    if not v.has("time_embed.timestep_embedder.linear_1.weight"):
        return None  # without the stem, FLUX.1's blocks: flux.py's rule says what they could be
    text = v.dim("context_embedder.weight", 1)
    if v.has("caption_projection.0.linear.weight"):
        b = _backbone(v, "bria_fibo", hidden)
        v.because(
            b, "caption_projection.0.linear.weight", "a caption projection into every block → Bria FIBO"
        )
        return b
    arch, name = _TEXT.get(text or 0, (None, None))
    if arch is None:
        return None
    b = _backbone(v, arch, hidden)
    v.because(
        b,
        "time_embed.timestep_embedder.linear_1.weight",
        "a time embedding without a pooled text vector (FLUX.1 has one)",
    )
    v.because(b, "context_embedder.weight", f"text states {text} wide → {name}")
    return b


def _backbone(v: View, arch: str, hidden: int | None) -> Backbone:
    b = Backbone(v.prefix, "transformer", arch, architecture=arch, prediction="flow")
    v.because(
        b,
        _Q,
        f"FLUX-style double-stream ({v.blocks(_Q)}) and single-stream ({v.blocks(_SINGLE)}) blocks, hidden {hidden}",
    )
    return b


def _ovis(v: View, hidden: int) -> Backbone:
    b = _backbone(v, "ovis_image", hidden)
    v.because(b, _FF, f"gated feed-forwards ({v.dim(_FF, 0)} = 8 × hidden, FLUX's are 4 ×) → Ovis-Image")
    if v.has("context_embedder_norm.weight"):
        v.because(
            b, "context_embedder_norm.weight", "an RMS norm on the text states before they are embedded"
        )
    return b
