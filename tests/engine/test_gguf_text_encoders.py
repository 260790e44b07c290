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


def _llama_gguf(path, arch: str, q_type, seed: int = 0):
    """A small Llama in a GGUF as llama.cpp's converter writes it (convert_hf_to_gguf.py, facts only):
    llama.cpp's names, and the q / k rows of each head put in rotary-interleaved order
    (`LlamaModel.permute`: reshape(heads, 2, d/2, …).swapaxes(1, 2)). Returns (transformers' model, its
    weights as the file holds them after dequantization, in transformers' order)."""
    from transformers import LlamaConfig, LlamaModel

    from engine.quant import dequantize

    cfg = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16)  # fmt: skip
    ref = LlamaModel(cfg).eval()
    g = torch.Generator().manual_seed(seed)
    march = {"llama": gguf.MODEL_ARCH.LLAMA, "mistral3": gguf.MODEL_ARCH.MISTRAL3}[arch]
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_uint32(f"{arch}.attention.head_count", 4)
    w.add_uint32(f"{arch}.attention.head_count_kv", 2)
    twin = {}
    for k, p in ref.state_dict().items():
        t = torch.randn(p.shape, generator=g) * (0.2 if p.dim() == 2 else 0.05) + (
            1.0 if p.dim() == 1 else 0.0
        )
        stored = t
        heads = {"q_proj": 4, "k_proj": 2}.get(k.split(".")[-2]) if ".self_attn." in k else None
        if heads:
            stored = (
                t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)
            )
        name = _llama_cpp_name(march, 2, f"model.{k}")
        if p.dim() == 2 and q_type is not None:
            raw = gguf.quants.quantize(stored.numpy(), q_type)
            w.add_tensor(name, raw, raw_dtype=q_type)
            back = dequantize(torch.from_numpy(raw.reshape(-1).copy()), q_type.name, tuple(t.shape))
        else:
            w.add_tensor(name, stored.numpy())
            back = stored
        if heads:  # what transformers' order is, from the stored rows
            back = (
                back.reshape(heads, back.shape[0] // heads // 2, 2, *back.shape[1:])
                .swapaxes(1, 2)
                .reshape(t.shape)
            )
        twin[f"model.{k}"] = back.float()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref.load_state_dict({k.removeprefix("model."): v for k, v in twin.items()})
    return ref, twin


@pytest.mark.parametrize("q_type", [Q8, None], ids=["q8_0", "f32"])
@pytest.mark.parametrize("arch", ["llama", "mistral3"])
def test_a_llama_gguf_puts_its_qk_rows_back_and_computes_like_transformers(tmp_path, arch, q_type):
    """llama.cpp stores Llama / Mistral q and k rows interleaved per head: read under transformers'
    names, each op's weight is transformers' own, and the model computes as transformers' does."""
    from transformers import LlamaModel

    from engine.denoise.common import Ops
    from engine.denoise.text import _swap

    p = tmp_path / f"{arch}.gguf"
    ref, twin = _llama_gguf(p, arch, q_type)
    d = detect_file(str(p))
    assert d.error is None, d.error
    c = Component("llm", p, "model.")
    ops = {u.path: u.module for u in c.units}
    x = torch.randn(3, 64)
    for k, want in twin.items():
        path = k.removeprefix("model.").rsplit(".", 1)[0]
        op = ops[path]
        if k.endswith(".weight") and want.dim() == 2 and "embed" not in k:
            w, _ = op.cast_params(x)
            assert torch.equal(w, want), k
    with torch.device("meta"):
        model = LlamaModel(ref.config)
    model.rotary_emb = type(ref.rotary_emb)(ref.config)  # its tables are computed, not stored
    _swap(model, Ops(ops, "llm"))
    ids = torch.randint(0, 100, (2, 12))
    with torch.inference_mode():
        got, want = model(input_ids=ids).last_hidden_state, ref(input_ids=ids).last_hidden_state
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_a_llama_gguf_without_its_head_count_is_a_format_error(tmp_path):
    from engine.errors import FormatError
    from engine.formats.gguf import read_gguf

    p = tmp_path / "llama.gguf"
    write_sparse_gguf(
        p,
        {"general.architecture": "llama"},
        [("token_embd.weight", "F16", (100, 64)), ("blk.0.attn_q.weight", "Q8_0", (64, 64))],
    )
    with pytest.raises(FormatError, match="head_count"):
        read_gguf(p)


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
