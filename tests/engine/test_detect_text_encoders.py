"""Text encoders of the 2025-26 families — umT5-XXL, Qwen2.5-VL, Qwen3 (-VL), Llama 3.1, Mistral Small 3,
Gemma 2 / 3 — from the transformers classes on the meta device, whole and as single shards."""

from __future__ import annotations

import pytest
from layouts_2026 import parts as P
from layouts_2026.common import blocks_only, detect, meta_shapes


def test_umt5_in_wans_own_naming():
    d = detect(P.umt5_wan())
    assert (d.kind, d.architecture, set(d.components)) == ("text_encoder", None, {"umt5_xxl"})
    shard = detect(blocks_only(P.umt5_wan(), "blocks.", 10, 14))
    assert set(shard.components) == {"umt5_xxl"}


torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

Q3 = dict(num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936)
LLMS = [
    # (class, config class, config, component); two layers: the width and MLP tell the release
    ("Qwen2_5_VLForConditionalGeneration", "Qwen2_5_VLConfig",
     dict(text_config=dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=2, num_attention_heads=28,
                           num_key_value_heads=4, vocab_size=152064), vision_config=dict(depth=1, out_hidden_size=3584)),
     "qwen25_vl_7b"),
    ("Qwen3ForCausalLM", "Qwen3Config", dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=2, **Q3), "qwen3_4b"),
    ("Qwen3ForCausalLM", "Qwen3Config", dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=2, **Q3), "qwen3_8b"),
    ("Qwen3ForCausalLM", "Qwen3Config",
     dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=2, num_attention_heads=16, num_key_value_heads=8,
          head_dim=128, vocab_size=151936), "qwen3_06b"),
    ("Qwen3VLForConditionalGeneration", "Qwen3VLConfig",
     dict(text_config=dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=2, **Q3),
          vision_config=dict(depth=1, out_hidden_size=2560, deepstack_visual_indexes=[0])), "qwen3_vl_4b"),
    ("LlamaForCausalLM", "LlamaConfig",
     dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
          vocab_size=128256), "llama31_8b"),
    ("MistralForCausalLM", "MistralConfig",
     dict(hidden_size=5120, intermediate_size=32768, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=8,
          head_dim=128, vocab_size=131072), "mistral3_24b"),
    ("Gemma2ForCausalLM", "Gemma2Config",
     dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=2, num_attention_heads=8, num_key_value_heads=4,
          head_dim=256, vocab_size=256000), "gemma2_2b"),
    ("Gemma3ForConditionalGeneration", "Gemma3Config",
     dict(text_config=dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=2, num_attention_heads=16,
                           num_key_value_heads=8, head_dim=256, vocab_size=262208), vision_config=dict(num_hidden_layers=1)),
     "gemma3_12b"),
    # CogView4's text encoder: gate and up projections fused in one matrix (once read as Qwen2, size unknown)
    ("GlmForCausalLM", "GlmConfig",
     dict(hidden_size=4096, intermediate_size=13696, num_hidden_layers=2, num_attention_heads=32, num_key_value_heads=2,
          vocab_size=151552), "glm4_9b"),
]  # fmt: skip


def _build(cls, cfg_cls, cfg) -> dict:
    return meta_shapes(getattr(transformers, cls), getattr(transformers, cfg_cls)(**cfg))


@pytest.mark.parametrize("cls, cfg_cls, cfg, comp", LLMS)
def test_llm_text_encoders_from_the_real_classes(cls, cfg_cls, cfg, comp):
    rows = _build(cls, cfg_cls, cfg)
    for naming in (rows, {k.replace("model.language_model.", "model."): s for k, s in rows.items()}):
        d = detect(naming)
        assert (d.kind, d.architecture, list(d.components)) == ("text_encoder", None, [comp]), d.evidence
        assert d.components[comp].prefix == ""  # the whole file, vision tower and lm_head included
    # ComfyUI saves a text encoder inside a checkpoint under text_encoders.<name>.transformer.
    d = detect({f"text_encoders.{comp}.transformer.{k}": s for k, s in rows.items()})
    assert set(d.components) == {comp} and d.components[comp].prefix == f"text_encoders.{comp}.transformer."


