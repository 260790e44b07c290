"""llama.cpp's tensor names in GGUF text encoders, mapped back onto the transformers names the
component is built from (so detection, loading and LoRA key maps see one naming).

Facts from gguf-py `gguf/tensor_mapping.py` and `constants.py` (MODEL_TENSOR per architecture; cited,
not copied): T5 / umT5 encoders (`t5`, `t5encoder`) keep `enc.blk.N.attn_q` … for
`encoder.block.N.layer.0.SelfAttention.q` …, `token_embd` for `shared`; decoder LLMs (`qwen2`,
`qwen2vl`, `qwen3`, `gemma2`, `gemma3`) keep `blk.N.attn_q` … for `model.layers.N.self_attn.q_proj` ….
ComfyUI-GGUF loads the same files by reversing these names (city96/ComfyUI-GGUF `loader.py`, its T5
and LLM key maps).

`llama` and `mistral3` GGUFs (Llama 3.1 for HiDream, Mistral Small 3 for FLUX.2) are mapped too, and
their q and k rows marked: llama.cpp keeps them in the interleaved rotary layout of Meta's and Mistral's
own checkpoints — converting a transformers checkpoint it undoes transformers' row permutation
(`LlamaModel.permute`, inherited by `Ministral3Model`), a Mistral-format one it keeps as it is
(`MistralModel.undo_permute = False`). Within each head of width d, file row 2i + j is transformers'
row j·d/2 + i; `interleaved_heads` gives the head count (`<arch>.attention.head_count`, `…head_count_kv`
for k) and engine.quant.Interleaved puts the rows back when an op dequantizes its weight.
"""

from __future__ import annotations

import re

_T5 = (
    ("token_embd", "shared"),
    ("enc.output_norm", "encoder.final_layer_norm"),
    ("enc.blk.{n}.attn_q", "encoder.block.{n}.layer.0.SelfAttention.q"),
    ("enc.blk.{n}.attn_k", "encoder.block.{n}.layer.0.SelfAttention.k"),
    ("enc.blk.{n}.attn_v", "encoder.block.{n}.layer.0.SelfAttention.v"),
    ("enc.blk.{n}.attn_o", "encoder.block.{n}.layer.0.SelfAttention.o"),
    ("enc.blk.{n}.attn_rel_b", "encoder.block.{n}.layer.0.SelfAttention.relative_attention_bias"),
    ("enc.blk.{n}.attn_norm", "encoder.block.{n}.layer.0.layer_norm"),
    ("enc.blk.{n}.ffn_gate", "encoder.block.{n}.layer.1.DenseReluDense.wi_0"),
    ("enc.blk.{n}.ffn_up", "encoder.block.{n}.layer.1.DenseReluDense.wi_1"),
    ("enc.blk.{n}.ffn_down", "encoder.block.{n}.layer.1.DenseReluDense.wo"),
    ("enc.blk.{n}.ffn_norm", "encoder.block.{n}.layer.1.layer_norm"),
)
_LLM = (
    ("token_embd", "model.embed_tokens"),
    ("output_norm", "model.norm"),
    ("output", "lm_head"),
    ("blk.{n}.attn_q", "model.layers.{n}.self_attn.q_proj"),
    ("blk.{n}.attn_k", "model.layers.{n}.self_attn.k_proj"),
    ("blk.{n}.attn_v", "model.layers.{n}.self_attn.v_proj"),
    ("blk.{n}.attn_output", "model.layers.{n}.self_attn.o_proj"),
    ("blk.{n}.attn_q_norm", "model.layers.{n}.self_attn.q_norm"),
    ("blk.{n}.attn_k_norm", "model.layers.{n}.self_attn.k_norm"),
    ("blk.{n}.attn_norm", "model.layers.{n}.input_layernorm"),
    ("blk.{n}.ffn_gate", "model.layers.{n}.mlp.gate_proj"),
    ("blk.{n}.ffn_up", "model.layers.{n}.mlp.up_proj"),
    ("blk.{n}.ffn_down", "model.layers.{n}.mlp.down_proj"),
)
# Qwen / Mistral: one norm after attention, before the MLP.
_LLM_NORMS = (("blk.{n}.ffn_norm", "model.layers.{n}.post_attention_layernorm"),)
# Gemma 2 / 3 wrap attention and MLP in norms on both sides (gguf-py's ATTN_POST_NORM, FFN_NORM,
# FFN_POST_NORM for Gemma2Model).
_GEMMA_NORMS = (
    ("blk.{n}.post_attention_norm", "model.layers.{n}.post_attention_layernorm"),
    ("blk.{n}.ffn_norm", "model.layers.{n}.pre_feedforward_layernorm"),
    ("blk.{n}.post_ffw_norm", "model.layers.{n}.post_feedforward_layernorm"),
)
TABLES = {
    "t5": _T5,
    "t5encoder": _T5,
    "qwen2": _LLM + _LLM_NORMS,
    "qwen2vl": _LLM + _LLM_NORMS,
    "qwen25vl": _LLM + _LLM_NORMS,
    "qwen3": _LLM + _LLM_NORMS,
    "llama": _LLM + _LLM_NORMS,
    "mistral3": _LLM + _LLM_NORMS,
    "gemma2": _LLM + _GEMMA_NORMS,
    "gemma3": _LLM + _GEMMA_NORMS,
}
PERMUTED = ("llama", "mistral3")  # q/k rows in llama.cpp's interleaved rotary layout (see above)
_QK = re.compile(r"^model\.layers\.\d+\.self_attn\.(q|k)_proj\.(weight|bias)$")


def _compile(pairs):
    out = []
    for gg, hf in pairs:
        pat = re.compile("^" + re.escape(gg).replace(r"\{n\}", r"(\d+)") + r"\.(weight|bias)$")
        out.append((pat, hf))
    return out


_COMPILED = {arch: _compile(pairs) for arch, pairs in TABLES.items()}


def is_llama_cpp_naming(names) -> bool:
    """Whether a GGUF's tensors use llama.cpp's names (a text encoder), not a model's own."""
    return any(n.startswith(("blk.", "enc.blk.")) for n in names) or "token_embd.weight" in names


def hf_names(architecture: str | None, names) -> dict[str, str] | None:
    """llama.cpp name -> transformers name for every tensor of a GGUF text encoder of `architecture`
    (`general.architecture`); None when the file does not use llama.cpp's names or its architecture
    has no table (then it keeps its names). A tensor no rule names keeps its own."""
    names = list(names)
    if not architecture or not is_llama_cpp_naming(names):
        return None
    compiled = _COMPILED.get(architecture)
    if compiled is None:
        return None
    out = {}
    for name in names:
        new = name
        for pat, hf in compiled:
            m = pat.match(name)
            if m:
                new = (hf.replace("{n}", m.group(1)) if "{n}" in hf else hf) + "." + m.groups()[-1]
                break
        out[name] = new
    return out


def interleaved_heads(architecture: str | None, meta, name: str) -> int | None:
    """For a tensor (transformers name) whose rows llama.cpp stores interleaved per head: the number of
    heads of that projection (q: the attention heads, k: the key/value heads), 0 when the metadata does
    not say it as one number; None for any other tensor."""
    if architecture not in PERMUTED:
        return None
    m = _QK.match(name)
    if not m:
        return None
    heads = meta.get(f"{architecture}.attention.head_count")
    if m.group(1) == "k":
        heads = meta.get(f"{architecture}.attention.head_count_kv", heads)
    return heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else 0
