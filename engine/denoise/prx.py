"""PRX's transformer forward pass (Photoroom, 2025), run on the component's own castable ops. Its released files hold
diffusers' own module names (`PRXTransformer2DModel`; diffusers has no single-file converter for it), bare or under
the prefix detection reads.

Architecture facts, from diffusers' `transformer_prx.py` and `pipelines/prx` (read for the facts, written from that
description, nothing copied):

* Image tokens: the latent cut into p×p patches, each flattened channel-major (c, row, column), then `img_in` — one
  Linear, or two with no activation between (`img_in.0`, `img_in.1`: the pixel-space PRX-7B's bottleneck). Text
  tokens: `txt_in` of the text encoder's states (T5Gemma's 2304; PRXPixel's Qwen3-VL), the same for every block.
* Time: the 256-wide sinusoidal embedding of 1000·t (cosines first, period 10000) → `time_in` (in_layer, SiLU,
  out_layer) = vec. PRX-7B adds `resolution_embedder` (the same MLP over the 128-wide embeddings of the latent's
  height and width, concatenated) to vec.
* Block (`blocks.N`): `modulation.lin`(SiLU(vec)) = (shift, scale, gate) for the attention and for the MLP;
  x += gate·attn((1 + scale)·LN(x) + shift), then the same over `post_attention_layernorm` and the MLP
  `down_proj`(GELU-tanh(`gate_proj`(n)) · `up_proj`(n)); affine-free LayerNorms, eps 1e-6.
* Attention: the image tokens are the only queries. `attention.img_qkv_proj` gives the image's q / k / v ([q; k; v],
  heads of 64), `attention.txt_kv_proj` the text's k / v; per-head RMS norms (`norm_q`, `norm_k`, `norm_added_k`,
  eps 1e-6); RoPE (FLUX.1's interleaved pairs, theta 10000, axes half the head each: row, column) on the image's q
  and k only; keys [text, image], padded text tokens (`attention_mask` 0) masked out; `to_out.0`. Only the image
  stream is carried from block to block.
* Out: (shift, scale) = `final_layer.adaLN_modulation.1`(SiLU(vec)), (1 + scale)·LN(x) + shift, `final_layer.linear`,
  unpatched as it was patched.

Inputs (diffusers' PRXTransformer2DModel.forward): `hidden_states` [B, C, H, W] (the VAE latent: 16 channels of the
FLUX.1 VAE, an 8th of the pixels, 2×2 patches; 32 of DC-AE, a 32nd, 1×1; PRXPixel's RGB pixels, C = 3), `timestep`
[B] in 0–1 (its pipeline's t / 1000), `encoder_hidden_states` [B, T, D] and optionally `attention_mask` [B, T] (1 for
each prompt's tokens, 0 for padding; default all 1). A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import Ops, layer_norm, merge_heads, mlp2, rms_norm_with, rope, timestep_embedding, wshape
from .flux import rope_table

THETA = 10000.0
TIME_SCALE = 1000.0  # diffusers' time_factor: the embedding reads 1000·t
TOKENS = 256  # a random step's prompt tokens (PRXPixel's pipeline trains with 256)
EPS = 1e-6
# Pixels per latent pixel by the latent's channels: the FLUX.1 VAE (16), DC-AE (32), PRXPixel's RGB (3)
VAE_SCALE = {16: 8, 32: 32, 3: 1}


@dataclass
class Block:
    """One block: its modulation, the image's fused q / k / v, the text's k / v, the three head norms, the output
    and the gated MLP (the two LayerNorms are affine-free: no layers)."""

    mod: object
    qkv: object
    q_norm: object
    k_norm: object
    txt_kv: object
    added_k_norm: object
    o: object
    gate: object
    up: object
    down: object

    def ops(self) -> list:
        return [self.mod, self.qkv, self.q_norm, self.k_norm, self.txt_kv, self.added_k_norm, self.o, self.gate,
                self.up, self.down]  # fmt: skip


@dataclass
class Prx:
    """A bound PRX transformer: call it with hidden_states [B, C, H, W], timestep [B] (0–1), encoder_hidden_states
    [B, T, D] [, attention_mask [B, T]]."""

    architecture: str
    img_in: list
    txt_in: object
    time_in: tuple[object, object]
    resolution: tuple[object, object] | None
    blocks: list[Block]
    final_mod: object
    final_linear: object
    heads: int
    patch: int
    dtype: torch.dtype = torch.float32
    family = "prx"
    step_inputs = ("hidden_states", "timestep", "encoder_hidden_states")  # diffusers' forward's names
    step_optional = ("attention_mask",)  # [B, T]: 1 for each prompt's tokens; default every token

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in[0])[1] // (self.patch * self.patch)

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_in)[1]

    def __call__(self, hidden_states, timestep, encoder_hidden_states, attention_mask=None) -> torch.Tensor:
        dt = self.dtype
        b, c, h, w = hidden_states.shape
        p = self.patch
        hp, wp = h // p, w // p
        txt = self.txt_in(encoder_hidden_states.to(dt))
        img = (
            hidden_states.to(dt).reshape(b, c, hp, p, wp, p).permute(0, 2, 4, 1, 3, 5).reshape(b, hp * wp, -1)
        )
        for proj in self.img_in:
            img = proj(img)
        rows, cols = torch.meshgrid(torch.arange(hp), torch.arange(wp), indexing="ij")
        ids = torch.stack([rows, cols], dim=-1).reshape(1, hp * wp, 2).to(img.device)
        head = wshape(self.blocks[0].q_norm)[0]
        pe = rope_table(ids, (head // 2, head // 2), THETA).to(img.device)
        vec = mlp2(self.time_in, _time_embedding(timestep).to(img.device, dt))
        if self.resolution is not None:  # PRX-7B: the latent's height and width, 128-wide embeddings each
            hw = torch.tensor([[h, w]], dtype=torch.float32, device=img.device).expand(b, 2)
            emb = torch.cat([timestep_embedding(hw[:, 0], 128), timestep_embedding(hw[:, 1], 128)], dim=-1)
            vec = vec + mlp2(self.resolution, emb.to(dt))
        mask = None
        if attention_mask is not None:  # keys [text, image]: padded text tokens are no keys
            keep = attention_mask.to(img.device).bool()
            mask = torch.cat([keep, torch.ones(b, hp * wp, dtype=torch.bool, device=img.device)], dim=1)[
                :, None, None
            ]
        for block in self.blocks:
            img = self._block(block, img, txt, vec, pe, mask)
        shift, scale = self.final_mod(F.silu(vec)).chunk(2, dim=-1)
        out = self.final_linear(layer_norm(img) * (1 + scale[:, None]) + shift[:, None])  # [B, L, C·p·p]
        c_out = out.shape[-1] // (p * p)
        return out.reshape(b, hp, wp, c_out, p, p).permute(0, 3, 1, 4, 2, 5).reshape(b, c_out, h, w)

    def _block(self, block: Block, x, txt, vec, pe, mask):
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = block.mod(F.silu(vec))[:, None].chunk(6, dim=-1)
        n = (1 + scale_a) * layer_norm(x) + shift_a
        x = x + gate_a * self._attn(block, n, txt, pe, mask)
        n = (1 + scale_m) * layer_norm(x) + shift_m
        return x + gate_m * block.down(F.gelu(block.gate(n), approximate="tanh") * block.up(n))

    def _attn(self, block: Block, n, txt, pe, mask):
        b, s, _ = n.shape
        q, k, v = block.qkv(n).reshape(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = rms_norm_with(block.q_norm, q, EPS), rms_norm_with(block.k_norm, k, EPS)
        tk, tv = block.txt_kv(txt).reshape(b, txt.shape[1], 2, self.heads, -1).permute(2, 0, 3, 1, 4)
        tk = rms_norm_with(block.added_k_norm, tk, EPS)
        q, k = rope(q, pe), rope(k, pe)
        keys, values = torch.cat([tk.to(k.dtype), k], dim=2), torch.cat([tv.to(v.dtype), v], dim=2)
        return block.o(merge_heads(F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)))

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """A text-to-image step at width × height pixels (the latent its channels say: the FLUX.1 VAE's 8th, DC-AE's
        32nd, PRXPixel's pixels), TOKENS prompt tokens, t in 0–1."""
        from .random_inputs import _latent

        h, w = (
            n * self.patch for n in _latent(width, height, VAE_SCALE.get(self.in_channels, 8) * self.patch)
        )
        return {
            "hidden_states": torch.randn(batch, self.in_channels, h, w, generator=g),
            "timestep": torch.rand(batch, generator=g),
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.context_dim, generator=g),
        }

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis)."""
        out = {"hidden_states": (None, self.in_channels, None, None), "timestep": (None,),
               "encoder_hidden_states": (None, None, self.context_dim)}  # fmt: skip
        if "attention_mask" in got:
            out["attention_mask"] = (None, got["encoder_hidden_states"].shape[1])
        return out

    def step_units(self, inputs: dict) -> int:
        """Image tokens, the batch's (what its activations grow with; engine.stepping)."""
        b, _, h, w = inputs["hidden_states"].shape
        return b * (h // self.patch) * (w // self.patch)

    def check_extra(self, got: dict, source: str) -> None:
        """The latent is whole patches."""
        h, w = got["hidden_states"].shape[-2:]
        if h % self.patch or w % self.patch:
            raise FormatError(
                f"{source}: input hidden_states is {h}×{w}; the model reads {self.patch}×{self.patch} patches"
            )

    def op_order(self) -> list:
        res = list(self.resolution) if self.resolution is not None else []
        order = [self.txt_in, *self.img_in, *self.time_in, *res]
        for block in self.blocks:
            order += block.ops()
        return [*order, self.final_mod, self.final_linear]


def _time_embedding(t: torch.Tensor) -> torch.Tensor:
    """[B] times in 0–1 -> [B, 256]: cos then sin of (t·f_i)·1000 — the scale applied after the frequencies, as
    diffusers' get_timestep_embedding(scale=1000) orders it (1000·t first differs by 1e-5 at high frequencies)."""
    half = 128
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None] * TIME_SCALE
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def _patch(width: int, bottleneck: bool) -> int | None:
    """The patch side a patch `width` (channels · p², the header's only word on either) stands for: 64 the FLUX.1
    VAE's 16 channels in 2×2 (diffusers' default config), 32 DC-AE's in 1×1, 3·p² PRXPixel's RGB behind its
    bottleneck; None for any other."""
    if bottleneck:
        p = round((width / 3) ** 0.5)
        return p if 3 * p * p == width else None
    return {64: 2, 32: 1}.get(width)


