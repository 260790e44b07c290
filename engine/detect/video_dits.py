"""LTX-Video, LTX-2, Mochi and Cosmos Predict2 (and Anima, built on it), in original and diffusers naming.

Facts (cited, not copied):
* LTX-Video (Lightricks/LTX-Video `ltx_video/models/transformers/transformer3d.py`; diffusers
  convert_ltx_transformer_checkpoint_to_diffusers: patchify_proj -> proj_in, adaln_single -> time_embed,
  q_norm -> norm_q): `transformer_blocks.N` with a per-block `scale_shift_table`, self- and
  cross-attention with RMS QK-norm over the whole width, GELU feed-forward. 2B: hidden 2048 (32 heads
  of 64), 28 blocks; 13B (0.9.7 / 0.9.8): hidden 4096 (32 x 128), 48 blocks (diffusers
  infer_diffusers_model_type: `transformer_blocks.47` = 0.9.7). ComfyUI tells LTX-2 by
  `audio_adaln_single` ("ltxav"); LTX-2 (Lightricks/LTX-2, diffusers convert_ltx2_transformer_to_diffusers)
  adds an audio stream to every block (`audio_attn1`, `audio_to_video_attn`, `audio_ff`): 48 blocks,
  video hidden 4096, audio 2048, Gemma 3 12B text (3840), 19B.
* Mochi 1 (genmoai/mochi `asymm_models_joint.py`; diffusers convert_mochi_transformer_checkpoint_to_
  diffusers): 48 asymmetric joint blocks, visual 3072 wide and text 1536 (`attn.qkv_x`, `attn.qkv_y`,
  `mod_x`, `mod_y`), T5-XXL pooled through `t5_y_embedder`; 10B.
* Cosmos Predict2 (nvidia-cosmos/cosmos-predict2 MiniTrainDIT; diffusers
  convert_cosmos_transformer_checkpoint_to_diffusers, COSMOS_2_0 names; ComfyUI "cosmos_predict2"):
  `blocks.N.{self_attn,cross_attn}.{q,k,v,output}_proj`, `mlp.layer1/2`, AdaLN-LoRA modulations
  (`adaln_modulation_self_attn.1/2`), T5 text 1024 wide, `x_embedder.proj.1` over (channels + padding
  mask) x 2x2: 68 = text-to-image, 72 = Video2World (one conditioning frame channel). 2B: 2048 wide, 28
  blocks; 14B: 5120, 36 blocks. Anima (circlestone-labs) is the 2B model with an `llm_adapter` (diffusers
  AnimaTextConditioner) mapping Qwen3 0.6B states into that T5 space. Cosmos 1.0 (Predict1, `cosmos_predict1`) adds
  learnable position embeddings (`extra_pos_embedder`, diffusers `learnable_pos_embed`); NVIDIA's 1.0 naming
  nests each block's parts (`blocks.blockN.blocks.{0,1,2}.block`, diffusers' COSMOS_1_0 renames); 7B 4096
  wide, 14B 5120; 68 patch inputs = Text2World (`t2v`), 72 = Video2World (`i2v`).
"""

from __future__ import annotations

from .backbone import Backbone
from .keys import KeyIndex
from .result import Evidence
from .view import find_view, variant

LTXV_SIZES = {2048: "2b", 4096: "13b"}


