"""FLUX.1's transformer forward pass (dev and schnell), run on the component's own castable ops, in the
file's own naming: BFL's (fused `qkv` and `linear1`) or diffusers' (separate q / k / v / mlp Linears,
which are the row blocks of BFL's fused ones).

Architecture facts, from black-forest-labs/flux `src/flux/model.py`, `modules/layers.py`, `math.py`
and `util.py` (written from that description, nothing copied):

* vec = time_in(emb(t)) [+ guidance_in(emb(guidance)) for dev] + vector_in(y), where emb is the 256-wide
  sinusoidal embedding of 1000·t and each `*_in` is Linear, SiLU, Linear; img = img_in(img),
  txt = txt_in(txt).
* positions: `ids = cat(txt_ids, img_ids)`, three axes of RoPE with widths (16, 56, 56) and theta
  10000 (`configs["flux-dev"|"flux-schnell"]`), a 2×2 rotation per frequency; head width 128
  (the QK-norm's scale holds it), so heads = hidden / 128.
* double block, per stream: Modulation = Linear(SiLU(vec)) → (shift, scale, gate) × 2; LayerNorm
  without affine (eps 1e-6), x·(1+scale)+shift, qkv, per-head RMSNorm of q and k (eps 1e-6, float32),
  joint attention over [txt, img] with RoPE, then x += gate·proj(attn);
  x += gate₂·mlp((1+scale₂)·LN(x)+shift₂) with a tanh-GELU MLP.
* single block over [txt, img]: one Modulation (shift, scale, gate); linear1 → (qkv, mlp);
  linear2(cat(attn, GELU(mlp))); x += gate·that.
* last layer: (shift, scale) = Linear(SiLU(vec)); Linear((1+scale)·LN(x)+shift). diffusers stores this
  Linear's two halves the other way round (its `norm_out` is (scale, shift): `swap_scale_shift` in
  diffusers' single_file_utils).

Chroma (lodestones' FLUX.1-schnell derivative; facts from diffusers' `ChromaTransformer2DModel` and its
`convert_chroma_transformer_checkpoint_to_diffusers`): the same blocks without their Modulation
Linears and without time_in / vector_in / guidance_in. One `distilled_guidance_layer` computes every
modulation at once: its input, per modulation index i of 3·singles + 12·doubles + 2, is the 16-wide
embeddings of 1000·t and of 1000·guidance (0 by default) and the 32-wide embedding of 1000·i;
in_proj, then 5 residual layers x += out_layer(SiLU(in_layer(RMSNorm(x)))), out_proj. Index order:
the single blocks (3 each), the double blocks' img streams (6 each), their txt streams (6 each), the
final layer's (shift, scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import UnsupportedModel
from .common import Ops, layer_norm, mlp2, rope, split_heads, timestep_embedding, wshape

AXES = (16, 56, 56)
THETA = 10000.0
TIME_FACTOR = 1000.0


@dataclass
class Proj:
    """One fused Linear split by output rows (BFL), or the separate Linears those rows are (diffusers)."""

    fused: object | None
    sizes: tuple[int, ...] = ()
    parts: tuple = ()

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.fused is not None:
            return self.fused(x).split(self.sizes, dim=-1)
        return tuple(p(x) for p in self.parts)

    def ops(self) -> list:
        return [self.fused] if self.fused is not None else list(self.parts)


@dataclass
class Stream:
    """One stream (img or txt) of a double block."""

    mod: object
    qkv: Proj
    q_norm: object
    k_norm: object
    proj: object
    mlp_in: object
    mlp_out: object

    def ops_before_attention(self) -> list:
        return [*self.qkv.ops(), self.q_norm, self.k_norm]


@dataclass
class Double:
    img: Stream
    txt: Stream

    def ops(self) -> list:
        i, t = self.img, self.txt
        mods = [m for m in (i.mod, t.mod) if m is not None]  # Chroma's blocks have none
        return [*mods, *i.ops_before_attention(), *t.ops_before_attention(),
                i.proj, i.mlp_in, i.mlp_out, t.proj, t.mlp_in, t.mlp_out]  # fmt: skip


@dataclass
class Single:
    mod: object
    linear1: Proj
    q_norm: object
    k_norm: object
    linear2: object

    def ops(self) -> list:
        mods = [self.mod] if self.mod is not None else []
        return [*mods, *self.linear1.ops(), self.q_norm, self.k_norm, self.linear2]


def rope_table(ids: torch.Tensor, axes: tuple[int, ...] = AXES, theta: float = THETA) -> torch.Tensor:
    """[B, L, n] positions -> [B, 1, L, sum(axes)/2, 2, 2] float32 rotations (angles in float64, as BFL's
    rope); FLUX.1's axes and theta unless given (Z-Image's: engine.denoise.nextdit)."""
    parts = []
    for i, d in enumerate(axes):
        omega = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64, device=ids.device) / d)
        ang = ids[..., i].double()[..., None] * omega
        cos, sin = torch.cos(ang), torch.sin(ang)
        parts.append(torch.stack([cos, -sin, sin, cos], dim=-1).reshape(*ang.shape, 2, 2))
    return torch.cat(parts, dim=-3).unsqueeze(1).float()


def _attention(q, k, v, pe, mask=None) -> torch.Tensor:
    o = F.scaled_dot_product_attention(rope(q, pe), rope(k, pe), v, attn_mask=mask)
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)


@dataclass
class Flux:
    """A bound FLUX.1 transformer: call it with BFL's inputs (img, img_ids, txt, txt_ids, timesteps, y
    [, guidance])."""

    architecture: str
    img_in: object
    txt_in: object
    time_in: tuple[object, object]
    guidance_in: tuple[object, object] | None
    vector_in: tuple[object, object]
    doubles: list[Double]
    singles: list[Single]
    final_mod: object
    final_swapped: bool
    final_linear: object
    heads: int
    dtype: torch.dtype = torch.float32

    @property
    def in_channels(self) -> int:
        return wshape(self.img_in)[1]

    @property
    def context_dim(self) -> int:
        return wshape(self.txt_in)[1]

    @property
    def vec_dim(self) -> int:
        return wshape(self.vector_in[0])[1]

    def __call__(self, img, img_ids, txt, txt_ids, timesteps, y, guidance=None) -> torch.Tensor:
        dt = self.dtype
        img = self.img_in(img.to(dt))
        vec = mlp2(self.time_in, timestep_embedding(TIME_FACTOR * timesteps.float(), 256).to(dt))
        if self.guidance_in is not None:
            if guidance is None:
                raise ValueError("FLUX.1 dev takes a `guidance` input")
            vec = vec + mlp2(self.guidance_in, timestep_embedding(TIME_FACTOR * guidance.float(), 256).to(dt))
        vec = vec + mlp2(self.vector_in, y.to(dt))
        txt = self.txt_in(txt.to(dt))
        streams = [img, txt]
        del img, txt  # _blocks holds the only references: each block's output replaces its input
        return self._blocks(streams, F.silu(vec), rope_table(torch.cat([txt_ids, img_ids], dim=1)))

    def _blocks(self, streams: list, vs, pe) -> torch.Tensor:
        """The double blocks, the single blocks and the last layer, from the embedded [image, text] `streams` (emptied,
        so no caller keeps the first activations for the whole pass) and SiLU(vec); the FLUX-like families without a
        pooled vector share them (engine.denoise.longcat_image)."""
        img, txt = streams
        streams.clear()
        for blk in self.doubles:
            img, txt = self._double(blk, img, txt, vs, pe)
        n_txt = txt.shape[1]
        x = torch.cat([txt, img], dim=1)
        del img, txt
        for blk in self.singles:
            x = self._single(blk, x, vs, pe)
        x = x[:, n_txt:]
        shift, scale = self.final_mod(vs).chunk(2, dim=-1)
        if self.final_swapped:
            shift, scale = scale, shift
        return self.final_linear((1 + scale[:, None]) * layer_norm(x) + shift[:, None])

    def _qkv(self, s: Stream, x, shift, scale):
        q, k, v = s.qkv((1 + scale) * layer_norm(x) + shift)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        return s.q_norm(q).to(v.dtype), s.k_norm(k).to(v.dtype), v

    def _double(self, blk: Double, img, txt, vs, pe, mask=None):
        im = blk.img.mod(vs)[:, None].chunk(6, dim=-1)
        tm = blk.txt.mod(vs)[:, None].chunk(6, dim=-1)
        return self._joint(blk, img, txt, im, tm, pe, mask)

    def _joint(self, blk: Double, img, txt, im, tm, pe, mask=None):
        iq, ik, iv = self._qkv(blk.img, img, im[0], im[1])
        tq, tk, tv = self._qkv(blk.txt, txt, tm[0], tm[1])
        attn = _attention(torch.cat([tq, iq], 2), torch.cat([tk, ik], 2), torch.cat([tv, iv], 2), pe, mask)
        n = txt.shape[1]
        img = self._after(blk.img, img, attn[:, n:], im)
        txt = self._after(blk.txt, txt, attn[:, :n], tm)
        return img, txt

    @staticmethod
    def _after(s: Stream, x, attn, m):
        x = x + m[2] * s.proj(attn)
        h = s.mlp_in((1 + m[4]) * layer_norm(x) + m[3])
        return x + m[5] * s.mlp_out(F.gelu(h, approximate="tanh"))

    def _single(self, blk: Single, x, vs, pe, mask=None):
        shift, scale, gate = blk.mod(vs)[:, None].chunk(3, dim=-1)
        return self._single_with(blk, x, shift, scale, gate, pe, mask)

    def _single_with(self, blk: Single, x, shift, scale, gate, pe, mask=None):
        q, k, v, mlp = blk.linear1((1 + scale) * layer_norm(x) + shift)
        q, k, v = (split_heads(t, self.heads) for t in (q, k, v))
        q, k = blk.q_norm(q).to(v.dtype), blk.k_norm(k).to(v.dtype)
        attn = _attention(q, k, v, pe, mask)
        return x + gate * blk.linear2(torch.cat([attn, F.gelu(mlp, approximate="tanh")], dim=2))

    def op_order(self) -> list:
        order = [self.img_in, *self.time_in, *(self.guidance_in or ()), *self.vector_in, self.txt_in]
        for d in self.doubles:
            order += d.ops()
        for s in self.singles:
            order += s.ops()
        return [*order, self.final_mod, self.final_linear]


@dataclass
class Approximator:
    """Chroma's `distilled_guidance_layer`: in_proj, residual (RMSNorm, in_layer, SiLU, out_layer)
    layers, out_proj."""

    in_proj: object
    layers: list[tuple[object, object]]
    norms: list
    out_proj: object

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = self.in_proj(x)
        for pair, norm in zip(self.layers, self.norms, strict=True):
            x = x + mlp2(pair, norm(x))
        return self.out_proj(x)

    def ops(self) -> list:
        out = [self.in_proj]
        for pair, norm in zip(self.layers, self.norms, strict=True):
            out += [norm, *pair]
        return [*out, self.out_proj]


@dataclass
class Chroma(Flux):
    """A bound Chroma transformer: call it with img, img_ids, txt, txt_ids, timesteps [, guidance] (every
    text token attends: a caller masking padding passes only the tokens it keeps)."""

    approximator: Approximator | None = None
    family = "chroma"

    @property
    def vec_dim(self) -> int:
        return 0

    def modulations(self, timesteps: torch.Tensor, guidance: torch.Tensor | None) -> torch.Tensor:
        """[B, 3·singles + 12·doubles + 2, hidden]: every block's modulation vectors, in index order."""
        b, dev = timesteps.shape[0], timesteps.device
        n = 3 * len(self.singles) + 12 * len(self.doubles) + 2
        g = guidance.float() if guidance is not None else torch.zeros(b, device=dev)
        tg = torch.cat([timestep_embedding(TIME_FACTOR * timesteps.float(), 16),
                        timestep_embedding(TIME_FACTOR * g, 16)], dim=1)  # fmt: skip
        idx = timestep_embedding(TIME_FACTOR * torch.arange(n, device=dev, dtype=torch.float32), 32)
        vec = torch.cat([tg[:, None].expand(b, n, 32), idx[None].expand(b, n, 32)], dim=-1)
        return self.approximator(vec.to(self.dtype))

    def __call__(self, img, img_ids, txt, txt_ids, timesteps, guidance=None) -> torch.Tensor:
        dt = self.dtype
        img = self.img_in(img.to(dt))
        mods = self.modulations(timesteps, guidance)
        txt = self.txt_in(txt.to(dt))
        pe = rope_table(torch.cat([txt_ids, img_ids], dim=1))
        ns, nd = len(self.singles), len(self.doubles)

        def vectors(start: int, count: int) -> tuple:
            return tuple(mods[:, i : i + 1] for i in range(start, start + count))

        for i, blk in enumerate(self.doubles):
            im, tm = vectors(3 * ns + 6 * i, 6), vectors(3 * ns + 6 * nd + 6 * i, 6)
            img, txt = self._joint(blk, img, txt, im, tm, pe)
        n_txt = txt.shape[1]
        x = torch.cat([txt, img], dim=1)
        del img, txt
        for i, blk in enumerate(self.singles):
            x = self._single_with(blk, x, *vectors(3 * i, 3), pe)
        x = x[:, n_txt:]
        shift, scale = vectors(mods.shape[1] - 2, 2)
        return self.final_linear((1 + scale) * layer_norm(x) + shift)

    def op_order(self) -> list:
        order = [self.img_in, *self.approximator.ops(), self.txt_in]
        for d in self.doubles:
            order += d.ops()
        for s in self.singles:
            order += s.ops()
        return [*order, self.final_linear]


