"""Motif-Video's transformer forward pass (Motif Technologies, Motif-Video-2B), run on the component's own castable ops.
Its blocks are FLUX.1's double- and single-stream blocks in diffusers' naming (engine.denoise.flux: `flux_like_blocks`
binds them, `Flux._qkv` / `_after` run their halves) on video tokens. Its release holds diffusers' own module names
(`MotifVideoTransformer3DModel`; diffusers' single-file loader maps its checkpoints by identity), bare or under the
prefix detection accepts (engine.detect.flux_likes).

Architecture facts, from diffusers' `transformer_motif_video.py` and `pipelines/motif_video` (read for the facts,
written from that description, nothing copied):

* Tokens: `x_embedder.proj`, a Conv3d with kernel = stride = (patch_t, patch, patch) = (1, 2, 2) over the channels-
  first latent [B, 33, F, H, W] (the Wan 2.1 VAE's 16 channels, a 16-channel first-frame condition, a 1-channel
  mask), frame-major then row-major. Text: `context_embedder` = linear_1, tanh-GELU, linear_2 of the text encoder's
  states (T5Gemma 2's, 4096 wide by default). Time: `time_text_embed.timestep_embedder` (linear_1, SiLU, linear_2) of
  the 256-wide sinusoid (cosines first) of t itself, t in 0–1000 — no pooled vector, no guidance embedding.
* Optional image conditioning (`image_embedder`, present when the config sets image_embed_dim): vision-encoder
  tokens through LayerNorm (eps 1e-5, affine), linear_1, exact GELU, linear_2, LayerNorm; they go before the text
  tokens in the text stream, always attended.
* Sequence order [video; text] (FLUX.1's is [text; image]; kept as diffusers has it, so the sums run in its order),
  key padding from `encoder_attention_mask` (video tokens always kept). RoPE only on the video tokens, a 2×2 rotation
  per frequency (FLUX.1's), axes (frame, row, column) of widths (16, 56, 56) at positions 0.. and theta 256
  (FLUX.1's is 10000); heads of 128 (the QK norms' scale holds it), QK RMS norms eps 1e-6.
* Double block: FLUX.1's (AdaLayerNormZero per stream: shift, scale, gate, shift', scale', gate'; joint attention;
  tanh-GELU MLPs). With `cross_attn` (enable_text_cross_attention_dual): after the gated attention residual the video
  stream adds, ungated, cross_attn(P, T) where P is the video part of the attention after `to_out.0` and T the
  modulated, normed text stream (the image-conditioning tokens skipped): q = to_q(P), k, v = to_k / to_v(T), RMS norms
  (eps 1e-6), RoPE on q alone, the text mask, `to_out.0`.
* Single block: FLUX.1's (shift, scale, gate; q / k / v and `proj_mlp` of the one normed sequence; `proj_out` of
  [attention, tanh-GELU(mlp)], gated). With `cross_attn` (enable_text_cross_attention_single) the video part of the
  raw attention output adds cross_attn of itself (the same cross-attention as above) before `proj_out`.
* Decoder (num_decoder_layers > 0): the last single blocks run without text: their "text" stream is the video tokens
  the blocks before made, their video stream starts again from the x_embedder's output, no mask; the decoder
  stream's output is what the head reads. Only the encoder's single blocks can hold a cross-attention, so the header
  tells the decoder blocks where the encoder's have one (they are the trailing single blocks without it); a file
  with decoder blocks and no single-block cross-attention cannot be told from one without and is read with none.
* Config facts no weight holds, taken as diffusers' defaults: the block norms are LayerNorms (norm_type
  "layer_norm"; "rms_norm" would leave the same keys), RoPE axes (16, 56, 56) and theta 256. The QK norms are RMS
  (qk_norm "rms_norm"): a LayerNorm QK norm holds a bias, and such a file is refused.
* Head: `norm_out.linear` (scale, shift) of SiLU(c), LayerNorm (eps 1e-6, affine-free), `proj_out` (patch_t·p·p·16
  values a token), unpatched to [B, 16, F, H, W] (the velocity).

Inputs (diffusers' forward's names): `hidden_states` [B, 33, F, H, W] (the noisy latent, the condition latent, the
mask; text-to-video's condition and mask are zeros), `timestep` [B] in 0–1000 (the scheduler's t), and
`encoder_hidden_states` [B, T, 4096]; optionally `encoder_attention_mask` [B, T] (1 for a prompt token, 0 for padding;
the pipeline pads to 512) and `image_embeds` [B, N, D] (image-to-video's SigLIP tokens of the first frame, for a file
with an image embedder). The output is [B, 16, F, H, W]. A self-described family (engine.denoise.SELF_DESCRIBED).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel
from .common import (
    Ops,
    layer_norm,
    layer_norm_with,
    merge_heads,
    mlp2,
    rope,
    split_heads,
    timestep_embedding,
    wshape,
)
from .flux import Flux, _attention, flux_like_blocks, rope_table

THETA = 256.0  # the config's rope_theta (FLUX.1's axes (16, 56, 56), another base)
TOKENS = 512  # the pipelines' max_sequence_length: a random step's prompt tokens
# a random image-to-video step's image tokens: the pipeline passes the last hidden states of T5Gemma 2's vision tower
# (Gemma 3's SigLIP: 896 px in patches of 14, 64 × 64, before the projector pools them to 256; the release's image
# processor config was not at hand to confirm the size)
IMAGE_TOKENS = 4096
LATENT = 16  # the Wan 2.1 VAE's channels: the output's
IMAGE_EPS = 1e-5  # the image embedder's LayerNorms (torch's default)


@dataclass
class Cross:
    """A block's text cross-attention (`cross_attn`): queries from the video tokens, keys and values from the text."""

    q: object
    k: object
    v: object
    q_norm: object
    k_norm: object
    out: object

    def ops(self) -> list:
        return [self.q, self.k, self.v, self.q_norm, self.k_norm, self.out]


