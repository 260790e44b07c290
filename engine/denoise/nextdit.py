"""Z-Image's transformer (Tongyi-MAI Z-Image Turbo / Base: a NextDiT of single-stream blocks over one
sequence of image and caption tokens), run on the component's own castable ops, in the original naming
(the release and ComfyUI's repackaged files: fused `attention.qkv`, `attention.out`, `x_embedder`,
`final_layer`) or diffusers' (`ZImageTransformer2DModel`: `attention.to_q/k/v`, `attention.to_out.0`,
`all_x_embedder.2-1`, `all_final_layer.2-1`).

Architecture facts, from the Z-Image paper's description and diffusers' `transformer_z_image.py` (read for
the facts, nothing copied):

* x [B, 16, h, w] latents → 2×2 patches whose features run (row offset, column offset, channel), channels
  last — unlike FLUX.1's channels-first patches; the output's rows unpack the same way.
* t [B] in 0–1 (its pipeline passes 1 − sigma: t = 1 is the clean image) → the 256-wide sinusoidal
  embedding (cosines first) of 1000·t → Linear, SiLU, Linear (`t_embedder.mlp.0/2`) → temb, 256 wide.
* cap_feats [B, T, 2560] Qwen3-4B states of the prompt's tokens → RMSNorm (`cap_embedder.0`, eps 1e-5)
  → Linear (`cap_embedder.1`).
* both sequences are padded to a multiple of 32 tokens with learned rows (`x_pad_token`,
  `cap_pad_token`, in place of the embedded padding).
* rotary positions on 3 axes of (32, 48, 48) dims, theta 256, on interleaved pairs (FLUX.1's rotation,
  integer positions): caption token i at (1 + i, 0, 0) for every padded caption row; image patch (r, c) at
  (L + 1, r, c) with L the padded caption length; image padding at (0, 0, 0).
* block: `adaLN_modulation.0` (a bare Linear of temb, no SiLU) → (scale, gate, scale₂, gate₂), gates
  through tanh; x += tanh(gate)·RMSNorm₂(attn(RMSNorm₁(x)·(1 + scale))); x += tanh(gate₂)·
  RMSNorm₄(FFN(RMSNorm₃(x)·(1 + scale₂))), FFN = w2(SiLU(w1 x)·w3 x) without biases; attention with
  per-head RMSNorm of q and k (eps 1e-5), no biases; every RMSNorm eps 1e-5. The head width is the
  q-norm's length (128), so the head count is read from the weights.
* order: the image tokens through the 2 `noise_refiner` blocks (modulated), the caption through the 2
  `context_refiner` blocks (unmodulated), then [image, caption] through the 30 `layers`.
* out: (1 + `final_layer.adaLN_modulation.1`(SiLU(temb))) scales LayerNorm(x) (no affine, eps 1e-6),
  then `final_layer.linear`; the image tokens are kept.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, layer_norm, merge_heads, mlp2, rms_norm_with, rope, timestep_embedding, wshape
from .flux import Proj, rope_table

SEQ_MULTIPLE = 32  # both sequences are padded to a multiple of this many tokens
AXES = (32, 48, 48)
THETA = 256.0
TIME_SCALE = 1000.0
NORM_EPS = 1e-5
PATCH = 2


@dataclass
class Block:
    mod: object | None  # adaLN_modulation.0; None in the caption's refiner
    norm1: object
    qkv: Proj
    norm_q: object
    norm_k: object
    out: object
    norm2: object
    ffn_norm1: object
    w1: object
    w3: object
    w2: object
    ffn_norm2: object

    def ops(self) -> list:
        return [*([self.mod] if self.mod is not None else []), self.norm1, *self.qkv.ops(), self.norm_q,
                self.norm_k, self.out, self.norm2, self.ffn_norm1, self.w1, self.w3, self.w2, self.ffn_norm2]  # fmt: skip


def positions(h: int, w: int, n_img: int, n_cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([n_img, 3] image rows, padding included; [n_cap, 3] caption rows) positions, float."""
    cap = torch.zeros(n_cap, 3)
    cap[:, 0] = 1 + torch.arange(n_cap)
    img = torch.zeros(n_img, 3)
    grid = img[: h * w].view(h, w, 3)
    grid[..., 0] = n_cap + 1
    grid[..., 1] = torch.arange(h)[:, None]
    grid[..., 2] = torch.arange(w)[None, :]
    return img, cap


