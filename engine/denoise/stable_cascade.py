"""Stable Cascade's (Würstchen v3's) UNets — Stage C, the prior, and Stage B, the decoder, full and lite — run on the
component's own castable ops, in the file's own naming: the release's (Stability's `stage_c.safetensors`,
`stage_b.safetensors` and their lite files: each attention a torch MultiheadAttention, `attention.attn.in_proj_weight`
and `out_proj`; Stage B's pooled-CLIP mapper `clip_mapper`) or diffusers' (`attention.to_q` / `to_k` / `to_v` /
`to_out.0`, `clip_txt_pooled_mapper`: what `convert_stable_cascade_unet_single_file_to_diffusers` renames).

Architecture facts, from Stability-AI/StableCascade `modules/stage_c.py`, `stage_b.py` and `common.py` (MIT) as
diffusers' `StableCascadeUNet` describes them (nothing copied):

* r (the noise ratio, 0–1) → 64-wide sinusoid of r · 10000 (sin first, log(10000) / (half − 1) frequency steps),
  followed by one such embedding of 0 for each extra time condition (Stage C: sca and crp, Stage B: sca).
* Conditions, LayerNormed (affine-free, eps 1e-6) as tokens: Stage C [clip_txt_mapper(clip_text),
  clip_txt_pooled_mapper(clip_text_pooled) as 4 tokens, clip_img_mapper(clip_img) as 4 tokens]; Stage B
  clip_mapper(clip) as 4 tokens.
* x → pixel-unshuffle (Stage B: 2, Stage C: 1) → `embedding.1` (1×1) → channel LayerNorm; Stage B adds
  `effnet_mapper`(effnet resized bilinearly to x, corners aligned) and the resized `pixels_mapper`(pixels; zeros of
  8×8 when none is given): two 1×1 convolutions around an exact GELU, then a channel LayerNorm.
* Levels (Stage C: two of 2048 / lite 1536, Stage B: four of 320 / 640 / 1280 / 1280, lite 320 / 576 / 1152 / 1152):
  down, each level after the first starts with a channel LayerNorm and a 2×2 stride-2 convolution (Stage C: a 1×1
  convolution, no resampling: `blocks.0`); its blocks run (its repeat mappers' count + 1) times, a 1×1 repeat mapper
  between the passes. Up, the deepest first, the same, the first ResBlock of each pass given the down path's output
  of its level as a skip (x resized to it when the sizes differ), then a channel LayerNorm and a 2×2 stride-2
  transposed convolution (Stage C: `blocks.1`, 1×1). Then `clf`: a channel LayerNorm, a 1×1 convolution,
  pixel-shuffle.
* ResBlock: x + channelwise(LN(depthwise 3×3(x)) [, skip]), channelwise = Linear(c (+ skip) → 4c), GELU,
  GlobalResponseNorm (x · γ · ‖x‖₂,HW / (mean_c ‖x‖₂,HW + 1e-6) + β + x), Linear(4c → c), over channels last.
  TimestepBlock: x · (1 + a) + b, (a, b) the sum of `mapper`(r's embedding) and each `mapper_<cond>`(its own).
  AttnBlock: x + attention(LN(x), [LN(x) tokens, kv_mapper.1(SiLU(conditions))]), 64-wide heads with biases.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, held, held_shape, wshape

HEAD = (
    64  # every release's head width (2048 / 32, 1536 / 24, 1280 / 20, 1152 / 18, 576 / 9): not in the weights
)
PATCH = {"stable_cascade_c": 1, "stable_cascade_b": 2}  # pixel-unshuffle (stage_c.py / stage_b.py's defaults)
T_CONDS = ("sca", "crp")  # the extra time conditions, in the original's order
EPS = 1e-6
PRIOR_PX = 42.67  # px per Stage C latent pixel (StableCascadePriorPipeline's resolution_multiple)
DECODER_SCALE = (
    10.67  # Stage B latent pixels per Stage C one (StableCascadeDecoderPipeline's latent_dim_scale)
)
CLIP_TOKENS = 77  # CLIP ViT-bigG's prompt states


def channel_norm(x: torch.Tensor) -> torch.Tensor:
    """The original's LayerNorm2d: an affine-free LayerNorm over the channel axis of [B, C, h, w]."""
    return F.layer_norm(x.permute(0, 2, 3, 1), (x.shape[1],), eps=EPS).permute(0, 3, 1, 2)


