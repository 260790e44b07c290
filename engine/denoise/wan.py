"""The Wan 2.x transformer's forward pass (Wan 2.1 T2V 1.3B / 14B, I2V and FLF2V 14B, VACE 1.3B / 14B, and
the Wan 2.2 A14B experts, which share the network), run on the component's own castable ops in the
original naming.

Architecture facts, from Wan-Video/Wan2.1 `wan/modules/model.py` (WanModel, WanAttentionBlock, Head,
rope_params / rope_apply, sinusoidal_embedding_1d; written from that description, nothing copied):

* x [B, C, F, H, W] latents → `patch_embedding`, a Conv3d with kernel = stride = (1, 2, 2) → tokens
  [B, F·H/2·W/2, dim]; the output is un-patchified back with each token's vector laid out (p_t, p_h,
  p_w, channels).
* e = time_embedding(sin(256, t)) — Linear, SiLU, Linear over the 256-wide sinusoid (cosines first) of
  t in 0–1000; e0 = time_projection(e) — SiLU, Linear to 6·dim — as (shift, scale, gate) × 2, added to
  each block's learned `modulation` [1, 6, dim]; both in float32.
* context = text_embedding(T5 states padded with zeros to 512 tokens) — Linear, tanh-GELU, Linear.
* block: y = self_attn(LN(x)·(1 + scale₁) + shift₁); x += gate₁·y; x += cross_attn(norm3(x), context);
  x += gate₂·ffn(LN(x)·(1 + scale₂) + shift₂) with LN without affine (eps 1e-6), norm3 an affine
  LayerNorm (eps 1e-6), ffn Linear, tanh-GELU, Linear. Attention: q / k / v / o Linears, RMSNorm of q
  and k over the whole width (eps 1e-6), heads of 128; self-attention rotates q and k by 3-axis RoPE:
  each head's d/2 complex pairs split (d/2 − 2⌊d/6⌋, ⌊d/6⌋, ⌊d/6⌋) for frame, row and column, with
  frequencies θ^(−2i/n) (θ = 10000, n = that axis's share of d).
* head: (shift, scale) = head.modulation [1, 2, dim] + e; Linear(LN(x)·(1 + scale) + shift).
* Wan 2.1's image-to-video and first-last-frame models condition on CLIP ViT-H image features too
  (`clip_fea` [B, 257, 1280], FLF2V two images' [B, 514, 1280] plus the learned `img_emb.emb_pos`):
  `img_emb` (MLPProj: LayerNorm, Linear, GELU, Linear, LayerNorm, eps 1e-5) maps them to the width, and
  each cross-attention adds a second attention of the same queries over them, through its own `k_img` /
  `v_img` projections and `norm_k_img` RMSNorm (WanI2VCrossAttention): o(attn(q, k, v) + attn(q, k_img,
  v_img)). Their input channels (36: the latent, a 4-channel mask and the image latent) come in `x`,
  already concatenated, as for Wan 2.2's I2V expert, which differs from its T2V one in them alone.
* VACE (Wan2.1 `wan/modules/vace_model.py`, VaceWanModel / VaceWanAttentionBlock): `vace_context` [B, 96,
  F, h, w] (the control video's latents and masks) through `vace_patch_embedding` (the same patching),
  zero-padded to the main tokens, runs through the `vace_blocks` — Wan blocks with their own modulation,
  the first adding `before_proj(c)` to the main tokens as they leave the patch embedding — before the
  main blocks; each VACE block's `after_proj(c)` is a hint added (× the context scale, default 1) after main
  block `vace_layers[i]`. The file does not say which main blocks those are: the releases spread them
  evenly (1.3B: every 2nd of 30, 14B: every 5th of 40 — the configs' `vace_layers`; ComfyUI spreads
  `num_layers // vace blocks` apart too).

* ChronoEdit (nv-tlabs; diffusers `transformer_chronoedit.py`, ChronoEditTransformer3DModel) is Wan 2.1 I2V
  14B's network and file; its RoPE alone differs: a clip of two latent frames (the input image and the
  edit, no temporal-reasoning frames) places the second at frame position `rope_temporal_skip_len` − 1 (8 − 1),
  an optional input here (Wan's positions 0 … F − 1 without it, which ChronoEdit's are for F ≠ 2).
* SkyReels-V2 and AnyFlow condition the time differently: engine.denoise.wan_variants, on this forward.

diffusers' WanTransformer3DModel is the same network (its tests here compare the two on the same
weights through diffusers' own single-file converter).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, held, held_shape, layer_norm_with, timestep_embedding, wshape

TEXT_LEN = 512
FREQ_DIM = 256
IMG_EPS = 1e-5  # MLPProj's LayerNorms: torch's default eps
CLIP_TOKENS = 257  # CLIP ViT-H/14's tokens for one image (256 patches and the class token)
THETA = 10000.0
EPS = 1e-6
HEAD_DIM = 128


def _ln(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x.float(), (x.shape[-1],), eps=EPS)


def rope_angles(f: int, h: int, w: int, d: int, device, skip: int | None = None) -> torch.Tensor:
    """[f·h·w, d/2] rotation angles (float64) for a grid of f frames of h × w patches; `skip`: ChronoEdit's
    temporal skip, which places a two-frame clip's second frame at position skip − 1."""
    c = d // 2
    parts = (c - 2 * (c // 3), c // 3, c // 3)
    axes = []
    for n, count in zip((f, h, w), parts, strict=True):
        share = 2 * count
        freqs = 1.0 / THETA ** (torch.arange(0, share, 2, dtype=torch.float64, device=device) / share)
        pos = torch.arange(n, dtype=torch.float64, device=device)
        if skip is not None and not axes and f == 2:  # the frame axis comes first
            pos = torch.tensor([0.0, skip - 1.0], dtype=torch.float64, device=device)
        axes.append(pos[:, None] * freqs[None])
    ft, fh, fw = axes
    grid = torch.cat(
        [
            ft[:, None, None].expand(f, h, w, -1),
            fh[None, :, None].expand(f, h, w, -1),
            fw[None, None, :].expand(f, h, w, -1),
        ],
        dim=-1,
    )
    return grid.reshape(f * h * w, c)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each consecutive pair (x₀, x₁) of [B, L, n, d] by the token's angle."""
    xf = x.float().reshape(*x.shape[:-1], -1, 2)
    a, b = xf[..., 0], xf[..., 1]
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return out.reshape(x.shape).type_as(x)


def embed_time(pair, t: torch.Tensor, dt) -> torch.Tensor:
    """Linear, SiLU, Linear over the 256-wide sinusoid of t ([B] or [B, F], flattened): [B·F, dim]."""
    return pair[1](F.silu(pair[0](timestep_embedding(t.float().flatten(), FREQ_DIM).to(dt))))


def per_frame(t: torch.Tensor, e: torch.Tensor, e0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(e, e0) of a flattened [B, F] t laid out per frame: [B, F, dim] and [B, 6, F, dim]; as they are for t [B]."""
    if t.dim() != 2:
        return e, e0
    return e.unflatten(0, t.shape), e0.unflatten(0, t.shape).transpose(1, 2)


def modulation(table: torch.Tensor, e: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
    """The n modulations of a learned table [1, n, dim] plus e: [B, n, dim] gives n × [B, 1, dim], per frame
    [B, n, F, dim] gives n × [B, F, dim]. A table ggml's writer stored as [n, dim] is read as [1, n, dim]."""
    table = table.reshape(1, n, -1)
    if e.dim() == 3:
        return (table + e).chunk(n, dim=1)
    return tuple(c.squeeze(1) for c in (table[:, :, None] + e).chunk(n, dim=1))


def _frames(x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [B, L, dim] and m [B, F, dim] so that they broadcast frame by frame (F = 1: as they are)."""
    if m.shape[1] == 1:
        return x, m
    return x.unflatten(1, (m.shape[1], -1)), m[:, :, None]


def modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    xv, sc = _frames(x, scale)
    return (xv * (1 + sc) + _frames(x, shift)[1]).reshape(x.shape)


def gated(x: torch.Tensor, y: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x + y · gate in float32 (a per-frame gate over each frame's tokens)."""
    yv, g = _frames(y.float(), gate)
    return x.float() + (yv * g).reshape(x.shape)


@dataclass
class Attn:
    q: object
    k: object
    v: object
    o: object
    norm_q: object
    norm_k: object
    k_img: object = None  # Wan 2.1 I2V / FLF2V cross-attention: keys and values of the image tokens
    v_img: object = None
    norm_k_img: object = None

    def ops(self) -> list:
        img = [self.k_img, self.norm_k_img, self.v_img] if self.k_img is not None else []
        return [self.q, self.norm_q, self.k, self.norm_k, self.v, *img, self.o]


@dataclass
class Block:
    modulation: object  # the plain module holding `modulation` [1, 6, dim]
    self_attn: Attn
    cross_attn: Attn
    norm3: object
    ffn_in: object
    ffn_out: object

    def ops(self) -> list:
        return [*self.self_attn.ops(), self.norm3, *self.cross_attn.ops(), self.ffn_in, self.ffn_out]


@dataclass
class VaceBlock:
    block: Block
    before_proj: object  # the first VACE block's only
    after_proj: object

    def ops(self) -> list:
        return [
            *([self.before_proj] if self.before_proj is not None else []),
            *self.block.ops(),
            self.after_proj,
        ]


@dataclass
class Wan:
    """A bound Wan 2.x transformer: call it with the original forward's x, t, context (and clip_fea)."""

    architecture: str
    patch_embedding: object
    text_embedding: tuple[object, object]
    time_embedding: tuple[object, object]
    time_projection: object
    blocks: list[Block]
    head: object
    head_modulation: object
    heads: int
    dtype: torch.dtype = torch.float32
    img_emb: tuple | None = None  # Wan 2.1 I2V / FLF2V: MLPProj's LayerNorm, Linear, Linear, LayerNorm
    emb_pos: object = None  # FLF2V: the plain module holding the two images' position embedding
    vace_patch_embedding: object = None  # VACE: the control video's patching, its blocks and their layers
    vace_blocks: tuple[VaceBlock, ...] = ()
    vace_layers: tuple[int, ...] = ()
    family = "wan"

    @property
    def dim(self) -> int:
        return wshape(self.patch_embedding)[0]

    @property
    def in_channels(self) -> int:
        return wshape(self.patch_embedding)[1]

    @property
    def out_channels(self) -> int:
        return wshape(self.head)[0] // 4

    @property
    def context_dim(self) -> int:
        return wshape(self.text_embedding[0])[1]

    @property
    def image_dim(self) -> int | None:
        """The CLIP image features' width (1280), or None for a model without the image branch."""
        return None if self.img_emb is None else wshape(self.img_emb[1])[1]

    @property
    def image_tokens(self) -> int | None:
        """How many image tokens the model takes: fixed by FLF2V's position embedding (two images)."""
        return None if self.emb_pos is None else held_shape(self.emb_pos, _emb_pos(self.emb_pos))[-2]

    @property
    def vace_channels(self) -> int | None:
        return None if self.vace_patch_embedding is None else wshape(self.vace_patch_embedding)[1]

    @property
    def optional_inputs(self) -> tuple[str, ...]:
        """VACE's hint strength [B] (default 1); an image-to-video model's ChronoEdit RoPE skip [B]."""
        vace = ("vace_context_scale",) if self.vace_channels else ()
        return vace + (("rope_temporal_skip_len",) if self.image_dim and type(self) is Wan else ())

    def shapes_extra(self, got: dict) -> dict:
        return {"rope_temporal_skip_len": (None,)} if "rope_temporal_skip_len" in got else {}

    def check_extra(self, got: dict, source: str) -> None:
        skip = got.get("rope_temporal_skip_len")
        if skip is not None and not (
            torch.all(skip == skip[0]) and skip[0] >= 2 and skip[0] == skip[0].round()
        ):
            raise FormatError(
                f"{source}: rope_temporal_skip_len holds {skip.tolist()}; it is one whole number ≥ 2 for the "
                "batch (ChronoEdit's: 8)"
            )

    def __call__(
        self,
        x,
        t,
        context,
        clip_fea=None,
        vace_context=None,
        vace_context_scale=None,
        rope_temporal_skip_len=None,
    ) -> torch.Tensor:
        h = self.patch_embedding(x.to(self.dtype))
        skip = None if rope_temporal_skip_len is None else int(rope_temporal_skip_len.reshape(-1)[0])
        return self.run(h, t, context, clip_fea, vace_context, vace_context_scale, rope_skip=skip)

    def run(
        self,
        h,
        t,
        context,
        clip_fea=None,
        vace_context=None,
        vace_context_scale=None,
        after_block=None,
        time_inputs=None,
        rope_skip=None,
        self_mask=None,
    ) -> torch.Tensor:
        """The forward from the patched latents h [B, dim, F, h, w] on; `after_block(i, x)`, where given,
        returns the tokens that go on after main block i (Wan Animate's face adapter adds to them);
        `time_inputs`: a variant's own time conditions, for its `_time` (engine.denoise.wan_variants);
        `rope_skip`: ChronoEdit's temporal skip (`rope_angles`); `self_mask`: the self-attention's [N, N] mask
        (True: attended; SkyReels-V2's block-causal frames)."""
        dt = self.dtype
        b, dim, f, hh, ww = h.shape
        x = h.flatten(2).transpose(1, 2)
        del h
        e, e0 = self._time(t, dim, **(time_inputs or {}))
        if context.shape[1] < TEXT_LEN:  # the original pads the T5 states to 512 tokens with zeros
            context = F.pad(context, (0, 0, 0, TEXT_LEN - context.shape[1]))
        ctx = self.text_embedding[1](F.gelu(self.text_embedding[0](context.to(dt)), approximate="tanh"))
        img = None
        if self.img_emb is not None:
            feats = clip_fea.to(dt)
            if self.emb_pos is not None:
                feats = feats + held(self.emb_pos, _emb_pos(self.emb_pos), feats.device).to(feats.device, dt)
            norm1, lin1, lin2, norm2 = self.img_emb  # the norms may be typed GroupNorm by the tree
            img = layer_norm_with(norm2, lin2(F.gelu(lin1(layer_norm_with(norm1, feats, IMG_EPS)))), IMG_EPS)
        ang = rope_angles(f, hh, ww, dim // self.heads, x.device, rope_skip)
        cos, sin = ang.cos().float()[None, :, None], ang.sin().float()[None, :, None]
        hints = self._vace_hints(x, vace_context, e0, ctx, cos, sin, img) if self.vace_blocks else {}
        strength = (
            None if vace_context_scale is None else vace_context_scale.to(x.device, x.dtype)[:, None, None]
        )
        for i, blk in enumerate(self.blocks):
            x = self._block(blk, x, e0, ctx, cos, sin, img, self_mask)
            if i in hints:  # × the context scale (1, the original's default, when none is given)
                x = x + (hints.pop(i) if strength is None else hints.pop(i) * strength)
            if after_block is not None:
                x = after_block(i, x)
        mod = held(self.head_modulation, _modulation(self.head_modulation), x.device).to(
            x.device, torch.float32
        )
        shift, scale = modulation(mod, e.float()[:, None], 2)
        out = self.head(modulate(_ln(x), scale, shift).to(dt))
        out = out.reshape(b, f, hh, ww, 1, 2, 2, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(b, -1, f, hh * 2, ww * 2)

    def _time(self, t, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(e, e0): the time embedding and its six modulations, [B, dim] and [B, 6, dim] for t [B], or per
        latent frame, [B, F, dim] and [B, 6, F, dim], for t [B, F] (SkyReels-V2's diffusion forcing)."""
        e = embed_time(self.time_embedding, t, self.dtype)
        return per_frame(t, e, self.time_projection(F.silu(e)).float().unflatten(1, (6, dim)))

    def _vace_hints(self, x, vace_context, e0, ctx, cos, sin, img) -> dict[int, torch.Tensor]:
        """{main block index: the hint added after it}, from the VACE blocks over the control video."""
        c = self.vace_patch_embedding(vace_context.to(self.dtype)).flatten(2).transpose(1, 2)
        if c.shape[1] < x.shape[1]:
            c = F.pad(c, (0, 0, 0, x.shape[1] - c.shape[1]))
        hints = {}
        for layer, vb in zip(self.vace_layers, self.vace_blocks, strict=True):
            if vb.before_proj is not None:
                c = vb.before_proj(c) + x
            c = self._block(vb.block, c, e0, ctx, cos, sin, img)
            hints[layer] = vb.after_proj(c)
        return hints

    def _attn(self, a: Attn, x, kv, cos=None, sin=None, img=None, mask=None) -> torch.Tensor:
        b, n, _ = x.shape
        q = a.norm_q(a.q(x)).reshape(b, n, self.heads, -1)
        k = a.norm_k(a.k(kv)).reshape(b, kv.shape[1], self.heads, -1)
        v = a.v(kv).reshape(b, kv.shape[1], self.heads, -1)
        if cos is not None:
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        q = q.transpose(1, 2)
        o = F.scaled_dot_product_attention(
            q, k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype), attn_mask=mask
        )
        if img is not None and a.k_img is not None:  # the image tokens' own attention, added
            ki = a.norm_k_img(a.k_img(img)).reshape(b, img.shape[1], self.heads, -1)
            vi = a.v_img(img).reshape(b, img.shape[1], self.heads, -1)
            o = o + F.scaled_dot_product_attention(
                q, ki.transpose(1, 2).to(q.dtype), vi.transpose(1, 2).to(q.dtype)
            )
        return a.o(o.transpose(1, 2).reshape(b, n, -1))

    def _block(self, blk: Block, x, e0, ctx, cos, sin, img=None, mask=None) -> torch.Tensor:
        dt = self.dtype
        mod = held(blk.modulation, _modulation(blk.modulation), x.device).to(x.device, torch.float32)
        e = modulation(mod, e0, 6)
        h = modulate(_ln(x), e[1], e[0]).to(dt)
        y = self._attn(blk.self_attn, h, h, cos, sin, mask=mask)
        del h
        x = gated(x, y, e[2]).to(dt)
        # norm3 through layer_norm_with: in a VACE block the module tree types it GroupNorm (its path has
        # no `blocks` segment, which is what tells the tree a block's 1-D norm is a LayerNorm)
        x = x + self._attn(blk.cross_attn, layer_norm_with(blk.norm3, x, EPS), ctx, img=img)
        y = blk.ffn_out(F.gelu(blk.ffn_in(modulate(_ln(x), e[4], e[3]).to(dt)), approximate="tanh"))
        return gated(x, y, e[5]).to(dt)

    def op_order(self, stem: tuple = (), after_block=None) -> list:
        """The ops in call order; `stem`: ops a variant runs between the patch embedding and the time
        embedding, `after_block(i)`: those it runs after main block i (Wan Animate's)."""
        order = [
            self.patch_embedding,
            *stem,
            *self.time_embedding,
            self.time_projection,
            *self.text_embedding,
        ]
        order += list(self.img_emb or ())
        if self.vace_blocks:
            order.append(self.vace_patch_embedding)
            for vb in self.vace_blocks:
                order += vb.ops()
        for i, blk in enumerate(self.blocks):
            order += blk.ops()
            if after_block is not None:
                order += after_block(i)
        return [*order, self.head]


def _emb_pos(module) -> str:
    """Where FLF2V's position embedding of the two images' tokens is held: `emb_pos` (original) or
    diffusers' `pos_embed` (the same [1, 514, 1280] tensor)."""
    return "emb_pos" if getattr(module, "emb_pos", None) is not None else "pos_embed"


def _modulation(module) -> str:
    """Where the learned modulation of a block or the head is held: `modulation` (original) or
    diffusers' `scale_shift_table` (the same [1, 6 | 2, dim] tensor)."""
    return "modulation" if getattr(module, "modulation", None) is not None else "scale_shift_table"


def bind_wan(ops: Ops, architecture: str, dtype: torch.dtype, plain: dict) -> Wan:
    """The forward of a Wan transformer in the original naming; `plain`: the component's plain modules by
    path (each block's and the head's `modulation`, FLF2V's `img_emb` holding `emb_pos`)."""
    img_emb = None
    if "img_emb.proj.1" in ops:  # Wan 2.1 I2V / FLF2V: CLIP image features through MLPProj
        img_emb = tuple(ops[f"img_emb.proj.{i}"] for i in (0, 1, 3, 4))
    pe = ops["patch_embedding"]
    if tuple(wshape(pe)[2:]) != (1, 2, 2):
        raise UnsupportedModel(f"{ops.what}: a patch embedding of {wshape(pe)[2:]}, not Wan's (1, 2, 2)")
    pe.stride = pe.kernel_size  # the file holds the kernel; the stride is the architecture's
    dim = wshape(pe)[0]
    if dim % HEAD_DIM:
        raise UnsupportedModel(f"{ops.what}: width {dim} is not a multiple of Wan's {HEAD_DIM}-wide heads")

    def attn(p: str) -> Attn:
        a = Attn(
            ops[f"{p}.q"], ops[f"{p}.k"], ops[f"{p}.v"], ops[f"{p}.o"], ops[f"{p}.norm_q"], ops[f"{p}.norm_k"]
        )
        if img_emb is not None and p.endswith("cross_attn"):
            a.k_img, a.v_img, a.norm_k_img = ops[f"{p}.k_img"], ops[f"{p}.v_img"], ops[f"{p}.norm_k_img"]
        return a

    def block(p: str) -> Block:
        norm3 = ops[f"{p}.norm3"]
        if p not in plain:
            raise UnsupportedModel(f"{ops.what}: block {p} has no modulation")
        return Block(plain[p], attn(f"{p}.self_attn"), attn(f"{p}.cross_attn"), norm3, ops[f"{p}.ffn.0"],
                     ops[f"{p}.ffn.2"])  # fmt: skip

    blocks = [block(f"blocks.{i}") for i in ops.children("blocks")]
    vace: dict = {}
    if ops.has_prefix("vace_blocks"):
        n = ops.children("vace_blocks")
        if not n or n != list(range(len(n))) or len(blocks) % len(n):
            raise UnsupportedModel(
                f"{ops.what}: {len(n)} VACE blocks over {len(blocks)} blocks: not spread as Wan's VACE releases"
            )
        vace = {
            "vace_patch_embedding": ops["vace_patch_embedding"],
            "vace_blocks": tuple(
                VaceBlock(
                    block(f"vace_blocks.{i}"),
                    ops[f"vace_blocks.{i}.before_proj"] if i == 0 else None,
                    ops[f"vace_blocks.{i}.after_proj"],
                )
                for i in n
            ),  # fmt: skip
            "vace_layers": tuple(range(0, len(blocks), len(blocks) // len(n))),
        }
        vace["vace_patch_embedding"].stride = vace["vace_patch_embedding"].kernel_size
    if "head" not in plain:
        raise UnsupportedModel(f"{ops.what}: no head.modulation")
    return Wan(
        architecture, pe, (ops["text_embedding.0"], ops["text_embedding.2"]),
        (ops["time_embedding.0"], ops["time_embedding.2"]), ops["time_projection.1"], blocks, ops["head.head"],
        plain["head"], dim // HEAD_DIM, dtype, img_emb, plain.get("img_emb"), **vace,
    )  # fmt: skip
