"""The NextDiT transformers of Z-Image (Tongyi-MAI Z-Image Turbo / Base) and Lumina-Image 2.0 (Alpha-VLLM):
single-stream blocks over one sequence of image and caption tokens, run on the component's own castable
ops, in the original naming (the releases and ComfyUI's repackaged files and GGUFs: fused
`attention.qkv`, `attention.out`, `feed_forward.w1/2/3`, `final_layer`) or diffusers'
(`ZImageTransformer2DModel`: `attention.to_q/k/v`, `all_x_embedder.2-1`, `all_final_layer.2-1`;
`Lumina2Transformer2DModel`: `attn.to_q/k/v`, `norm1.linear`, `feed_forward.linear_1/2/3`, `norm_out`).

Architecture facts, from the Z-Image and Lumina-Image 2.0 papers' descriptions and diffusers'
`transformer_z_image.py` / `transformer_lumina2.py` (read for the facts, nothing copied):

* x [B, 16, h, w] latents → 2×2 patches whose features run (row offset, column offset, channel), channels
  last — unlike FLUX.1's channels-first patches — → `x_embedder`; the output's rows unpack the same way.
* t [B] in 0–1 (both pipelines pass 1 − sigma: t = 1 is the clean image) → the 256-wide sinusoidal
  embedding (cosines first) of s·t → Linear, SiLU, Linear (`t_embedder.mlp.0/2`) → temb; s = 1000 and
  temb 256 wide for Z-Image, s = 1 and 1024 wide for Lumina 2.
* cap_feats [B, T, D] text states (Z-Image: Qwen3-4B's, 2560; Lumina 2: Gemma-2-2B's, 2304) → RMSNorm
  (`cap_embedder.0`) → Linear (`cap_embedder.1`).
* block: the modulation Linear (Z-Image `adaLN_modulation.0` of temb; Lumina 2 `adaLN_modulation.1` of
  SiLU(temb)) → (scale, gate, scale₂, gate₂); x += tanh(gate)·RMSNorm₂(attn(RMSNorm₁(x)·(1 + scale)));
  x += tanh(gate₂)·RMSNorm₄(FFN(RMSNorm₃(x)·(1 + scale₂))), FFN = w2(SiLU(w1 x)·w3 x), no biases;
  attention with per-head RMSNorm of q and k and grouped K/V heads (Lumina 2: 24 query heads on 8),
  no biases. Every RMSNorm eps 1e-5. The head width is the q-norm's length (Z-Image 128, Lumina 2 96): the
  head counts are read from the weights.
* rotary positions on 3 axes, interleaved pairs (FLUX.1's rotation), integer positions: Z-Image axes
  (32, 48, 48), theta 256; caption row i at (1 + i, 0, 0), image patch (r, c) at (L + 1, r, c), both
  sequences padded to a multiple of 32 tokens with learned rows (`x_pad_token`, `cap_pad_token`; image
  padding at (0, 0, 0)), L the padded caption length. Lumina 2 axes (32, 32, 32), theta 10000; caption
  token i at (i, 0, 0), image patch at (l, r, c), l the caption's length (its mask's count); no padding
  rows, a batch of unequal captions masked.
* order: Z-Image runs the image through the 2 modulated `noise_refiner` blocks, then the caption through
  the 2 unmodulated `context_refiner` blocks, then [image, caption] through the `layers`; Lumina 2 the
  caption's refiner first (its padding masked), then the image's, then [caption, image].
* out: (1 + `final_layer.adaLN_modulation.1`(SiLU(temb))) scales LayerNorm(x) (no affine, eps 1e-6), then
  `final_layer.linear`; the image tokens are kept. Lumina 2's release holds an unused `norm_final`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, held, layer_norm, merge_heads, mlp2, rms_norm_with, rope, timestep_embedding, wshape
from .flux import Proj, rope_table

SEQ_MULTIPLE = 32  # Z-Image pads both sequences to a multiple of this many tokens
NORM_EPS = 1e-5
PATCH = 2


@dataclass(frozen=True)
class Family:
    name: str
    axes: tuple[int, ...]
    theta: float
    time_scale: float
    mod_silu: bool  # the blocks' modulation reads SiLU(temb) (Lumina 2), not temb (Z-Image)
    padded: bool  # Z-Image's learned pad rows and its positions; else Lumina 2's


FAMILIES = {
    "z_image": Family("z_image", (32, 48, 48), 256.0, 1000.0, mod_silu=False, padded=True),
    "lumina2": Family("lumina2", (32, 32, 32), 10000.0, 1.0, mod_silu=True, padded=False),
}


@dataclass
class Block:
    mod: object | None  # the modulation Linear; None in the caption's refiner
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


def _padded(n: int) -> int:
    return n + (-n) % SEQ_MULTIPLE


def _grid(ids: torch.Tensor, h: int, w: int) -> None:
    """Write patch rows and columns into axes 1 and 2 of ids [..., h·w, 3]."""
    grid = ids.view(*ids.shape[:-2], h, w, 3)
    grid[..., 1] = torch.arange(h)[:, None]
    grid[..., 2] = torch.arange(w)[None, :]


def z_image_positions(h: int, w: int, n_img: int, n_cap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([n_img, 3] image rows, padding included; [n_cap, 3] caption rows) Z-Image positions, float."""
    cap = torch.zeros(n_cap, 3)
    cap[:, 0] = 1 + torch.arange(n_cap)
    img = torch.zeros(n_img, 3)
    img[: h * w, 0] = n_cap + 1
    _grid(img[: h * w], h, w)
    return img, cap


