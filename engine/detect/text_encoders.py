"""Decoder-LLM text encoders (Qwen2.5-VL, Qwen3 / Qwen3-VL, Llama 3.1, Mistral Small 3, Gemma 2 / 3) and
umT5-XXL, under any prefix and from any shard: what the 2025-26 diffusion families condition on.

Facts (cited, not copied):
* transformers' decoder naming `layers.N.self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`, under
  `model.` (CausalLM), `model.language_model.` (v5 multimodal) or `language_model.model.` (v4
  multimodal); ComfyUI's repackaged encoders keep `model.layers.N` (comfy/text_encoders/llama.py).
* What tells the families (transformers Qwen2 / Qwen3 / Gemma2 / Gemma3 / Llama / Mistral modeling; ComfyUI
  sd.py `detect_te_model`): Qwen2 and 2.5 have biased q/k/v; Qwen3 and Gemma 3 a per-head `q_norm`; Gemma 2
  and 3 `pre_` and `post_feedforward_layernorm`; Llama and Mistral none of these.
* Sizes (the released config.json values, as ComfyUI's llama.py configs record them): Qwen2.5-VL 7B hidden
  3584, MLP 18944, 28 layers, vocabulary 152064; Qwen2.5(-VL) 3B 2048 / 11008; Qwen3 0.6B 1024 / 3072,
  1.7B 2048 / 6144, 4B 2560 / 9728, 8B 4096 / 12288, 14B 5120 / 17408 (Qwen3-VL keeps its size's language
  model and adds a vision tower); Llama 3 / 3.1 8B 4096 / 14336, vocabulary 128256 (llava-llama-3 128320);
  Mistral Small 3.x 24B 5120 / 32768, 40 layers (FLUX.2's text encoder; ComfyUI also knows a pruned one);
  Gemma 2 2B 2304 / 9216; Gemma 3 1B 1152 / 6912, 4B 2560 / 10240, 12B 3840 / 15360; GLM-4 9B (THUDM/
  glm-4-9b-hf, CogView4's text encoder) 4096 / 13696 in one fused `gate_up_proj`, 40 layers, vocabulary
  151552 (transformers Glm modeling). Mistral 7B (vocabulary 32000 / 32768) and Ministral 8B (131072)
  share Llama 3.1 8B's widths: the vocabulary tells them apart where the file holds the embedding.
* umT5-XXL (google/umt5-xxl; Wan2.1 `wan/modules/t5.py` umt5_xxl: vocabulary 256384, dim 4096, FFN 10240,
  64 heads, 24 layers, `shared_pos=False`): a relative-position table in every block (T5 v1.1 keeps one,
  in block 0). Wan's own file names it `token_embedding`, `blocks.N.attn.q`, `blocks.N.pos_embedding`.
"""

from __future__ import annotations

from .keys import KeyIndex
from .parts import Part
from .result import Evidence
from .view import View

# (style, hidden, MLP width) -> (component, release, who conditions on it)
KNOWN = {
    ("qwen2", 3584, 18944): (
        "qwen25_vl_7b",
        "Qwen2.5-VL 7B",
        "Qwen-Image, HunyuanVideo 1.5, HunyuanImage 2.1",
    ),
    ("qwen2", 2048, 11008): ("qwen25_vl_3b", "Qwen2.5-VL 3B", "OmniGen2"),
    ("qwen3", 1024, 3072): ("qwen3_06b", "Qwen3 0.6B", "Anima"),
    ("qwen3", 2048, 6144): ("qwen3_17b", "Qwen3 1.7B", ""),
    ("qwen3", 2560, 9728): ("qwen3_4b", "Qwen3 4B", "Z-Image, FLUX.2 klein 4B"),
    ("qwen3", 4096, 12288): ("qwen3_8b", "Qwen3 8B", "FLUX.2 klein 9B"),
    ("qwen3", 5120, 17408): ("qwen3_14b", "Qwen3 14B", ""),
    ("llama", 4096, 14336): ("llama31_8b", "Llama 3.1 8B", "HiDream-I1; HunyuanVideo's llava-llama-3-8b"),
    ("llama", 5120, 32768): ("mistral3_24b", "Mistral Small 3 24B", "FLUX.2 dev"),
    ("gemma2", 2304, 9216): ("gemma2_2b", "Gemma 2 2B", "Lumina 2, Sana"),
    ("gemma3", 1152, 6912): ("gemma3_1b", "Gemma 3 1B", ""),
    ("gemma3", 2560, 10240): ("gemma3_4b", "Gemma 3 4B", "NewBie"),
    ("gemma3", 3840, 15360): ("gemma3_12b", "Gemma 3 12B", "LTX-2"),
    ("glm", 4096, 13696): ("glm4_9b", "GLM-4 9B", "CogView4"),
}
# Vocabularies that tell a release from others of its widths (the released config.json values).
_VOCABULARY = {
    "llama31_8b": (128256, 128320),  # Llama 3 / 3.1; llava-llama-3-8b adds 64 image tokens
    "glm4_9b": (151552,),
}
_ROOTS = ("model.language_model.", "language_model.model.", "model.")
_VISION = ("visual.", "vision_tower.", "vision_model.", "multi_modal_projector.")


def find_llm_encoders(ix: KeyIndex) -> list[Part]:
    parts = []
    for prefix, q in ix.locate("layers.#.self_attn.q_proj.weight").items():
        down = prefix + "layers.#.mlp.down_proj.weight"
        if (
            not ix.locate("layers.#.mlp.down_proj.weight").get(prefix)
            or "vision" in prefix
            or "visual" in prefix
        ):
            continue  # a SigLIP / CLIP vision tower (mlp.fc1) or an attention-only stack
        parts.append(_llm(ix, prefix, q, down))
    return parts