# -- binding the file's ops -----------------------------------------------------------------------------


def _check_heads(q_norm, hidden: int, what: str, name: str = "FLUX.1") -> int:
    head = wshape(q_norm)[0]
    if head != sum(AXES) or hidden % head:
        raise UnsupportedModel(
            f"{what}: head width {head} with hidden size {hidden} — {name} uses 128-wide heads "
            f"(RoPE axes {AXES})"
        )
    return hidden // head


def flux_like_blocks(ops: Ops, name: str, stem: str = "x_embedder") -> tuple[list, list, int]:
    """The diffusers-named FLUX.1 blocks of a FLUX-like family without FLUX.1's pooled vector (Bria, LongCat-Image,
    Ovis-Image, Motif-Video) and their head count, from the 128-wide heads over the `stem`'s width (Motif-Video's
    is its patch convolution, `x_embedder.proj`)."""
    doubles, singles = diffusers_blocks(ops)
    if not doubles and not singles:
        raise UnsupportedModel(f"{ops.what}: no {name} double- or single-stream blocks")
    q_norm = doubles[0].img.q_norm if doubles else singles[0].q_norm
    return doubles, singles, _check_heads(q_norm, wshape(ops[stem])[0], ops.what, name)


def bind_bfl(ops: Ops, architecture: str, dtype: torch.dtype) -> Flux:
    hidden = wshape(ops["img_in"])[0]

    chroma = "distilled_guidance_layer.in_proj" in ops

    def stream(p: str) -> Stream:
        return Stream(
            None if chroma else ops[f"{p}_mod.lin"],
            Proj(ops[f"{p}_attn.qkv"], (hidden, hidden, hidden)),
            ops[f"{p}_attn.norm.query_norm"],
            ops[f"{p}_attn.norm.key_norm"],
            ops[f"{p}_attn.proj"],
            ops[f"{p}_mlp.0"],
            ops[f"{p}_mlp.2"],
        )

    doubles = [Double(stream(f"double_blocks.{i}.img"), stream(f"double_blocks.{i}.txt"))
               for i in ops.children("double_blocks")]  # fmt: skip
    singles = []
    for i in ops.children("single_blocks"):
        p = f"single_blocks.{i}"
        lin1 = ops[f"{p}.linear1"]
        mlp = wshape(lin1)[0] - 3 * hidden
        singles.append(Single(None if chroma else ops[f"{p}.modulation.lin"], Proj(lin1, (hidden, hidden, hidden, mlp)),
                              ops[f"{p}.norm.query_norm"], ops[f"{p}.norm.key_norm"], ops[f"{p}.linear2"]))  # fmt: skip
    heads = _check_heads(doubles[0].img.q_norm if doubles else singles[0].q_norm, hidden, ops.what)
    if chroma:
        return Chroma(architecture, ops["img_in"], ops["txt_in"], (), None, (), doubles, singles, None, False,
                      ops["final_layer.linear"], heads, dtype, _approximator(ops, "in_layer", "out_layer"))  # fmt: skip
    guidance = (
        (ops["guidance_in.in_layer"], ops["guidance_in.out_layer"]) if "guidance_in.in_layer" in ops else None
    )
    return Flux(
        architecture, ops["img_in"], ops["txt_in"], (ops["time_in.in_layer"], ops["time_in.out_layer"]),
        guidance, (ops["vector_in.in_layer"], ops["vector_in.out_layer"]), doubles, singles,
        ops["final_layer.adaLN_modulation.1"], False, ops["final_layer.linear"], heads, dtype,
    )  # fmt: skip