def modulation(blk: Block, tmod, runs=None):
    """apply(i, y): y times the block's i-th factor of (1 + scale, tanh(gate), 1 + scale₂, tanh(gate₂))
    (y itself in an unmodulated refiner). With `runs` (Z-Image Omni: [(start, end, noisy)] covering
    the sequence), `tmod` holds the B noisy time rows then the B clean ones (t = 1), and each run
    takes its side's factors — per token as the Omni forward selects them."""
    if blk.mod is None:
        return lambda i, y: y
    s1, g1, s2, g2 = blk.mod(tmod)[:, None].chunk(4, dim=-1)
    mod = (1 + s1, g1.tanh(), 1 + s2, g2.tanh())
    if runs is None:
        return lambda i, y: y * mod[i]
    b = mod[0].shape[0] // 2
    sides = ([f[:b] for f in mod], [f[b:] for f in mod])  # noisy, clean
    return lambda i, y: torch.cat([y[:, s:e] * sides[0 if noisy else 1][i] for s, e, noisy in runs], 1)


def attention_half(blk: Block, x, pe, apply, keys=None):
    """x plus the block's gated self-attention (`apply` from `modulation`)."""
    a = rms_norm_with(blk.norm1, x, NORM_EPS)
    q, k, v = blk.qkv(apply(0, a))
    hd = wshape(blk.norm_q)[0]
    q, k, v = (u.unflatten(-1, (-1, hd)).transpose(1, 2) for u in (q, k, v))
    q = rope(rms_norm_with(blk.norm_q, q, NORM_EPS).to(v.dtype), pe)
    k = rope(rms_norm_with(blk.norm_k, k, NORM_EPS).to(v.dtype), pe)
    o = F.scaled_dot_product_attention(q, k, v, attn_mask=keys, enable_gqa=k.shape[1] != q.shape[1])
    o = rms_norm_with(blk.norm2, blk.out(merge_heads(o)), NORM_EPS)
    return x + apply(1, o)


def ffn_half(blk: Block, x, apply):
    """x plus the block's gated SwiGLU feed-forward."""
    f = apply(2, rms_norm_with(blk.ffn_norm1, x, NORM_EPS))
    f = rms_norm_with(blk.ffn_norm2, blk.w2(F.silu(blk.w1(f)) * blk.w3(f)), NORM_EPS)
    return x + apply(3, f)