def _llm(ix: KeyIndex, prefix: str, q: str, down: str) -> Part:
    def key(suffix: str) -> str | None:
        return (
            ix.locate(suffix).get(prefix)
            if "#" in suffix
            else (prefix + suffix if ix.has(prefix + suffix) else None)
        )

    hidden = ix.dim(q, 1)
    mlp = ix.dim(key("layers.#.mlp.gate_proj.weight") or key("layers.#.mlp.up_proj.weight"), 0)
    fused = key("layers.#.mlp.gate_up_proj.weight")  # GLM's gate and up projections in one matrix
    if fused is not None:
        mlp = (ix.dim(fused, 0) or 0) // 2 or None
        style = "glm"
    elif key("layers.#.post_feedforward_layernorm.weight"):
        style = "gemma3" if key("layers.#.self_attn.q_norm.weight") else "gemma2"
    elif key("layers.#.self_attn.q_norm.weight"):
        style = "qwen3"
    elif key("layers.#.self_attn.q_proj.bias"):
        style = "qwen2"
    else:
        style = "llama"
    root = next((prefix[: -len(r)] for r in _ROOTS if prefix.endswith(r)), prefix)
    vision = any(p.startswith((root + v, root + "model." + v)) for p in ix.by_pattern for v in _VISION)
    vocab = ix.dim(key("embed_tokens.weight"), 0)
    layers = View(ix, prefix).blocks("layers.#.self_attn.q_proj.weight").replace("blocks", "layers")
    what = {
        "qwen2": "biased q/k/v (Qwen2)",
        "qwen3": "per-head QK-norm (Qwen3)",
        "gemma2": "sandwich norms (Gemma 2)",
        "gemma3": "sandwich norms and QK-norm (Gemma 3)",
        "llama": "no biases or QK-norm (Llama / Mistral)",
        "glm": "a fused gate / up MLP (GLM)",
    }[style]
    ev = [Evidence(q, ix.shape(q), f"a decoder LLM with {what}: hidden {hidden}, MLP {mlp}, {layers}")]
    found = KNOWN.get((style, hidden, mlp))
    if found is not None and vocab and found[0] in _VOCABULARY and vocab not in _VOCABULARY[found[0]]:
        # Mistral 7B and Ministral 8B have Llama 3.1 8B's widths (4096 / 14336) and not its vocabulary
        ev.append(
            Evidence(
                key("embed_tokens.weight"),
                ix.shape(key("embed_tokens.weight")),
                f"{found[1]}'s widths, but a vocabulary of {vocab}, not its "
                f"{' / '.join(map(str, _VOCABULARY[found[0]]))}: another model of this size",
            )
        )
        found = None
    if found is None:
        ev.append(
            Evidence(
                down,
                ix.shape(down) if ix.has(down) else None,
                f"{style}-style, hidden {hidden}, MLP {mlp}: no known release",
            )
        )
        return Part(root, "other", f"{style} LLM", evidence=ev)
    comp, name, users = found
    if style == "qwen3" and vision:
        comp, name = comp.replace("qwen3_", "qwen3_vl_"), name.replace("Qwen3", "Qwen3-VL")
        users = "Krea 2" if comp == "qwen3_vl_4b" else users
    why = f"→ {name}" + (f" (text encoder of {users})" if users else "")
    if vocab:
        why += f", vocabulary {vocab}"
    if comp == "qwen25_vl_7b" and not vision:
        why += "; no vision tower in this file (Qwen2.5 7B has the same language model)"
    if comp == "llama31_8b":
        why += "; Llama 3 8B has the same layout"
    ev.append(Evidence(key("embed_tokens.weight") or q, ix.shape(key("embed_tokens.weight") or q), why))
    return Part(root, comp, name, evidence=ev)


def find_umt5(ix: KeyIndex) -> list[Part]:
    """umT5-XXL in transformers naming (any shard) and in Wan's own naming."""
    parts = []
    bias = "encoder.block.#.layer.0.SelfAttention.relative_attention_bias.weight"
    for prefix in ix.locate("encoder.block.#.layer.0.SelfAttention.q.weight"):
        blocks = View(ix, prefix).numbers(bias)
        vocab = ix.dim(prefix + "shared.weight", 0) or ix.dim(prefix + "encoder.embed_tokens.weight", 0)
        q = ix.locate("encoder.block.#.layer.0.SelfAttention.q.weight")[prefix]
        d_model = ix.dim(q, 1)
        if d_model == 4096 and (vocab == 256384 or any(n > 0 for n in blocks)):
            why = (
                "relative position tables in every block"
                if any(n > 0 for n in blocks)
                else f"vocabulary {vocab}"
            )
            parts.append(
                Part(
                    prefix,
                    "umt5_xxl",
                    "umT5-XXL",
                    evidence=[
                        Evidence(
                            q,
                            ix.shape(q),
                            f"a T5 encoder, d_model 4096, {why} → umT5-XXL (Wan's text encoder)",
                        )
                    ],
                )
            )
    for prefix, q in ix.locate("blocks.#.attn.q.weight").items():
        if not ix.locate("blocks.#.pos_embedding.embedding.weight").get(prefix) or not ix.locate(
            "blocks.#.ffn.gate.0.weight"
        ).get(prefix):
            continue
        why = f"Wan's own T5 naming, d_model {ix.dim(q, 1)}, a relative-position table per block"
        comp = "umt5_xxl" if ix.dim(q, 1) == 4096 else "other"
        parts.append(
            Part(
                prefix,
                comp,
                "umT5-XXL",
                evidence=[Evidence(q, ix.shape(q), why + (" → umT5-XXL" if comp == "umt5_xxl" else ""))],
            )
        )
    return parts