def ltx(ix: KeyIndex) -> Backbone | None:
    for norm in ("transformer_blocks.#.attn1.q_norm.weight", "transformer_blocks.#.attn1.norm_q.weight"):
        v = find_view(
            ix, norm, "transformer_blocks.#.scale_shift_table", "transformer_blocks.#.ff.net.0.proj.weight"
        )
        if v is not None:
            break
    else:
        return None
    q = "transformer_blocks.#.attn1.to_q.weight"
    hidden = v.dim(q, 1)
    if v.dim(norm, 0) != hidden:
        return None  # LTX normalises queries over the whole width, not per head
    audio = next(
        (
            s
            for s in (
                "transformer_blocks.#.audio_attn1.to_q.weight",
                "audio_adaln_single.linear.weight",
                "audio_patchify_proj.weight",
            )
            if v.has(s)
        ),
        None,
    )
    family = "ltx2" if audio else "ltxv"
    b = Backbone(v.prefix, "transformer", family, architecture=family, prediction="flow")
    v.because(
        b,
        q,
        f"LTX blocks with whole-width QK-norm and their own scale-shift table ({v.blocks(q)}), hidden {hidden}",
    )
    if audio:
        v.because(b, audio, "an audio stream beside the video stream → LTX-2")
        b.variant = "normal" if hidden == 4096 else None
        if b.variant is None:
            v.because(b, q, f"video hidden {hidden}: not the released LTX-2 (4096)")
        return b
    size = LTXV_SIZES.get(hidden or 0)
    why = (
        f"hidden {hidden} → LTX-Video {size.upper()}"
        if size
        else f"hidden {hidden}: no known LTX-Video release"
    )
    v.because(b, q, why)
    b.variant = variant("normal", size) if size else None
    return b


def mochi(ix: KeyIndex) -> Backbone | None:
    names = ("blocks.#.attn.qkv_x.weight", "blocks.#.attn.qkv_y.weight", "blocks.#.mod_x.weight")
    v = find_view(ix, *names)
    if v is None:
        names = (
            "transformer_blocks.#.attn1.to_q.weight",
            "transformer_blocks.#.attn1.add_q_proj.weight",
            "transformer_blocks.#.norm1.linear.weight",
        )
        v = find_view(ix, *names)
        if v is None or v.dim(names[1], 1) == v.dim(names[0], 1):
            return None  # Mochi's text stream is narrower than its visual stream
    b = Backbone(v.prefix, "transformer", "mochi", architecture="mochi", prediction="flow")
    hidden = v.dim(names[0], 1)
    text = v.dim(names[1], 1)
    v.because(
        b,
        names[1],
        f"asymmetric joint blocks ({v.blocks(names[1])}): visual {hidden} wide, text {text or '?'} → Mochi",
    )
    b.variant = "normal" if hidden == 3072 else None
    if b.variant is None:
        v.because(b, names[0], f"visual width {hidden}: not the released Mochi 1 (3072)")
    return b


COSMOS_SIZES = {2048: "2b", 5120: "14b"}


def cosmos(ix: KeyIndex) -> Backbone | None:
    names = (
        "blocks.#.self_attn.q_proj.weight",
        "blocks.#.mlp.layer1.weight",
        "blocks.#.adaln_modulation_self_attn.1.weight",
        "x_embedder.proj.1.weight",
    )
    v = find_view(ix, *names[:3])
    if v is not None and v.prefix.endswith("llm_adapter."):
        v = None
    if v is None:
        names = (
            "transformer_blocks.#.attn1.to_q.weight",
            "transformer_blocks.#.ff.net.0.proj.weight",
            "transformer_blocks.#.norm1.linear_1.weight",
            "patch_embed.proj.weight",
        )
        v = find_view(ix, *names[:3], "transformer_blocks.#.norm3.linear_2.weight")
    if v is None:
        return _predict1_original(ix)
    hidden = v.dim(names[0], 1)
    b = Backbone(v.prefix, "transformer", "cosmos", architecture="cosmos_predict2", prediction="flow")
    v.because(
        b, names[2], f"Cosmos blocks with AdaLN-LoRA modulation ({v.blocks(names[0])}), hidden {hidden}"
    )
    for learnable in ("extra_pos_embedder.pos_emb_h", "learnable_pos_embed.pos_emb_h"):
        if v.has(learnable):
            return _predict1(v, b, hidden, learnable, names[3], names[0])
    stem = v.has(names[3])
    if hidden == 4096 and not stem:  # a shard of blocks only: this width is Cosmos 1.0 7B's alone
        return _predict1(v, b, hidden, None, names[3], names[0])
    if hidden == 5120 and not stem:
        b.also = [
            "cosmos_predict1"
        ]  # Cosmos 1.0 14B's blocks are this very layout; its tables would be elsewhere
    size = COSMOS_SIZES.get(hidden or 0)
    if size is None:
        v.because(b, names[0], f"hidden {hidden}: no known Cosmos Predict2 release has this size")
    else:
        v.because(b, names[0], f"hidden {hidden} → Cosmos Predict2 {size.upper()}")
    task = None
    patch_in = v.dim(names[3], 1)
    if patch_in is not None:
        channels = patch_in // 4 - 1  # (latent + conditioning channels + padding mask) x 2x2 patch
        task = {16: "t2i", 17: "i2v"}.get(channels)
        what = {"t2i": "text-to-image", "i2v": "Video2World (a conditioning-frame channel)"}.get(
            task or "", "no known release"
        )
        v.because(b, names[3], f"{patch_in} = ({channels} + padding mask) × 2×2 input features → {what}")
    else:
        b.because(
            ix,
            v.prefix + names[3],
            "no patch embedding in this file (a shard?): text-to-image or Video2World cannot be told",
        )
    adapter = v.key("llm_adapter.blocks.#.cross_attn.q_proj.weight") or v.key("llm_adapter.embed.weight")
    if adapter is not None:
        task = "anima"
        b.because(ix, adapter, "an LLM adapter from Qwen3 states into the T5 text space → Anima")
    elif size == "2b":
        b.evidence.append(
            Evidence(
                "",
                None,
                "Anima's transformer alone (its adapter saved apart, as diffusers does) is this layout too",
            )
        )
    b.variant = variant(task, size)
    return b


