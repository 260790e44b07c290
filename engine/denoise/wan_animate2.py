"""Wan-Animate-2's transformer: Wan 2.1 I2V 14B's network (engine.denoise.wan) whose self-attention also attends to a
driving video's keys and values, in context; run on the component's own castable ops in the release's naming (a
diffusers-named file renamed onto it).

Architecture facts, from diffusers' `transformer_wan_animate_2.py` (WanAnimate2Transformer3DModel, its attention
processor, `create_mask`) and its modular pipeline (`modular_pipelines/wan_animate_2/denoise.py`: what the two calls
are given); the release's naming from `convert_wan_animate_2_transformer_to_diffusers`. Written from that
description, nothing copied:

* The release wraps each Wan block in an in-context module: `blocks.N.block.self_attn.q`; diffusers drops the wrapper
  and names the attentions' projections `to_q` / `to_k` / `to_v` / `to_out.0` / `add_k_proj` / `add_v_proj` /
  `norm_added_k`, keeping the original's names for the rest (`ffn.0`, `norm3`, `modulation`, `head.head`, `img_emb`).
* Two passes share the blocks. The reference pass runs the driving video's latents (`driving_video_latents`, 16
  channels, and `driving_video_condition`, a 4-channel mask and the driving latents, concatenated into the 36 input
  channels) through the blocks at timestep 1, with its own prompt (`prompt_ref_embeds`) and CLIP image
  (`condition_clip_context`), its RoPE positions offset by `refer_offset_*` = (1, 0, the grid's width) with time
  stride `refer_stride` = 1 (the config's defaults: the file holds neither), and keeps each block's self-attention
  keys (after norm_k) and values. A denoising step runs the generation latents (`hidden_states` and
  `condition_latents`, the reference image slot then F − 1 frames) at `timestep`; in its self-attention every
  generation frame f attends to every generation token and, for f ≥ 1, to the reference frame f − 1's cached keys
  (rotated by the reference's positions) and values (the BlockMask of `create_mask`, over a geometry of F − 1
  reference frames of the generation's size: the pipeline's segments, which this forward requires).
* The rest is Wan's: timestep embedding, umT5 text padded to 512 tokens, MLPProj of the CLIP states, modulated
  blocks, head.

Here both passes are one forward (`step` gets all the inputs): its first call runs the reference tokens beside the
generation tokens through each block — each op called once, over both streams' tokens — and keeps the rotated
reference keys and values of every block; later calls with the same reference tensors (the later steps of one
`loadout step` run) read them and run the generation tokens alone. So a run's first step pays for the extraction
(`first_step_s`), the median `s_per_step` of three steps or more does not. The masked attention is one SDPA call per
generation frame, over [generation keys ; that frame's reference keys] (the mask is frame-block structured).
diffusers' unconditional branch of classifier-free guidance skips block 9 (`is_uncondtion`, its spelling: an optional
input, [B] of 0 / 1); here the block still runs over every token (its ops keep their order, the reference stream needs
it) and the flagged samples' generation tokens leave it as they came.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, Taken, held, layer_norm_with, timestep_embedding, wshape
from .wan import EPS, FREQ_DIM, IMG_EPS, TEXT_LEN, THETA, Wan, _ln, _modulation, _rope, bind_wan

REFER_OFFSETS = (1, 0, -1)  # diffusers' refer_offset_t / _h / _w defaults; -1: the reference grid's size
REFER_STRIDE = 1
FRAMES = 2  # random inputs: the reference image slot and one generated frame; the driving video's one frame
CLIP_TOKENS = 257
UNCOND_SKIP = 9  # the block diffusers' forward skips on the unconditional branch
INPUTS = ("hidden_states", "timestep", "encoder_hidden_states", "condition_latents", "driving_video_latents",
          "driving_video_condition", "prompt_ref_embeds")  # fmt: skip
IMAGE_INPUTS = ("encoder_hidden_states_image", "condition_clip_context")
# diffusers' attention names -> the release's (convert_wan_animate_2_transformer_to_diffusers, read backwards)
_ATTN = {"to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "o", "add_k_proj": "k_img", "add_v_proj": "v_img",
         "norm_added_k": "norm_k_img"}  # fmt: skip


def rope_angles_at(f: int, h: int, w: int, d: int, device, start=(0, 0, 0), stride: int = 1) -> torch.Tensor:
    """[f·h·w, d/2] rotation angles (float64) of a grid whose frame, row and column positions start at `start`,
    frames `stride` apart (Wan's split of a head's pairs over the three axes)."""
    c = d // 2
    axes = []
    for n, count, s0, step in zip(
        (f, h, w), (c - 2 * (c // 3), c // 3, c // 3), start, (stride, 1, 1), strict=True
    ):
        share = 2 * count
        freqs = 1.0 / THETA ** (torch.arange(0, share, 2, dtype=torch.float64, device=device) / share)
        pos = s0 + step * torch.arange(n, dtype=torch.float64, device=device)
        axes.append(pos[:, None] * freqs[None])
    ft, fh, fw = axes
    grid = torch.cat([ft[:, None, None].expand(f, h, w, -1), fh[None, :, None].expand(f, h, w, -1),
                      fw[None, None, :].expand(f, h, w, -1)], dim=-1)  # fmt: skip
    return grid.reshape(f * h * w, c)


def _cos_sin(ang: torch.Tensor):
    return ang.cos().float()[None, :, None], ang.sin().float()[None, :, None]


def _in_context(q, k, v, kr, vr, hw: int) -> torch.Tensor:
    """Generation frame 0 attends to the generation tokens; frame f ≥ 1 to them and the reference frame f − 1
    ([B, H, L, D] each; the reference's kr / vr [B, H, (F − 1)·hw, D]): one SDPA call per frame, the reference
    frame's rows written into the tail of one key / value buffer."""
    n, frames = k.shape[2], q.shape[2] // hw
    out = [F.scaled_dot_product_attention(q[:, :, :hw], k, v)]
    kb, vb = torch.cat([k, kr[:, :, :hw]], dim=2), torch.cat([v, vr[:, :, :hw]], dim=2)
    for f in range(1, frames):
        if f > 1:
            kb[:, :, n:] = kr[:, :, (f - 1) * hw : f * hw]
            vb[:, :, n:] = vr[:, :, (f - 1) * hw : f * hw]
        out.append(F.scaled_dot_product_attention(q[:, :, f * hw : (f + 1) * hw], kb, vb))
    return torch.cat(out, dim=2)


@dataclass
class WanAnimate2(Wan):
    """A bound Wan-Animate-2 transformer: diffusers' argument names for a denoising step and the reference pass."""

    family = "wan_animate2"
    # (the reference tensors, each block's rotated reference keys and values [B, H, L, D]) of the last extraction
    cache: tuple | None = field(default=None, repr=False, compare=False)

    def __call__(self, hidden_states, timestep, encoder_hidden_states, condition_latents, driving_video_latents,
                 driving_video_condition, prompt_ref_embeds, encoder_hidden_states_image=None,
                 condition_clip_context=None, is_uncondtion=None) -> torch.Tensor:  # fmt: skip
        refs = (driving_video_latents, driving_video_condition, prompt_ref_embeds, condition_clip_context)
        fresh = self.cache is None or any(a is not b for a, b in zip(self.cache[0], refs, strict=True))
        kv = None if fresh else self.cache[1]
        dt = self.dtype
        x = torch.cat([hidden_states, condition_latents], dim=1).to(dt)
        b, _, f, _, _ = x.shape
        texts, images, times = [encoder_hidden_states], [encoder_hidden_states_image], [timestep.float()]
        if kv is None:  # the reference pass beside this step: its frames after the generation's, one patching
            x = torch.cat(
                [x, torch.cat([driving_video_latents, driving_video_condition], dim=1).to(dt)], dim=2
            )
            texts.append(prompt_ref_embeds)
            images.append(condition_clip_context)
            times.append(torch.ones_like(times[0]))  # the reference pass's fixed timestep
        h = self.patch_embedding(x)
        del x
        _, dim, _, hh, ww = h.shape
        tokens = h.flatten(2).transpose(1, 2)
        del h
        xs = (
            list(tokens.split([f * hh * ww, tokens.shape[1] - f * hh * ww], dim=1))
            if kv is None
            else [tokens]
        )
        e = self.time_embedding[1](
            F.silu(self.time_embedding[0](timestep_embedding(torch.cat(times), FREQ_DIM).to(dt)))
        )
        e0 = self.time_projection(F.silu(e)).float().unflatten(1, (6, dim))
        ctx = torch.cat([F.pad(c, (0, 0, 0, TEXT_LEN - c.shape[1])) for c in texts]).to(dt)
        ctx = self.text_embedding[1](F.gelu(self.text_embedding[0](ctx), approximate="tanh")).split(b)
        img = [None] * len(xs)
        if self.img_emb is not None:
            norm1, lin1, lin2, norm2 = self.img_emb
            feats = layer_norm_with(norm1, torch.cat(images).to(dt), IMG_EPS)
            img = layer_norm_with(norm2, lin2(F.gelu(lin1(feats))), IMG_EPS).split(b)
        d = dim // self.heads
        rope = _cos_sin(rope_angles_at(f, hh, ww, d, tokens.device))
        grid = (f - 1, hh, ww)  # the reference's
        start = tuple(grid[i] if o < 0 else o for i, o in enumerate(REFER_OFFSETS))
        rope_ref = _cos_sin(rope_angles_at(*grid, d, tokens.device, start, REFER_STRIDE))
        del tokens
        new_kv = [] if kv is None else None
        for i, blk in enumerate(self.blocks):
            out = self._block2(
                blk, xs, e0.split(b), ctx, img, rope, rope_ref, kv[i] if kv else new_kv, hh * ww
            )
            if i == UNCOND_SKIP and is_uncondtion is not None:  # the unconditional samples skip the block
                out[0] = torch.where(is_uncondtion.to(out[0].device).bool()[:, None, None], xs[0], out[0])
            xs = out
        if new_kv is not None:
            self.cache = (refs, new_kv)
        x = xs[0]
        mod = held(self.head_modulation, _modulation(self.head_modulation), x.device).to(
            x.device, torch.float32
        )
        shift, scale = (mod + e[:b].float()[:, None]).chunk(2, dim=1)
        out = self.head((_ln(x) * (1 + scale) + shift).to(dt))
        out = out.reshape(b, f, hh, ww, 1, 2, 2, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(b, -1, f, hh * 2, ww * 2)

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], t.shape[1], self.heads, -1)

    def _block2(self, blk, xs, e0s, ctx, img, rope, rope_ref, kv, hw: int) -> list:
        """One block over the generation tokens and, in an extraction, the reference tokens after them: every op
        called once over both; `kv` the block's cached reference (keys, values), or the list this pass fills."""
        dt = self.dtype
        mod = held(blk.modulation, _modulation(blk.modulation), xs[0].device).to(xs[0].device, torch.float32)
        es = [(mod + e0).chunk(6, dim=1) for e0 in e0s]
        lens = [x.shape[1] for x in xs]
        h = torch.cat([(_ln(x) * (1 + e[1]) + e[0]).to(dt) for x, e in zip(xs, es, strict=True)], dim=1)
        a = blk.self_attn
        q, k, v = (t.split(lens, dim=1) for t in (a.norm_q(a.q(h)), a.norm_k(a.k(h)), a.v(h)))
        del h
        outs = []
        if isinstance(kv, list):  # the reference tokens: dense self-attention, their keys and values kept
            qr, kr = _rope(self._heads(q[1]), *rope_ref), _rope(self._heads(k[1]), *rope_ref)
            kr, vr = kr.transpose(1, 2), self._heads(v[1]).transpose(1, 2).to(qr.dtype)
            kv.append((kr, vr))
            outs.append(F.scaled_dot_product_attention(qr.transpose(1, 2), kr, vr))
            kr, vr = kv[-1]
        else:
            kr, vr = kv
        qg, kg = _rope(self._heads(q[0]), *rope), _rope(self._heads(k[0]), *rope)
        vg = self._heads(v[0]).transpose(1, 2).to(qg.dtype)
        outs.insert(0, _in_context(qg.transpose(1, 2), kg.transpose(1, 2), vg, kr, vr, hw))
        del q, k, v, qg, kg, vg
        y = a.o(torch.cat([o.transpose(1, 2).flatten(2) for o in outs], dim=1)).split(lens, dim=1)
        xs = [(x.float() + t.float() * e[2]).to(dt) for x, t, e in zip(xs, y, es, strict=True)]
        c = blk.cross_attn
        n = layer_norm_with(blk.norm3, torch.cat(xs, dim=1), EPS)
        q = self._heads(c.norm_q(c.q(n))).split(lens, dim=1)
        both = torch.cat(ctx[: len(xs)], dim=1)
        k = self._heads(c.norm_k(c.k(both))).split(TEXT_LEN, dim=1)
        v = self._heads(c.v(both)).split(TEXT_LEN, dim=1)
        ki = vi = None
        if c.k_img is not None:
            pics = torch.cat(img[: len(xs)], dim=1)
            ki = self._heads(c.norm_k_img(c.k_img(pics))).split(img[0].shape[1], dim=1)
            vi = self._heads(c.v_img(pics)).split(img[0].shape[1], dim=1)
        outs = []
        for j in range(len(xs)):
            qj = q[j].transpose(1, 2)
            o = F.scaled_dot_product_attention(
                qj, k[j].transpose(1, 2).to(qj.dtype), v[j].transpose(1, 2).to(qj.dtype)
            )
            if ki is not None:  # the CLIP image tokens' own attention, added
                o = o + F.scaled_dot_product_attention(qj, ki[j].transpose(1, 2).to(qj.dtype),
                                                       vi[j].transpose(1, 2).to(qj.dtype))  # fmt: skip
            outs.append(o.transpose(1, 2).flatten(2))
        y = c.o(torch.cat(outs, dim=1)).split(lens, dim=1)
        xs = [x + t for x, t in zip(xs, y, strict=True)]
        h = torch.cat([(_ln(x) * (1 + e[4]) + e[3]).to(dt) for x, e in zip(xs, es, strict=True)], dim=1)
        y = blk.ffn_out(F.gelu(blk.ffn_in(h), approximate="tanh")).split(lens, dim=1)
        return [(x.float() + t.float() * e[5]).to(dt) for x, t, e in zip(xs, y, es, strict=True)]

    # -- inputs ---------------------------------------------------------------------------------------------
    @property
    def condition_channels(self) -> int:
        return self.in_channels - self.out_channels

    def own_inputs(self) -> tuple[str, ...]:
        return (*INPUTS, *(IMAGE_INPUTS if self.image_dim else ()))

    def random_family(self, h: int, w: int, batch: int, g: torch.Generator) -> dict:
        """A clip of FRAMES latent frames of h × w and the driving video's FRAMES − 1, prompts of 512 tokens."""
        c, cond, f = self.out_channels, self.condition_channels, FRAMES
        out = {
            "hidden_states": torch.randn(batch, c, f, h, w, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "encoder_hidden_states": torch.randn(batch, TEXT_LEN, self.context_dim, generator=g),
            "condition_latents": torch.randn(batch, cond, f, h, w, generator=g),
            "driving_video_latents": torch.randn(batch, c, f - 1, h, w, generator=g),
            "driving_video_condition": torch.randn(batch, cond, f - 1, h, w, generator=g),
            "prompt_ref_embeds": torch.randn(batch, TEXT_LEN, self.context_dim, generator=g),
        }
        if self.image_dim:
            for n in IMAGE_INPUTS:
                out[n] = torch.randn(batch, CLIP_TOKENS, self.image_dim, generator=g)
        return out

    def family_shapes(self, got: dict) -> dict:
        x = got["hidden_states"]
        f, h, w = tuple(x.shape[2:]) if x.dim() == 5 else (None, None, None)
        ref = None if f is None else f - 1
        c, cond = self.out_channels, self.condition_channels
        out = {"hidden_states": (None, c, None, None, None), "timestep": (None,),
               "encoder_hidden_states": (None, None, self.context_dim), "condition_latents": (None, cond, f, h, w),
               "driving_video_latents": (None, c, ref, h, w), "driving_video_condition": (None, cond, ref, h, w),
               "prompt_ref_embeds": (None, None, self.context_dim)}  # fmt: skip
        if self.image_dim:
            for n in IMAGE_INPUTS:
                out[n] = (None, CLIP_TOKENS, self.image_dim)
        if "is_uncondtion" in got:
            out["is_uncondtion"] = (None,)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """The prompts within the 512 tokens diffusers pads them to (a one-frame clip: a driving video of no frames,
        which the shapes refuse)."""
        if "is_uncondtion" in got and not ((got["is_uncondtion"] == 0) | (got["is_uncondtion"] == 1)).all():
            raise FormatError(f"{source}: input is_uncondtion holds values other than 0 and 1")
        for n in ("encoder_hidden_states", "prompt_ref_embeds"):
            if got[n].shape[1] > TEXT_LEN:
                raise FormatError(
                    f"{source}: input {n} has {got[n].shape[1]} tokens; Wan-Animate-2 takes {TEXT_LEN}"
                )


def is_animate2(mods) -> bool:
    """Wan-Animate-2's blocks, in either naming: the release's wrapped ones or diffusers' `self_attn.to_q`."""
    return "blocks.0.block.self_attn.q" in mods or "blocks.0.self_attn.to_q" in mods


def original_path(p: str) -> str:
    """A Wan-Animate-2 module path (either naming) as Wan's original one (`blocks.N.self_attn.q`), which
    engine.denoise.wan binds."""
    parts = p.split(".")
    if parts[0] != "blocks" or len(parts) < 3:
        return p
    if parts[2] == "block":
        return ".".join(parts[:2] + parts[3:])
    if len(parts) >= 4 and parts[2] in ("self_attn", "cross_attn"):
        rest = ".".join(parts[3:])
        return ".".join(parts[:3]) + "." + _ATTN.get(rest, rest)
    return p


def bind_wan_animate2(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, WanAnimate2]:
    """(naming, the forward) of a Wan-Animate-2 file: its paths renamed onto Wan's original ones."""
    from .. import ops as castable

    naming = "original" if "blocks.0.block.self_attn.q" in mods else "diffusers"
    cast = {original_path(p): m for p, m in mods.items() if isinstance(m, castable.Castable)}
    plain = {original_path(p): m for p, m in mods.items() if not isinstance(m, castable.Castable)}
    ops = ops.renamed(cast)
    base = bind_wan(ops, architecture, dtype, Taken(plain, ops))
    if base.vace_blocks:
        raise UnsupportedModel(f"{ops.what}: VACE blocks beside Wan-Animate-2's: no release has both")
    if wshape(base.patch_embedding)[1] <= base.out_channels:
        raise UnsupportedModel(
            f"{ops.what}: a patch embedding with no conditioning channels: not Wan-Animate-2's"
        )
    return naming, WanAnimate2(**{f.name: getattr(base, f.name) for f in fields(Wan)})
