"""SANA-Video's transformer (NVlabs' SANA-Video 2B, 480p), run on the component's own castable ops, in the file's own
naming: diffusers' (`patch_embedding`, `transformer_blocks.N.attn1.to_q`, `ff.conv_temp`; what the `_diffusers`
releases ship) or the original release's (Sana's: `x_embedder.proj`, `blocks.N.attn.qkv`, `cross_attn.kv_linear`,
`mlp.t_conv`), renamed onto Sana's (engine.denoise.sana, whose binder and Mix-FFN this reuses).

Architecture facts, from diffusers' `SanaVideoTransformer3DModel` (`transformer_sana_video.py`, its
`SanaLinearAttnProcessor3_0` and `GLUMBTempConv`), its pipelines (`pipelines/sana_video/`) and diffusers'
`scripts/convert_sana_video_to_diffusers.py` (the release's names); written from that description, nothing copied:

* x [B, 16, F, H, W] (Wan 2.1 VAE latents) → `x_embedder.proj`, a Conv3d with kernel = stride = the patch ((1, 2, 2)
  at 480p; the converter's 720p layout patches (1, 1, 1)) → tokens in (frame, row, column) order.
* t in 0–1000, one per item [B] or one per token [B, 1, F', h, w] (image-to-video: 0 on the conditioning frame):
  e = `t_embedder.mlp`(emb₂₅₆(t)) per token; six modulations = `t_block.1`(SiLU(e)) (worked out here once per distinct
  t and picked per token: diffusers holds them per token, six times the tokens' size). Captions as Sana's (Gemma 2
  states [B, T, 2304] → `y_embedder.y_proj` → RMSNorm `attention_y_norm`), keys masked by the prompt's mask.
* Block: Sana's (modulated affine-free LN, eps 1e-6; cross-attention over the caption; Mix-FFN), with
  * heads 112 wide in both attentions, q and k RMS-normalised over the whole width (`q_norm`, `k_norm`, eps 1e-5);
  * linear attention with RoPE: q, k through ReLU, then Wan's 3-axis RoPE (the head's 56 pairs split 20 / 18 / 18
    over frame, row, column; θ = 10000; engine.denoise.wan) applied to q and k; per head out = (V·K_rotᵀ)·Q_rot /
    (1ᵀKᵀQ + 1e-15): the denominator uses the unrotated q and k;
  * the Mix-FFN (1×1 conv to 2·r·D, SiLU, 3×3 depthwise, a · SiLU(b), 1×1 back; r = 3 in the release) per frame,
    then a temporal (3, 1) convolution (`mlp.t_conv`, no bias, zero-padded) over [D, frames, h·w] added to it.
* Final: (shift, scale) = `final_layer.scale_shift_table` + e (per token where t is), `final_layer.linear`
  (LN(x)·(1 + scale) + shift), unpatchified (p_t, p_h, p_w, channels).

Where diffusers' processor computes the linear attention's denominator and the rotations in the model's dtype, this
computes them in float32 (its numerator already is). The release also keeps `pos_embed`, the null caption and a
`logvar_linear` no forward reads; they are taken unread.

Inputs (diffusers' forward's names): `hidden_states` [B, 16, F, H, W], `encoder_hidden_states` [B, T, 2304],
`timestep` [B] or [B, 1, F/p_t, H/p_h, W/p_w], and optionally `encoder_attention_mask` [B, T] (1 keep, 0 drop); the
output is the velocity [B, 16, F, H, W]. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import (
    Ops,
    held,
    layer_norm,
    merge_heads,
    mlp2,
    rms_norm_with,
    split_heads,
    timestep_embedding,
    wshape,
)
from .sana import _BLOCK, _TOP, CAPTION_EPS, Attn, Sana, bind_attn, bind_table, release_ops
from .wan import _rope, rope_angles

HEAD = 112  # both attentions' head width in every SANA-Video config
TOKENS = 300  # a random step's prompt tokens (the pipeline's max_sequence_length)


@dataclass
class Block:
    table: object  # the plain holder of the block's scale_shift_table [6, D]
    attn: Attn
    cross: Attn
    ffn: tuple[object, object, object, object]  # inverted, depth, point and temporal convolutions


@dataclass
class SanaVideo:
    """A bound SANA-Video transformer: call it with diffusers' forward's inputs (module docstring)."""

    architecture: str
    embed: object
    t_embedder: tuple[object, object]
    t_block: object
    caption: tuple[object, object]
    caption_norm: object
    blocks: list[Block]
    final_table: object
    final_linear: object
    dtype: torch.dtype = torch.float32
    family = "sana_video"
    step_inputs = ("hidden_states", "encoder_hidden_states", "timestep")
    step_optional = ("encoder_attention_mask",)

    @property
    def patch(self) -> tuple[int, int, int]:
        return tuple(wshape(self.embed)[2:])

    @property
    def in_channels(self) -> int:
        return wshape(self.embed)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.caption[0])[1]

    def __call__(self, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask=None):
        dt = self.dtype
        b = hidden_states.shape[0]
        x = self.embed(hidden_states.to(dt))  # [B, D, F', h, w]
        _, dim, f, h, w = x.shape
        tokens = x.flatten(2).transpose(1, 2)
        del x
        levels, which = _levels(timestep.to(tokens.device).reshape(b, -1).float())
        e = mlp2(self.t_embedder, timestep_embedding(levels, 256).to(dt))  # [U, D]
        mods = self.t_block(F.silu(e)).unflatten(-1, (6, dim))  # [U, 6, D]
        ctx = self.caption[1](
            F.gelu(self.caption[0](encoder_hidden_states.to(tokens.device, dt)), approximate="tanh")
        )
        ctx = rms_norm_with(self.caption_norm, ctx, CAPTION_EPS)
        keys = None
        if encoder_attention_mask is not None and not bool(encoder_attention_mask.all()):
            keys = encoder_attention_mask.to(tokens.device).bool()[:, None, None, :]
        ang = rope_angles(f, h, w, HEAD, tokens.device)
        cos, sin = ang.cos().float()[None, None], ang.sin().float()[None, None]  # [1, 1, N, HEAD/2]
        for blk in self.blocks:
            table = held(blk.table, "scale_shift_table", tokens.device).to(tokens.device, dt)
            m = table + mods  # (shift, scale, gate, shift₂, scale₂, gate₂) per level, picked per token
            y = layer_norm(tokens) * (1 + m[which, 1]) + m[which, 0]
            tokens = tokens + m[which, 2] * self._linear_attn(blk.attn, y, cos, sin)
            tokens = tokens + self._cross(blk.cross, tokens, ctx, keys)
            y = layer_norm(tokens) * (1 + m[which, 4]) + m[which, 3]
            tokens = tokens + m[which, 5] * _temporal_ffn(blk.ffn, y, f, h, w)
        table = held(self.final_table, "scale_shift_table", tokens.device).to(tokens.device, dt)
        m = table + e[:, None]
        out = self.final_linear(layer_norm(tokens) * (1 + m[which, 1]) + m[which, 0])
        pt, ph, pw = self.patch
        out = out.reshape(b, f, h, w, pt, ph, pw, -1).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return out.reshape(b, -1, f * pt, h * ph, w * pw)

    @staticmethod
    def _linear_attn(a: Attn, x, cos, sin):
        q, k, v = Sana._qk(a, x, None)
        heads = q.shape[-1] // HEAD
        dt = x.dtype
        q, k, v = (split_heads(p, heads).float() for p in (q, k, v))  # [B, H, N, d]
        # float32 copies of the tokens' size, each dropped once used: a video's N is large
        k = F.relu(k)
        k_sum = k.sum(dim=2)  # the denominator's keys, unrotated
        kv = torch.einsum("bhnd,bhne->bhde", _rope(k, cos, sin), v)  # [B, H, d, d]
        del k, v
        q = F.relu(q)
        den = torch.einsum("bhnd,bhd->bhn", q, k_sum)[..., None]  # the unrotated q
        out = torch.einsum("bhnd,bhde->bhne", _rope(q, cos, sin), kv)
        del q
        return a.o(merge_heads(out * (1 / (den + 1e-15))).to(dt))

    @staticmethod
    def _cross(a: Attn, x, ctx, keys):
        q, k, v = Sana._qk(a, x, ctx)
        q, k, v = (split_heads(t, t.shape[-1] // HEAD) for t in (q, k, v))
        return a.o(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=keys)))

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """One latent frame at width × height pixels (Wan's 8× VAE), TOKENS prompt tokens unmasked, t in 0–1000."""
        from .random_inputs import _latent

        ph, pw = self.patch[1:]
        h, w = (n * p for n, p in zip(_latent(width, height, 8 * ph), (ph, pw), strict=True))
        return {
            "hidden_states": torch.randn(batch, self.in_channels, self.patch[0], h, w, generator=g),
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.context_dim, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
        }

    def _grid(self, x) -> tuple:
        return tuple(n // p for n, p in zip(x.shape[2:], self.patch, strict=True))

    def step_units(self, inputs: dict) -> int:
        """Video tokens, the batch's (what its activations grow with; engine.stepping)."""
        x = inputs["hidden_states"]
        f, h, w = self._grid(x)
        return x.shape[0] * f * h * w

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis); a per-token timestep spans the token grid."""
        x, t = got.get("hidden_states"), got.get("timestep")
        grid = self._grid(x) if x is not None and x.dim() == 5 else (None, None, None)
        out = {"hidden_states": (None, self.in_channels, None, None, None),
               "encoder_hidden_states": (None, None, self.context_dim),
               "timestep": (None, 1, *grid) if t is not None and t.dim() > 1 else (None,)}  # fmt: skip
        if "encoder_attention_mask" in got:
            c = got.get("encoder_hidden_states")
            out["encoder_attention_mask"] = (None, c.shape[1] if c is not None and c.dim() == 3 else None)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """The latent is whole patches."""
        dims = got["hidden_states"].shape[2:]
        if any(n % p for n, p in zip(dims, self.patch, strict=True)):
            raise FormatError(
                f"{source}: input hidden_states is {'×'.join(map(str, dims))} (frames × height × width); the "
                f"model reads {'×'.join(map(str, self.patch))} patches"
            )

    def op_order(self) -> list:
        order = [self.embed, *self.t_embedder, self.t_block, *self.caption, self.caption_norm]
        for blk in self.blocks:
            order += [*blk.attn.ops(), *blk.cross.ops(), *blk.ffn]
        return [*order, self.final_linear]


def _levels(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the distinct times [U], each token's index into them [B, 1 or N]) of t [B, 1] or per token [B, N]: the
    modulations are worked out per level (image-to-video has two: 0 on the first frame, t elsewhere), not held as
    [B, N, 6·D] (six times the tokens); one per item needs no search (and no device sync)."""
    if t.shape[1] == 1:
        return t[:, 0], torch.arange(t.shape[0], device=t.device)[:, None]
    levels, which = torch.unique(t, return_inverse=True)
    return levels, which


def _temporal_ffn(ffn, y: torch.Tensor, f: int, h: int, w: int) -> torch.Tensor:
    """Sana's Mix-FFN on each frame, then the temporal (3, 1) convolution over [B, D, frames, h·w] added; [B, N, D]."""
    inverted, depth, point, temporal = ffn
    b, n, d = y.shape
    frames = y.reshape(b * f, h, w, d).permute(0, 3, 1, 2)
    a, g = depth(F.silu(inverted(frames))).chunk(2, dim=1)
    z = point(a * F.silu(g)).reshape(b, f, d, h * w).transpose(1, 2)  # [B, D, F, h·w]
    z = z + temporal(z)
    return z.permute(0, 2, 3, 1).reshape(b, n, d)


# -- binding the file's ops -----------------------------------------------------------------------------

# diffusers' paths -> the release's: Sana's, with the 3-D patch embedding and the temporal convolution
_VIDEO_TOP = (("patch_embedding", "x_embedder.proj"), *_TOP)
_VIDEO_BLOCK = (*_BLOCK, ("ff.conv_temp", "mlp.t_conv"))
_VIDEO_UNREAD = ("pos_embed", "y_embedder", "logvar_linear")  # the release's; the converter drops them


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, SanaVideo]:
    """(naming, the forward) of a SANA-Video transformer in diffusers' or the release's naming."""
    diffusers, ops, mods, embed = release_ops(
        ops, mods, _VIDEO_TOP, _VIDEO_BLOCK, _VIDEO_UNREAD, ("patch_embedding",)
    )
    if len(wshape(embed)) != 5:
        raise UnsupportedModel(
            f"{ops.what}: the patch embedding is {list(wshape(embed))}, not SANA-Video's Conv3d"
        )
    dim = wshape(embed)[0]
    if dim % HEAD:
        raise UnsupportedModel(
            f"{ops.what}: width {dim} is no whole number of SANA-Video's {HEAD}-wide heads"
        )
    if "cfg_embedder.mlp.0" in ops:
        raise UnsupportedModel(
            f"{ops.what}: a guidance embedder (SANA-Sprint style) — no SANA-Video release has one, and Loadout "
            "does not run it"
        )

    blocks = []
    for i in ops.children("blocks"):
        p = f"blocks.{i}"
        ffn = tuple(ops[f"{p}.mlp.{n}_conv.conv"] for n in ("inverted", "depth", "point"))
        blocks.append(Block(bind_table(ops, mods, p, 6, dim, "SANA-Video"), bind_attn(ops, f"{p}.attn", False, dim),
                            bind_attn(ops, f"{p}.cross_attn", True, dim), (*ffn, ops[f"{p}.mlp.t_conv"])))  # fmt: skip
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no blocks — not a SANA-Video transformer")
    for blk in blocks:
        blk.ffn[1].padding = (1, 1)  # the depthwise 3x3 keeps the grid
        blk.ffn[1].groups = wshape(blk.ffn[1])[0]
        if tuple(wshape(blk.ffn[3])[2:]) != (3, 1):
            raise UnsupportedModel(
                f"{ops.what}: a temporal convolution {list(wshape(blk.ffn[3]))}, not (3, 1)"
            )
        blk.ffn[3].padding = (1, 0)  # zero-padded over the frames
    final = "final_layer" if "final_layer" in mods else ""
    model = SanaVideo(
        architecture, embed, (ops["t_embedder.mlp.0"], ops["t_embedder.mlp.2"]), ops["t_block.1"],
        (ops["y_embedder.y_proj.fc1"], ops["y_embedder.y_proj.fc2"]), ops["attention_y_norm"], blocks,
        bind_table(ops, mods, final, 2, dim, "SANA-Video"), ops["final_layer.linear"], dtype,
    )  # fmt: skip
    return ("diffusers" if diffusers else "release"), model
