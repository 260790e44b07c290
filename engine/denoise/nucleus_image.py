"""NucleusMoE-Image's transformer forward pass (Nucleus-Image, 2026), run on the component's own castable ops. Its
release (`transformer/` of the Nucleus-Image repository, `NucleusMoEImageTransformer2DModel`) holds diffusers' own
module names, bare or under a prefix detection strips.

Architecture facts, from diffusers' `transformer_nucleusmoe_image.py`, its pipeline (`pipeline_nucleusmoe_image.py`)
and the release's `transformer/config.json` (read for the facts, written from that description, nothing copied):

* Qwen-Image's stem, packing and rotary embedding (engine.denoise.qwen_image): 2×2 patches of the 16-channel
  latent, channels first, through `img_in` [D, 64]; the text's states through `txt_norm` (RMSNorm, eps 1e-6); the
  rotary positions of a single frame centred on its grid, text token i at max(h//2, w//2) + i on all three axes,
  axes (16, 56, 56), theta 10000, interleaved pairs.
* Time, t in 0–1 (the scheduler's timestep / 1000, rounded to the model's dtype first): the D-wide sinusoid of
  1000·t (cosines first) → `time_text_embed.timestep_embedder` (Linear D→4D, SiLU, Linear) → RMSNorm
  (`time_text_embed.norm`, eps 1e-6) = temb.
* Block (single stream: only the image tokens are queries and are updated): (scale, gate, scale₂, gate₂) =
  `img_mod.1`(SiLU(temb)), gates clamped to [−2, 2] then tanh'd. The text keys and values come from the block's own
  `encoder_proj` of the normed text: `attn.add_k_proj` / `add_v_proj` (bias-free), per-head RMSNorm of the keys
  (`norm_added_k`; the file's `norm_added_q` is built but never used), rotated at the text positions. Image:
  n = LN(x) (affine-free, eps 1e-6), `to_q` / `to_k` / `to_v` of n·(1 + scale), per-head RMSNorm of q and k, rotary;
  the queries attend to [image keys, text keys] (grouped-query: each key head serves heads / kv_heads query heads,
  consecutive), the text masked by `encoder_hidden_states_mask`; x += gate·`to_out.0`(out). Then n₂ = LN(x):
  x += gate₂·MLP(n₂·(1 + scale₂)). The MLP of the first dense blocks (3 in the release) is a SwiGLU
  `img_mlp.net.2`(a · SiLU(b)), (a, b) = `img_mlp.net.0.proj` halves; the others' a mixture of experts:
* MoE (`img_mlp`): expert-choice routing. The router `gate` (bias-free) reads [temb, n₂] (the unmodulated norm),
  softmax over the experts in float32 (the release: `use_sigmoid` false), rounded back. Each expert takes its top
  C = max(1, ⌈capacity·S / E⌉) of the item's S image tokens by that score (the release's capacity factors: 4 for
  blocks 3 and 4, 2 after); a token's scores are divided by their sum over the experts that took it (+ 1e-12) and
  times `route_scale` 2.5. Expert e: (g, u) = halves of x·`experts.gate_up_proj`[e] ([E, D, 2I], stored
  input-major), out (SiLU(g)·u)·`experts.down_proj`[e]; each token's result (weighted in float32) is added onto the
  `shared_expert` SwiGLU (as the dense MLP) of every token. No load-balancing term acts in the forward, and every
  expert runs on C tokens of every item at every step: the routing decides which tokens, never which experts.
* Out: (scale, shift) = `norm_out.linear`(SiLU(temb)), `proj_out`(LN(x)·(1 + scale) + shift) → 64 per patch.
* Rounding: the routing orders tokens by their bf16 scores, so a one-ulp difference upstream moves tokens between
  experts (31% apart after 3 MoE blocks in bf16). The norms round as diffusers' RMSNorm (float32, then the weight's
  dtype, then the weight) and the rotary table is diffusers' (float32 angles through torch.polar), not Qwen-Image's
  float64 one: bit for bit with diffusers in bf16 on the CPU.

Inputs (diffusers' NucleusMoEImageTransformer2DModel.forward's names): `hidden_states` [B, h·w, 64] (the pipeline's
packed latent), `timestep` [B] in 0–1, `encoder_hidden_states` [B, T, 4096] (Qwen3-VL states), `img_shapes` [B, 3]
(frame, h, w) — one image size, frame 1; optionally `encoder_hidden_states_mask` [B, T] (1 for each prompt's
tokens). The output is [B, h·w, 64]. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from ..model.experts import PackedExperts
from .common import Ops, held_shape, layer_norm, rope, wshape
from .qwen_image import positions

EPS = 1e-6
AXES = (16, 56, 56)  # the rotary axes (frame, row, column), base 10000: FLUX.1's and Qwen-Image's table
GATE_CLAMP = 2.0
ROUTE_SCALE = 2.5  # the release's route_scale (not in the weights)
# the release's capacity factors by block (transformer/config.json); DEFAULT_CAPACITY for its other MoE blocks
CAPACITY = {3: 4.0, 4: 4.0}
DEFAULT_CAPACITY = 2.0
TOKENS = 256  # a random step's prompt tokens


@dataclass
class MoE:
    gate: object
    experts: object  # engine.model.experts.PackedExperts: `gate_up_proj` [E, D, 2I], `down_proj` [E, I, D]
    shared: tuple[object, object]
    capacity: float

    def ops(self) -> list:
        return [self.gate, self.experts, *self.shared]


@dataclass
class Block:
    mod: object
    encoder_proj: object
    q: object
    k: object
    v: object
    norm_q: object
    norm_k: object
    add_k: object
    add_v: object
    norm_added_k: object
    out: object
    mlp: MoE | tuple[object, object]

    def ops(self) -> list:
        mlp = self.mlp.ops() if isinstance(self.mlp, MoE) else list(self.mlp)
        return [self.mod, self.encoder_proj, self.q, self.k, self.v, self.norm_q, self.norm_k, self.add_k,
                self.add_v, self.norm_added_k, self.out, *mlp]  # fmt: skip


def _swiglu(pair, x: torch.Tensor) -> torch.Tensor:
    """diffusers' FeedForward "swiglu": the projection's first half times SiLU of its second."""
    a, b = pair[0](x).chunk(2, dim=-1)
    return pair[1](a * F.silu(b))


def _moe(moe: MoE, x: torch.Tensor, n: torch.Tensor, temb: torch.Tensor) -> torch.Tensor:
    """Expert-choice routing as diffusers' NucleusMoELayer computes it (module docstring)."""
    b, s, d = x.shape
    logits = moe.gate(torch.cat([temb[:, None].expand(-1, s, -1), n], dim=-1))
    affinity = F.softmax(logits.float(), dim=-1).to(logits.dtype).transpose(1, 2)  # [B, E, S]
    e = affinity.shape[1]
    c = max(1, math.ceil(moe.capacity * s / e))  # at most s: the binder checked capacity <= e
    top = torch.topk(affinity, k=c, dim=-1).indices  # [B, E, C]
    weight = affinity.gather(-1, top)
    rows = (
        (top + torch.arange(b, device=x.device).view(b, 1, 1) * s).transpose(0, 1).reshape(-1)
    )  # expert-major
    weight = weight.transpose(0, 1).reshape(-1)
    sums = torch.zeros(b * s, device=x.device, dtype=weight.dtype).scatter_add_(0, rows, weight)
    weight = weight / (sums[rows] + 1e-12) * ROUTE_SCALE
    gate_up, down = moe.experts.cast_experts(x)
    # every expert takes exactly B·C tokens: one batched product per weight, not a loop over the experts
    g, u = torch.bmm(x.reshape(b * s, d)[rows].view(e, b * c, d), gate_up).chunk(2, dim=-1)
    out = torch.bmm(F.silu(g) * u, down).reshape(e * b * c, d)
    routed = (out.float() * weight[:, None]).to(x.dtype)
    out = _swiglu(moe.shared, x).reshape(b * s, d)
    return out.scatter_add(0, rows[:, None].expand(-1, d), routed).reshape(b, s, d)


