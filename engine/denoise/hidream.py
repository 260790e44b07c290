"""HiDream-I1's transformer (Full, Dev and Fast: one 17B layout; HiDream-E1's editing models share it), run on the
component's own castable ops, in its one naming: the release's, which diffusers keeps as is (its single-file converter
`convert_hidream_transformer_to_diffusers` only strips ComfyUI's `model.diffusion_model.` prefix).

Architecture facts, from diffusers' `HiDreamImageTransformer2DModel` (`transformer_hidream_image.py`) and HiDream-ai's
own `hi_diffusers` code it was ported from, with the released config (HiDream-I1-Full / -Dev `transformer/config.json`:
2560 wide, 20 heads of 128, 16 double- and 32 single-stream blocks, 4 routed experts of which 2 are activated, RoPE
axes (64, 32, 32), max_resolution (128, 128), `llama_layers` 0…31 then 31 sixteen times) — written from that
description, nothing copied:

* hidden_states [B, 16, H, W] (the FLUX.1 VAE's latent) → 2×2 patches, features (row, column, channel) →
  `x_embedder.proj`; out through `final_layer.linear` and back the same way.
* temb = `t_embedder` (Linear, SiLU, Linear on the 256-wide sinusoidal embedding, cosines first, of t in 0–1000) +
  `p_embedder` (Linear, SiLU, Linear on the pooled CLIP-L and CLIP-G embeddings, 768 + 1280).
* Text: `caption_projection.i` (a bias-free Linear) of Llama 3.1 8B's layer min(i, 31) for block i, and
  `caption_projection.48` of T5-XXL's states. The T5 tokens and the last block's Llama tokens are a text stream
  the double blocks carry along; each block appends its own Llama layer's tokens to it and drops them after.
* RoPE on interleaved pairs over the whole 128-wide head, axes (frame, row, column) of (64, 32, 32), theta 10000:
  image tokens at (0, row, column), text tokens at the origin (unrotated).
* Double block: `adaLN_modulation.1`(SiLU(temb)) → shift, scale, gate, shift₂, scale₂, gate₂ for the image, then the
  same six for the text; LayerNorm without affine (eps 1e-6), x·(1 + scale) + shift; q, k, v (`to_q` … for the image,
  `to_q_t` … for the text), q and k RMS-normalised over the whole width (eps 1e-5); one attention over
  [image, text]; x += gate·out (`to_out`, `to_out_t`); image += gate₂·MoE(…), text += gate₂·SwiGLU(…) (`ff_t`).
* Single block over [image, T5 + last Llama, the block's Llama]: the image stream's half of a double block; the
  block's Llama tokens are dropped after it. The image tokens are read out after the last.
* SwiGLU: w2(SiLU(w1·x) ⊙ w3·x), bias-free. MoE (`ff_i`, DeepSeek's in eval mode): softmax(`gate`·x) over the routed
  experts, the top 2 kept unnormalised; out = Σ weight·expert(x) over the chosen experts + `shared_experts`(x).
* A non-square latent's tokens are padded with zeros to max_seq = 4096 (max_resolution 128 × 128 in 2×2 patches:
  1024 × 1024 px of area) at position (0, 0, 0), and the padding's keys zeroed (not masked out: every query still
  gives them the weight of a logit 0, as the release's code does); a square one is not padded. HiDream-E1-Full's
  config raises max_resolution to (96, 192) (4608), E1.1's pipeline max_seq to 8192: their input is the target's
  latent and the reference image's side by side along the width, the output's left half the prediction.
* ComfyUI (comfy/ldm/hidream) runs the same blocks but pads nothing, stacks the Llama states [B, 32, T, D], takes E1's
  reference as `image_cond` and returns the output negated (the pipelines' sign): its non-square results differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import (
    NormedAttn,
    Ops,
    layer_norm,
    merge_heads,
    mlp2,
    rms_norm_with,
    rope,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import rope_table

HEAD_DIM = 128
AXES = (64, 32, 32)
THETA = 10000.0
QK_EPS = 1e-5
TOP_K = 2  # num_activated_experts of the released configs (not in the weights)
LLAMA_LAYERS = 32  # Llama 3.1 8B's decoder layers: the stack of states the model takes
MAX_SEQ = 4096  # max_resolution (128, 128) over 2×2 patches: the tokens a non-square latent is padded to
E1_MAX_SEQ = "HiDream-E1-Full's config: 4608, E1.1's pipeline: 8192"


@dataclass
class MoE:
    gate: object
    experts: list[tuple[object, object, object]]  # each (w1, w3, w2)
    shared: tuple[object, object, object]

    def ops(self) -> list:
        return [self.gate, *(op for e in self.experts for op in e), *self.shared]


@dataclass
class Block:
    mod: object
    img: NormedAttn
    txt: NormedAttn | None  # a single-stream block has none
    ff_i: MoE | tuple  # the release's MoE; a plain SwiGLU where a config has no routed experts
    ff_t: tuple | None

    def ops(self) -> list:
        i, t = self.img, self.txt
        order = [self.mod, *i.ops()[:5], *(t.ops()[:5] if t else ()), i.o, *((t.o,) if t else ())]
        return order + _ff_ops(self.ff_i) + list(self.ff_t or ())


@dataclass
class HiDream:
    """A bound HiDream-I1 transformer: call it with hidden_states, timesteps, encoder_hidden_states_t5,
    encoder_hidden_states_llama3 (the [32, B, T, 4096] stack), pooled_embeds [, max_seq]."""

    architecture: str
    x_embedder: object
    t_embedder: tuple[object, object]
    p_embedder: tuple[object, object]
    captions: list  # caption_projection.0 … (one per block, then T5's)
    doubles: list[Block]
    singles: list[Block]
    final_mod: object
    final_linear: object
    dtype: torch.dtype = torch.float32
    family = "hidream"
    llama_layers = LLAMA_LAYERS

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1] // 4

    @property
    def t5_dim(self) -> int:
        return wshape(self.captions[-1])[1]

    @property
    def llama_dim(self) -> int:
        return wshape(self.captions[0])[1]

    @property
    def pooled_dim(self) -> int:
        return wshape(self.p_embedder[0])[1]

    def padded_length(self, h: int, w: int, max_seq=None, source: str = "inputs") -> int | None:
        """The tokens an H × W latent's patches are padded to (None: a square latent is not padded); a FormatError
        where a non-square latent has more patches than that, or `max_seq` [B] is not one whole number."""
        if max_seq is not None:
            v = max_seq.flatten()
            if not (v == v[0]).all() or v[0] < 1 or v[0] != v[0].round():
                raise FormatError(
                    f"{source}: max_seq must be one whole number of tokens for the batch, not {v.tolist()}"
                )
        if h == w:
            return None
        seq = MAX_SEQ if max_seq is None else int(max_seq.flatten()[0])
        n = (h // 2) * (w // 2)
        if n > seq:
            raise FormatError(
                f"{source}: a non-square {w}×{h} latent ({n} patches) is padded to max_seq = {seq} tokens "
                f"(HiDream-I1: {MAX_SEQ}, an image of 1024×1024 px of area); choose a smaller or a square image, "
                f"or give max_seq [B] ({E1_MAX_SEQ})"
            )
        return seq

    def __call__(self, hidden_states, timesteps, encoder_hidden_states_t5, encoder_hidden_states_llama3,
                 pooled_embeds, max_seq=None) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        b, c, h, w = hidden_states.shape
        ph, pw = h // 2, w // 2
        n = ph * pw
        seq = self.padded_length(h, w, max_seq)
        x = hidden_states.to(dt).reshape(b, c, ph, 2, pw, 2).permute(0, 2, 4, 3, 5, 1).reshape(b, n, 4 * c)
        ids = torch.zeros(n, 3, device=x.device)
        ids[:, 1] = torch.arange(ph, device=x.device).repeat_interleave(pw).float()
        ids[:, 2] = torch.arange(pw, device=x.device).repeat(ph).float()
        keep = None
        if seq is not None:  # the padding: zero patches at the origin, their keys zeroed
            x, ids = F.pad(x, (0, 0, 0, seq - n)), F.pad(ids, (0, 0, 0, seq - n))
            keep = (torch.arange(seq, device=x.device) < n).to(dt)
        img = self.x_embedder(x)
        temb = mlp2(self.t_embedder, timestep_embedding(timesteps.float(), 256).to(dt))
        temb = temb + mlp2(self.p_embedder, pooled_embeds.to(dt))
        llama = encoder_hidden_states_llama3
        blocks = len(self.doubles) + len(self.singles)
        per_block = [self.captions[i](llama[llama_layer(i)].to(dt)) for i in range(blocks)]
        t5 = self.captions[-1](encoder_hidden_states_t5.to(dt))
        carried = torch.cat([t5, per_block[-1]], dim=1)  # T5's tokens and the last block's Llama layer's
        n_carried = carried.shape[1]
        n_txt = n_carried + llama.shape[2]
        pe = rope_table(torch.cat([ids, ids.new_zeros(n_txt, 3)])[None], AXES, THETA)
        vs = F.silu(temb)
        for i, blk in enumerate(self.doubles):
            img, txt = self._double(blk, img, torch.cat([carried, per_block[i]], dim=1), vs, pe, keep)
            carried = txt[:, :n_carried]
        n_img = img.shape[1]
        x = torch.cat([img, carried], dim=1)
        del img, carried
        n_x = x.shape[1]
        if keep is not None:
            keep = torch.cat([keep, keep.new_ones(n_txt)])
        # each single block's own Llama tokens, dropped after it
        for blk, own in zip(self.singles, per_block[len(self.doubles) :], strict=True):
            x = self._single(blk, torch.cat([x, own], dim=1), vs, pe, keep)[:, :n_x]
        shift, scale = self.final_mod(vs)[:, None].chunk(2, dim=-1)
        out = self.final_linear(layer_norm(x[:, :n_img]) * (1 + scale) + shift)[:, :n]
        return out.reshape(b, ph, pw, 2, 2, -1).permute(0, 5, 1, 3, 2, 4).reshape(b, -1, 2 * ph, 2 * pw)

    def _qkv(self, a: NormedAttn, x):
        q = rms_norm_with(a.q_norm, a.q(x), QK_EPS).to(x.dtype)
        k = rms_norm_with(a.k_norm, a.k(x), QK_EPS).to(x.dtype)
        return q, k, a.v(x)

    @staticmethod
    def _attend(q, k, v, pe):
        heads = q.shape[-1] // HEAD_DIM
        q, k, v = (split_heads(t, heads) for t in (q, k, v))
        return merge_heads(F.scaled_dot_product_attention(rope(q, pe), rope(k, pe), v))

    def _double(self, blk: Block, img, txt, vs, pe, keep):
        m = blk.mod(vs)[:, None].chunk(12, dim=-1)
        qi, ki, vi = self._qkv(blk.img, layer_norm(img) * (1 + m[1]) + m[0])
        if keep is not None:
            ki = ki * keep[:, None]
        qt, kt, vt = self._qkv(blk.txt, layer_norm(txt) * (1 + m[7]) + m[6])
        o = self._attend(torch.cat([qi, qt], 1), torch.cat([ki, kt], 1), torch.cat([vi, vt], 1), pe)
        n = img.shape[1]
        oi, ot = blk.img.o(o[:, :n]), blk.txt.o(o[:, n:])
        img, txt = img + m[2] * oi, txt + m[8] * ot
        fi = _ff(blk.ff_i, layer_norm(img) * (1 + m[4]) + m[3])
        ft = _swiglu(blk.ff_t, layer_norm(txt) * (1 + m[10]) + m[9])
        return img + m[5] * fi, txt + m[11] * ft

    def _single(self, blk: Block, x, vs, pe, keep):
        m = blk.mod(vs)[:, None].chunk(6, dim=-1)
        q, k, v = self._qkv(blk.img, layer_norm(x) * (1 + m[1]) + m[0])
        if keep is not None:
            k = k * keep[:, None]
        x = x + m[2] * blk.img.o(self._attend(q, k, v, pe))
        return x + m[5] * _ff(blk.ff_i, layer_norm(x) * (1 + m[4]) + m[3])

    def op_order(self) -> list:
        order = [self.x_embedder, *self.t_embedder, *self.p_embedder, *self.captions]
        for blk in (*self.doubles, *self.singles):
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def llama_layer(block: int) -> int:
    """The Llama layer block `block` reads (the released configs' `llama_layers`: 0…31, then 31)."""
    return min(block, LLAMA_LAYERS - 1)


def _swiglu(ff, x):
    w1, w3, w2 = ff
    return w2(F.silu(w1(x)) * w3(x))


def _ff(ff, x):
    return _moe(ff, x) if isinstance(ff, MoE) else _swiglu(ff, x)


def _ff_ops(ff) -> list:
    return ff.ops() if isinstance(ff, MoE) else list(ff)


def _moe(moe: MoE, x):
    """diffusers' MOEFeedForwardSwiGLU in eval mode (its `moe_infer`): each token through its top-2 routed experts,
    weighted by their softmax scores and summed in expert order, plus the shared experts. Every expert runs, an idle
    one on no tokens, so the ops a step fetches do not depend on the routing (the streamer reads them ahead)."""
    flat = x.reshape(-1, x.shape[-1])
    weight, chosen = torch.topk(moe.gate(flat).softmax(dim=-1), TOP_K, dim=-1, sorted=False)
    order = chosen.flatten().argsort(stable=True)  # the (token, choice) pairs by expert, tokens in order
    counts = torch.bincount(chosen.flatten(), minlength=len(moe.experts)).tolist()  # one device sync a layer
    rows, weight = order // TOP_K, weight.flatten()[order, None]
    y = torch.zeros_like(flat)
    start = 0
    for expert, n in zip(moe.experts, counts, strict=True):  # each token at most once per expert
        r, start = rows[start : start + n], start + n
        y.index_add_(0, r, _swiglu(expert, flat[r]) * weight[start - n : start])
    return y.reshape(x.shape) + _swiglu(moe.shared, x)


# -- binding the file's ops -----------------------------------------------------------------------------


def bind_hidream(ops: Ops, architecture: str, dtype: torch.dtype) -> HiDream:
    """The forward of a HiDream transformer in its one naming (HiDream-ai's, which diffusers keeps)."""

    def swiglu(p: str) -> tuple:
        return tuple(ops[f"{p}.{n}"] for n in ("w1", "w3", "w2"))

    def attn(p: str, t: str = "") -> NormedAttn:
        return NormedAttn(
            *(ops[f"{p}.{n}{t}"] for n in ("to_q", "to_k", "to_v", "to_out", "q_rms_norm", "k_rms_norm"))
        )

    def ff_i(p: str):
        experts = ops.children(f"{p}.experts")
        if not experts:
            return swiglu(p)
        return MoE(
            ops[f"{p}.gate"], [swiglu(f"{p}.experts.{e}") for e in experts], swiglu(f"{p}.shared_experts")
        )

    def block(p: str, double: bool) -> Block:
        p = f"{p}.block"
        return Block(ops[f"{p}.adaLN_modulation.1"], attn(f"{p}.attn1"), attn(f"{p}.attn1", "_t") if double else None,
                     ff_i(f"{p}.ff_i"), swiglu(f"{p}.ff_t") if double else None)  # fmt: skip

    doubles = [block(f"double_stream_blocks.{i}", True) for i in ops.children("double_stream_blocks")]
    singles = [block(f"single_stream_blocks.{i}", False) for i in ops.children("single_stream_blocks")]
    if not doubles or not singles:
        raise UnsupportedModel(f"{ops.what}: no double- or single-stream blocks — not a HiDream transformer")
    width = wshape(ops["x_embedder.proj"])[0]
    if width % HEAD_DIM:
        raise UnsupportedModel(
            f"{ops.what}: width {width}: HiDream's heads are {HEAD_DIM} wide (RoPE axes {AXES})"
        )
    blocks = len(doubles) + len(singles)
    captions = [ops[f"caption_projection.{i}.linear"] for i in range(blocks + 1)]
    for blk in (*doubles, *singles):
        if isinstance(blk.ff_i, MoE) and len(blk.ff_i.experts) < TOP_K:
            raise UnsupportedModel(
                f"{ops.what}: {len(blk.ff_i.experts)} routed experts: HiDream routes to {TOP_K}"
            )
    return HiDream(
        architecture, ops["x_embedder.proj"], (ops["t_embedder.timestep_embedder.linear_1"],
        ops["t_embedder.timestep_embedder.linear_2"]), (ops["p_embedder.pooled_embedder.linear_1"],
        ops["p_embedder.pooled_embedder.linear_2"]), captions, doubles, singles, ops["final_layer.adaLN_modulation.1"],
        ops["final_layer.linear"], dtype,
    )  # fmt: skip
