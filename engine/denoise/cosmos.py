"""Cosmos Predict2's transformer (NVIDIA's MiniTrainDIT: the 2B and 14B Text2Image and Video2World models), run on
the component's own castable ops, in the file's own naming: the release's (`x_embedder.proj.1`, `blocks.N.self_attn`,
`adaln_modulation_*`, with or without its `net.` prefix) or diffusers' (`patch_embed`, `transformer_blocks.N.attn1`,
`norm1.linear_*`, renamed onto them).

Architecture facts, from nvidia-cosmos/cosmos-predict2 `minitrain_dit.py`, diffusers' `CosmosTransformer3DModel` and
its `convert_cosmos_to_diffusers.py` (COSMOS_2_0 names and configs; written from that description, nothing copied):

* x [B, 16, F, H, W] (Wan 2.1 VAE latents), then for Video2World a condition-mask channel (1 on the given
  frames), then a padding-mask channel (zeros), cut into (1, 2, 2) patches flattened channel first (c, t, h,
  w) → `x_embedder.proj.1` (a bias-free Linear: 68 inputs for Text2Image, 72 for Video2World).
* t in 0–1 (the rectified-flow time σ / (σ + 1), one per batch item or per latent frame): its D-wide
  sinusoidal embedding s (cosines first, of t itself); base = `t_embedder.1` (Linear D→D, SiLU, Linear D→3D,
  bias-free); e = `t_embedding_norm`(s) (RMSNorm with weight, eps 1e-6).
* Each of a block's three sublayers is AdaLN-LoRA modulated: (shift, scale, gate) = adaln_modulation_*.2(
  adaln_modulation_*.1(SiLU(e))) + base, LN(x)·(1 + scale) + shift (affine-free, eps 1e-6), x += gate · out:
  self-attention (RoPE), cross-attention to context [B, T, 1024] (T5-XXL states; the pipelines zero the
  padding, which stays in), a GELU MLP 4× wide; every Linear bias-free; q and k RMS-normalised per head
  (eps 1e-6).
* 3-D RoPE on rotate-half pairs, per head of 128: 44 temporal, 42 row and 42 column frequencies, each axis
  with theta 10000 · s^(d / (d − 2)) for its NTK scale s (Predict2 configs: Text2Image (1, 4, 4),
  2B Video2World (1, 3, 3), 14B Video2World (20/24, 2, 2)); frame positions times 24 / fps when fps is
  given.
* Final: (shift, scale) = final_layer.adaln_modulation.2(…1(SiLU(e))) + base[:2D], LN, final_layer.linear, each
  token's outputs ordered (h, w, t, c) of its patch.

Anima (circlestone-labs: Cosmos Predict2 2B with an `llm_adapter`; facts from diffusers' `AnimaTextConditioner`
and ComfyUI's Anima inputs): the context is made from Qwen3 0.6B states [B, S, 1024] and T5 token ids [B, T]:
h = embed(ids); 6 blocks of h += self_attn(RMS(h)), h += cross_attn(RMS(h), states), h += mlp(RMS(h)) (RMSNorms
with weights, eps 1e-6; 16 heads of 64, bias-free q/k/v/o with per-head RMS q/k norms, rotate-half RoPE theta
10000 at each sequence's own positions — the ids' for queries, the states' for the cross-attention's keys;
mlp Linear, GELU, Linear with biases); context = RMS(out_proj(h)), times optional per-token `t5xxl_weights`,
zero-padded to 512 tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import NormedAttn as Attn
from .common import Ops, layer_norm, merge_heads, rms_norm_with, split_heads, timestep_embedding, wshape

PATCH = (1, 2, 2)
LATENT = 16  # Wan 2.1 VAE channels
HEAD = 128
ADAPTER_HEAD = 64  # Anima's adapter: 16 heads over 1024
CONTEXT_TOKENS = 512  # the context Anima's adapter pads to (the T5 length the DiT was trained on)
EPS = 1e-6
BASE_FPS = 24.0
THETA = 10000.0
# (Video2World?, width) -> RoPE NTK scales (t, h, w): the Predict2 configs' facts, not in the weights
ROPE_SCALE = {(False, 2048): (1.0, 4.0, 4.0), (False, 5120): (1.0, 4.0, 4.0), (True, 2048): (1.0, 3.0, 3.0),
              (True, 5120): (20 / 24, 2.0, 2.0)}  # fmt: skip


@dataclass
class Block:
    mods: tuple  # three (adaln .1, adaln .2) pairs: self-attention, cross-attention, MLP
    attn1: Attn
    attn2: Attn
    mlp: tuple[object, object]


@dataclass
class AdapterBlock:
    norms: tuple  # before the self-attention, the cross-attention, the MLP
    self_attn: Attn
    cross_attn: Attn
    mlp: tuple[object, object]


@dataclass
class Adapter:
    """Anima's `llm_adapter`: Qwen3 states and T5 token ids -> the DiT's 1024-wide context."""

    embed: object
    blocks: list[AdapterBlock]
    out_proj: object
    norm: object

    @property
    def vocab(self) -> int:
        return wshape(self.embed)[0]

    def __call__(self, states: torch.Tensor, ids: torch.Tensor, weights=None) -> torch.Tensor:
        table = self.embed.cast_params(states)[0]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
            raise ValueError(f"t5xxl_ids beyond the adapter's {table.shape[0]} tokens")
        h = F.embedding(ids.long(), table).to(states.dtype)
        heads = h.shape[-1] // ADAPTER_HEAD
        q_rope = _rope_1d(h.shape[1], states.device)
        k_rope = _rope_1d(states.shape[1], states.device)
        for blk in self.blocks:
            y = rms_norm_with(blk.norms[0], h, EPS)
            h = h + _adapter_attn(blk.self_attn, y, y, heads, q_rope, q_rope)
            y = rms_norm_with(blk.norms[1], h, EPS)
            h = h + _adapter_attn(blk.cross_attn, y, states, heads, q_rope, k_rope)
            h = h + blk.mlp[1](F.gelu(blk.mlp[0](rms_norm_with(blk.norms[2], h, EPS))))
        out = rms_norm_with(self.norm, self.out_proj(h), EPS)
        if weights is not None:
            out = out * weights.to(out.dtype)[..., None]
        return F.pad(out, (0, 0, 0, max(0, CONTEXT_TOKENS - out.shape[1])))

    def ops(self) -> list:
        order = [self.embed]
        for blk in self.blocks:
            order += [
                blk.norms[0],
                *blk.self_attn.ops(),
                blk.norms[1],
                *blk.cross_attn.ops(),
                blk.norms[2],
                *blk.mlp,
            ]
        return [*order, self.out_proj, self.norm]


def _rope_1d(n: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [1, 1, n, 64] of positions 0..n-1 on rotate-half pairs (theta 10000), in float32."""
    inv = 1.0 / THETA ** (torch.arange(0, ADAPTER_HEAD, 2, device=device, dtype=torch.float32) / ADAPTER_HEAD)
    ang = torch.outer(torch.arange(n, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)[None, None]
    return ang.cos(), ang.sin()


def _adapter_attn(a: Attn, x, src, heads: int, q_rope, k_rope):
    q = rms_norm_with(a.q_norm, split_heads(a.q(x), heads), EPS)
    k = rms_norm_with(a.k_norm, split_heads(a.k(src), heads), EPS)
    v = split_heads(a.v(src), heads)
    q, k = _rotate(q, *q_rope).to(v.dtype), _rotate(k, *k_rope).to(v.dtype)
    return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v)))


