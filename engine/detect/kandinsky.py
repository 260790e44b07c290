"""Kandinsky 5 and Kandinsky 6 (and its video super-resolution transformer): detection (their forwards:
engine.denoise.kandinsky5, kandinsky6, kandinsky6_sr).

Facts (cited, not copied):
* Kandinsky 5 (ai-forever/Kandinsky-5 `kandinsky/models/dit.py` DiffusionTransformer3D; diffusers
  transformer_kandinsky.py Kandinsky5Transformer3DModel keeps its module names, so the release files and
  diffusers' read alike): `text_transformer_blocks.N` (self-attention, `text_modulation` of 6 x width) then
  `visual_transformer_blocks.N` with self- and cross-attention (`to_query` / `to_key` / `to_value` /
  `out_layer`, per-head RMS `query_norm`) and a `visual_modulation` of 9 x width. Release configs
  (Kandinsky-5 `configs/config_5s_sft.yaml`, `k5_pro_t2v_5s_sft_hd_parallel.yaml`): T2V Lite (2B) width
  1792, 32 visual blocks; Pro (19B) width 4096, 60 visual blocks. The image model (T2I / I2I Lite, 6B) is
  width 2560 with 50 visual blocks (Kandinsky-5.0-T2I-Lite's transformer config, as a port lists it). Every
  pipeline samples
  with FlowMatchEulerDiscreteScheduler.
* Kandinsky 6 (diffusers transformer_kandinsky6.py Kandinsky6Transformer3DModel): video and audio denoised
  together; `visual_transformer_blocks.N` hold a `video_dec_block` and an `audio_dec_block` (each
  Kandinsky 5's decoder block, feed-forward as diffusers' `FeedForward`) with `va_cross_attention` /
  `av_cross_attention` between them; text blocks per modality (`video_text_transformer_blocks`, ...).
  Its super-resolution model (transformer_kandinsky6_sr.py Kandinsky6SRTransformer3DModel) keeps the
  visual blocks alone: self-attention and a `visual_modulation` of 6 x width, no cross-attention, no text.
  Pipelines: FlowMatchEulerDiscreteScheduler or PiflowScheduler (both flow matching).
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .view import View, find_view, variant

_BLOCK = "visual_transformer_blocks.#."
# width -> (size, what it is): Kandinsky 5's releases
K5_SIZES = {1792: ("2b", "T2V Lite (2B)"), 4096: ("19b", "Pro (19B)"), 2560: ("6b", "Image Lite (6B)")}


def kandinsky(ix: KeyIndex) -> Backbone | None:
    fused = find_view(
        ix,
        _BLOCK + "video_dec_block.self_attention.to_query.weight",
        _BLOCK + "audio_dec_block.self_attention.to_query.weight",
    )
    if fused is not None:
        return _kandinsky6(fused)
    q = _BLOCK + "self_attention.to_query.weight"
    v = find_view(ix, q, _BLOCK + "visual_modulation.out_layer.weight")
    if v is None:
        return None
    if v.has(_BLOCK + "cross_attention.to_query.weight"):
        return _kandinsky5(v)
    return _kandinsky6_sr(v)


def _kandinsky5(v: View) -> Backbone:
    q = _BLOCK + "cross_attention.to_query.weight"
    b = Backbone(v.prefix, "transformer", "kandinsky5", architecture="kandinsky5", prediction="flow")
    hidden = v.dim(q, 1)
    v.because(
        b,
        q,
        f"visual blocks with self- and cross-attention and a 9-fold modulation ({v.blocks(q)}), hidden {hidden}"
        " → Kandinsky 5",
    )
    size = K5_SIZES.get(hidden or 0)
    if size is None:
        v.because(b, q, f"hidden {hidden}: no known Kandinsky 5 release has this size")
        b.variant = None
    else:
        v.because(b, q, f"hidden {hidden} → Kandinsky 5 {size[1]}")
        b.variant = variant("normal", size[0])
    return b


def _kandinsky6(v: View) -> Backbone:
    q = _BLOCK + "video_dec_block.self_attention.to_query.weight"
    b = Backbone(v.prefix, "transformer", "kandinsky6", architecture="kandinsky6", prediction="flow")
    hidden, audio = v.dim(q, 1), v.dim(_BLOCK + "audio_dec_block.self_attention.to_query.weight", 1)
    v.because(
        b,
        q,
        f"fused video / audio blocks ({v.blocks(q)}), video hidden {hidden}, audio hidden {audio} → Kandinsky 6",
    )
    b.variant = "normal"
    return b


def _kandinsky6_sr(v: View) -> Backbone | None:
    q = _BLOCK + "self_attention.to_query.weight"
    mod = _BLOCK + "visual_modulation.out_layer.weight"
    hidden, mods = v.dim(q, 1), v.dim(mod, 0)
    if not hidden or mods != 6 * hidden or not v.has(_BLOCK + "feed_forward.net.0.proj.weight"):
        return None  # no layout we know: Kandinsky 5's blocks always hold cross-attention
    b = Backbone(v.prefix, "transformer", "kandinsky6", architecture="kandinsky6_sr", prediction="flow")
    v.because(
        b,
        mod,
        f"Kandinsky visual blocks without cross-attention, a 6-fold modulation ({v.blocks(q)}), hidden {hidden}"
        " → Kandinsky 6 super-resolution",
    )
    b.variant = "normal"
    return b