def r_embedding(r: torch.Tensor, dim: int, max_positions: float = 10000.0) -> torch.Tensor:
    """[B] noise ratios -> [B, dim] float32: sin(r·10000·f_i) then cos, f_i = exp(-i · log(10000) / (half - 1))."""
    half = dim // 2
    r = r.float() * max_positions
    freqs = torch.exp(-math.log(max_positions) / (half - 1) * torch.arange(half, device=r.device).float())
    args = r[:, None] * freqs[None]
    return F.pad(torch.cat([args.sin(), args.cos()], 1), (0, dim % 2))


def _plain(holder, attr: str, x: torch.Tensor) -> torch.Tensor:
    """A plain holder's tensor for computing with x. One mapped from the file (a disk-tier module on the CPU) may sit
    at any offset, and the CPU's GEMM rounds an unaligned matrix differently from an aligned one: such a one is
    copied, so a partial run gives the full run's bits."""
    t = held(holder, attr, x.device).to(x.device, x.dtype)
    return t.clone() if t.data_ptr() % 64 else t


@dataclass
class Res:
    depthwise: object
    fc1: object
    grn: object  # the plain holder of GlobalResponseNorm's gamma and beta
    fc2: object

    def __call__(self, x, skip=None):
        dt = x.dtype
        h = channel_norm(self.depthwise(x))
        if skip is not None:
            h = torch.cat([h, skip], 1)
        h = F.gelu(self.fc1(h.permute(0, 2, 3, 1)))
        g = held(self.grn, "gamma", h.device).to(h.device, dt)
        b = held(self.grn, "beta", h.device).to(h.device, dt)
        agg = torch.linalg.vector_norm(h, dim=(1, 2), keepdim=True)
        h = g * (h * (agg / (agg.mean(dim=-1, keepdim=True) + EPS))) + b + h
        return self.fc2(h).permute(0, 3, 1, 2) + x

    def ops(self) -> list:
        return [self.depthwise, self.fc1, self.fc2]


@dataclass
class Time:
    mappers: list  # `mapper`, then `mapper_<cond>` of each extra condition

    def __call__(self, x, r_embeds):
        a = b = 0
        for m, e in zip(self.mappers, r_embeds, strict=True):
            ai, bi = m(e.to(x.dtype))[:, :, None, None].chunk(2, dim=1)
            a, b = a + ai, b + bi
        return x * (1 + a) + b

    def ops(self) -> list:
        return list(self.mappers)


@dataclass
class Attn:
    kv_mapper: object
    qkv: object | None  # the release's plain holder of in_proj_weight / in_proj_bias
    split: tuple | None  # diffusers' to_q, to_k, to_v
    out: object

    def __call__(self, x, cond):
        b, c, h, w = x.shape
        kv = self.kv_mapper(F.silu(cond))
        q_in = channel_norm(x).flatten(2).transpose(1, 2)
        kv = torch.cat([q_in, kv], 1)
        if self.qkv is not None:
            weight, bias = _plain(self.qkv, "in_proj_weight", x), _plain(self.qkv, "in_proj_bias", x)
            wq, wk, wv = weight.chunk(3)
            bq, bk, bv = bias.chunk(3)
            q, k, v = F.linear(q_in, wq, bq), F.linear(kv, wk, bk), F.linear(kv, wv, bv)
        else:
            q, k, v = self.split[0](q_in), self.split[1](kv), self.split[2](kv)
        heads = c // HEAD
        q, k, v = (t.reshape(b, -1, heads, HEAD).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, c)
        return x + self.out(o).transpose(1, 2).reshape(b, c, h, w)

    def ops(self) -> list:
        return [self.kv_mapper, *(self.split or ()), self.out]


@dataclass
class Level:
    blocks: list  # Res / Time / Attn in call order
    repeats: list  # the 1×1 repeat mappers between the passes
    down: object | None  # the convolution that enters this level (None: the first)
    up: object | None  # the convolution that leaves it upwards (None: the first)


