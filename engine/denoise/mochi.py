"""Mochi 1's transformer (Genmo's 10B asymmetric joint DiT, `mochi-1-preview`), run on the component's own castable
ops, in the file's own naming: the release's (`x_embedder.proj`, `t5_y_embedder`, `t5_yproj`, `blocks.N.mod_x`,
`attn.qkv_x`, `attn.q_norm_x`, `mlp_x.w1`, `final_layer.mod`: Genmo's `dit.safetensors` and ComfyUI's files, with or
without `model.diffusion_model.`) or diffusers' (`patch_embed.proj`, `time_embed.pooler`, `transformer_blocks.N.norm1
.linear`, `attn1.to_q` / `add_q_proj`, `ff.net.0.proj`, `norm_out.linear`, renamed onto them).

Architecture facts, from genmoai/mochi `src/genmo/mochi_preview/dit/joint_model/` (`asymm_models_joint.py`:
AsymmDiTJoint, AsymmetricJointBlock, AsymmetricAttention, FinalLayer; `layers.py`, `utils.py`, `rope_mixed.py`,
`temporal_rope.py`, `mod_rmsnorm.py`, `residual_tanh_gated_rmsnorm.py`; the config in `pipelines.py`), diffusers'
`MochiTransformer3DModel` / `MochiAttnProcessor2_0` and its single-file converter
`convert_mochi_transformer_checkpoint_to_diffusers` (both Apache-2.0; written from that description, nothing copied):

* x [B, 12, T, H, W] (the Mochi VAE's latents: an 8th of the pixels, a 6th of the frames) → `x_embedder.proj` (2×2
  patches of each frame) → tokens in (frame, row, column) order, 3072 wide; out: `final_layer.linear` → 2×2 patches
  of 12 channels, features (row offset, column offset, channel).
* sigma [B] in 0–1 (1 is noise): e = `t_embedder.mlp`(emb₂₅₆(1000 · (1 − sigma))) (Linear, SiLU, Linear;
  cosines first). diffusers' `timestep` is that 1000 · (1 − sigma) already (its pipeline's inverted sigmas); its
  output is the same as Genmo's (the velocity z₀ − ε the Euler step adds times sigma − sigma_next), sign and scale.
* y_feat [B, L, 4096] T5-XXL states (256 tokens in its pipeline) with y_mask [B, L] (1 for the prompt's tokens,
  first; an empty negative prompt marks none): c = e + `t5_y_embedder`(y_feat, y_mask), an attention pool: the
  masked mean of the tokens prepended to them, one query (`to_q` of the mean) over keys and values (`to_kv`: k then
  v, 8 heads) of the mean and the prompt's tokens, then `to_out` (4096 → 3072); the text stream is
  `t5_yproj`(y_feat), 1536 wide.
* Block (48; the last, `update_y=False`, leaves the text as it is): with s = SiLU(c), (scale, gate, scale₂, gate₂)
  = `mod_x`(s) and for the text `mod_y`(s) (the last block: its one scale). Each stream is RMS-normalised (eps 1e-6,
  affine-free) times (1 + scale) → its fused `attn.qkv_x` / `attn.qkv_y` (no bias; q, k, v in that order, 24
  heads of 128 over 3072 for both streams), q and k RMS-normalised per head (`q_norm_x` … `k_norm_y`, eps 1e-5);
  the visual q and k rotated; one softmax attention over the visual tokens and the prompt's tokens; outputs
  through `proj_x` / `proj_y`. x += tanh(gate) · RMS(proj_x(o)); x += tanh(gate₂) · RMS(mlp_x(RMS(x)·(1 + scale₂)))
  ("sandwich" norms, eps 1e-6); mlp = w2(SiLU(a) · b) with (a, b) the halves of w1 (diffusers' SwiGLU holds them
  the other way round: b, a); the same for the text stream with its own modulations.
* RoPE: learned `pos_frequencies` [3, heads, 64]: a token at (frame t, row r, column c) turns pair i of head h by
  t·f[0,h,i] + r'·f[1,h,i] + c'·f[2,h,i], r' and c' the centres of the grid's rows and columns spread over
  √(36864 / (rows · columns)) each (every size maps onto a 192 × 192 grid's area), on interleaved pairs (x[2i],
  x[2i+1]), in float32.
* Final: (shift, scale) = `final_layer.mod`(SiLU(c)) (diffusers' `norm_out.linear`: scale, shift);
  LN(x)·(1 + scale) + shift (affine-free, eps 1e-6).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, held, held_shape, layer_norm, mlp2, rms_norm_with, timestep_embedding, wshape
from .flux import Proj

PATCH = 2
POOL_HEADS = 8  # the T5 attention pool's heads (AsymmDiTJoint's t5_y_embedder: num_heads=8)
TIME_SCALE = 1000.0  # the release config's timestep_scale
ROPE_AREA = 36864.0  # create_position_matrix's target_area: a 192 x 192 grid of patches
QK_EPS = 1e-5
EPS = 1e-6


@dataclass
class Stream:
    """One stream (visual or text) of a block: its modulation, fused qkv, q / k norms, output projection, SwiGLU."""

    mod: object
    qkv: Proj
    q_norm: object
    k_norm: object
    proj: object | None  # none in the last block's text stream
    mlp: tuple[object, object] | None

    def ops_before_attention(self) -> list:
        return [*self.qkv.ops(), self.q_norm, self.k_norm]


@dataclass
class Block:
    x: Stream
    y: Stream

    @property
    def update_y(self) -> bool:
        return self.y.mlp is not None


@dataclass
class Mochi:
    """A bound Mochi 1 transformer: call it with x, sigma, y_feat [, y_mask]."""

    architecture: str
    embed: object
    t_embedder: tuple[object, object]
    pool: tuple[object, object, object]  # t5_y_embedder's to_kv, to_q, to_out
    yproj: object
    pos: object  # the plain holder of pos_frequencies [3, heads, head / 2]
    blocks: list[Block]
    final: tuple[object, object]  # final_layer.mod, final_layer.linear
    diffusers: bool  # diffusers' SwiGLU halves (x · SiLU(gate)) and final modulation order (scale, shift)
    dtype: torch.dtype = torch.float32
    family = "mochi"

    @property
    def in_channels(self) -> int:
        return wshape(self.embed)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.yproj)[1]

    @property
    def heads(self) -> int:
        return held_shape(self.pos, "pos_frequencies")[1]

    def __call__(self, x, sigma, y_feat, y_mask=None) -> torch.Tensor:
        dt, (b, _, t, h, w) = self.dtype, x.shape
        ph, pw = h // PATCH, w // PATCH
        frames = x.to(dt).transpose(1, 2).reshape(b * t, -1, h, w)
        tokens = self.embed(frames).reshape(b, t, -1, ph * pw).transpose(2, 3).reshape(b, t * ph * pw, -1)
        e = mlp2(self.t_embedder, timestep_embedding(TIME_SCALE * (1 - sigma.float()), 256).to(dt))
        mask = torch.ones(y_feat.shape[:2], device=y_feat.device) if y_mask is None else y_mask.float()
        # the prompts' tokens alone, up to the longest (the mask is checked to mark them first); prompts all as long
        # take no mask (the original's B = 1 path), others have their padding masked out of every attention
        counts = mask.sum(1)
        n = int(counts.max())
        y_feat, mask = y_feat[:, :n], mask[:, :n]
        keys = None
        if not bool((counts == n).all()):
            keys = F.pad(mask.bool(), (tokens.shape[1], 0), value=True)[:, None, None].to(tokens.device)
        y_feat = y_feat.to(dt)
        c = e + self._pool(y_feat, mask.to(y_feat.device, dt))
        y = self.yproj(y_feat)
        cos, sin = self._rope(t, ph, pw, tokens.device)
        cs = F.silu(c)
        for blk in self.blocks:
            tokens, y = self._block(blk, tokens, y, cs, cos, sin, keys)
        a, bb = self.final[0](cs).chunk(2, dim=1)
        shift, scale = (bb, a) if self.diffusers else (a, bb)
        out = self.final[1](layer_norm(tokens) * (1 + scale[:, None]) + shift[:, None])
        out = out.reshape(b, t, ph, pw, PATCH, PATCH, -1).permute(0, 6, 1, 2, 4, 3, 5)
        return out.reshape(b, -1, t, h, w)

    def _pool(self, y, mask):
        """t5_y_embedder: one query (the masked mean) over the mean and the prompt's tokens, 8 heads."""
        to_kv, to_q, to_out = self.pool
        b, n, d = y.shape
        mean = (y * (mask / mask.sum(1, keepdim=True).clamp(min=1))[..., None]).sum(1, keepdim=True)
        seq = torch.cat([mean, y], dim=1)
        k, v = to_kv(seq).reshape(b, n + 1, 2, POOL_HEADS, d // POOL_HEADS).permute(2, 0, 3, 1, 4)
        q = to_q(seq[:, 0]).reshape(b, POOL_HEADS, 1, d // POOL_HEADS)
        keep = F.pad(mask.bool(), (1, 0), value=True)[:, None, None]
        return to_out(F.scaled_dot_product_attention(q, k, v, attn_mask=keep).reshape(b, d))

    def _rope(self, t: int, ph: int, pw: int, device):
        """cos, sin [N, heads, head / 2] of the learned mixed frequencies at each token's (frame, row, column)."""
        scale = math.sqrt(ROPE_AREA / (ph * pw))

        def centres(n: int) -> torch.Tensor:
            edges = torch.linspace(-n * scale / 2, n * scale / 2, n + 1)
            return (edges[:-1] + edges[1:]) / 2

        grid = torch.meshgrid(torch.arange(t, dtype=torch.float32), centres(ph), centres(pw), indexing="ij")
        pos = torch.stack(grid, dim=-1).reshape(-1, 3).to(device)
        freqs = held(self.pos, "pos_frequencies", device).to(device, torch.float32)
        angles = torch.einsum("nd,dhf->nhf", pos, freqs)
        return angles.cos(), angles.sin()

    def _block(self, blk: Block, x, y, cs, cos, sin, keys):
        sx = blk.x.mod(cs).chunk(4, dim=1)
        sy = blk.y.mod(cs).chunk(4, dim=1) if blk.update_y else (blk.y.mod(cs),)
        qx, kx, vx = self._qkv(blk.x, _modulated(x, sx[0]), cos, sin)
        qy, ky, vy = self._qkv(blk.y, _modulated(y, sy[0]), None, None)
        q, k, v = (torch.cat(p, dim=2) for p in ((qx, qy), (kx, ky), (vx, vy)))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=keys).transpose(1, 2).flatten(2)
        ox, oy = o.split((x.shape[1], y.shape[1]), dim=1)
        x = _gated(x, blk.x.proj(ox), sx[1])
        if blk.update_y:
            y = _gated(y, blk.y.proj(oy), sy[1])
        x = _gated(x, self._mlp(blk.x.mlp, _modulated(x, sx[2])), sx[3])
        if blk.update_y:
            y = _gated(y, self._mlp(blk.y.mlp, _modulated(y, sy[2])), sy[3])
        return x, y

    def _qkv(self, s: Stream, x, cos, sin):
        b, n, heads = x.shape[0], x.shape[1], self.heads
        q, k, v = (p.reshape(b, n, heads, p.shape[-1] // heads) for p in s.qkv(x))
        q, k = rms_norm_with(s.q_norm, q, QK_EPS), rms_norm_with(s.k_norm, k, QK_EPS)
        if cos is not None:
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        return (p.transpose(1, 2) for p in (q, k, v))  # [B, heads, N, head]

    def _mlp(self, mlp, x):
        a, b = mlp[0](x).chunk(2, dim=-1)
        return mlp[1](a * F.silu(b) if self.diffusers else F.silu(a) * b)

    def op_order(self) -> list:
        order = [self.embed, *self.t_embedder, *self.pool, self.yproj]
        for blk in self.blocks:
            order += [blk.x.mod, blk.y.mod, *blk.x.ops_before_attention(), *blk.y.ops_before_attention()]
            order += [blk.x.proj, *([blk.y.proj] if blk.update_y else []), *blk.x.mlp, *(blk.y.mlp or ())]
        return [*order, *self.final]


def _modulated(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """RMS(x)·(1 + scale) in float32 (modulated_rmsnorm), back in x's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS) * (1 + scale.float()[:, None])).to(
        x.dtype
    )


def _gated(x: torch.Tensor, res: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x + tanh(gate)·RMS(res) (residual_tanh_gated_rmsnorm: the residual normalised in float32)."""
    rf = res.float()
    return x + (
        rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + EPS) * torch.tanh(gate.float())[:, None]
    ).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs (x[2i], x[2i+1]) of [B, N, heads, head] turned by the angles of cos / sin [N, heads, head/2]."""
    even, odd = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2).type_as(x)


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's: the one rename table LoRAs use too (engine.lora.family_names.MOCHI), and what only
# the binder renames: the T5 pool's module (its own holder), the final modulation and the SwiGLU w1s (halves swapped,
# read in diffusers' order), and the split q / k / v, bound as row blocks in place of the release's fused qkv_x / qkv_y
_OWN_TOP = {"time_embed.pooler": "t5_y_embedder", "norm_out.linear": "final_layer.mod"}
_OWN_BLOCK = {"attn1.to_q": "attn.q_x", "attn1.to_k": "attn.k_x", "attn1.to_v": "attn.v_x", "attn1.add_q_proj": "attn.q_y",
              "attn1.add_k_proj": "attn.k_y", "attn1.add_v_proj": "attn.v_y", "ff.net.0.proj": "mlp_x.w1",
              "ff_context.net.0.proj": "mlp_y.w1"}  # fmt: skip


def release_paths(mods) -> dict:
    """diffusers path -> the release's, for every path of `mods` the two names differ in."""
    from ..lora.family_names import MOCHI, to_original

    out = to_original(mods, MOCHI) | {p: r for p, r in _OWN_TOP.items() if p in mods}
    for p in mods:
        if p.startswith("transformer_blocks."):
            _, i, rest = p.split(".", 2)
            if rest in _OWN_BLOCK:
                out[p] = f"blocks.{i}.{_OWN_BLOCK[rest]}"
    return out


def bind_mochi(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Mochi]:
    """(naming, the forward) of a Mochi 1 transformer in the release's or diffusers' naming."""
    diffusers = "patch_embed.proj" in mods
    if diffusers:
        rename = release_paths(mods)
        mods = {rename.get(p, p): m for p, m in mods.items()}
        ops = ops.renamed(mods)
    root = mods.get("")
    if root is None or getattr(root, "pos_frequencies", None) is None:
        raise UnsupportedModel(f"{ops.what}: no pos_frequencies — not a Mochi transformer")
    ops.take(root)
    embed = ops["x_embedder.proj"]
    embed.stride = tuple(wshape(embed)[2:])
    dim = wshape(embed)[0]
    _, heads, half = held_shape(root, "pos_frequencies")
    if tuple(wshape(embed)[2:]) != (PATCH, PATCH) or heads * half * 2 != dim:
        raise UnsupportedModel(
            f"{ops.what}: width {dim}, patch {wshape(embed)[2:]}, pos_frequencies {heads} heads of {2 * half}: "
            "not Mochi's 2x2 patches of heads spanning the width"
        )

    def stream(p: str, s: str, last: bool) -> Stream:
        a = f"{p}.attn"
        if f"{a}.qkv_{s}" in ops:
            qkv = Proj(ops[f"{a}.qkv_{s}"], (dim, dim, dim))
        else:  # diffusers' split q / k / v
            qkv = Proj(None, parts=tuple(ops[f"{a}.{n}_{s}"] for n in "qkv"))
        text_end = last and s == "y"
        proj = None if text_end else ops[f"{a}.proj_{s}"]
        mlp = None if text_end else (ops[f"{p}.mlp_{s}.w1"], ops[f"{p}.mlp_{s}.w2"])
        return Stream(ops[f"{p}.mod_{s}"], qkv, ops[f"{a}.q_norm_{s}"], ops[f"{a}.k_norm_{s}"], proj, mlp)

    depth = ops.children("blocks")
    if not depth:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a Mochi transformer")
    blocks = [
        Block(stream(f"blocks.{i}", "x", False), stream(f"blocks.{i}", "y", i == depth[-1])) for i in depth
    ]
    model = Mochi(
        architecture, embed, (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]),
        tuple(ops[f"t5_y_embedder.{n}"] for n in ("to_kv", "to_q", "to_out")), ops["t5_yproj"], root, blocks,
        (ops["final_layer.mod"], ops["final_layer.linear"]), diffusers, dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
