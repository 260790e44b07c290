"""GGUF text encoders in llama.cpp's tensor names (as ComfyUI-GGUF users download them) are read under
transformers' names: detected as the encoder they are, loaded, and computing like the original.

The llama.cpp names come from the `gguf` package itself (`get_tensor_name_map`), an independent
reference for the map in engine/formats/gguf_names.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.detect import detect_file
from engine.formats.gguf import write_sparse_gguf
from engine.model import Component
from tests.support import synth

Q8 = gguf.GGMLQuantizationType.Q8_0


def _llama_cpp_name(arch, n_blocks: int, key: str) -> str:
    base, suffix = key.rsplit(".", 1)
    got = gguf.get_tensor_name_map(arch, n_blocks).get_name(base)
    assert got is not None, key
    return f"{got}.{suffix}"


def test_a_t5xxl_gguf_is_the_t5xxl_component(tmp_path):
    rows = [(k, d, s) for k, d, s in synth.layout("t5xxl", dtype="F16") if k != "encoder.embed_tokens.weight"]
    gg = []
    for k, _, shape in rows:
        quant = len(shape) == 2 and "relative_attention_bias" not in k
        gg.append((_llama_cpp_name(gguf.MODEL_ARCH.T5ENCODER, 24, k), "Q8_0" if quant else "F16", shape))
    p = tmp_path / "t5-v1_1-xxl-encoder-Q8_0.gguf"
    write_sparse_gguf(p, {"general.architecture": "t5encoder"}, gg)
    d = detect_file(str(p))
    assert (d.kind, d.error) == ("text_encoder", None)
    assert list(d.components) == ["t5xxl"]
    assert d.components["t5xxl"].params == sum(int(np.prod(s)) for _, _, s in rows)


@pytest.mark.parametrize("arch", ["llama", "mistral3"])
def test_a_llama_gguf_is_refused_with_the_reason(tmp_path, arch):
    p = tmp_path / "llama.gguf"
    write_sparse_gguf(
        p,
        {"general.architecture": arch},
        [("token_embd.weight", "F16", (100, 64)), ("blk.0.attn_q.weight", "Q8_0", (64, 64))],
    )
    d = detect_file(str(p))
    assert d.error.type == "unsupported" and f"q/k rows of {arch} models" in d.error.message


def test_a_small_t5_gguf_computes_like_transformers(tmp_path):
    """A T5 encoder's linear layers Q8_0 in the GGUF: each loaded op equals transformers' layer with
    the dequantized weight."""
    from transformers import T5Config, T5EncoderModel

    cfg = T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=2, d_kv=32, vocab_size=100,
                   feed_forward_proj="gated-gelu", is_encoder_decoder=False)  # fmt: skip
    torch.manual_seed(0)
    ref = T5EncoderModel(cfg).eval()
    w = gguf.GGUFWriter(str(tmp_path / "t5.gguf"), arch="t5encoder")
    expect = {}
    for k, v in ref.state_dict().items():
        if k == "encoder.embed_tokens.weight":  # tied to `shared`
            continue
        x = v.numpy().astype(np.float32)
        name = _llama_cpp_name(gguf.MODEL_ARCH.T5ENCODER, 2, k)
        if x.ndim == 2 and "relative" not in k and k != "shared.weight":
            raw = gguf.quants.quantize(x, Q8)
            w.add_tensor(name, raw, raw_dtype=Q8)
            expect[k] = torch.from_numpy(gguf.quants.dequantize(raw, Q8).copy())
        else:
            w.add_tensor(name, x)
            expect[k] = v
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    comp = Component("t5", tmp_path / "t5.gguf", "", compute_dtype="float32")
    q = comp.module.get_submodule("encoder.block.1.layer.0.SelfAttention.q")
    assert q.weight.dtype == torch.uint8  # the Q8_0 blocks, dequantized per op
    x = torch.randn(3, 64)
    for name in ("encoder.block.1.layer.0.SelfAttention.q", "encoder.block.0.layer.1.DenseReluDense.wo"):
        op = comp.module.get_submodule(name)
        xin = torch.randn(3, op.in_features)
        assert torch.equal(op(xin), torch.nn.functional.linear(xin, expect[name + ".weight"])), name
    assert torch.equal(comp.module.get_submodule("shared").weight, expect["shared.weight"])
    del x


@pytest.mark.parametrize("arch", ["qwen2vl", "qwen3", "gemma2"])
def test_decoder_llm_names_map_onto_transformers_names(arch):
    from engine.formats.gguf_names import hf_names

    march = {
        "qwen2vl": gguf.MODEL_ARCH.QWEN2VL,
        "qwen3": gguf.MODEL_ARCH.QWEN3,
        "gemma2": gguf.MODEL_ARCH.GEMMA2,
    }[arch]
    hf = ["model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_proj.weight",
          "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight",
          "model.layers.3.input_layernorm.weight", "model.layers.3.post_attention_layernorm.weight"]  # fmt: skip
    if arch == "gemma2":
        hf += [
            "model.layers.3.pre_feedforward_layernorm.weight",
            "model.layers.3.post_feedforward_layernorm.weight",
        ]
    if arch == "qwen3":
        hf += ["model.layers.0.self_attn.q_norm.weight", "model.layers.0.self_attn.k_norm.weight"]
    names = {_llama_cpp_name(march, 4, k): k for k in hf}
    assert hf_names(arch, names) == names
