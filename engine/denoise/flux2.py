"""FLUX.2's transformer forward pass ([dev] 32B, [klein] 4B / 9B), run on the component's own castable ops, in
the file's own naming: BFL's (fused `qkv` and `linear1`, as the releases and ComfyUI's files keep it) or
diffusers' (`Flux2Transformer2DModel`: separate q / k / v in the double blocks, `to_qkv_mlp_proj`).

Architecture facts, from BFL's FLUX.2 model card and diffusers' `transformer_flux2.py` and its
`convert_flux2_transformer_checkpoint_to_diffusers` (read for the facts, nothing copied). FLUX.1's blocks
(engine.denoise.flux) with these differences:

* no biases anywhere; no pooled-vector embedder: vec = time_in(emb(1000·t)) [+ guidance_in(emb(1000·g))
  for [dev]; [klein] has no guidance input], emb the 256-wide sinusoidal embedding (cosines first).
* the modulations are shared by all blocks: `double_stream_modulation_img.lin` / `_txt.lin` (SiLU(vec) →
  (shift, scale, gate) × 2 for every double block's stream) and `single_stream_modulation.lin` (one
  (shift, scale, gate) for every single block); the blocks hold no modulation of their own.
* the MLPs are SwiGLU: `mlp.0` is 2·m wide, SiLU(first half) · second half, then `mlp.2` (m = 3·hidden);
  a single block's `linear1` gives q, k, v and the 2·m MLP input, `linear2` takes [attn, SwiGLU(mlp)].
* rotary positions on 4 axes (t, h, w, l) of 32 dims each, theta 2000, FLUX.1's pair rotation: image
  patches at (0, row, column, 0), text tokens at (0, 0, 0, i) (diffusers' Flux2 pipeline ids).
* heads of 128 (the QK-norm's scale holds it); in_channels 128: 2×2 patches of the 32-channel latent.
* out: (shift, scale) = final_layer.adaLN_modulation.1(SiLU(vec)) (diffusers' `norm_out.linear` holds the
  halves the other way round), Linear((1 + scale)·LN(x) + shift).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, layer_norm, mlp2, split_heads, timestep_embedding, wshape
from .flux import Double, Flux, Proj, Single, Stream, _attention, rope_table

AXES = (32, 32, 32, 32)
THETA = 2000.0
TIME_FACTOR = 1000.0


def swiglu(h: torch.Tensor) -> torch.Tensor:
    a, b = h.chunk(2, dim=-1)
    return F.silu(a) * b


@dataclass
class Flux2(Flux):
    """A bound FLUX.2 transformer: call it with img [B, L, 128], img_ids [B, L, 4], txt [B, T, D], txt_ids
    [B, T, 4], timesteps [B] (0–1) [, guidance [B] for [dev]]."""

    mods: tuple = ()  # the shared modulation Linears: double img, double txt, single
    family = "flux2"

    @property
    def vec_dim(self) -> int:
        return 0

    def __call__(self, img, img_ids, txt, txt_ids, timesteps, guidance=None) -> torch.Tensor:
        dt = self.dtype
        img = self.img_in(img.to(dt))
        vec = mlp2(self.time_in, timestep_embedding(TIME_FACTOR * timesteps.float(), 256).to(dt))
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError("FLUX.2 [dev] takes a `guidance` input")
            vec = vec + mlp2(self.guidance_in, timestep_embedding(TIME_FACTOR * guidance.float(), 256).to(dt))
        txt = self.txt_in(txt.to(dt))
        pe = rope_table(torch.cat([txt_ids, img_ids], dim=1), AXES, THETA)
        vs = F.silu(vec)
        im, tm = (m(vs)[:, None].chunk(6, dim=-1) for m in self.mods[:2])
        single = self.mods[2](vs)[:, None].chunk(3, dim=-1)
        for blk in self.doubles:
            img, txt = self._joint(blk, img, txt, im, tm, pe)
        n_txt = txt.shape[1]
        x = torch.cat([txt, img], dim=1)
        del img, txt
        for blk in self.singles:
            x = self._single_with(blk, x, *single, pe)
        x = x[:, n_txt:]
        shift, scale = self.final_mod(vs).chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        return self.final_linear((1 + scale[:, None]) * layer_norm(x) + shift[:, None])

    @staticmethod
    def _after(s: Stream, x, attn, m):
        x = x + m[2] * s.proj(attn)
        return x + m[5] * s.mlp_out(swiglu(s.mlp_in((1 + m[4]) * layer_norm(x) + m[3])))

    def _single_with(self, blk: Single, x, shift, scale, gate, pe):
        q, k, v, mlp = blk.linear1((1 + scale) * layer_norm(x) + shift)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        q, k = blk.q_norm(q).to(v.dtype), blk.k_norm(k).to(v.dtype)
        return x + gate * blk.linear2(torch.cat([_attention(q, k, v, pe), swiglu(mlp)], dim=2))

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, *(self.guidance_in or ()), self.txt_in, *self.mods]
        for d in self.doubles:
            order += d.ops()
        for s in self.singles:
            order += s.ops()
        return [*order, self.final_mod, self.final_linear]


def _heads(q_norm, hidden: int, what: str) -> int:
    head = wshape(q_norm)[0]
    if head != sum(AXES) or hidden % head:
        raise UnsupportedModel(
            f"{what}: head width {head} with hidden size {hidden} — FLUX.2 uses 128-wide heads (RoPE axes {AXES})"
        )
    return hidden // head


def _single(ops: Ops, lin1: str, hidden: int, q_norm: str, k_norm: str, lin2: str) -> Single:
    mlp = wshape(ops[lin1])[0] - 3 * hidden  # the SwiGLU input: 2·m
    return Single(None, Proj(ops[lin1], (hidden, hidden, hidden, mlp)), ops[q_norm], ops[k_norm], ops[lin2])


def bind_flux2_bfl(ops: Ops, architecture: str, dtype: torch.dtype) -> Flux2:
    hidden = wshape(ops["img_in"])[0]

    def stream(p: str) -> Stream:
        return Stream(None, Proj(ops[f"{p}_attn.qkv"], (hidden, hidden, hidden)), ops[f"{p}_attn.norm.query_norm"],
                      ops[f"{p}_attn.norm.key_norm"], ops[f"{p}_attn.proj"], ops[f"{p}_mlp.0"], ops[f"{p}_mlp.2"])  # fmt: skip

    doubles = [Double(stream(f"double_blocks.{i}.img"), stream(f"double_blocks.{i}.txt"))
               for i in ops.children("double_blocks")]  # fmt: skip
    singles = [
        _single(ops, f"{p}.linear1", hidden, f"{p}.norm.query_norm", f"{p}.norm.key_norm", f"{p}.linear2")
        for p in (f"single_blocks.{i}" for i in ops.children("single_blocks"))
    ]
    guidance = ("guidance_in.in_layer", "guidance_in.out_layer")
    return _model(ops, architecture, dtype, hidden, doubles, singles,
                  ("img_in", "txt_in", ("time_in.in_layer", "time_in.out_layer"), guidance,
                   ("double_stream_modulation_img.lin", "double_stream_modulation_txt.lin", "single_stream_modulation.lin"),
                   "final_layer.adaLN_modulation.1", False, "final_layer.linear"))  # fmt: skip


def bind_flux2_diffusers(ops: Ops, architecture: str, dtype: torch.dtype) -> Flux2:
    hidden = wshape(ops["x_embedder"])[0]
    doubles = []
    for i in ops.children("transformer_blocks"):
        p, a = f"transformer_blocks.{i}", f"transformer_blocks.{i}.attn"
        img = Stream(None, Proj(None, parts=(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"])), ops[f"{a}.norm_q"],
                     ops[f"{a}.norm_k"], ops[f"{a}.to_out.0"], ops[f"{p}.ff.linear_in"], ops[f"{p}.ff.linear_out"])  # fmt: skip
        txt = Stream(None, Proj(None, parts=(ops[f"{a}.add_q_proj"], ops[f"{a}.add_k_proj"], ops[f"{a}.add_v_proj"])),
                     ops[f"{a}.norm_added_q"], ops[f"{a}.norm_added_k"], ops[f"{a}.to_add_out"],
                     ops[f"{p}.ff_context.linear_in"], ops[f"{p}.ff_context.linear_out"])  # fmt: skip
        doubles.append(Double(img, txt))
    singles = [
        _single(ops, f"{a}.to_qkv_mlp_proj", hidden, f"{a}.norm_q", f"{a}.norm_k", f"{a}.to_out")
        for a in (f"single_transformer_blocks.{i}.attn" for i in ops.children("single_transformer_blocks"))
    ]
    te = "time_guidance_embed"
    return _model(ops, architecture, dtype, hidden, doubles, singles,
                  ("x_embedder", "context_embedder", (f"{te}.timestep_embedder.linear_1", f"{te}.timestep_embedder.linear_2"),
                   (f"{te}.guidance_embedder.linear_1", f"{te}.guidance_embedder.linear_2"),
                   ("double_stream_modulation_img.linear", "double_stream_modulation_txt.linear",
                    "single_stream_modulation.linear"), "norm_out.linear", True, "proj_out"))  # fmt: skip


def _model(ops: Ops, architecture: str, dtype, hidden: int, doubles, singles, names) -> Flux2:
    """The model from its blocks and the paths of its other layers: (img_in, txt_in, the time embedder's
    pair, the guidance embedder's pair (taken where the file has it), the three shared modulations, the
    final modulation, whether its halves are (scale, shift), the final Linear)."""
    img_in, txt_in, time, guidance, mods, final_mod, swapped, final = names
    if not doubles and not singles:
        raise UnsupportedModel(f"{ops.what}: no FLUX.2 blocks")
    heads = _heads(doubles[0].img.q_norm if doubles else singles[0].q_norm, hidden, ops.what)
    g = (ops[guidance[0]], ops[guidance[1]]) if guidance[0] in ops else None
    return Flux2(architecture, ops[img_in], ops[txt_in], (ops[time[0]], ops[time[1]]), g, (), doubles, singles,
                 ops[final_mod], swapped, ops[final], heads, dtype, tuple(ops[m] for m in mods))  # fmt: skip