@dataclass
class Cosmos:
    """A bound Cosmos Predict2 transformer: call it with x, timesteps, context [, condition_mask] [, fps]."""

    architecture: str
    embed: object
    t_embedder: tuple[object, object]
    t_norm: object
    blocks: list[Block]
    final_mod: tuple[object, object]
    final_linear: object
    heads: int
    rope_scale: tuple[float, float, float]
    video2world: bool
    dtype: torch.dtype = torch.float32
    adapter: Adapter | None = None  # Anima's
    family = "cosmos"

    @property
    def in_channels(self) -> int:
        return LATENT

    @property
    def context_dim(self) -> int:
        """The width of the `context` input: T5 states, or for Anima the Qwen3 states its adapter reads."""
        if self.adapter is not None:
            return wshape(self.adapter.blocks[0].cross_attn.k)[1]
        return wshape(self.blocks[0].attn2.k)[1]

    def __call__(self, x, timesteps, context, condition_mask=None, fps=None, t5xxl_ids=None,
                 t5xxl_weights=None) -> torch.Tensor:  # fmt: skip
        dt = self.dtype
        b, c, f, h, w = x.shape
        if (
            self.adapter is not None
        ):  # Anima: `context` holds Qwen3 states, made into the DiT's by the adapter
            if t5xxl_ids is None:
                raise ValueError("Anima takes `t5xxl_ids` beside its Qwen3 `context`")
            context = self.adapter(context.to(dt), t5xxl_ids, t5xxl_weights)
        parts = [x.to(dt)]
        if self.video2world:
            parts.append(
                condition_mask.to(dt) if condition_mask is not None else x.new_zeros(b, 1, f, h, w, dtype=dt)
            )
        parts.append(x.new_zeros(b, 1, f, h, w, dtype=dt))  # the padding mask: no padding
        tokens = self.embed(_patches(torch.cat(parts, dim=1)))  # [B, F·h/2·w/2, D]
        s = timestep_embedding(timesteps.float().reshape(-1), tokens.shape[-1]).to(dt)
        base, e = self.t_embedder[1](F.silu(self.t_embedder[0](s))), rms_norm_with(self.t_norm, s, EPS)
        per = timesteps.reshape(b, -1).shape[1]  # 1, or one per latent frame
        base, e = (_per_token(v.reshape(b, per, -1), tokens.shape[1]) for v in (base, e))
        cos, sin = self._rope(f, h // 2, w // 2, fps, x.device)
        es = F.silu(e)
        extra = self._extra_pos(f, h // 2, w // 2, x.device)  # Cosmos 1.0's, added at each block's start
        for blk in self.blocks:
            tokens = self._block(
                blk, tokens if extra is None else tokens + extra, context.to(dt), es, base, cos, sin
            )
        shift, scale = (self.final_mod[1](self.final_mod[0](es)) + base[..., : 2 * tokens.shape[-1]]).chunk(
            2, -1
        )
        out = self.final_linear(layer_norm(tokens) * (1 + scale) + shift)  # [B, S, (h, w, t, c)]
        out = out.reshape(b, f, h // 2, w // 2, 2, 2, 1, -1).permute(0, 7, 1, 6, 2, 4, 3, 5)
        return out.reshape(b, -1, f, h, w)

    def _extra_pos(self, f: int, h: int, w: int, device) -> torch.Tensor | None:
        return None  # Predict2 has no learnable position embedding (engine.denoise.cosmos1 has)

    def _block(self, blk: Block, x, ctx, es, base, cos, sin):
        for (l1, l2), run in zip(blk.mods, (0, 1, 2), strict=True):
            shift, scale, gate = (l2(l1(es)) + base).chunk(3, dim=-1)
            y = layer_norm(x) * (1 + scale) + shift
            if run == 0:
                out = self._attn(blk.attn1, y, y, cos, sin)
            elif run == 1:
                out = self._attn(blk.attn2, y, ctx, None, None)
            else:
                out = blk.mlp[1](F.gelu(blk.mlp[0](y)))
            x = x + gate * out
        return x

    def _attn(self, a: Attn, x, src, cos, sin):
        q = rms_norm_with(a.q_norm, split_heads(a.q(x), self.heads), EPS)
        k = rms_norm_with(a.k_norm, split_heads(a.k(src), self.heads), EPS)
        v = split_heads(a.v(src), self.heads)
        if cos is not None:
            q, k = _rotate(q, cos, sin).to(v.dtype), _rotate(k, cos, sin).to(v.dtype)
        return a.o(merge_heads(F.scaled_dot_product_attention(q.to(v.dtype), k.to(v.dtype), v)))

    def _rope(self, f: int, h: int, w: int, fps, device):
        """cos, sin [1 or B, 1, S, 128]: the (t, h, w) angles twice over (rotate-half pairs), in float32 as the
        original computes them."""
        d_h = HEAD // 6 * 2
        dims = (HEAD - 2 * d_h, d_h, d_h)
        freqs = []
        for d, s in zip(dims, self.rope_scale, strict=True):
            theta = THETA * s ** (d / (d - 2))
            rng = torch.arange(0, d, 2, device=device, dtype=torch.float32)[: d // 2] / d
            freqs.append(1.0 / theta**rng)
        t = torch.arange(f, device=device, dtype=torch.float32)
        if fps is not None:
            t = t[None] / fps.float().reshape(-1, 1).to(device) * BASE_FPS
        else:
            t = t[None]
        ang_t = (t[..., None] * freqs[0])[:, :, None, None, :].expand(-1, f, h, w, -1)
        ang_h = torch.outer(torch.arange(h, device=device, dtype=torch.float32), freqs[1])[
            None, None, :, None, :
        ]
        ang_w = torch.outer(torch.arange(w, device=device, dtype=torch.float32), freqs[2])[
            None, None, None, :, :
        ]
        n = t.shape[0]
        ang = torch.cat([ang_t, ang_h.expand(n, f, h, w, -1), ang_w.expand(n, f, h, w, -1)], dim=-1)
        ang = torch.cat([ang, ang], dim=-1).reshape(n, 1, f * h * w, HEAD)
        return ang.cos(), ang.sin()

    def op_order(self) -> list:
        order = [*(self.adapter.ops() if self.adapter else ()), self.embed, *self.t_embedder, self.t_norm]
        for blk in self.blocks:
            for pair, ops in zip(blk.mods, (blk.attn1.ops(), blk.attn2.ops(), list(blk.mlp)), strict=True):
                order += [*pair, *ops]
        return [*order, *self.final_mod, self.final_linear]


def _patches(x: torch.Tensor) -> torch.Tensor:
    """[B, C, F, H, W] -> [B, F·H/2·W/2, C·4]: (1, 2, 2) patches flattened channel first (c, t, h, w)."""
    b, c, f, h, w = x.shape
    x = x.reshape(b, c, f, 1, h // 2, 2, w // 2, 2).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(b, f * (h // 2) * (w // 2), c * 4)


def _per_token(v: torch.Tensor, tokens: int) -> torch.Tensor:
    """[B, 1 or F, D] -> [B, 1 or S, D]: one per batch item, or each frame's repeated over its tokens."""
    return v if v.shape[1] == 1 else v.repeat_interleave(tokens // v.shape[1], dim=1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on rotate-half pairs (x[i], x[i + d/2]), in float32."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return xf * cos + torch.cat([-x2, x1], dim=-1) * sin


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's (the inverse of diffusers' COSMOS_2_0 renames)
# buffers the release keeps beside its layers, computed here (its RoPE's position table and ranges, its
# training counters)
_DERIVED = ("pos_embedder", "accum_video_sample_counter", "accum_image_sample_counter", "accum_iteration",
            "accum_train_in_hours")  # fmt: skip


def bind_cosmos(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Cosmos]:
    """(naming, the forward) of a Cosmos Predict2 transformer in the release's or diffusers' naming."""
    diffusers = "patch_embed.proj" in mods
    if diffusers:  # renamed through the LoRA table (engine.lora.family_names.COSMOS), one to one
        from ..lora.family_names import COSMOS, to_original

        rename = to_original(mods, COSMOS)
        ops = ops.renamed({rename.get(p, p): m for p, m in mods.items()})
    for p, m in mods.items():
        held = {*m._parameters, *m._buffers}
        if p.split(".", 1)[0] in _DERIVED or (p == "" and held and held <= set(_DERIVED)):
            ops.take(m)
    embed = ops["x_embedder.proj.1"]
    dim, inputs = wshape(embed)
    channels = inputs // (PATCH[1] * PATCH[2])
    if dim % HEAD or channels not in (LATENT + 1, LATENT + 2) or inputs % 4:
        raise UnsupportedModel(
            f"{ops.what}: a patch embedding [{dim}, {inputs}]: not Cosmos Predict2's (16 latent channels and "
            "its masks in 2x2 patches, 128-wide heads)"
        )
    video2world = channels == LATENT + 2

    def attn(p: str) -> Attn:
        return Attn(
            *(ops[f"{p}.{n}"] for n in ("q_proj", "k_proj", "v_proj", "output_proj", "q_norm", "k_norm"))
        )

    def mod(p: str) -> tuple[object, object]:
        return ops[f"{p}.1"], ops[f"{p}.2"]

    blocks = [Block(tuple(mod(f"blocks.{i}.adaln_modulation_{s}") for s in ("self_attn", "cross_attn", "mlp")),
                    attn(f"blocks.{i}.self_attn"), attn(f"blocks.{i}.cross_attn"),
                    (ops[f"blocks.{i}.mlp.layer1"], ops[f"blocks.{i}.mlp.layer2"])) for i in ops.children("blocks")]  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a Cosmos Predict2 transformer")
    scale = ROPE_SCALE.get((video2world, dim), ROPE_SCALE[(video2world, 2048)])
    adapter = _bind_adapter(ops) if ops.has_prefix("llm_adapter") else None
    model = Cosmos(
        architecture, embed, (ops["t_embedder.1.linear_1"], ops["t_embedder.1.linear_2"]), ops["t_embedding_norm"],
        blocks, mod("final_layer.adaln_modulation"), ops["final_layer.linear"], dim // HEAD, scale, video2world,
        dtype, adapter,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model


def _bind_adapter(ops: Ops) -> Adapter:
    a = "llm_adapter"
    if ops.has_prefix(f"{a}.in_proj"):
        raise UnsupportedModel(
            f"{ops.what}: an LLM adapter with an input projection: not Anima's (1024 wide)"
        )

    def attn(p: str) -> Attn:
        return Attn(*(ops[f"{p}.{n}"] for n in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")))

    blocks = [AdapterBlock(tuple(ops[f"{a}.blocks.{n}.norm_{s}"] for s in ("self_attn", "cross_attn", "mlp")),
                           attn(f"{a}.blocks.{n}.self_attn"), attn(f"{a}.blocks.{n}.cross_attn"),
                           (ops[f"{a}.blocks.{n}.mlp.0"], ops[f"{a}.blocks.{n}.mlp.2"]))
              for n in ops.children(f"{a}.blocks")]  # fmt: skip
    return Adapter(ops[f"{a}.embed"], blocks, ops[f"{a}.out_proj"], ops[f"{a}.norm"])