@dataclass
class NextDiT:
    """A bound Z-Image or Lumina 2 transformer: call it with x [B, 16, h, w] (h, w even), t [B] (0–1) and
    cap_feats [B, T, D] (and, for Lumina 2, optionally cap_mask [B, T]: 1 for each caption's tokens, first)."""

    architecture: str
    spec: Family
    x_embedder: object
    time: tuple[object, object]
    cap_norm: object  # the plain holder of cap_embedder.0's weight (a norm its path does not name)
    cap_embedder: object
    noise_refiner: list[Block]
    context_refiner: list[Block]
    layers: list[Block]
    final_mod: object
    final_linear: object
    pads: object | None  # Z-Image: the root module holding x_pad_token and cap_pad_token
    dtype: torch.dtype = torch.float32
    # Z-Image Omni: the SigLIP embedder's norm holder and Linear, and its refiner (engine.denoise.z_image_omni)
    siglip: tuple[object, object] | None = None
    siglip_refiner: list[Block] | None = None
    family = "nextdit"

    @property
    def in_channels(self) -> int:
        return wshape(self.x_embedder)[1] // (PATCH * PATCH)

    @property
    def context_dim(self) -> int:
        return wshape(self.cap_embedder)[1]

    @property
    def omni(self) -> bool:
        return self.siglip is not None

    # Z-Image Omni's own inputs (engine.denoise.random_inputs / input_shapes / inputs call these, as Wan Animate's)
    def random_extra(self, out: dict, g) -> dict:
        if not self.omni:
            return out
        from .z_image_omni import random_omni

        return random_omni(self, out, g)

    def shapes_extra(self, got: dict) -> dict:
        if not self.omni:
            return {}
        from .z_image_omni import omni_shapes

        return omni_shapes(self, got)

    def check_extra(self, got: dict, source: str) -> None:
        if self.omni:
            from .z_image_omni import check_omni

            check_omni(got, source)

    def __call__(self, x, t, cap_feats, cap_mask=None, **omni) -> torch.Tensor:
        if self.omni:  # Z-Image Omni: every call runs its sequence of captions, images and SigLIP grids
            from .z_image_omni import omni_forward

            return omni_forward(self, x, t, cap_feats, **omni)
        dt, f = self.dtype, self.spec
        b, c, height, width = x.shape
        h, w = height // PATCH, width // PATCH
        temb = mlp2(self.time, timestep_embedding(f.time_scale * t.float(), 256).to(dt))
        tmod = F.silu(temb) if f.mod_silu else temb
        patches = x.to(dt).reshape(b, c, h, PATCH, w, PATCH).permute(0, 2, 4, 3, 5, 1).reshape(b, h * w, -1)
        img = self.x_embedder(patches)
        seq, first = (self._z_image if f.padded else self._lumina2)(img, cap_feats, cap_mask, tmod, h, w)
        n = h * w  # the final layer runs on the image rows only (each row is normalised on its own)
        seq = (
            seq[:, first[0] : first[0] + n]
            if len(set(first)) == 1
            else torch.stack([seq[i, s : s + n] for i, s in enumerate(first)])
        )
        scale = 1 + self.final_mod(F.silu(temb))[:, None]
        out = self.final_linear(layer_norm(seq) * scale)
        return out.reshape(b, h, w, PATCH, PATCH, -1).permute(0, 5, 1, 3, 2, 4).reshape(b, -1, height, width)

    def _caption(self, cap_feats, embedder=None):
        """RMSNorm (a plain holder's scale) then Linear: the caption embedder, or another such pair."""
        norm, linear = embedder or (self.cap_norm, self.cap_embedder)
        weight = held(norm, "weight", cap_feats.device).to(cap_feats.device, self.dtype)
        return linear(F.rms_norm(cap_feats.to(self.dtype), (cap_feats.shape[-1],), weight, NORM_EPS))

    def _z_image(self, img, cap_feats, cap_mask, tmod, h, w):
        """(the sequence after the layers, each item's first image row): [image, caption], each padded.
        Captions of several lengths (`cap_mask`) are each padded to their own multiple of 32, as the
        release pads each caption of its list; the batch's shorter sequences are then masked."""
        if cap_mask is not None and not bool(cap_mask.all()):
            return self._z_image_items(img, cap_feats, cap_mask, tmod, h, w)
        f, n = self.spec, h * w
        n_img, n_cap = _padded(n), _padded(cap_feats.shape[1])
        ipos, cpos = z_image_positions(h, w, n_img, n_cap)
        pe_img, pe_cap = (rope_table(p.to(img.device)[None], f.axes, f.theta) for p in (ipos, cpos))
        img = self._pad(img, "x_pad_token", n_img)
        for blk in self.noise_refiner:
            img = self._block(blk, img, pe_img, tmod)
        cap = self._pad(self._caption(cap_feats), "cap_pad_token", n_cap)
        for blk in self.context_refiner:
            cap = self._block(blk, cap, pe_cap, None)
        seq, pe = torch.cat([img, cap], 1), torch.cat([pe_img, pe_cap], 2)
        for blk in self.layers:
            seq = self._block(blk, seq, pe, tmod)
        return seq, [0] * img.shape[0]

    def _z_image_items(self, img, cap_feats, cap_mask, tmod, h, w):
        """`_z_image` for a batch whose captions differ in length: item i's caption is its first l_i rows
        and pad rows up to L_i (l_i rounded up to 32), its image rows sit at frame L_i + 1."""
        f, (b, n, d), dev = self.spec, img.shape, img.device
        lens = [int(m) for m in cap_mask.sum(1).round()]
        padded = [_padded(m) for m in lens]
        n_img, longest = _padded(n), max(padded)
        ipos = torch.stack([z_image_positions(h, w, n_img, p)[0] for p in padded])  # image at frame L_i + 1
        cpos = z_image_positions(h, w, n_img, longest)[1].expand(
            b, -1, -1
        )  # caption row j at 1 + j, every item
        img = self._pad(img, "x_pad_token", n_img)
        pe_img = rope_table(ipos.to(dev), f.axes, f.theta)
        for blk in self.noise_refiner:
            img = self._block(blk, img, pe_img, tmod)
        cap, rows = self._caption(cap_feats), img.new_zeros(b, longest, d)
        token = held(self.pads, "cap_pad_token", dev).to(dev, rows.dtype)
        for i, (m, p) in enumerate(zip(lens, padded, strict=True)):
            rows[i, :m], rows[i, m:p] = cap[i, :m], token
        keep = torch.arange(longest)[None] < torch.tensor(padded)[:, None]  # [B, L]: each caption's rows
        keys = None if len(set(padded)) == 1 else keep.to(dev)[:, None, None]
        pe_cap = rope_table(cpos.to(dev), f.axes, f.theta)
        for blk in self.context_refiner:
            rows = self._block(blk, rows, pe_cap, None, keys)
        seq, pe = torch.cat([img, rows], 1), torch.cat([pe_img, pe_cap], 2)
        keys = (
            None
            if keys is None
            else torch.cat([torch.ones(b, n_img, dtype=torch.bool), keep], 1).to(dev)[:, None, None]
        )
        for blk in self.layers:
            seq = self._block(blk, seq, pe, tmod, keys)
        return seq, [0] * b

    def _lumina2(self, img, cap_feats, cap_mask, tmod, h, w):
        """(the sequence after the layers, each item's first image row): [caption, image], per item."""
        f, (b, n, _), t_len = self.spec, img.shape, cap_feats.shape[1]
        lens = [t_len] * b if cap_mask is None else [int(m) for m in cap_mask.sum(1).round()]
        cap_ids = torch.zeros(b, t_len, 3)
        cap_ids[..., 0] = torch.arange(t_len)
        img_ids = torch.zeros(b, n, 3)
        img_ids[..., 0] = torch.tensor(lens, dtype=torch.float32)[:, None]
        _grid(img_ids, h, w)
        pe_cap, pe_img = (rope_table(p.to(img.device), f.axes, f.theta) for p in (cap_ids, img_ids))
        masked = min(lens) < t_len
        keys = cap_mask.to(img.device).bool()[:, None, None] if masked else None
        cap = self._caption(cap_feats)
        for blk in self.context_refiner:
            cap = self._block(blk, cap, pe_cap, None, keys)
        for blk in self.noise_refiner:
            img = self._block(blk, img, pe_img, tmod)
        if len(set(lens)) == 1:  # one length: no padding in the joint sequence, no mask
            m = lens[0]
            seq, pe, keys = torch.cat([cap[:, :m], img], 1), torch.cat([pe_cap[:, :, :m], pe_img], 2), None
        else:
            longest = max(lens) + n
            seq = img.new_zeros(b, longest, img.shape[-1])
            ids, keep = torch.zeros(b, longest, 3), torch.zeros(b, longest, dtype=torch.bool)
            for i, m in enumerate(lens):
                seq[i, :m], seq[i, m : m + n] = cap[i, :m], img[i]
                ids[i, :m], ids[i, m : m + n], keep[i, : m + n] = cap_ids[i, :m], img_ids[i], True
            pe, keys = rope_table(ids.to(img.device), f.axes, f.theta), keep.to(img.device)[:, None, None]
        for blk in self.layers:
            seq = self._block(blk, seq, pe, tmod, keys)
        return seq, lens

    def _pad(self, rows: torch.Tensor, name: str, to: int) -> torch.Tensor:
        if rows.shape[1] == to:
            return rows
        token = held(self.pads, name, rows.device).to(rows.device, rows.dtype)
        return torch.cat([rows, token.expand(rows.shape[0], to - rows.shape[1], -1)], 1)

    def _modulation(self, blk: Block, tmod, runs=None):
        return modulation(blk, tmod, runs)

    def _block(self, blk: Block, x, pe, tmod, keys=None, runs=None):
        apply = modulation(blk, tmod, runs)
        return ffn_half(blk, attention_half(blk, x, pe, apply, keys), apply)

    def op_order(self) -> list:
        image, caption = self.noise_refiner, self.context_refiner
        first, then = (
            (image, caption) if self.spec.padded else (caption, image)
        )  # Z-Image's order, Lumina 2's
        order = [*self.time, self.x_embedder]
        if not self.spec.padded:
            order.append(self.cap_embedder)
        for blk in first:
            order += blk.ops()
        if self.spec.padded:
            order.append(self.cap_embedder)
        for blk in then:
            order += blk.ops()
        if self.omni:  # the SigLIP grids' embedder and refiner run between the refiners and the layers
            order.append(self.siglip[1])
            for blk in self.siglip_refiner:
                order += blk.ops()
        for blk in self.layers:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