@dataclass
class MotifVideo(Flux):
    """A bound Motif-Video transformer: call it with hidden_states [B, C, F, H, W], timestep [B] (0–1000),
    encoder_hidden_states [B, T, D] [, encoder_attention_mask [B, T], image_embeds [B, N, E]]."""

    txt_out: tuple = ()  # context_embedder's linear_2 (txt_in is its linear_1)
    image_in: tuple | None = None  # image_embedder's norm_in, linear_1, linear_2, norm_out
    cross_doubles: list = field(default_factory=list)  # a Cross or None per double block
    cross_singles: list = field(default_factory=list)  # a Cross or None per single block
    decoders: int = 0  # the trailing single blocks that make the decoder
    patch: tuple[int, int] = (1, 2)  # (patch_t, patch)
    family = "motif_video"
    step_inputs = ("hidden_states", "timestep", "encoder_hidden_states")  # diffusers' names
    step_optional = ("encoder_attention_mask", "image_embeds")

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def vec_dim(self) -> int:
        return 0  # no pooled text vector

    @property
    def image_dim(self) -> int | None:
        return None if self.image_in is None else wshape(self.image_in[1])[1]

    def __call__(
        self, hidden_states, timestep, encoder_hidden_states, encoder_attention_mask=None, image_embeds=None
    ):
        dt = self.dtype
        b, _, f, h, w = hidden_states.shape
        pt, p = self.patch
        img = self.img_in(hidden_states.to(dt)).flatten(2).transpose(1, 2)
        dev = img.device
        first = img if self.decoders else None  # the decoder's stream starts from the patch embedding
        vs = F.silu(mlp2(self.time_in, timestep_embedding(timestep.float().to(dev), 256).to(dt)))
        txt = self.txt_out[0](
            F.gelu(self.txt_in(encoder_hidden_states.to(device=dev, dtype=dt)), approximate="tanh")
        )
        keep = None if encoder_attention_mask is None else encoder_attention_mask.to(dev) > 0.5
        n_image = 0
        if image_embeds is not None:
            e = self._image(image_embeds.to(device=dev, dtype=dt))
            n_image = e.shape[1]
            txt = torch.cat([e, txt], dim=1)
            if keep is not None:
                keep = torch.cat([torch.ones(b, n_image, dtype=torch.bool, device=dev), keep], dim=1)
        pos = _grid(f // pt, h // p, w // p, dev)
        n_img, n_txt = pos.shape[0], txt.shape[1]
        # [video; text], diffusers' order; the text at position 0 in every axis: angle 0, left as it is
        pe = rope_table(torch.cat([pos, pos.new_zeros(n_txt, 3)])[None], theta=THETA)
        pe_img = pe[:, :, :n_img]
        mask = text_mask = None
        if keep is not None and not bool(keep.all()):
            mask = torch.cat([torch.ones(b, n_img, dtype=torch.bool, device=dev), keep], dim=1)[:, None, None]
            text_mask = keep[:, n_image:][:, None, None]
        ctx = (pe_img, text_mask, n_image)
        for blk, cross in zip(self.doubles, self.cross_doubles, strict=True):
            img, txt = self._dual(blk, cross, img, txt, vs, pe, mask, ctx)
        x = torch.cat([img, txt], dim=1)
        del img, txt
        n_enc = len(self.singles) - self.decoders
        for blk, cross in zip(self.singles[:n_enc], self.cross_singles[:n_enc], strict=True):
            x = self._single_cross(blk, cross, x, n_img, vs, pe, mask, ctx)
        x = x[:, :n_img]
        if self.decoders:  # [the decoder's stream; the encoder's video tokens (unrotated)]
            pe = rope_table(torch.cat([pos, pos.new_zeros(n_img, 3)])[None], theta=THETA)
            x = torch.cat([first, x], dim=1)
            for blk in self.singles[n_enc:]:
                x = self._single(blk, x, vs, pe)
            x = x[:, :n_img]
        scale, shift = self.final_mod(vs)[:, None].chunk(2, dim=-1)  # diffusers' norm_out: (scale, shift)
        out = self.final_linear((1 + scale) * layer_norm(x) + shift)
        out = out.reshape(b, f // pt, h // p, w // p, -1, pt, p, p).permute(0, 4, 1, 5, 2, 6, 3, 7)
        return out.reshape(b, out.shape[1], f, h, w)

    def _image(self, e: torch.Tensor) -> torch.Tensor:
        norm_in, l1, l2, norm_out = self.image_in
        e = l2(F.gelu(l1(layer_norm_with(norm_in, e, IMAGE_EPS))))
        return layer_norm_with(norm_out, e, IMAGE_EPS)

    def _cross(self, c: Cross, x, text, pe_img, text_mask) -> torch.Tensor:
        """The text cross-attention of video tokens `x` to the normed `text` (RoPE on the queries alone)."""
        q, k, v = (split_heads(t, self.heads) for t in (c.q(x), c.k(text), c.v(text)))
        q, k = rope(c.q_norm(q).to(v.dtype), pe_img), c.k_norm(k).to(v.dtype)
        return c.out(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=text_mask)))

    def _dual(self, blk, cross: Cross | None, img, txt, vs, pe, mask, ctx):
        im = blk.img.mod(vs)[:, None].chunk(6, dim=-1)
        tm = blk.txt.mod(vs)[:, None].chunk(6, dim=-1)
        iq, ik, iv = self._qkv(blk.img, img, im[0], im[1])
        tq, tk, tv = self._qkv(blk.txt, txt, tm[0], tm[1])
        attn = _attention(torch.cat([iq, tq], 2), torch.cat([ik, tk], 2), torch.cat([iv, tv], 2), pe, mask)
        del iq, ik, iv, tq, tk, tv
        n = img.shape[1]
        if cross is None:
            img = self._after(blk.img, img, attn[:, :n], im)
        else:
            pe_img, text_mask, n_image = ctx
            o = blk.img.proj(attn[:, :n])
            normed = ((1 + tm[1]) * layer_norm(txt) + tm[0])[:, n_image:]
            img = img + im[2] * o + self._cross(cross, o, normed, pe_img, text_mask)
            img = img + im[5] * blk.img.mlp_out(
                F.gelu(blk.img.mlp_in((1 + im[4]) * layer_norm(img) + im[3]), approximate="tanh")
            )
        return img, self._after(blk.txt, txt, attn[:, n:], tm)

    def _single_cross(self, blk, cross: Cross | None, x, n_img: int, vs, pe, mask, ctx):
        if cross is None:
            return self._single(blk, x, vs, pe, mask)
        pe_img, text_mask, n_image = ctx
        shift, scale, gate = blk.mod(vs)[:, None].chunk(3, dim=-1)
        normed = (1 + scale) * layer_norm(x) + shift
        q, k, v, mlp = blk.linear1(normed)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        q, k = blk.q_norm(q).to(v.dtype), blk.k_norm(k).to(v.dtype)
        attn = _attention(q, k, v, pe, mask)
        del q, k, v
        a = attn[:, :n_img]
        a = a + self._cross(cross, a, normed[:, n_img + n_image :], pe_img, text_mask)
        attn = torch.cat([a, attn[:, n_img:]], dim=1)
        return x + gate * blk.linear2(torch.cat([attn, F.gelu(mlp, approximate="tanh")], dim=2))

    def step_random(self, width: int, height: int, batch: int, g: torch.Generator) -> dict:
        """One latent frame at width × height pixels (the 8× VAE latent, one token per 16 pixels): noise in the first
        16 channels, text-to-video's empty condition and mask (zeros); TOKENS prompt tokens; t in 0–1000; a file with
        an image embedder also gets IMAGE_TOKENS image tokens (image-to-video's call)."""
        from .random_inputs import _latent

        h, w = (n * 2 for n in _latent(width, height, 16))
        x = torch.zeros(batch, self.in_channels, self.patch[0], h, w)
        x[:, :LATENT] = torch.randn(batch, LATENT, self.patch[0], h, w, generator=g)
        out = {
            "hidden_states": x,
            "timestep": torch.rand(batch, generator=g) * 1000.0,
            "encoder_hidden_states": torch.randn(batch, TOKENS, self.context_dim, generator=g),
        }
        if self.image_in is not None:
            out["image_embeds"] = torch.randn(batch, IMAGE_TOKENS, self.image_dim, generator=g)
        return out

    def step_units(self, inputs: dict) -> int:
        """Video tokens, the batch's (what its activations grow with; engine.stepping)."""
        b, _, f, h, w = inputs["hidden_states"].shape
        pt, p = self.patch
        return b * (f // pt) * (h // p) * (w // p)

    def step_shapes(self, got: dict) -> dict:
        """The shape of each input (None: any size on that axis); the mask as long as the prompt."""
        text = got.get("encoder_hidden_states")
        out = {"hidden_states": (None, self.in_channels, None, None, None), "timestep": (None,),
               "encoder_hidden_states": (None, None, self.context_dim)}  # fmt: skip
        if "encoder_attention_mask" in got:
            out["encoder_attention_mask"] = (
                None,
                text.shape[1] if text is not None and text.dim() == 3 else None,
            )
        if "image_embeds" in got:
            out["image_embeds"] = (None, None, self.image_dim)
        return out

    def check_extra(self, got: dict, source: str) -> None:
        """The latent's frames and sides are whole patches; a mask holds 0 / 1 (and, for a file with a text
        cross-attention, keeps a token of every prompt); image tokens need an image embedder."""
        if "image_embeds" in got and self.image_in is None:
            raise FormatError(
                f"{source}: input image_embeds given, but this Motif-Video file has no image embedder "
                "(image_embedder): a text-to-video model; leave image_embeds out"
            )
        f, h, w = got["hidden_states"].shape[2:]
        pt, p = self.patch
        if f % pt or h % p or w % p:
            raise FormatError(
                f"{source}: input hidden_states has {f} frames of {h}×{w}; this Motif-Video's patches are {pt} "
                f"frame{'s' if pt > 1 else ''} of {p}×{p}"
            )
        m = got.get("encoder_attention_mask")
        if m is not None and not ((m == 0) | (m == 1)).all():
            raise FormatError(f"{source}: input encoder_attention_mask holds values other than 0 and 1")
        crosses = any(c is not None for c in (*self.cross_doubles, *self.cross_singles))
        if m is not None and crosses and not bool(m.any(dim=1).all()):
            raise FormatError(
                f"{source}: input encoder_attention_mask keeps no prompt token for some item; this file's text "
                "cross-attention needs one (an empty prompt still has its end token)"
            )

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, self.txt_in, *self.txt_out, *(self.image_in or ())]
        for d, c in zip(self.doubles, self.cross_doubles, strict=True):
            i, t = d.img, d.txt
            order += [i.mod, t.mod, *i.ops_before_attention(), *t.ops_before_attention(), i.proj]
            order += [*(c.ops() if c is not None else ()), i.mlp_in, i.mlp_out, t.proj, t.mlp_in, t.mlp_out]
        for s, c in zip(self.singles, self.cross_singles, strict=True):
            ops = s.ops()
            order += [*ops[:-1], *(c.ops() if c is not None else ()), ops[-1]]
        return [*order, self.final_mod, self.final_linear]


