"""JoyImage Edit's and Edit Plus's transformer forward pass (JD, jdopensource/JoyAI-Image-Edit and -Edit-Plus, 2026),
run on the component's own castable ops. Its released files hold diffusers' own module names (diffusers has no
single-file converter for it); the two releases build the same modules key for key (engine.detect.dits_2026), so one
forward runs both.

Architecture facts, from diffusers' `transformer_joyimage.py`, `transformer_joyimage_edit_plus.py` and
`pipelines/joyimage` (read for the facts, written from that description, nothing copied):

* Image tokens: `img_in`, a 1×2×2 patch Conv3d over the Wan 2.1 VAE's 16-channel latent. An edit's items (the
  reference images' latents and the target's) are one sequence, the target first, then the references, each item a
  frame on the time axis (positions t = its index). Text: `condition_embedder.text_embedder` (linear_1, GELU-tanh,
  linear_2) of Qwen3-VL's states (4096).
* Time: the 256-wide sinusoidal embedding of t (0–1000, the scheduler's timesteps; cosines first) →
  `condition_embedder.time_embedder` (linear_1, SiLU, linear_2) = temb; `time_proj`(SiLU(temb)) = six [B, D] vectors.
* Block (`double_blocks.N`), image and text streams each with its own weights: (shift, scale, gate) × 2 =
  `img_mod.modulate_table` [1, 6, D] + those vectors (Wan's learned table); x += gate·attn((1 + scale)·LN(x) + shift),
  then the same with the MLP (`img_mlp.net.0.proj`, GELU-tanh, `img_mlp.net.2`); LayerNorms affine-free, eps 1e-6,
  in float32.
* Attention (`attn`): fused `img_attn_qkv` / `txt_attn_qkv` ([q; k; v], heads of 128), per-head RMS norms (`*_q_norm`,
  `*_k_norm`, eps 1e-6), RoPE on the image's q and k only (theta 256, axes 16 / 56 / 56 over (t, row, column), each
  angle on an interleaved pair, worked in float32), one joint attention over [image, text] (Edit Plus: padded text
  tokens are no keys), `img_attn_proj` / `txt_attn_proj`.
* Out (image tokens only): `proj_out`(LN(x)) — no modulation —, unpatched (pt, ph, pw, c) into each item's frame.

Inputs (diffusers' JoyImageEditTransformer3DModel.forward): `hidden_states` [B, 16, T, h, w] (an 8th of the pixels),
or an edit's [B, N, 16, T, h, w] (N items: the reference images' latents first, the target's last, all one size), the
output is of the same shape (each item's prediction; the target's is the last); `timestep` [B] (0–1000),
`encoder_hidden_states` [B, L, 4096] and optionally Edit Plus's `encoder_hidden_states_mask` [B, L] (1 for each
prompt's tokens; default all). A random step is an edit: one reference image of the target's size. The text RoPE of
diffusers' `rope_type="mrope"` (not the releases' default "rope") and Edit Plus's references of other sizes than the
target's (its padded patch lists) are not run. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, held, merge_heads, mlp2, rms_norm_with, timestep_embedding, wshape

AXES = (16, 56, 56)
THETA = 256.0
TOKENS = 256  # a random step's prompt tokens
EPS = 1e-6
VAE_SCALE = 8  # the Wan 2.1 VAE's spatial compression (its pipeline's vae_scale_factor_spatial)


@dataclass
class Stream:
    """One stream's half of a block: its modulation table's holder, fused q / k / v, the two head norms, the attention
    output and the MLP."""

    mod: object
    qkv: object
    q_norm: object
    k_norm: object
    o: object
    mlp: tuple[object, object]


@dataclass
class JoyImage:
    """A bound JoyImage Edit / Edit Plus transformer: call it with hidden_states [B, C, T, h, w] or [B, N, C, T, h, w]
    (references first, the target last), timestep [B] (0–1000), encoder_hidden_states [B, L, D]
    [, encoder_hidden_states_mask [B, L]]."""

    architecture: str
    img_in: object
    time_embedder: tuple[object, object]
    time_proj: object
    text_embedder: tuple[object, object]
    blocks: list[tuple[Stream, Stream]]
    proj_out: object
    heads: int
    dtype: torch.dtype = torch.float32
    family = "joyimage"
    step_inputs = ("hidden_states", "timestep", "encoder_hidden_states")  # diffusers' forward's names
    step_optional = ("encoder_hidden_states_mask",)  # Edit Plus's: [B, L], 1 for each prompt's tokens

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def patch(self) -> tuple[int, int, int]:
        return tuple(wshape(self.img_in)[2:])

    @property
    def context_dim(self) -> int:
        return wshape(self.text_embedder[0])[1]

    def __call__(self, hidden_states, timestep, encoder_hidden_states, encoder_hidden_states_mask=None):
        dt = self.dtype
        items = hidden_states.dim() == 6
        x = hidden_states if items else hidden_states[:, None]
        x = torch.cat([x[:, -1:], x[:, :-1]], dim=1)  # the target first, then the references
        b, n, c, t, h, w = x.shape
        pt, ph, pw = self.patch
        x = x.permute(0, 2, 1, 3, 4, 5).reshape(b, c, n * t, h, w)
        tt, th, tw = n * t // pt, h // ph, w // pw
        img = self.img_in(x.to(dt)).flatten(2).transpose(1, 2)  # [B, tt·th·tw, D]
        temb = mlp2(self.time_embedder, timestep_embedding(timestep.float(), 256).to(img.device, dt))
        vec = self.time_proj(F.silu(temb)).unflatten(1, (6, -1)).float()  # [B, 6, D]
        txt = self.text_embedder[1](
            F.gelu(self.text_embedder[0](encoder_hidden_states.to(dt)), approximate="tanh")
        )
        cos, sin = _rope(tt, th, tw, img.device)
        mask = None
        if encoder_hidden_states_mask is not None:  # keys [image, text]: padded text tokens are none
            keep = encoder_hidden_states_mask.to(img.device).bool()
            mask = torch.cat([torch.ones(b, img.shape[1], dtype=torch.bool, device=img.device), keep], dim=1)
            mask = mask[:, None, None]
        for pair in self.blocks:
            img, txt = self._block(pair, img, txt, vec, cos, sin, mask)
        out = self.proj_out(_ln(img))  # [B, S, pt·ph·pw·C]
        c_out = out.shape[-1] // (pt * ph * pw)
        out = out.reshape(b, tt, th, tw, pt, ph, pw, c_out).permute(0, 7, 1, 4, 2, 5, 3, 6)
        out = out.reshape(b, c_out, n, t, h, w).permute(0, 2, 1, 3, 4, 5)
        out = torch.cat([out[:, 1:], out[:, :1]], dim=1)  # back in the input's order
        return out if items else out[:, 0]

    def _block(self, pair, img, txt, vec, cos, sin, mask):
        (si, st) = pair
        mi, mt = _mods(si.mod, vec), _mods(st.mod, vec)
        ni, nt = _modulate(_ln(img), mi[1], mi[0]), _modulate(_ln(txt), mt[1], mt[0])
        oi, ot = self._attn(si, st, ni, nt, cos, sin, mask)
        img, txt = img + oi * mi[2][:, None].to(img.dtype), txt + ot * mt[2][:, None].to(txt.dtype)
        ni, nt = _modulate(_ln(img), mi[4], mi[3]), _modulate(_ln(txt), mt[4], mt[3])
        img = img + _mlp(si.mlp, ni) * mi[5][:, None].to(img.dtype)
        return img, txt + _mlp(st.mlp, nt) * mt[5][:, None].to(txt.dtype)

    def _attn(self, si: Stream, st: Stream, ni, nt, cos, sin, mask):
        b, s, _ = ni.shape
        qi, ki, vi = (y.reshape(b, s, self.heads, -1) for y in si.qkv(ni).chunk(3, dim=-1))
        qt, kt, vt = (y.reshape(b, nt.shape[1], self.heads, -1) for y in st.qkv(nt).chunk(3, dim=-1))
        qi, ki = rms_norm_with(si.q_norm, qi, EPS), rms_norm_with(si.k_norm, ki, EPS)
        qt, kt = rms_norm_with(st.q_norm, qt, EPS), rms_norm_with(st.k_norm, kt, EPS)
        qi, ki = _rotate(qi, cos, sin), _rotate(ki, cos, sin)
        q, k, v = (
            torch.cat([a, bb.to(a.dtype)], dim=1).transpose(1, 2) for a, bb in ((qi, qt), (ki, kt), (vi, vt))
        )
        o = merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
        return si.o(o[:, :s]), st.o(o[:, s:])

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """An edit step at width × height pixels: one reference image's latent of the target's size, then the
        target's (the Wan 2.1 VAE's 8th, one frame), TOKENS prompt tokens, t in 0–1000."""
        from .random_inputs import _latent

        h, w = (n * self.patch[1] for n in _latent(width, height, VAE_SCALE * self.patch[1]))
        return {
            "hidden_states": torch.randn(batch, 2, self.in_channels, self.patch[0], h, w, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.context_dim, generator=g),
        }

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        latent = (None, None, self.in_channels, None, None, None) if got["hidden_states"].dim() == 6 else (
            None, self.in_channels, None, None, None)  # fmt: skip
        out = {
            "hidden_states": latent,
            "timestep": (None,),
            "encoder_hidden_states": (None, None, self.context_dim),
        }
        if "encoder_hidden_states_mask" in got:
            out["encoder_hidden_states_mask"] = (None, got["encoder_hidden_states"].shape[1])
        return out

    def step_units(self, inputs: dict) -> int:
        """Image tokens, every item's (what its activations grow with; engine.stepping)."""
        x = inputs["hidden_states"]
        pt, ph, pw = self.patch
        return x[..., 0, 0, 0, 0].numel() * (x.shape[-3] // pt) * (x.shape[-2] // ph) * (x.shape[-1] // pw)

    def check_extra(self, got: dict, source: str) -> None:
        """The latent is whole patches."""
        t, h, w = got["hidden_states"].shape[-3:]
        pt, ph, pw = self.patch
        if t % pt or h % ph or w % pw:
            raise FormatError(
                f"{source}: input hidden_states is {t}×{h}×{w}; the model reads {pt}×{ph}×{pw} patches"
            )

    def op_order(self) -> list:
        order = [self.img_in, *self.time_embedder, self.time_proj, *self.text_embedder]
        for si, st in self.blocks:
            order += [
                si.qkv,
                st.qkv,
                si.q_norm,
                si.k_norm,
                st.q_norm,
                st.k_norm,
                si.o,
                st.o,
                *si.mlp,
                *st.mlp,
            ]
        return [*order, self.proj_out]


def _ln(x: torch.Tensor) -> torch.Tensor:
    """Affine-free LayerNorm worked in float32, cast back (diffusers' FP32LayerNorm)."""
    return F.layer_norm(x.float(), (x.shape[-1],), eps=EPS).to(x.dtype)


def _mods(holder, vec: torch.Tensor) -> list[torch.Tensor]:
    """The six [B, D] modulation vectors: the stream's learned table + the time's, in float32."""
    table = held(holder, "modulate_table", vec.device).to(vec.device, torch.float32)
    return list((table + vec).unbind(1))


def _modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    return x * (1 + scale[:, None].to(x.dtype)) + shift[:, None].to(x.dtype)


def _mlp(pair, x: torch.Tensor) -> torch.Tensor:
    return pair[1](F.gelu(pair[0](x), approximate="tanh"))


def _rope(tt: int, th: int, tw: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [1, S, 1, 128] over the (t, row, column) grid: each axis' angles pos · theta^(-2i/d), each twice
    in a row (an interleaved pair's), in float32 as diffusers works them."""
    grid = torch.stack(
        torch.meshgrid(*(torch.arange(s, dtype=torch.float32) for s in (tt, th, tw)), indexing="ij")
    )
    angles = []
    for i, d in enumerate(AXES):
        freqs = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles.append(torch.outer(grid[i].reshape(-1), freqs).repeat_interleave(2, dim=1))
    a = torch.cat(angles, dim=1)[None, :, None].to(device)
    return a.cos(), a.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x·cos + x'·sin, x' each interleaved pair (a, b) turned to (−b, a); worked in float32, cast back."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    turned = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    return (x.float() * cos + turned * sin).to(x.dtype)


# -- binding the file's ops -----------------------------------------------------------------------------


def _stream(ops: Ops, mods: dict, i: int, s: str) -> Stream:
    p = f"double_blocks.{i}"
    holder = mods.get(f"{p}.{s}_mod")
    if holder is None or getattr(holder, "modulate_table", None) is None:
        raise UnsupportedModel(
            f"{ops.what}: no modulation table '{p}.{s}_mod.modulate_table' — not a JoyImage layout"
        )
    ops.take(holder)
    return Stream(
        holder, ops[f"{p}.attn.{s}_attn_qkv"], ops[f"{p}.attn.{s}_attn_q_norm"], ops[f"{p}.attn.{s}_attn_k_norm"],
        ops[f"{p}.attn.{s}_attn_proj"], (ops[f"{p}.{s}_mlp.net.0.proj"], ops[f"{p}.{s}_mlp.net.2"]),
    )  # fmt: skip


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, JoyImage]:
    """The forward of a JoyImage Edit / Edit Plus transformer (its files hold diffusers' names)."""
    blocks = [
        (_stream(ops, mods, i, "img"), _stream(ops, mods, i, "txt")) for i in ops.children("double_blocks")
    ]
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no JoyImage double blocks")
    hidden, head = wshape(ops["img_in"])[0], wshape(blocks[0][0].q_norm)[0]
    if head != sum(AXES) or hidden % head or len(wshape(ops["img_in"])) != 5:
        raise UnsupportedModel(
            f"{ops.what}: head width {head} with hidden size {hidden} — JoyImage's heads are {sum(AXES)} wide "
            f"(RoPE axes {AXES}) over a 3-D patch embedding"
        )
    ops["img_in"].stride = tuple(
        wshape(ops["img_in"])[2:]
    )  # the file holds the kernel; the stride is the same
    e = "condition_embedder"
    return "diffusers", JoyImage(
        architecture, ops["img_in"], (ops[f"{e}.time_embedder.linear_1"], ops[f"{e}.time_embedder.linear_2"]),
        ops[f"{e}.time_proj"], (ops[f"{e}.text_embedder.linear_1"], ops[f"{e}.text_embedder.linear_2"]), blocks,
        ops["proj_out"], hidden // head, dtype,
    )  # fmt: skip