# each role of a block's layers, by path below the block: the original naming, then diffusers' (Z-Image's
# `attention.*`, Lumina 2's `attn.*`, `norm1.*`, `feed_forward.linear_*`)
_ROLES = {
    "mod": ("adaLN_modulation.0", "adaLN_modulation.1", "norm1.linear"),
    "norm1": ("attention_norm1", "norm1.norm", "norm1"),
    "norm_q": ("attention.q_norm", "attention.norm_q", "attn.norm_q"),
    "norm_k": ("attention.k_norm", "attention.norm_k", "attn.norm_k"),
    "out": ("attention.out", "attention.to_out.0", "attn.to_out.0"),
    "norm2": ("attention_norm2", "norm2"),
    "ffn_norm1": ("ffn_norm1",),
    "w1": ("feed_forward.w1", "feed_forward.linear_1"),
    "w3": ("feed_forward.w3", "feed_forward.linear_3"),
    "w2": ("feed_forward.w2", "feed_forward.linear_2"),
    "ffn_norm2": ("ffn_norm2",),
}
# the model's own layers: original, Z-Image diffusers, Lumina 2 diffusers
_TOP = {
    "x_embedder": ("x_embedder", "all_x_embedder.2-1"),
    "time_1": ("t_embedder.mlp.0", "time_caption_embed.timestep_embedder.linear_1"),
    "time_2": ("t_embedder.mlp.2", "time_caption_embed.timestep_embedder.linear_2"),
    "cap_norm": ("cap_embedder.0", "time_caption_embed.caption_embedder.0"),
    "cap_embedder": ("cap_embedder.1", "time_caption_embed.caption_embedder.1"),
    "final_mod": (
        "final_layer.adaLN_modulation.1",
        "all_final_layer.2-1.adaLN_modulation.1",
        "norm_out.linear_1",
    ),
    "final_linear": ("final_layer.linear", "all_final_layer.2-1.linear", "norm_out.linear_2"),
}