def _approximator(ops: Ops, inner: str, outer: str) -> Approximator:
    """Chroma's distilled_guidance_layer; its residual layers' Linears are `inner` / `outer` (the
    original's in_layer / out_layer, diffusers' linear_1 / linear_2)."""
    g = "distilled_guidance_layer"
    layers = ops.children(f"{g}.layers")
    return Approximator(
        ops[f"{g}.in_proj"],
        [(ops[f"{g}.layers.{n}.{inner}"], ops[f"{g}.layers.{n}.{outer}"]) for n in layers],
        [ops[f"{g}.norms.{n}"] for n in layers],
        ops[f"{g}.out_proj"],
    )


def bind_diffusers(ops: Ops, architecture: str, dtype: torch.dtype) -> Flux:
    hidden = wshape(ops["x_embedder"])[0]
    chroma = "distilled_guidance_layer.in_proj" in ops
    doubles, singles = diffusers_blocks(ops, chroma)
    heads = _check_heads(doubles[0].img.q_norm if doubles else singles[0].q_norm, hidden, ops.what)
    if chroma:
        return Chroma(architecture, ops["x_embedder"], ops["context_embedder"], (), None, (), doubles, singles,
                      None, False, ops["proj_out"], heads, dtype, _approximator(ops, "linear_1", "linear_2"))  # fmt: skip
    te = "time_text_embed"
    guidance = (
        (ops[f"{te}.guidance_embedder.linear_1"], ops[f"{te}.guidance_embedder.linear_2"])
        if f"{te}.guidance_embedder.linear_1" in ops
        else None
    )
    return Flux(
        architecture, ops["x_embedder"], ops["context_embedder"],
        (ops[f"{te}.timestep_embedder.linear_1"], ops[f"{te}.timestep_embedder.linear_2"]), guidance,
        (ops[f"{te}.text_embedder.linear_1"], ops[f"{te}.text_embedder.linear_2"]), doubles, singles,
        ops["norm_out.linear"], True, ops["proj_out"], heads, dtype,
    )  # fmt: skip