def _padded(n: int) -> int:
    return n + (-n) % SEQ_MULTIPLE


@dataclass
class NextDiT:
    """A bound Z-Image transformer: call it with x [B, 16, h, w] (h, w even), t [B] (0–1) and cap_feats
    [B, T, 2560]."""

    architecture: str
    x_embedder: object
    time: tuple[object, object]
    cap_norm: object  # the plain holder of cap_embedder.0's weight (a norm its path does not name)
    cap_embedder: object
    noise_refiner: list[Block]
    context_refiner: list[Block]
    layers: list[Block]
    final_mod: object
    final_linear: object
    pads: object  # the root module holding x_pad_token and cap_pad_token
    dtype: torch.dtype = torch.float32
    family = "nextdit"

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1] // (PATCH * PATCH)

    @property
    def context_dim(self) -> int:
        return wshape(self.cap_embedder)[1]

    def __call__(self, x, t, cap_feats) -> torch.Tensor:
        dt = self.dtype
        b, c, height, width = x.shape
        h, w = height // PATCH, width // PATCH
        n = h * w
        n_img, n_cap = _padded(n), _padded(cap_feats.shape[1])
        temb = mlp2(self.time, timestep_embedding(TIME_SCALE * t.float(), 256).to(dt))
        patches = x.to(dt).reshape(b, c, h, PATCH, w, PATCH).permute(0, 2, 4, 3, 5, 1).reshape(b, n, -1)
        img = self._pad(self.x_embedder(patches), "x_pad_token", n_img)
        ipos, cpos = positions(h, w, n_img, n_cap)
        pe_img, pe_cap = (rope_table(p.to(x.device)[None], AXES, THETA) for p in (ipos, cpos))
        for blk in self.noise_refiner:
            img = self._block(blk, img, pe_img, temb)
        weight = self.cap_norm.weight.to(x.device, dt)
        cap = self.cap_embedder(F.rms_norm(cap_feats.to(dt), (cap_feats.shape[-1],), weight, NORM_EPS))
        cap = self._pad(cap, "cap_pad_token", n_cap)
        for blk in self.context_refiner:
            cap = self._block(blk, cap, pe_cap, None)
        seq, pe = torch.cat([img, cap], 1), torch.cat([pe_img, pe_cap], 2)
        for blk in self.layers:
            seq = self._block(blk, seq, pe, temb)
        scale = 1 + self.final_mod(F.silu(temb))[:, None]
        out = self.final_linear(layer_norm(seq[:, :n]) * scale)
        return out.reshape(b, h, w, PATCH, PATCH, -1).permute(0, 5, 1, 3, 2, 4).reshape(b, -1, height, width)

    def _pad(self, rows: torch.Tensor, name: str, to: int) -> torch.Tensor:
        if rows.shape[1] == to:
            return rows
        token = getattr(self.pads, name).to(rows.device, rows.dtype)
        return torch.cat([rows, token.expand(rows.shape[0], to - rows.shape[1], -1)], 1)

    def _block(self, blk: Block, x, pe, temb):
        mod = None  # (1 + scale, tanh(gate), 1 + scale₂, tanh(gate₂)); none in the caption's refiner
        if blk.mod is not None:
            s1, g1, s2, g2 = blk.mod(temb)[:, None].chunk(4, dim=-1)
            mod = (1 + s1, g1.tanh(), 1 + s2, g2.tanh())
        a = rms_norm_with(blk.norm1, x, NORM_EPS)
        q, k, v = blk.qkv(a if mod is None else a * mod[0])
        hd = wshape(blk.norm_q)[0]
        q, k, v = (u.unflatten(-1, (-1, hd)).transpose(1, 2) for u in (q, k, v))
        q = rope(rms_norm_with(blk.norm_q, q, NORM_EPS).to(v.dtype), pe)
        k = rope(rms_norm_with(blk.norm_k, k, NORM_EPS).to(v.dtype), pe)
        o = F.scaled_dot_product_attention(q, k, v, enable_gqa=k.shape[1] != q.shape[1])
        o = rms_norm_with(blk.norm2, blk.out(merge_heads(o)), NORM_EPS)
        x = x + (o if mod is None else mod[1] * o)
        f = rms_norm_with(blk.ffn_norm1, x, NORM_EPS)
        f = f if mod is None else f * mod[2]
        f = rms_norm_with(blk.ffn_norm2, blk.w2(F.silu(blk.w1(f)) * blk.w3(f)), NORM_EPS)
        return x + (f if mod is None else mod[3] * f)

    def op_order(self) -> list:
        order = [*self.time, self.x_embedder]
        for blk in self.noise_refiner:
            order += blk.ops()
        order.append(self.cap_embedder)
        for blk in (*self.context_refiner, *self.layers):
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def bind_z_image(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, NextDiT]:
    """(naming, the forward) of a Z-Image transformer in the original or diffusers' naming; `mods`: the
    component's modules by path (the plain holders of the caption norm and the pad tokens among them)."""
    diffusers = "all_x_embedder.2-1" in mods
    head = "all_final_layer.2-1" if diffusers else "final_layer"
    root, cap_norm = mods.get(""), mods.get("cap_embedder.0")
    if (
        root is None
        or not all(hasattr(root, n) for n in ("x_pad_token", "cap_pad_token"))
        or cap_norm is None
    ):
        raise UnsupportedModel(f"{ops.what}: no pad tokens or caption norm — not a Z-Image transformer")
    ops.take(root)
    ops.take(cap_norm)
    dim = wshape(ops["all_x_embedder.2-1" if diffusers else "x_embedder"])[0]

    def block(p: str, modulated: bool) -> Block:
        a = f"{p}.attention"
        if f"{a}.qkv" in ops:
            hd = wshape(ops[f"{a}.q_norm"])[0]
            kv = (wshape(ops[f"{a}.qkv"])[0] - dim) // 2
            qkv = Proj(ops[f"{a}.qkv"], (dim, kv, kv))
            norms, out = (ops[f"{a}.q_norm"], ops[f"{a}.k_norm"]), ops[f"{a}.out"]
        else:
            qkv = Proj(None, parts=(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"]))
            norms, out = (ops[f"{a}.norm_q"], ops[f"{a}.norm_k"]), ops[f"{a}.to_out.0"]
            hd = wshape(norms[0])[0]
        if dim % hd or sum(AXES) != hd:
            raise UnsupportedModel(
                f"{ops.what}: heads {hd} wide in a width of {dim}: Z-Image's rotary axes {AXES} need 128"
            )
        return Block(ops[f"{p}.adaLN_modulation.0"] if modulated else None, ops[f"{p}.attention_norm1"], qkv,
                     *norms, out, ops[f"{p}.attention_norm2"], ops[f"{p}.ffn_norm1"], ops[f"{p}.feed_forward.w1"],
                     ops[f"{p}.feed_forward.w3"], ops[f"{p}.feed_forward.w2"], ops[f"{p}.ffn_norm2"])  # fmt: skip

    def blocks(name: str, modulated: bool) -> list[Block]:
        return [block(f"{name}.{i}", modulated) for i in ops.children(name)]

    model = NextDiT(
        architecture, ops["all_x_embedder.2-1" if diffusers else "x_embedder"],
        (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]), cap_norm, ops["cap_embedder.1"],
        blocks("noise_refiner", True), blocks("context_refiner", False), blocks("layers", True),
        ops[f"{head}.adaLN_modulation.1"], ops[f"{head}.linear"], root, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "original"), model