@dataclass
class StableCascade:
    """A bound Stage C (call it with x, r, clip_text, clip_text_pooled, clip_img) or Stage B (x, r, effnet, clip [,
    pixels]) UNet."""

    architecture: str
    embedding: object
    conds: dict  # name -> the mapper of that condition (Stage C: clip_text / clip_text_pooled / clip_img; B: clip)
    effnet: tuple | None  # Stage B's effnet_mapper.0 / .2
    pixels: tuple | None  # Stage B's pixels_mapper.0 / .2
    down: list  # Level per depth
    up: list  # Level per depth, the deepest first
    clf: object
    c_cond: int
    clip_seq: int
    r_dim: int
    n_conds: int  # extra time conditions (Stage C 2, Stage B 1)
    resample: bool  # Stage B's 2×2 strided (transposed) convolutions; Stage C's 1×1 mappings keep the size
    dtype: torch.dtype = torch.float32
    family = "stable_cascade"

    @property
    def patch(self) -> int:
        return PATCH[self.architecture]

    @property
    def in_channels(self) -> int:
        return wshape(self.embedding)[1] // self.patch**2

    @property
    def inputs(self) -> tuple[str, ...]:
        """The original forwards' arguments (StageC.forward(x, r, clip_text, clip_text_pooled, clip_img), StageB.forward(x,
        r, effnet, clip)), required first; Stage B's pixels are optional (zeros of 8×8, as its sampling passes)."""
        return ("x", "r", *self.conds) if self.effnet is None else ("x", "r", "effnet", "clip")

    def shapes(self, got) -> dict:
        out = {"x": (None, self.in_channels, None, None), "r": (None,)}
        out.update({n: (None, None, wshape(m)[1]) for n, m in self.conds.items()})
        if self.effnet is not None:
            out["effnet"] = (None, wshape(self.effnet[0])[1], None, None)
            if "pixels" in got:
                out["pixels"] = (None, wshape(self.pixels[0])[1], None, None)
        return out

    def random_inputs(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """Seeded inputs at `width` × `height` px: Stage C's latent ceil(px / 42.67) a side (StableCascadePriorPipeline's
        resolution_multiple), Stage B's int(that · 10.67) (StableCascadeDecoderPipeline's latent_dim_scale; made even for
        its 2×2 pixel-unshuffle) with Stage C's output as its effnet; 77 CLIP tokens, one pooled and one image embedding."""
        hc, wc = math.ceil(height / PRIOR_PX), math.ceil(width / PRIOR_PX)
        out = {"r": torch.rand(batch, generator=g)}
        if self.effnet is None:
            out["x"] = torch.randn(batch, self.in_channels, hc, wc, generator=g)
        else:
            h, w = (int(n * DECODER_SCALE) // 2 * 2 for n in (hc, wc))
            out["x"] = torch.randn(batch, self.in_channels, max(h, 2), max(w, 2), generator=g)
            out["effnet"] = torch.randn(batch, wshape(self.effnet[0])[1], hc, wc, generator=g)
        for n, m in self.conds.items():
            out[n] = torch.randn(batch, CLIP_TOKENS if n == "clip_text" else 1, wshape(m)[1], generator=g)
        return out

    def _conditions(self, b: int, **given) -> torch.Tensor:
        toks = []
        for name, m in self.conds.items():
            t = given[name].to(self.dtype)
            if name == "clip_text":
                toks.append(m(t))
            else:  # a pooled or image embedding: clip_seq tokens each
                toks.append(m(t).reshape(b, t.shape[1] * self.clip_seq, -1))
        c = torch.cat(toks, 1)
        return F.layer_norm(c, (c.shape[-1],), eps=EPS)

    def __call__(self, x, r, clip_text=None, clip_text_pooled=None, clip_img=None, effnet=None, clip=None,
                 pixels=None) -> torch.Tensor:  # fmt: skip
        dt, b = self.dtype, x.shape[0]
        given = dict(clip_text=clip_text, clip_text_pooled=clip_text_pooled, clip_img=clip_img, clip=clip)
        zero = r_embedding(torch.zeros_like(r), self.r_dim).to(x.device)
        r_embeds = [r_embedding(r, self.r_dim).to(x.device), *[zero] * self.n_conds]
        cond = self._conditions(b, **given)
        h = channel_norm(self.embedding(F.pixel_unshuffle(x.to(dt), self.patch)))
        if self.effnet is not None:
            e = F.interpolate(effnet.to(dt), size=h.shape[-2:], mode="bilinear", align_corners=True)
            h = h + channel_norm(self.effnet[1](F.gelu(self.effnet[0](e))))
            p = pixels.to(dt) if pixels is not None else h.new_zeros(b, wshape(self.pixels[0])[1], 8, 8)
            p = channel_norm(self.pixels[1](F.gelu(self.pixels[0](p))))
            h = h + F.interpolate(p, size=h.shape[-2:], mode="bilinear", align_corners=True)
        outs = []
        for lv in self.down:
            if lv.down is not None:
                h = channel_norm(h)
                h = lv.down(h)
            h = self._passes(lv, h, r_embeds, cond, None)
            outs.insert(0, h)
        h = outs[0]
        for i, lv in enumerate(self.up):
            h = self._passes(lv, h, r_embeds, cond, outs[i] if i > 0 else None)
            if lv.up is not None:
                h = channel_norm(h)
                h = _conv_t(lv.up, h) if self.resample else lv.up(h)
        out = self.clf(channel_norm(h))
        return F.pixel_shuffle(out, self.patch)

    def _passes(self, lv: Level, h, r_embeds, cond, skip):
        for j in range(len(lv.repeats) + 1):
            for k, blk in enumerate(lv.blocks):
                if isinstance(blk, Res):
                    s = skip if k == 0 else None
                    if s is not None and h.shape[-2:] != s.shape[-2:]:
                        h = F.interpolate(h.float(), s.shape[-2:], mode="bilinear", align_corners=True).to(
                            h.dtype
                        )
                    h = blk(h, s)
                elif isinstance(blk, Time):
                    h = blk(h, r_embeds)
                else:
                    h = blk(h, cond)
            if j < len(lv.repeats):
                h = lv.repeats[j](h)
        return h

    def op_order(self) -> list:
        order = list(self.conds.values()) + [self.embedding]
        order += [*(self.effnet or ()), *(self.pixels or ())]
        for lv in self.down:
            order += [lv.down] if lv.down is not None else []
            order += _level_ops(lv)
        for lv in self.up:
            order += _level_ops(lv)
            order += [lv.up] if hasattr(lv.up, "cast_params") else []
        return [*order, self.clf]


def _level_ops(lv: Level) -> list:
    """A level's ops in its first pass's call order, then its repeat mappers: each op once, as the streamer plans
    (a later pass over the same blocks reads them again on demand)."""
    out = []
    for blk in lv.blocks:
        out += blk.ops()
    return out + lv.repeats


def _conv_t(op, x: torch.Tensor) -> torch.Tensor:
    """Stage B's 2×2 stride-2 transposed convolution (weight [in, out, 2, 2]): where in = out the module tree types it as
    a convolution (its cast, patched and streamed weight); elsewhere its bias [out] fits no layer, so it is a plain
    holder, read as it is."""
    if not hasattr(op, "cast_params"):
        return F.conv_transpose2d(x, _plain(op, "weight", x), _plain(op, "bias", x), stride=2)
    if op.compute_dtype is not None and x.dtype != op.compute_dtype:
        x = x.to(op.compute_dtype)
    w, bias = op.cast_params(x)
    return F.conv_transpose2d(x, w, bias, stride=2)


# -- binding the file's ops -----------------------------------------------------------------------------


def bind_stable_cascade(
    ops: Ops, mods: dict, architecture: str, dtype: torch.dtype
) -> tuple[str, StableCascade]:
    """(naming, the forward) of a Stage C or Stage B UNet in the release's or diffusers' naming."""
    if architecture not in PATCH:
        raise UnsupportedModel(f"{ops.what}: {architecture} is not a Stable Cascade stage Loadout steps")
    embedding = ops["embedding.1"]
    if architecture == "stable_cascade_c":
        mappers = {
            "clip_text": "clip_txt_mapper",
            "clip_text_pooled": "clip_txt_pooled_mapper",
            "clip_img": "clip_img_mapper",
        }
        conds = {n: ops[p] for n, p in mappers.items()}
        c_cond = wshape(conds["clip_text"])[0]
    else:
        pooled = "clip_mapper" if "clip_mapper" in ops else "clip_txt_pooled_mapper"
        conds = {"clip": ops[pooled]}
        c_cond = _first_kv(ops)
    pooled_rows = wshape(conds["clip_text_pooled" if "clip_text_pooled" in conds else "clip"])[0]
    if c_cond is None or pooled_rows % c_cond:
        raise UnsupportedModel(
            f"{ops.what}: a pooled-CLIP mapper of {pooled_rows} rows — not Stable Cascade's"
        )
    attn_release = any(p.endswith(".attention.attn.out_proj") for p in ops.by_path)
    down = [
        _level(ops, mods, f"down_blocks.{i}", f"down_repeat_mappers.{i}", attn_release)
        for i in ops.children("down_blocks")
    ]
    up = [
        _level(ops, mods, f"up_blocks.{i}", f"up_repeat_mappers.{i}", attn_release)
        for i in ops.children("up_blocks")
    ]
    if not down or len(down) != len(up):
        raise UnsupportedModel(
            f"{ops.what}: {len(down)} down and {len(up)} up levels — not a Stable Cascade UNet"
        )
    resample = architecture == "stable_cascade_b"
    for i, lv in enumerate(down[1:], 1):
        lv.down = ops[f"down_downscalers.{i}.1"] if resample else ops[f"down_downscalers.{i}.1.blocks.0"]
        lv.down.stride = (2, 2) if resample else lv.down.stride
    for i, lv in enumerate(up[:-1]):
        if resample and not hasattr(
            mods.get(f"up_upscalers.{i}.1"), "cast_params"
        ):  # in ≠ out: a plain holder
            lv.up = mods.get(f"up_upscalers.{i}.1")
            if (
                lv.up is None
                or getattr(lv.up, "weight", None) is None
                or len(held_shape(lv.up, "weight")) != 4
            ):
                raise UnsupportedModel(f"{ops.what}: no up_upscalers.{i}.1 transposed convolution")
            ops.take(lv.up)
        else:
            lv.up = ops[f"up_upscalers.{i}.1"] if resample else ops[f"up_upscalers.{i}.1.blocks.1"]
    time = next((b for lv in down for b in lv.blocks if isinstance(b, Time)), None)
    if time is None:
        raise UnsupportedModel(f"{ops.what}: no timestep blocks — not a Stable Cascade UNet")
    model = StableCascade(
        architecture, embedding, conds,
        (ops["effnet_mapper.0"], ops["effnet_mapper.2"]) if resample else None,
        (ops["pixels_mapper.0"], ops["pixels_mapper.2"]) if resample else None,
        down, up, ops["clf.1"], c_cond, pooled_rows // c_cond, wshape(time.mappers[0])[1], len(time.mappers) - 1,
        resample, dtype,
    )  # fmt: skip
    return ("release" if attn_release or "clip_mapper" in ops else "diffusers"), model


def _first_kv(ops: Ops) -> int | None:
    p = next((p for p in ops.by_path if p.endswith(".kv_mapper.1")), None)
    return wshape(ops[p])[1] if p is not None else None


def _level(ops: Ops, mods: dict, prefix: str, repeat_prefix: str, release: bool) -> Level:
    blocks = []
    for j in ops.children(prefix):
        p = f"{prefix}.{j}"
        if f"{p}.depthwise" in ops:
            dw = ops[f"{p}.depthwise"]
            c = wshape(dw)[0]
            dw.groups, dw.padding = c, (wshape(dw)[2] // 2, wshape(dw)[3] // 2)
            grn = mods.get(f"{p}.channelwise.2")
            if grn is None or held_shape(grn, "gamma")[-1] != 4 * c:
                raise UnsupportedModel(
                    f"{ops.what}: {p} has no GlobalResponseNorm of {4 * c} — not Stable Cascade's"
                )
            ops.take(grn)
            blocks.append(Res(dw, ops[f"{p}.channelwise.0"], grn, ops[f"{p}.channelwise.4"]))
        elif f"{p}.mapper" in ops:
            extra = [ops[f"{p}.mapper_{n}"] for n in T_CONDS if f"{p}.mapper_{n}" in ops]
            blocks.append(Time([ops[f"{p}.mapper"], *extra]))
        elif release:
            holder = mods.get(f"{p}.attention.attn")
            if holder is None or getattr(holder, "in_proj_weight", None) is None:
                raise UnsupportedModel(f"{ops.what}: {p} has no attention.attn.in_proj_weight")
            ops.take(holder)
            blocks.append(Attn(ops[f"{p}.kv_mapper.1"], holder, None, ops[f"{p}.attention.attn.out_proj"]))
        else:
            split = tuple(ops[f"{p}.attention.to_{n}"] for n in "qkv")
            blocks.append(Attn(ops[f"{p}.kv_mapper.1"], None, split, ops[f"{p}.attention.to_out.0"]))
        if isinstance(blocks[-1], Attn) and wshape(blocks[-1].out)[0] % HEAD:
            raise UnsupportedModel(
                f"{ops.what}: {p}: width {wshape(blocks[-1].out)[0]} is not made of 64-wide heads"
            )
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks under {prefix}")
    return Level(blocks, [ops[f"{repeat_prefix}.{r}"] for r in ops.children(repeat_prefix)], None, None)