def diffusers_blocks(ops: Ops, bare: bool = False) -> tuple[list[Double], list[Single]]:
    """The double and single blocks in diffusers' FLUX.1 naming (also Bria's, engine.denoise.bria); `bare`: without
    their modulation Linears (Chroma's)."""
    doubles = []
    for i in ops.children("transformer_blocks"):
        p = f"transformer_blocks.{i}"
        a = f"{p}.attn"
        img = Stream(None if bare else ops[f"{p}.norm1.linear"], Proj(None, parts=(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"])),
                     ops[f"{a}.norm_q"], ops[f"{a}.norm_k"], ops[f"{a}.to_out.0"],
                     ops[f"{p}.ff.net.0.proj"], ops[f"{p}.ff.net.2"])  # fmt: skip
        txt = Stream(None if bare else ops[f"{p}.norm1_context.linear"],
                     Proj(None, parts=(ops[f"{a}.add_q_proj"], ops[f"{a}.add_k_proj"], ops[f"{a}.add_v_proj"])),
                     ops[f"{a}.norm_added_q"], ops[f"{a}.norm_added_k"], ops[f"{a}.to_add_out"],
                     ops[f"{p}.ff_context.net.0.proj"], ops[f"{p}.ff_context.net.2"])  # fmt: skip
        doubles.append(Double(img, txt))
    singles = []
    for i in ops.children("single_transformer_blocks"):
        p = f"single_transformer_blocks.{i}"
        a = f"{p}.attn"
        lin1 = Proj(None, parts=(ops[f"{a}.to_q"], ops[f"{a}.to_k"], ops[f"{a}.to_v"], ops[f"{p}.proj_mlp"]))
        singles.append(
            Single(
                None if bare else ops[f"{p}.norm.linear"],
                lin1,
                ops[f"{a}.norm_q"],
                ops[f"{a}.norm_k"],
                ops[f"{p}.proj_out"],
            )
        )
    return doubles, singles