@dataclass
class NucleusImage:
    """A bound NucleusMoE-Image transformer: call it with diffusers' forward's inputs (module docstring)."""

    architecture: str
    img_in: object
    txt_norm: object
    time: tuple[object, object]
    time_norm: object
    blocks: list[Block]
    norm_out: object
    proj_out: object
    heads: int
    kv_heads: int
    dtype: torch.dtype = torch.float32
    family = "nucleus_image"
    step_inputs = ("hidden_states", "timestep", "encoder_hidden_states", "img_shapes")  # diffusers' names
    step_optional = ("encoder_hidden_states_mask",)  # [B, T]: 1 for each prompt's tokens; default every token

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_norm)[0]

    def __call__(
        self, hidden_states, timestep, encoder_hidden_states, img_shapes, encoder_hidden_states_mask=None
    ):
        dt = self.dtype
        x = self.img_in(hidden_states.to(dt))
        dev = x.device
        t = timestep.to(dev, dt).float()  # diffusers rounds t to the model's dtype before the sinusoid
        emb = _sinusoid(t, wshape(self.time[0])[1]).to(dt)
        temb = _rms(self.time_norm, self.time[1](F.silu(self.time[0](emb))))
        ctx = _rms(self.txt_norm, encoder_hidden_states.to(dev, dt)).to(dt)
        _, h, w = (int(v) for v in img_shapes[0])
        ipos, tpos = positions(h, w, ctx.shape[1])
        pe = _rope_table(ipos.to(dev)[None]), _rope_table(tpos.to(dev)[None])
        mask = None
        if encoder_hidden_states_mask is not None:
            keep = encoder_hidden_states_mask.to(dev).bool()
            mask = torch.cat([torch.ones(x.shape[:2], dtype=torch.bool, device=dev), keep], 1)[:, None, None]
        ts = F.silu(temb)
        for blk in self.blocks:
            x = self._block(blk, x, ctx, temb, ts, pe, mask)
        scale, shift = self.norm_out(ts)[:, None].chunk(2, dim=-1)
        return self.proj_out((1 + scale) * layer_norm(x) + shift)

    def _block(self, blk: Block, x, ctx, temb, ts, pe, mask):
        scale, gate, scale2, gate2 = blk.mod(ts)[:, None].chunk(4, dim=-1)
        gate, gate2 = gate.clamp(-GATE_CLAMP, GATE_CLAMP).tanh(), gate2.clamp(-GATE_CLAMP, GATE_CLAMP).tanh()
        txt = blk.encoder_proj(ctx)
        m = layer_norm(x) * (1 + scale)
        q = _heads(blk.q(m), self.heads)
        k, v = _heads(blk.k(m), self.kv_heads), _heads(blk.v(m), self.kv_heads)
        q, k = _rms(blk.norm_q, q).to(v.dtype), _rms(blk.norm_k, k).to(v.dtype)
        tk, tv = _heads(blk.add_k(txt), self.kv_heads), _heads(blk.add_v(txt), self.kv_heads)
        tk = _rms(blk.norm_added_k, tk).to(tv.dtype)
        q, k, tk = rope(q, pe[0]), rope(k, pe[0]), rope(tk, pe[1])
        groups = self.heads // self.kv_heads
        k, v = torch.cat([k, tk], 2), torch.cat([v, tv], 2)
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + gate * blk.out(o.transpose(1, 2).flatten(2))
        n = layer_norm(x)
        m = n * (1 + scale2)
        y = _moe(blk.mlp, m, n, temb) if isinstance(blk.mlp, MoE) else _swiglu(blk.mlp, m)
        x = x + gate2 * y
        if x.dtype == torch.float16:  # as diffusers: keep a half-precision residual finite
            x = x.clamp(torch.finfo(x.dtype).min, torch.finfo(x.dtype).max)
        return x

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """The pipeline's step at width × height pixels (2×2 patches of the 8× latent: a token per 16 pixels) with
        TOKENS prompt tokens, t in 0–1."""
        from .random_inputs import _latent

        h, w = _latent(width, height, 16)
        return {
            "hidden_states": torch.randn(batch, h * w, self.in_channels, generator=g),
            "timestep": torch.rand(batch, generator=g),
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.context_dim, generator=g),
            "img_shapes": torch.tensor([[1.0, h, w]]).expand(batch, -1).clone(),
        }

    def step_units(self, inputs: dict) -> int:
        """Image and text tokens, the batch's (what its activations grow with; engine.stepping)."""
        x, c = inputs["hidden_states"], inputs["encoder_hidden_states"]
        return x.shape[0] * (x.shape[1] + c.shape[1])

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        out = {"hidden_states": (None, None, self.in_channels), "timestep": (None,),
               "encoder_hidden_states": (None, None, self.context_dim), "img_shapes": (None, 3)}  # fmt: skip
        if "encoder_hidden_states_mask" in got:
            out["encoder_hidden_states_mask"] = (None, got["encoder_hidden_states"].shape[1])
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """One image size for the batch, a single frame, whose h × w patches are the latent's tokens."""
        shapes = got["img_shapes"]
        if (shapes != shapes.round()).any() or (shapes != shapes[:1]).any():
            raise FormatError(f"{source}: input img_shapes must hold one whole (frame, h, w) for every item")
        f, h, w = (int(v) for v in shapes[0])
        if f != 1 or h < 1 or w < 1 or h * w != got["hidden_states"].shape[1]:
            raise FormatError(
                f"{source}: input img_shapes says {f} frame(s) of {h}×{w} patches, but hidden_states holds "
                f"{got['hidden_states'].shape[1]} tokens of one image"
            )

    def op_order(self) -> list:
        order = [self.img_in, *self.time, self.time_norm, self.txt_norm]
        for blk in self.blocks:
            order += blk.ops()
        return [*order, self.norm_out, self.proj_out]


