"""HunyuanVideo 1.0's transformer (text-to-video, the latent-concat image-to-video releases and SkyReels),
run on the component's own castable ops, in the file's own naming: Tencent's release names
(`img_attn_qkv`, `img_mod.linear`: the release files, musubi-tuner's), ComfyUI's FLUX-style names
(`img_attn.qkv`, `img_mod.lin`, renamed onto Tencent's) or diffusers' (`transformer_blocks`,
`single_transformer_blocks`, `context_embedder.token_refiner`).

Architecture facts, from Tencent/HunyuanVideo `hyvideo/modules/models.py`, `token_refiner.py`,
`posemb_layers.py` and diffusers' `HunyuanVideoTransformer3DModel` (written from that description, nothing
copied):

* x [B, C, F, H, W] → `img_in.proj`, a Conv3d over (1, 2, 2) patches → tokens in (frame, row, column)
  order. C: 16 (t2v), 33 (i2v: latent, image latent, mask), 32 (SkyReels).
* vec = time_in(emb(t)) + vector_in(text_states_2) [+ guidance_in(emb(guidance))], emb the 256-wide
  sinusoidal embedding (cosines first) of t itself (0–1000, the scheduler's timestep) and of the guidance
  as the pipeline passes it (1000 × the embedded guidance scale); `*_in` Linear, SiLU, Linear.
* The token refiner (`txt_in`): c = t_embedder(emb(t)) + c_embedder(mean of text_states over its mask);
  txt = input_embedder(text_states); then 2 blocks of txt += gate₁·proj(attn(norm1(txt))),
  txt += gate₂·fc2(SiLU(fc1(norm2(txt)))), (gate₁, gate₂) = adaLN_modulation.1(SiLU(c)); norm1 / norm2
  LayerNorms with their affine weights (eps 1e-6); no QK-norm and no RoPE there; a padded text token
  attends to nothing outside the prompt, and every token attends to the first.
* Double block (FLUX.1's: per stream Modulation → shift, scale, gate × 2; affine-free LayerNorm eps 1e-6;
  per-head RMSNorm of q and k, eps 1e-6; tanh-GELU MLP 4× wide) with the joint sequence in the order
  [img, txt] and RoPE on the image tokens only. Single block: linear1 → (q, k, v, mlp), linear2 of
  (attn, GELU(mlp)), over [img, txt], RoPE again on the image part.
* Attention: 128-wide heads (24 in the 13B release), every query attends to the image tokens and the
  prompt's text tokens (text_mask: the padding after them is left out).
* RoPE: three axes (frame, row, column) of widths (16, 56, 56), theta 256, on interleaved pairs (FLUX.1's
  layout).
* Final: (shift, scale) = final_layer.adaLN_modulation.1(SiLU(vec)) (diffusers' `norm_out.linear` holds
  them as scale, shift); final_layer.linear((1 + scale)·LN(x) + shift); each token's outputs are
  (channel, frame, row, column) of its patch.

The token-replace image-to-video release (HunyuanVideo-I2V's second version, diffusers' `image_condition_type=
"token_replace"`) shares the t2v layout key for key, so the file cannot say which it is: the input
`guiding_frame_index` asks for it (ComfyUI's name for it; 0, the first latent frame, the clean image's, as both
pipelines pass it). Then the first frame's image tokens are modulated by vec₀ = time_in(emb(0)) + vector_in(
text_states_2) (no guidance term) in every double block's image stream and every single block, and by vec
everywhere else (the text stream, the other frames, the final layer) — diffusers'
`HunyuanVideoTokenReplaceTransformerBlock` / `...SingleTransformerBlock`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .common import (
    layer_norm,
    layer_norm_with,
    merge_heads,
    mlp2,
    rms_norm_with,
    rope,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import Proj, Single, Stream, rope_table  # FLUX.1's streams and single blocks, as HunyuanVideo's

AXES = (16, 56, 56)
THETA = 256.0
EPS = 1e-6
PATCH = (1, 2, 2)


@dataclass
class Refiner:
    """One block of the token refiner."""

    norm1: object
    qkv: Proj
    proj: object
    norm2: object
    fc1: object
    fc2: object
    ada: object

    def ops(self) -> list:
        return [self.ada, self.norm1, *self.qkv.ops(), self.proj, self.norm2, self.fc1, self.fc2]


@dataclass
class HunyuanVideo:
    """A bound HunyuanVideo transformer: call it with the original forward's inputs (x, t, text_states,
    text_states_2 [, guidance] [, text_mask])."""

    architecture: str
    img_in: object
    time_in: tuple[object, object]
    guidance_in: tuple[object, object] | None
    vector_in: tuple[object, object] | None
    txt_proj: object
    txt_t: tuple[object, object]
    txt_c: tuple[object, object]
    refiner: list[Refiner]
    doubles: list[tuple[Stream, Stream]]
    singles: list[Single]
    final_mod: object
    final_swapped: bool
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "hunyuan_video"
    patch = PATCH

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_proj)[1]

    @property
    def vec_dim(self) -> int:
        return wshape(self.vector_in[0])[1] if self.vector_in is not None else 0

    def __call__(
        self, x, t, text_states, text_states_2, guidance=None, text_mask=None, guiding_frame_index=None
    ) -> torch.Tensor:
        dt = self.dtype
        img, pe = self._patches(x)
        b = x.shape[0]
        if guiding_frame_index is not None:  # token replace: the time embedder once over t and the frame's 0
            t_emb = mlp2(
                self.time_in, timestep_embedding(torch.cat([t.float(), t.new_zeros(b).float()]), 256).to(dt)
            )
            vec, vec0 = t_emb[:b], t_emb[b:]
        else:
            vec = mlp2(self.time_in, timestep_embedding(t.float(), 256).to(dt))
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError("this HunyuanVideo takes a `guidance` input (1000 × the guidance scale)")
            vec = vec + mlp2(self.guidance_in, timestep_embedding(guidance.float(), 256).to(dt))
        if self.vector_in is not None:
            pooled = mlp2(self.vector_in, text_states_2.to(dt))
            vec = vec + pooled
            if guiding_frame_index is not None:
                vec0 = vec0 + pooled
        mask = _mask(text_mask)
        txt = self._refine(text_states, t, mask)
        first = None
        if guiding_frame_index is not None:  # the first latent frame's tokens: (h / 2)·(w / 2)
            first = ((x.shape[3] // self.patch[1]) * (x.shape[4] // self.patch[2]), vec0)
        return self._run(x.shape, img, txt, mask, vec, pe, first=first)

    def _patches(self, x):
        """The image tokens ([B, F·h·w / patch, D], (frame, row, column) order) and their RoPE table."""
        b, _, f, h, w = x.shape
        pf, ph, pw = self.patch
        img = self.img_in(x.to(self.dtype)).flatten(2).transpose(1, 2)
        return img, rope_table(_positions(f // pf, h // ph, w // pw, x.device).expand(b, -1, -1), AXES, THETA)

    def _run(self, shape, img, txt, mask, vec, pe, keep: int | None = None, first=None) -> torch.Tensor:
        """The blocks over [img, txt] (`mask` [B, T] the text tokens every query attends to, None for all),
        the final layer on the last `keep` image tokens (all by default: FramePack's history comes first), and the
        patches back into the latent's shape. `first`: (n, vec₀), the first n image tokens modulated by vec₀
        (token replace)."""
        b = shape[0]
        n_img = img.shape[1]
        keys = None
        if mask is not None:  # the image tokens and the prompt's own text tokens
            keys = torch.cat([torch.ones(b, n_img, dtype=torch.bool, device=mask.device), mask], dim=1)
            keys = keys[:, None, None, :]
        vs = F.silu(vec)
        if first is not None:  # [vec; vec₀]: each image modulation computed once for both
            first = (first[0], torch.cat([vs, F.silu(first[1])]))
        for img_s, txt_s in self.doubles:
            img, txt = self._double(img_s, txt_s, img, txt, vs, pe, keys, first)
        seq = torch.cat([img, txt], dim=1)
        del img, txt
        for blk in self.singles:
            seq = self._single(blk, seq, n_img, vs, pe, keys, first)
        img = seq[:, n_img - (keep or n_img) : n_img]
        shift, scale = self.final_mod(vs).chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        return self._unpatch(
            self.final_linear((1 + scale[:, None]) * layer_norm(img) + shift[:, None]), shape
        )

    def _unpatch(self, out: torch.Tensor, shape) -> torch.Tensor:
        """[B, tokens, (c, pf, ph, pw)] -> [B, C, F, H, W]."""
        b, _, f, h, w = shape
        pf, ph, pw = self.patch
        c = out.shape[-1] // (pf * ph * pw)
        out = out.reshape(b, f // pf, h // ph, w // pw, c, pf, ph, pw)
        return out.permute(0, 4, 1, 5, 2, 6, 3, 7).reshape(b, c, f, h, w)

    # -- the token refiner ----------------------------------------------------------------------------

    def _refine(self, text_states, t, mask):
        dt = self.dtype
        s = text_states.to(dt)
        if mask is None:
            pooled = s.mean(dim=1)
        else:
            m = mask.to(s.dtype)[..., None]
            pooled = (s * m).sum(dim=1) / m.sum(dim=1)
        c = mlp2(self.txt_t, timestep_embedding(t.float(), 256).to(dt)) + mlp2(self.txt_c, pooled)
        txt = self.txt_proj(s)
        attn_mask = None if mask is None else self._refiner_mask(mask)
        cs = F.silu(c)
        for blk in self.refiner:
            g1, g2 = blk.ada(cs)[:, None].chunk(2, dim=-1)
            q, k, v = (split_heads(p, self.heads) for p in blk.qkv(layer_norm_with(blk.norm1, txt, EPS)))
            a = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask))
            txt = txt + g1 * blk.proj(a)
            txt = txt + g2 * blk.fc2(F.silu(blk.fc1(layer_norm_with(blk.norm2, txt, EPS))))
        return txt

    @staticmethod
    def _refiner_mask(mask: torch.Tensor) -> torch.Tensor:
        """Token i sees token j when both are the prompt's; every token sees the first (the original's guard
        against a padded row that sees nothing)."""
        attn_mask = (mask[:, :, None] & mask[:, None, :])[:, None]
        attn_mask[..., 0] = True
        return attn_mask

    # -- the blocks -----------------------------------------------------------------------------------

    def _qkv(self, qkv: Proj, q_norm, k_norm, x):
        q, k, v = (split_heads(p, self.heads) for p in qkv(x)[:3])
        return rms_norm_with(q_norm, q, EPS).to(v.dtype), rms_norm_with(k_norm, k, EPS).to(v.dtype), v

    def _double(self, i: Stream, s: Stream, img, txt, vs, pe, keys, first=None):
        im, fm = _mods(i.mod, vs, first, 6)
        tm = s.mod(vs)[:, None].chunk(6, dim=-1)
        iq, ik, iv = self._qkv(i.qkv, i.q_norm, i.k_norm, _modulate(layer_norm(img), im, fm))
        tq, tk, tv = self._qkv(s.qkv, s.q_norm, s.k_norm, (1 + tm[1]) * layer_norm(txt) + tm[0])
        q = torch.cat([rope(iq, pe), tq], dim=2)
        k = torch.cat([rope(ik, pe), tk], dim=2)
        a = merge_heads(F.scaled_dot_product_attention(q, k, torch.cat([iv, tv], dim=2), attn_mask=keys))
        n = img.shape[1]
        return _after(i, img, a[:, :n], im, fm), _after(s, txt, a[:, n:], tm)

    def _single(self, blk: Single, seq, n_img: int, vs, pe, keys, first=None):
        m, fm = _mods(blk.mod, vs, first, 3)
        gate = m[2]
        q, k, v, mlp = blk.linear1(_modulate(layer_norm(seq), m, fm))
        q, k, v = (split_heads(p, self.heads) for p in (q, k, v))
        q, k = rms_norm_with(blk.q_norm, q, EPS).to(v.dtype), rms_norm_with(blk.k_norm, k, EPS).to(v.dtype)
        q = torch.cat([rope(q[:, :, :n_img], pe), q[:, :, n_img:]], dim=2)
        k = torch.cat([rope(k[:, :, :n_img], pe), k[:, :, n_img:]], dim=2)
        a = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=keys))
        out = blk.linear2(torch.cat([a, F.gelu(mlp, approximate="tanh")], dim=2))
        return seq + gate * out if fm is None else _gated(seq, out, m, fm, 2)

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, *(self.guidance_in or ()), *(self.vector_in or ()), *self.txt_t,
                 *self.txt_c, self.txt_proj]  # fmt: skip
        for blk in self.refiner:
            order += blk.ops()
        for i, s in self.doubles:
            order += [i.mod, s.mod, *i.ops_before_attention(), *s.ops_before_attention(),
                      i.proj, i.mlp_in, i.mlp_out, s.proj, s.mlp_in, s.mlp_out]  # fmt: skip
        for blk in self.singles:
            order += blk.ops()
        return [*order, self.final_mod, self.final_linear]


def _after(s: Stream, x, attn, m, fm=None):
    if fm is None:
        x = x + m[2] * s.proj(attn)
        y = s.mlp_in((1 + m[4]) * layer_norm(x) + m[3])
        return x + m[5] * s.mlp_out(F.gelu(y, approximate="tanh"))
    x = _gated(x, s.proj(attn), m, fm, 2)
    y = s.mlp_in(_modulate(layer_norm(x), m, fm, 4, 3))
    return _gated(x, s.mlp_out(F.gelu(y, approximate="tanh")), m, fm, 5)


# Token replace (HunyuanVideo-I2V's second version): the first n image tokens take vec₀'s modulation. `fm` is
# (n, its chunks) or None; every modulation op still runs once (over [vec; vec₀]), so the read-ahead order holds.


def _mods(mod, vs, first, parts: int):
    """(vec's chunks, None) or, with `first` (n, [vec; vec₀]), (vec's chunks, (n, vec₀'s chunks))."""
    if first is None:
        return mod(vs)[:, None].chunk(parts, dim=-1), None
    n, both = first
    b = vs.shape[0]
    m = mod(both)[:, None].chunk(parts, dim=-1)
    return tuple(c[:b] for c in m), (n, tuple(c[b:] for c in m))


def _modulate(h, m, fm, scale: int = 1, shift: int = 0):
    """(1 + scale)·h + shift, the first fm[0] tokens by vec₀'s chunks."""
    if fm is None:
        return (1 + m[scale]) * h + m[shift]
    n, f = fm
    return torch.cat([(1 + f[scale]) * h[:, :n] + f[shift], (1 + m[scale]) * h[:, n:] + m[shift]], dim=1)


def _gated(x, y, m, fm, gate: int):
    """x + gate·y, the first fm[0] tokens by vec₀'s gate."""
    n, f = fm
    return torch.cat([x[:, :n] + f[gate] * y[:, :n], x[:, n:] + m[gate] * y[:, n:]], dim=1)


def _mask(mask) -> torch.Tensor | None:
    """A [B, T] 0/1 mask as booleans, or None where every token counts."""
    return None if mask is None or bool(mask.all()) else mask.bool()


def _positions(f: int, h: int, w: int, device) -> torch.Tensor:
    """[1, f·h·w, 3] (frame, row, column) of each image token, in the patch convolution's order."""
    grid = torch.meshgrid(
        *(torch.arange(n, device=device, dtype=torch.float32) for n in (f, h, w)), indexing="ij"
    )
    return torch.stack(grid, dim=-1).reshape(1, f * h * w, 3)