def _first(paths, where, prefix: str = "") -> str:
    """The first of `paths` (below `prefix`) that `where` holds; the first one when none is (its absence
    is then said by whoever reads it)."""
    for p in paths:
        if f"{prefix}{p}" in where:
            return f"{prefix}{p}"
    return f"{prefix}{paths[0]}"


def bind_nextdit(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, NextDiT]:
    """(naming, the forward) of a Z-Image or Lumina 2 transformer in the original or diffusers' naming;
    `mods`: the component's modules by path (the plain holders of the caption norm and pad tokens)."""
    spec = FAMILIES[architecture]
    naming = "original" if "t_embedder.mlp.0" in mods and "x_embedder" in mods else "diffusers"
    cap_norm = mods.get(_first(_TOP["cap_norm"], mods))
    if cap_norm is None or getattr(cap_norm, "weight", None) is None:
        raise UnsupportedModel(
            f"{ops.what}: no caption norm ({_TOP['cap_norm'][0]}) — not a NextDiT transformer"
        )
    ops.take(cap_norm)
    root = mods.get("")
    if spec.padded:
        if root is None or not all(hasattr(root, n) for n in ("x_pad_token", "cap_pad_token")):
            raise UnsupportedModel(f"{ops.what}: no x_pad_token / cap_pad_token — not a Z-Image transformer")
        ops.take(root)
    if "norm_final" in mods:
        ops.take(mods["norm_final"])  # Lumina-Image 2.0's release holds it; its forward never reads it
    top = {role: _first(paths, ops) for role, paths in _TOP.items()}
    dim = wshape(ops[top["x_embedder"]])[0]

    def block(p: str, modulated: bool) -> Block:
        r = {role: _first(paths, ops, f"{p}.") for role, paths in _ROLES.items()}
        if f"{p}.attention.qkv" in ops:
            kv = (wshape(ops[f"{p}.attention.qkv"])[0] - dim) // 2
            qkv = Proj(ops[f"{p}.attention.qkv"], (dim, kv, kv))
        else:
            a = "attention" if f"{p}.attention.to_q" in ops else "attn"
            qkv = Proj(None, parts=tuple(ops[f"{p}.{a}.to_{n}"] for n in "qkv"))
        hd = wshape(ops[r["norm_q"]])[0]
        if dim % hd or sum(spec.axes) != hd:
            raise UnsupportedModel(
                f"{ops.what}: heads {hd} wide in a width of {dim}: {architecture}'s rotary axes {spec.axes} "
                f"need {sum(spec.axes)}"
            )
        return Block(ops[r["mod"]] if modulated else None, ops[r["norm1"]], qkv, ops[r["norm_q"]], ops[r["norm_k"]],
                     ops[r["out"]], ops[r["norm2"]], ops[r["ffn_norm1"]], ops[r["w1"]], ops[r["w3"]], ops[r["w2"]],
                     ops[r["ffn_norm2"]])  # fmt: skip

    def blocks(name: str, modulated: bool) -> list[Block]:
        return [block(f"{name}.{i}", modulated) for i in ops.children(name)]

    siglip = siglip_refiner = None
    if spec.padded and "siglip_embedder.1" in ops:  # Z-Image Omni: SigLIP2 grids of the input images
        norm = mods.get("siglip_embedder.0")
        if norm is None or getattr(norm, "weight", None) is None or not hasattr(root, "siglip_pad_token"):
            raise UnsupportedModel(
                f"{ops.what}: a SigLIP embedder without its norm or pad token — not Z-Image Omni"
            )
        ops.take(norm)
        siglip, siglip_refiner = (norm, ops["siglip_embedder.1"]), blocks("siglip_refiner", False)
    model = NextDiT(
        architecture, spec, ops[top["x_embedder"]], (ops[top["time_1"]], ops[top["time_2"]]), cap_norm,
        ops[top["cap_embedder"]], blocks("noise_refiner", True), blocks("context_refiner", False),
        blocks("layers", True), ops[top["final_mod"]], ops[top["final_linear"]], root if spec.padded else None,
        dtype, siglip, siglip_refiner,
    )  # fmt: skip
    return naming, model
