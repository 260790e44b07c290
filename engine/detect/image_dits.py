"""Image transformers of 2025-26: Qwen-Image (and its Edit / Layered releases), Krea 2, HiDream-I1 and Sana,
in their original naming and diffusers naming.

Facts (cited, not copied):
* Qwen-Image was released in diffusers naming and ComfyUI keeps it (comfy/ldm/qwen_image): 60
  `transformer_blocks.N` with separate image / text streams (`img_mod.1`, `txt_mod.1` [6 x 3072, 3072],
  `attn.add_q_proj`), `txt_norm` over Qwen2.5-VL's 3584-wide states, `img_in` [3072, 64]
  (diffusers QwenImageTransformer2DModel defaults, 20B parameters). Qwen-Image-Edit and Edit-2509 use
  the same transformer (diffusers QwenImageEditPipeline loads QwenImageTransformer2DModel unchanged);
  ComfyUI marks the 2511 edit model with a `__index_timestep_zero__` key and tells Qwen-Image-Layered
  by `time_text_embed.addition_t_embedding` (ComfyUI model_detection.py).
* Qwen-Image 2.1 (diffusers QwenImage21Transformer2DModel, `CHECKPOINT_KEY_NAMES["qwen-image-2.1"]` =
  `txt_in.text_norm.weight` with or without `model.diffusion_model.`): one stream, no per-block modulation (one
  shared `modulation.1` [4 x 4096, 4096]), blocks of `attn.to_q` / `norm_q` and a SwiGLU `img_mlp.{gate_layer, proj,
  out}`, which ComfyUI's files fuse into `img_mlp.gate_up` (gate rows first:
  `convert_qwen_image21_transformer_checkpoint_to_diffusers`). Defaults: 32 blocks, hidden 4096, MLP 12288,
  64 unpatched latent channels, Qwen3-VL 8B states (4096): 7.1B parameters.
* Krea 2 (diffusers Krea2Transformer2DModel, `convert_krea2_transformer_checkpoint_to_diffusers` for the
  original names): 28 single-stream blocks, hidden 6144 with grouped K/V (1536), a gated attention
  output (`attn.gate` / `to_gate`), SwiGLU `mlp.{gate,up,down}`, and a text-fusion stack over Qwen3-VL
  4B layers (`txtfusion.projector` / `text_fusion.projector`).
* HiDream-I1 (HiDream-ai/HiDream-I1, whose naming diffusers keeps as is): 16 double-stream + 32
  single-stream blocks at 2560 wide, mixture-of-experts feed-forward (`ff_i.experts.N`, `ff_i.gate`),
  separate text projections (`attn1.to_q_t`), 49 `caption_projection.N` (ComfyUI model_detection.py).
  Full, Dev and Fast are three trainings of one config; HiDream-E1 (E1-Full, E1.1) keeps it key for key (its
  transformer config differs in max_resolution alone, which no tensor holds).
* Sana (NVlabs/Sana `diffusion/model/nets/sana_multi_scale.py`; diffusers convert_sana_transformer_to_
  diffusers): linear-attention blocks with a Mix-FFN of convolutions (`mlp.inverted_conv`,
  `depth_conv`, `point_conv`; diffusers `ff.conv_inverted`...) and cross-attention to Gemma 2 2B
  (`cross_attn.kv_linear`). Sizes (Sana configs): 600M hidden 1152, 28 blocks; 1600M hidden 2240, 20
  blocks; Sana 1.5 4.8B hidden 2240, 60 blocks. SANA-Sprint adds a guidance embedding.
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .result import Evidence
from .view import find_view, variant


def qwen_image(ix: KeyIndex) -> Backbone | None:
    anchor = "transformer_blocks.#.img_mod.1.weight"
    v = find_view(ix, anchor, "transformer_blocks.#.txt_mod.1.weight")
    if v is None:
        return None
    b = Backbone(v.prefix, "transformer", "qwen_image", architecture="qwen_image", prediction="flow")
    hidden = v.dim(anchor, 1)
    v.because(
        b, anchor, f"dual-stream blocks with image and text modulation ({v.blocks(anchor)}) → Qwen-Image"
    )
    size = "20b" if hidden == 3072 else None
    if size is None:
        v.because(b, anchor, f"hidden size {hidden}: no known Qwen-Image release has this size")
    task = "normal"
    if v.has("__index_timestep_zero__"):
        task = "edit"
        v.because(
            b,
            "__index_timestep_zero__",
            "ComfyUI's marker of the reference-image timestep → Qwen-Image-Edit 2511",
        )
    elif v.has("time_text_embed.addition_t_embedding.weight"):
        task = "layered"
        v.because(
            b,
            "time_text_embed.addition_t_embedding.weight",
            "an extra layer-index embedding → Qwen-Image-Layered",
        )
    elif any("edit" in ix.metadata.get(k, "").lower() for k in ("modelspec.architecture", "modelspec.title")):
        task = "edit"
        b.evidence.append(Evidence("__metadata__.modelspec.title", None, "the metadata names an Edit model"))
    else:
        why = "Qwen-Image-Edit and Edit-2509 share Qwen-Image's layout key for key: without a marker or metadata the file is reported as the base model"
        b.evidence.append(Evidence("", None, why))
    b.variant = task  # one size (20B) so far: the variant is the task alone
    return b


QWEN21_MLP = ("transformer_blocks.#.img_mlp.gate_layer.weight", "transformer_blocks.#.img_mlp.gate_up.weight")


def qwen_image21(ix: KeyIndex) -> Backbone | None:
    """Qwen-Image 2.1: single-stream blocks with a SwiGLU `img_mlp` and no modulation of their own (Qwen-Image 1's
    blocks hold `img_mod` / `txt_mod`, its MLP `img_mlp.net`)."""
    for anchor in QWEN21_MLP:
        v = find_view(ix, anchor, "transformer_blocks.#.attn.norm_q.weight")
        if v is not None and not v.has("transformer_blocks.#.img_mod.1.weight"):
            break
    else:
        return None
    b = Backbone(v.prefix, "transformer", "qwen_image21", architecture="qwen_image21", prediction="flow")
    hidden = v.dim("transformer_blocks.#.attn.to_q.weight", 1) or v.dim(anchor, 1)
    fused = (
        "fused gate and up (ComfyUI's names)" if anchor.endswith("gate_up.weight") else "gate_layer / proj"
    )
    why = f"single-stream blocks without modulation of their own, a SwiGLU img_mlp ({fused}; {v.blocks(anchor)}), hidden {hidden} → Qwen-Image 2.1"
    v.because(b, anchor, why)
    for stem, what in (("modulation.1.weight", "one modulation shared by every block"),
                       ("txt_in.text_norm.weight", "a text projection with its own norm (diffusers' Qwen-Image 2.1 key)")):  # fmt: skip
        if v.has(stem):
            v.because(b, stem, what)
    if hidden != 4096:
        v.because(b, anchor, f"hidden size {hidden}: not the released Qwen-Image 2.1 (4096, 7.1B)")
    b.variant = "normal"
    return b


def krea2(ix: KeyIndex) -> Backbone | None:
    names = ("blocks.#.attn.gate.weight", "blocks.#.mlp.gate.weight", "blocks.#.attn.wq.weight")
    v = find_view(ix, names[0], names[1], names[2])
    if v is None:
        names = (
            "transformer_blocks.#.attn.to_gate.weight",
            "transformer_blocks.#.ff.gate.weight",
            "transformer_blocks.#.attn.to_q.weight",
        )
        v = find_view(ix, *names)
    if v is None:
        return None
    b = Backbone(v.prefix, "transformer", "krea2", architecture="krea2", prediction="flow")
    hidden = v.dim(names[2], 1)
    kv = v.dim(names[2].replace("wq", "wk").replace("to_q", "to_k"), 0)
    why = f"single-stream blocks with gated attention and SwiGLU ({v.blocks(names[0])}), hidden {hidden}, K/V {kv} → Krea 2"
    v.because(b, names[0], why)
    for stem in ("txtfusion.projector.weight", "text_fusion.projector.weight"):
        if v.has(stem):
            v.because(b, stem, f"a fusion of {v.dim(stem, 1)} text-encoder layers (Qwen3-VL) → Krea 2")
    b.variant = "normal"
    if hidden != 6144:
        v.because(b, names[2], f"hidden size {hidden}: not the released Krea 2 (6144)")
    return b


def hidream(ix: KeyIndex) -> Backbone | None:
    anchor = "double_stream_blocks.#.block.attn1.to_q_t.weight"
    v = find_view(ix, anchor)
    if v is None:
        anchor = "single_stream_blocks.#.block.ff_i.gate.weight"
        v = find_view(ix, anchor, "single_stream_blocks.#.block.attn1.to_q.weight")
    if v is None:
        return None
    b = Backbone(v.prefix, "transformer", "hidream", architecture="hidream", prediction="flow")
    hidden = v.dim(anchor, 1)
    v.because(
        b,
        anchor,
        f"HiDream blocks with mixture-of-experts feed-forward ({v.blocks(anchor)}), hidden {hidden}",
    )
    b.variant = "normal"
    if hidden != 2560:
        v.because(b, anchor, f"hidden size {hidden}: not the released HiDream-I1 (2560)")
    b.evidence.append(
        Evidence(
            "",
            None,
            "HiDream-I1 Full, Dev and Fast, and the HiDream-E1 editing models, share one layout: the header "
            "cannot tell them apart",
        )
    )
    return b


SANA_SIZES = {1152: "0.6b", 2240: "1.6b"}


def sana(ix: KeyIndex) -> Backbone | None:
    names = (
        "blocks.#.mlp.inverted_conv.conv.weight",
        "blocks.#.cross_attn.kv_linear.weight",
        "blocks.#.attn.qkv.weight",
    )
    v = find_view(ix, names[0], names[1])
    if v is None:
        names = (
            "transformer_blocks.#.ff.conv_inverted.weight",
            "transformer_blocks.#.attn2.to_k.weight",
            "transformer_blocks.#.attn1.to_q.weight",
        )
        v = find_view(ix, names[0], names[1])
    if v is None:
        return None
    for patch in ("x_embedder.proj.weight", "patch_embed.proj.weight", "patch_embedding.weight"):
        if len(v.shape(patch) or ()) == 5:
            return None  # a 3-D patch embedding: a video model on Sana's blocks (SANA-Video), no Sana release
    b = Backbone(v.prefix, "transformer", "sana", architecture="sana", prediction="flow")
    hidden = v.dim(names[2], 1)
    v.because(
        b,
        names[0],
        f"linear-attention blocks with a convolutional Mix-FFN ({v.blocks(names[0])}), hidden {hidden} → Sana",
    )
    size = SANA_SIZES.get(hidden or 0)
    nums = v.numbers(names[0])
    if size is None:
        v.because(b, names[2], f"hidden size {hidden}: no known Sana release has this size")
    elif size == "1.6b" and nums and nums[-1] >= 20:
        size = "4.8b"  # Sana 1.5 4.8B keeps the 1.6B width and triples the depth (60 blocks)
        v.because(
            b, names[0], f"block {nums[-1]} exists: deeper than the 1.6B model's 20 blocks → Sana 1.5 4.8B"
        )
    elif size == "1.6b" and nums != list(range(20)):
        size = None
        v.because(
            b, names[0], "hidden 2240 in part of the blocks: Sana 1.6B (20 blocks) or Sana 1.5 4.8B (60)"
        )
    else:
        v.because(b, names[2], f"hidden {hidden} with {len(nums)} blocks → Sana {size.upper()}")
    task = "normal"
    # SANA-Sprint's guidance embedding: the release's `cfg_embedder` (NVlabs' convert_sana_to_diffusers maps it
    # onto diffusers' `time_embed.guidance_embedder`)
    guide = next(
        (
            k
            for k in ("time_embed.guidance_embedder.linear_1.weight", "cfg_embedder.mlp.0.weight")
            if v.has(k)
        ),
        None,
    )
    if guide is not None:
        task = "sprint"
        v.because(b, guide, "a guidance embedding → SANA-Sprint")
    b.variant = variant(task, size)
    return b