@pytest.mark.parametrize("cls, cfg_cls, cfg, comp", [LLMS[0], LLMS[1], LLMS[5]])
def test_a_shard_of_layers_is_named_from_its_own_keys(cls, cfg_cls, cfg, comp):
    cfg = dict(cfg)
    if "text_config" in cfg:
        cfg["text_config"] = {**cfg["text_config"], "num_hidden_layers": 6}
    else:
        cfg["num_hidden_layers"] = 6
    rows = _build(cls, cfg_cls, cfg)
    container = next(
        p for p in ("model.language_model.layers.", "model.layers.") if any(k.startswith(p) for k in rows)
    )
    d = detect(blocks_only(rows, container, 3, 6))
    assert set(d.components) == {comp}
    assert any("layers 3-5 (part of a sharded model)" in e.reason for e in d.evidence)


def test_an_unknown_llm_size_is_other_with_its_reason():
    d = detect(
        _build(
            "Qwen3ForCausalLM",
            "Qwen3Config",
            dict(hidden_size=3072, intermediate_size=8192, num_hidden_layers=2, **Q3),
        )
    )
    assert (d.kind, set(d.components)) == ("text_encoder", {"other"})
    assert any("no known release" in e.reason for e in d.evidence)


def test_umt5_from_transformers_whole_and_sharded():
    cfg = transformers.UMT5Config(
        vocab_size=256384,
        d_model=4096,
        d_kv=64,
        d_ff=10240,
        num_layers=4,
        num_heads=64,
        feed_forward_proj="gated-gelu",
    )
    rows = meta_shapes(transformers.UMT5EncoderModel, cfg)
    assert set(detect(rows).components) == {"umt5_xxl"}
    shard = {k: s for k, s in rows.items() if k.startswith(("encoder.block.2.", "encoder.block.3."))}
    assert set(detect(shard).components) == {"umt5_xxl"}
    # T5 v1.1 XXL keeps its relative table in block 0 only: still t5xxl
    t5 = meta_shapes(
        transformers.T5EncoderModel,
        transformers.T5Config(
            vocab_size=32128,
            d_model=4096,
            d_kv=64,
            d_ff=10240,
            num_layers=4,
            num_heads=64,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
        ),
    )
    assert set(detect(t5).components) == {"t5xxl"}


@pytest.mark.parametrize(("cls", "cfg_cls", "vocab"), [("MistralForCausalLM", "MistralConfig", 32768),
                                                      ("Ministral3ForCausalLM", "Ministral3Config", 131072)])  # fmt: skip
def test_llama_31_8b_widths_with_another_vocabulary_are_not_llama(cls, cfg_cls, vocab):
    """Mistral 7B and Ministral 8B have Llama 3.1 8B's widths (once both were named Llama 3.1 8B)."""
    cfg = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=2, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=vocab)  # fmt: skip
    d = detect(_build(cls, cfg_cls, cfg))
    assert (d.kind, list(d.components)) == ("text_encoder", ["other"]), d.evidence
    assert any(f"a vocabulary of {vocab}" in e.reason for e in d.evidence)


@pytest.mark.parametrize("prefix", ["vision_model.", ""])
def test_siglip_and_bare_clip_vision_towers_are_clip_vision(prefix):
    """SigLIP so400m (FLUX.1 Redux's image encoder, ComfyUI's clip_vision folder) under transformers 4's
    `vision_model.` or as transformers 5 holds it (bare): once a CLIP tower of unknown width, or unknown."""
    siglip = _build("SiglipVisionModel", "SiglipVisionConfig",
                    dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=2, num_attention_heads=16,
                         image_size=384, patch_size=14))  # fmt: skip
    d = detect({prefix + k: v for k, v in siglip.items()})
    assert d.kind == "clip_vision" and "SigLIP so400m (FLUX.1 Redux's image encoder)" in d.evidence[0].reason
    clip = _build("CLIPVisionModel", "CLIPVisionConfig",
                  dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=2, num_attention_heads=16))  # fmt: skip
    d = detect({prefix + k.removeprefix("vision_model."): v for k, v in clip.items()})
    assert d.kind == "clip_vision" and "CLIP ViT-L/14" in d.evidence[0].reason