def _sinusoid(t: torch.Tensor, dim: int) -> torch.Tensor:
    """[B] t → [B, dim] float32: cos then sin of 1000·(t·f_i), f_i = 10000^(−i/half) — diffusers' order of the
    products (t times the frequency, then the 1000), which rounds differently from (1000·t)·f_i by up to ~1e-5 of
    the output at angles near 1000."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = 1000.0 * (t.float()[:, None] * freqs[None])
    return torch.cat([args.cos(), args.sin()], dim=-1)


def _rope_table(ids: torch.Tensor) -> torch.Tensor:
    """[B, L, 3] positions → [B, 1, L, 64, 2, 2] rotations (common.rope's layout) tabulated as diffusers'
    NucleusMoEEmbedRope does: float32 angles through torch.polar (Qwen-Image's table, float64 angles, differs by an ulp
    here and there — enough, in bf16, to move a token between experts)."""
    parts = []
    for i, d in enumerate(AXES):
        omega = 1.0 / torch.pow(10000, torch.arange(0, d, 2, device=ids.device).to(torch.float32).div(d))
        z = torch.polar(torch.ones_like(ang := ids[..., i].float()[..., None] * omega), ang)
        cos, sin = z.real, z.imag
        parts.append(torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*ang.shape, 2, 2))
    return torch.cat(parts, dim=-3).unsqueeze(1)


def _rms(op, x: torch.Tensor) -> torch.Tensor:
    """RMSNorm (eps 1e-6) rounded as diffusers' RMSNorm does: x·rsqrt(mean x²) in float32, rounded to the weight's
    dtype, then times the weight — in bf16 a second rounding F.rms_norm does not make. Expert-choice routing picks
    tokens by their scores' order, so a one-ulp difference upstream can move a token between experts."""
    if op.compute_dtype is not None and x.dtype != op.compute_dtype:
        x = x.to(op.compute_dtype)
    w, _ = op.cast_params(x)
    y = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
    return y.to(w.dtype) * w if w.dtype in (torch.float16, torch.bfloat16) else y * w


def _heads(t: torch.Tensor, n: int) -> torch.Tensor:
    """[B, L, n·d] → [B, n, L, d]."""
    return t.unflatten(-1, (n, -1)).transpose(1, 2)


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, NucleusImage]:
    """The forward of a NucleusMoE-Image transformer in diffusers' names (the release's)."""
    blocks = []
    for i in ops.children("transformer_blocks"):
        p = f"transformer_blocks.{i}"
        a = f"{p}.attn"
        ops.get(f"{a}.norm_added_q")  # built by diffusers' Attention, never used by its processor
        if f"{p}.img_mlp.gate" in ops:
            experts = ops[f"{p}.img_mlp.experts"]
            s = f"{p}.img_mlp.shared_expert.net"
            mlp = MoE(ops[f"{p}.img_mlp.gate"], experts, (ops[f"{s}.0.proj"], ops[f"{s}.2"]),
                      CAPACITY.get(i, DEFAULT_CAPACITY))  # fmt: skip
            _check_experts(ops, p, mlp)
        else:
            mlp = (ops[f"{p}.img_mlp.net.0.proj"], ops[f"{p}.img_mlp.net.2"])
        blocks.append(Block(ops[f"{p}.img_mod.1"], ops[f"{p}.encoder_proj"], ops[f"{a}.to_q"], ops[f"{a}.to_k"],
                            ops[f"{a}.to_v"], ops[f"{a}.norm_q"], ops[f"{a}.norm_k"], ops[f"{a}.add_k_proj"],
                            ops[f"{a}.add_v_proj"], ops[f"{a}.norm_added_k"], ops[f"{a}.to_out.0"], mlp))  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no NucleusMoE-Image transformer blocks")
    hidden = wshape(ops["img_in"])[0]
    head = wshape(blocks[0].norm_q)[0]
    kv = wshape(blocks[0].k)[0]
    if head != sum(AXES) or hidden % head or kv % head or (hidden // head) % (kv // head):
        raise UnsupportedModel(
            f"{ops.what}: heads of {head} with hidden size {hidden} and keys {kv} wide — NucleusMoE-Image's heads are "
            "128 wide (RoPE axes 16, 56, 56) and its query heads a multiple of its key heads"
        )
    te = "time_text_embed"
    return "diffusers", NucleusImage(
        architecture, ops["img_in"], ops["txt_norm"],
        (ops[f"{te}.timestep_embedder.linear_1"], ops[f"{te}.timestep_embedder.linear_2"]), ops[f"{te}.norm"],
        blocks, ops["norm_out.linear"], ops["proj_out"], hidden // head, kv // head, dtype,
    )  # fmt: skip


def _check_experts(ops: Ops, p: str, moe: MoE) -> None:
    if not isinstance(moe.experts, PackedExperts):
        raise UnsupportedModel(
            f"{ops.what}: {p}.img_mlp.experts holds {', '.join(moe.experts._parameters) or 'no tensors'}, not "
            "NucleusMoE-Image's packed gate_up_proj [E, D, 2I] and down_proj [E, I, D]"
        )
    e, d2 = wshape(moe.gate)
    gu, dn = held_shape(moe.experts, "gate_up_proj"), held_shape(moe.experts, "down_proj")
    d = d2 // 2
    if moe.capacity > e:  # each expert would take more tokens than an image has (diffusers' topk fails)
        raise UnsupportedModel(
            f"{ops.what}: {p}.img_mlp routes to {e} experts, fewer than NucleusMoE-Image's capacity factor "
            f"{moe.capacity:g} for that block: not the release's layout"
        )
    if (
        len(gu) != 3
        or len(dn) != 3
        or gu[0] != e
        or dn[0] != e
        or gu[1] != d
        or dn[2] != d
        or gu[2] != 2 * dn[1]
    ):
        raise UnsupportedModel(
            f"{ops.what}: {p}.img_mlp's experts are gate_up_proj {list(gu)} and down_proj {list(dn)} for a router of "
            f"{e} experts over {d} channels — not NucleusMoE-Image's packed [E, D, 2I] and [E, I, D]"
        )