# -- binding the file's ops -----------------------------------------------------------------------------

_BLOCK = ("modulation.lin", "attention.img_qkv_proj", "attention.norm_q", "attention.norm_k", "attention.txt_kv_proj",
          "attention.norm_added_k", "attention.to_out.0", "gate_proj", "up_proj", "down_proj")  # fmt: skip


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, Prx]:
    """The forward of a PRX transformer (its files hold diffusers' names)."""
    blocks = [Block(*(ops[f"blocks.{i}.{n}"] for n in _BLOCK)) for i in ops.children("blocks")]
    if not blocks:
        raise UnsupportedModel(f"{ops.what}: no PRX blocks")
    img_in = [ops["img_in"]] if "img_in" in ops else [ops["img_in.0"], ops["img_in.1"]]
    hidden, head = wshape(ops["txt_in"])[0], wshape(blocks[0].q_norm)[0]
    patch = _patch(wshape(img_in[0])[1], len(img_in) == 2)
    if (
        hidden % head
        or head % 4
        or patch is None
        or wshape(ops["final_layer.linear"])[0] != wshape(img_in[0])[1]
    ):
        raise UnsupportedModel(
            f"{ops.what}: hidden size {hidden}, heads of {head}, {wshape(img_in[0])[1]}-wide patches "
            f"({'' if len(img_in) == 2 else 'no '}bottleneck) — not a PRX layout Loadout can run (known: the FLUX.1 "
            "VAE's 16 channels in 2×2 patches, DC-AE's 32 in 1×1, PRXPixel's RGB behind a bottleneck; heads split in "
            "two RoPE axes)"
        )
    res = None
    if ops.has_prefix("resolution_embedder"):
        res = (ops["resolution_embedder.mlp.in_layer"], ops["resolution_embedder.mlp.out_layer"])
    return "diffusers", Prx(
        architecture, img_in, ops["txt_in"], (ops["time_in.in_layer"], ops["time_in.out_layer"]), res, blocks,
        ops["final_layer.adaLN_modulation.1"], ops["final_layer.linear"], hidden // head, patch, dtype,
    )  # fmt: skip