def _grid(f: int, h: int, w: int, device) -> torch.Tensor:
    """[f·h·w, 3] (frame, row, column) positions, frame-major."""
    axes = [torch.arange(n, dtype=torch.float32, device=device) for n in (f, h, w)]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, 3)


# -- binding the file's ops -----------------------------------------------------------------------------


def _cross(ops: Ops, p: str) -> Cross | None:
    a = f"{p}.cross_attn"
    if f"{a}.to_q" not in ops:
        return None
    return Cross(*(ops[f"{a}.{n}"] for n in ("to_q", "to_k", "to_v", "norm_q", "norm_k", "to_out.0")))


def bind(ops: Ops, mods: dict, architecture: str, dtype: torch.dtype) -> tuple[str, MotifVideo]:
    """The forward of a Motif-Video transformer (diffusers' names: the release's own)."""
    stem = ops["x_embedder.proj"]
    kernel = tuple(wshape(stem)[2:])
    if len(kernel) != 3 or kernel[1] != kernel[2]:
        raise UnsupportedModel(
            f"{ops.what}: x_embedder.proj has kernel {list(kernel)}, not a (t, p, p) video patch"
        )
    stem.stride = stem.kernel_size  # the file holds the kernel; the stride is the architecture's
    doubles, singles, heads = flux_like_blocks(ops, "Motif-Video", "x_embedder.proj")
    q_norm = doubles[0].img.q_norm if doubles else singles[0].q_norm
    if getattr(q_norm, "bias", None) is not None:
        raise UnsupportedModel(
            f'{ops.what}: its QK norms hold a bias (qk_norm "layer_norm"); Loadout runs Motif-Video\'s RMS QK norms'
        )
    cross_doubles = [_cross(ops, f"transformer_blocks.{i}") for i in ops.children("transformer_blocks")]
    cross_singles = [
        _cross(ops, f"single_transformer_blocks.{i}") for i in ops.children("single_transformer_blocks")
    ]
    if len({c is None for c in cross_doubles}) > 1:
        raise FormatError(
            f"{ops.what}: some double blocks have a text cross-attention (cross_attn) and some not"
        )
    with_cross = [i for i, c in enumerate(cross_singles) if c is not None]
    if with_cross and with_cross != list(range(len(with_cross))):
        raise FormatError(
            f"{ops.what}: single blocks {with_cross} have a text cross-attention; Motif-Video's are the first ones "
            "(its encoder's), the decoder's after them have none"
        )
    decoders = len(singles) - len(with_cross) if with_cross else 0
    te, ce = "time_text_embed.timestep_embedder", "context_embedder"
    image_in = None
    if ops.has_prefix("image_embedder"):
        image_in = tuple(ops[f"image_embedder.{n}"] for n in ("norm_in", "linear_1", "linear_2", "norm_out"))
    pt, p = kernel[0], kernel[1]
    out = wshape(ops["proj_out"])[0]
    if out != pt * p * p * LATENT:
        raise UnsupportedModel(
            f"{ops.what}: proj_out gives {out} values a token; Motif-Video's give {pt}×{p}×{p}×{LATENT} (its VAE's "
            f"{LATENT} channels)"
        )
    return "diffusers", MotifVideo(
        architecture, stem, ops[f"{ce}.linear_1"], (ops[f"{te}.linear_1"], ops[f"{te}.linear_2"]), None, (),
        doubles, singles, ops["norm_out.linear"], True, ops["proj_out"], heads, dtype,
        (ops[f"{ce}.linear_2"],), image_in, cross_doubles, cross_singles, decoders, (pt, p),
    )  # fmt: skip
