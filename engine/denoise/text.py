"""Text encoders' forward passes: transformers' own CLIP and T5 encoder classes, built on the meta device
from the file's shapes, with every weight-holding layer replaced by the component's castable op at the same
path (the residency manager's modules, tiers and patches) — so a text encoder's load, offload and
streaming are measured by the same `loadout step` as a denoiser's.

Configurations, read from the weights (facts of the released configs, cited: openai/clip-vit-large-patch14
`config.json` — 12 heads of 64, `quick_gelu`; laion CLIP-ViT-bigG-14 and CLIP-ViT-H-14 — heads of 64,
`gelu`; google/t5-v1_1-xxl and umt5-xxl — `gated-gelu`, 64 heads of 64, 32 relative-position buckets,
max distance 128; original T5 — `relu`):

* CLIP (transformers naming, `text_model.…`, as SD1 checkpoints and ComfyUI's clip_l / clip_g files
  keep it): hidden and vocabulary from `token_embedding`, positions from `position_embedding`, layers
  counted, intermediate from `fc1`; 64-wide heads; `quick_gelu` at width 768 (CLIP-L), `gelu` otherwise;
  built as CLIPTextModelWithProjection (whose paths are the files' `text_model.…`), the projection an
  identity when the file has none. OpenCLIP's naming (`resblocks`, SDXL's
  CLIP-G inside a checkpoint) is refused by name for now.
* T5 / umT5 encoder (`encoder.block.N.layer.…`, `shared` or `encoder.embed_tokens`): d_model and
  vocabulary from the embedding, heads from `relative_attention_bias` [buckets, heads], d_kv = q rows /
  heads, d_ff from `wi_0` (gated-gelu) or `wi` (relu); umT5 has a relative bias in every block.

Inputs: `input_ids` [B, T] token ids (integers); the output is the last hidden state [B, T, width].

A T5 / umT5 computing in float16 (a card's text encoder) runs its feed-forward out-projections `wo` in float32
and keeps the residual stream in float32 after them, normalizing it in float32 before the float16 layers, as
transformers' T5 does (`_keep_in_fp32_modules`): their outputs pass float16's range (`_t5_feed_forward`).
"""

from __future__ import annotations

import types
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from ..ops import RMSNorm
from .common import Ops, wshape

CLIP_TOKENS = 77
T5_TOKENS = 512


@dataclass
class TextEncoder:
    """A bound text encoder: call it with `input_ids` [B, T]."""

    architecture: str
    kind: str  # "clip" | "t5"
    model: object  # the transformers module, its layers the component's ops
    order: list
    vocab: int
    tokens: int
    width: int
    family = "text"

    @property
    def in_channels(self) -> int:
        return 0

    def __call__(self, input_ids) -> torch.Tensor:
        return self.model(input_ids=input_ids.long()).last_hidden_state

    def op_order(self) -> list:
        return self.order


def _swap(model, ops: Ops) -> None:
    """Every module of `model` at a path the component holds becomes the component's op (the weights
    then live only in the component); a path the model has and the file lacks stays meta, and fails."""
    from ..ops import Castable

    for name, _ in list(model.named_modules()):
        op = ops.get(name)
        if (
            not isinstance(op, Castable) or not name
        ):  # a plain module (e.g. a stored position_ids): not a layer
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, attr, op)
    left = [n for n, p in [*model.named_parameters(), *model.named_buffers()] if p.is_meta]
    if left:
        raise UnsupportedModel(
            f"{ops.what}: no tensor for {', '.join(left[:3])} — not a layout Loadout can run"
        )


def _t5_feed_forward(self, x: torch.Tensor) -> torch.Tensor:
    """T5's feed-forward (gated: wo(act(wi_0(x)) · wi_1(x)); else wo(act(wi(x))); dropout is off in
    eval) without transformers' cast of the hidden states to `wo.weight`'s dtype before `wo`: a
    component's weight is held as stored -- GGUF blocks (uint8), fp8 -- and its op casts it to the
    compute dtype itself; rounding the activations to the storage dtype first turned a GGUF T5's output
    into noise (uint8) and an fp8 one's into fp8-rounded states.

    In float16, `wo` computes in float32 and hands back float32, so the residual stream is float32 from
    the first feed-forward on: T5 v1.1 and umT5 were trained in bfloat16 and their feed-forward outputs
    pass float16's 65504 (transformers' T5 keeps `wo` in float32 for this, `_keep_in_fp32_modules`; the
    residual then promotes to float32 the same way). The weight is the op's as it computes (cast to
    float16, exact for float16 / fp8 storage), widened."""
    h = self.act(self.wi_0(x)) * self.wi_1(x) if hasattr(self, "wi_0") else self.act(self.wi(x))
    if h.dtype != torch.float16:
        return self.wo(h)
    w, b = self.wo.cast_params(h)
    return F.linear(h.float(), w.float(), None if b is None else b.float())