# Cosmos 1.0 (Cosmos-Predict1) Diffusion: 7B 4096 wide (32 heads), 28 blocks; 14B 5120 (40 heads), 36 blocks
# (diffusers' convert_cosmos_to_diffusers.py Cosmos-1.0 configs); its own learnable position embeddings
COSMOS1_SIZES = {4096: "7b", 5120: "14b"}
# NVIDIA's 1.0 naming: `blocks.blockN.blocks.{0,1,2}.block.…` (self-attention, cross-attention, MLP)
_C1_Q = "blocks.block0.blocks.0.block.attn.to_q.0.weight"


def _predict1_original(ix: KeyIndex) -> Backbone | None:
    v = find_view(ix, "extra_pos_embedder.pos_emb_h", _C1_Q)
    if v is None:
        return None
    b = Backbone(v.prefix, "transformer", "cosmos", architecture="cosmos_predict1")
    n = sum(
        k.endswith(".blocks.0.block.attn.to_q.0.weight") for k in ix.with_prefix(v.prefix + "blocks.block")
    )
    v.because(b, _C1_Q, f"Cosmos 1.0 blocks (`blocks.blockN.blocks.M.block`, {n} blocks)")
    return _predict1(v, b, v.dim(_C1_Q, 1), "extra_pos_embedder.pos_emb_h", "x_embedder.proj.1.weight", _C1_Q)


def _predict1(v, b: Backbone, hidden: int | None, learnable: str | None, patch: str, block: str) -> Backbone:
    """Cosmos 1.0 (Predict1): the variant from the width and the patch embedding's inputs."""
    b.architecture, b.prediction = "cosmos_predict1", None
    if learnable is not None:
        v.because(b, learnable, "learnable position embeddings beside RoPE → Cosmos 1.0 (Predict1)")
    else:
        b.evidence.append(
            Evidence("", None, "Cosmos blocks 4096 wide with no stem (a shard): only Cosmos 1.0 7B")
        )
    b.evidence.append(Evidence("", None, "EDM-preconditioned (c_skip / c_out of σ): none of eps, v or flow"))
    size = COSMOS1_SIZES.get(hidden or 0)
    why = (
        f"hidden {hidden} → Cosmos 1.0 {size.upper()}" if size else f"hidden {hidden}: no Cosmos 1.0 release"
    )
    v.because(b, block, why)
    task = None
    patch_in = v.dim(patch, 1)
    if patch_in is not None:
        task = {68: "t2v", 72: "i2v"}.get(patch_in)
        what = {"t2v": "Text2World", "i2v": "Video2World (a condition-mask channel)"}.get(
            task or "", "no release"
        )
        v.because(b, patch, f"{patch_in} = (16 latent + masks) × 2×2 input features → {what}")
    b.variant = variant(task, size)
    return b