def _t5_norm(self, x: torch.Tensor) -> torch.Tensor:
    """T5's RMS norm (no mean, no bias) of a float32 residual stream in a float16 run: normalized in
    float32, rounded to float16, then scaled (transformers' T5LayerNorm order), so the float16 layers
    after it get values in range. In any other case the op's own forward."""
    if x.dtype != torch.float32 or self.compute_dtype != torch.float16:
        return type(self).forward(self, x)
    w, _ = self.cast_params(x)  # (in the compute dtype, float16)
    return F.rms_norm(x, (x.shape[-1],), None, self.eps).to(w.dtype) * w


def bind_clip(ops: Ops, architecture: str, dtype: torch.dtype) -> TextEncoder:
    from torch import nn
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    t = "text_model"
    vocab, hidden = wshape(ops[f"{t}.embeddings.token_embedding"])
    positions = wshape(ops[f"{t}.embeddings.position_embedding"])[0]
    layers = ops.children(f"{t}.encoder.layers")
    proj = ops.get("text_projection")
    cfg = CLIPTextConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=wshape(ops[f"{t}.encoder.layers.0.mlp.fc1"])[0],
        num_hidden_layers=len(layers), num_attention_heads=hidden // 64, max_position_embeddings=positions,
        hidden_act="quick_gelu" if hidden == 768 else "gelu", projection_dim=wshape(proj)[0] if proj else hidden,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):  # the class whose module paths are the files' (`text_model.…`)
        model = CLIPTextModelWithProjection(cfg)
    if proj is None:
        model.text_projection = nn.Identity()  # (only the pooled `text_embeds` pass through it)
    model.text_model.embeddings.position_ids = torch.arange(positions).expand(1, -1)
    _swap(model, ops)
    model.eval().requires_grad_(False)
    order = [ops[f"{t}.embeddings.token_embedding"], ops[f"{t}.embeddings.position_embedding"]]
    for i in layers:
        p = f"{t}.encoder.layers.{i}"
        order += [ops[f"{p}.layer_norm1"], ops[f"{p}.self_attn.q_proj"], ops[f"{p}.self_attn.k_proj"],
                  ops[f"{p}.self_attn.v_proj"], ops[f"{p}.self_attn.out_proj"], ops[f"{p}.layer_norm2"],
                  ops[f"{p}.mlp.fc1"], ops[f"{p}.mlp.fc2"]]  # fmt: skip
    order.append(ops[f"{t}.final_layer_norm"])
    if proj is not None:
        order.append(proj)
    return TextEncoder(architecture, "clip", model, order, vocab, positions, hidden)


def bind_t5(ops: Ops, architecture: str, dtype: torch.dtype) -> TextEncoder:
    from transformers import T5Config, T5EncoderModel

    embed = ops.get("shared") or ops.get("encoder.embed_tokens")
    if embed is None:
        raise UnsupportedModel(f"{ops.what}: no token embedding (shared / encoder.embed_tokens)")
    vocab, d_model = wshape(embed)
    blocks = ops.children("encoder.block")
    a = "encoder.block.0.layer.0.SelfAttention"
    buckets, heads = wshape(ops[f"{a}.relative_attention_bias"])
    gated = "encoder.block.0.layer.1.DenseReluDense.wi_0" in ops
    ff = ops["encoder.block.0.layer.1.DenseReluDense." + ("wi_0" if gated else "wi")]
    per_block = "encoder.block.1.layer.0.SelfAttention.relative_attention_bias" in ops  # umT5
    if per_block:
        from transformers import UMT5Config as T5Config
        from transformers import UMT5EncoderModel as T5EncoderModel
    cfg = T5Config(
        vocab_size=vocab, d_model=d_model, d_kv=wshape(ops[f"{a}.q"])[0] // heads, d_ff=wshape(ff)[0],
        num_layers=len(blocks), num_heads=heads, relative_attention_num_buckets=buckets,
        feed_forward_proj="gated-gelu" if gated else "relu", is_encoder_decoder=False, use_cache=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = T5EncoderModel(cfg)
    model.shared = model.encoder.embed_tokens = embed  # one embedding, under either name in the file
    _swap(model, ops)
    for m in model.modules():
        if hasattr(m, "wo") and (hasattr(m, "wi_0") or hasattr(m, "wi")):
            m.forward = types.MethodType(_t5_feed_forward, m)
        elif isinstance(m, RMSNorm):
            m.forward = types.MethodType(_t5_norm, m)
    model.eval().requires_grad_(False)
    order = [embed]
    for i in blocks:
        p = f"encoder.block.{i}.layer"
        sa = f"{p}.0.SelfAttention"
        order += [ops[f"{p}.0.layer_norm"], ops[f"{sa}.q"], ops[f"{sa}.k"], ops[f"{sa}.v"]]
        if f"{sa}.relative_attention_bias" in ops:
            order.append(ops[f"{sa}.relative_attention_bias"])
        order += [ops[f"{sa}.o"], ops[f"{p}.1.layer_norm"]]
        d = f"{p}.1.DenseReluDense"
        order += [ops[f"{d}.wi_0"], ops[f"{d}.wi_1"]] if gated else [ops[f"{d}.wi"]]
        order.append(ops[f"{d}.wo"])
    order.append(ops["encoder.final_layer_norm"])
    return TextEncoder(architecture, "t5", model, order, vocab, T5_TOKENS, d_model)
