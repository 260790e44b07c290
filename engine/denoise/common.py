"""Pieces both denoisers use: sinusoidal embeddings, multi-head attention, and picking a module tree's
ops by path.

Facts (cited, not copied): the sinusoidal embedding is the one of OpenAI's guided-diffusion `nn.py`
kept by CompVis `ldm/modules/diffusionmodules/util.py` (`timestep_embedding`: `half = dim // 2`
frequencies exp(-ln(10000) * i / half), cosines first, then sines) and by black-forest-labs/flux
`modules/layers.py` (the same, after scaling t by 1000); diffusers' `get_timestep_embedding` with
`flip_sin_to_cos=True, downscale_freq_shift=0` is the same function.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..errors import FormatError, UnsupportedModel


def wshape(op) -> tuple[int, ...]:
    """The logical shape of an op's weight: a quantized weight (GGUF blocks) is held as flat uint8
    bytes, its shape recorded in `op.quantized` (engine.ops); every other weight is what it says."""
    q = getattr(op, "quantized", {}).get(getattr(op, "weight_attr", "weight"))
    if q is not None:
        return tuple(q.shape)
    return tuple(getattr(op, getattr(op, "weight_attr", "weight")).shape)


def held(module, attr: str, device=None) -> torch.Tensor:
    """A plain holder's tensor (a pad token, a modulation table, a position embedding) as its values: one
    held as ggml blocks (engine.model.tree: stable-diffusion.cpp's GGUFs quantize them) or scaled (a norm's
    weight in a scaled-fp8 file) is dequantized to float32 -- on `device` when given, its stored bytes
    moved there first (smaller than its values)."""
    t = getattr(module, attr)
    spec = getattr(module, "quantized", {}).get(attr)
    if spec is None:
        return t
    if device is not None:
        t = t.to(device)
    if hasattr(spec, "bind"):  # a scaled fp8 / int8 weight: its scale is another of the holder's tensors
        spec = spec.bind(module)
    return spec.dequantize(t, torch.float32)


def held_shape(module, attr: str) -> tuple[int, ...]:
    """The logical shape of a plain holder's tensor (a quantized one is held as flat bytes)."""
    spec = getattr(module, "quantized", {}).get(attr)
    return tuple(spec.shape) if spec is not None else tuple(getattr(module, attr).shape)


def check_grid(h: int, w: int, m: int) -> None:
    """A latent of h × w 2×2 patches must fit a learned position table of m × m (SD3's, AuraFlow's): a
    FormatError that says the largest size in pixels (a patch is 16 pixels: 2 latent pixels of 8)."""
    if h > m or w > m:
        raise FormatError(
            f"a {16 * w}×{16 * h} px image ({w}×{h} patches) is larger than this model's positions "
            f"({m}×{m} patches, {16 * m} px a side): choose a smaller size"
        )


def timestep_embedding(t: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """[N] (fractional) timesteps -> [N, dim] float32: cos(t·f_i) then sin(t·f_i), f_i = P^(-i/half)."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = t.float()[:, None] * freqs[None]
    emb = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb


LN_EPS = 1e-6  # the DiTs' affine-free LayerNorms (FLUX.1, Chroma, SD3, Qwen-Image)


def layer_norm_with(op, x: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm over x's last axis with `op`'s weight and bias (cast, patched and streamed as the op's
    own forward would): for a norm the module tree typed as a GroupNorm because nothing in its path says
    LayerNorm (Wan 2.1's `img_emb.proj.0`, a VACE block's `norm3`), which the architecture knows to be one."""
    if op.compute_dtype is not None and x.dtype != op.compute_dtype:
        x = x.to(op.compute_dtype)
    w, b = op.cast_params(x)
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def rms_norm_with(op, x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over x's last axis with `op`'s weight (cast, patched and streamed as its own forward would)
    at the architecture's eps (the module tree gives its RMSNorms a default the file does not hold: Z-Image's
    are 1e-5)."""
    if op.compute_dtype is not None and x.dtype != op.compute_dtype:
        x = x.to(op.compute_dtype)
    w, _ = op.cast_params(x)
    return F.rms_norm(x, (x.shape[-1],), w, eps)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    """LayerNorm over the last axis without affine parameters (eps 1e-6)."""
    return F.layer_norm(x, (x.shape[-1],), eps=LN_EPS)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """[B, N, heads·d] -> [B, heads, N, d]."""
    b, n, inner = x.shape
    return x.reshape(b, n, heads, inner // heads).transpose(1, 2)


def merge_heads(o: torch.Tensor) -> torch.Tensor:
    """[B, heads, N, d] -> [B, N, heads·d]."""
    b, h, n, d = o.shape
    return o.transpose(1, 2).reshape(b, n, h * d)


def rope(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on interleaved pairs (x[2i], x[2i+1]): `pe` [..., d/2, 2, 2] rotations (FLUX.1's
    layout, engine.denoise.flux.rope_table), computed in float32."""
    xf = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = pe[..., 0] * xf[..., 0] + pe[..., 1] * xf[..., 1]
    return out.reshape(x.shape).type_as(x)


def mlp2(pair, x: torch.Tensor) -> torch.Tensor:
    """Linear, SiLU, Linear (the embedders of FLUX.1, SD3, Qwen-Image and Chroma's layers)."""
    return pair[1](F.silu(pair[0](x)))


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int) -> torch.Tensor:
    """Multi-head scaled dot-product attention over [B, N, heads·d] projections (scale d^-1/2, as
    ldm's CrossAttention and diffusers' Attention use); returns [B, N, heads·d]."""
    b, n, inner = q.shape
    d = inner // heads
    q, k, v = (t.reshape(b, -1, heads, d).transpose(1, 2) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v)
    return out.transpose(1, 2).reshape(b, n, inner)


@dataclass
class NormedAttn:
    """An attention's q, k, v and output projections with q / k norms (LTX-Video's, LTX-2's, Cosmos', Anima's
    adapter's), and LTX-2.3's per-head output gate where it has one; fetched in call order: q, its norm, k, its
    norm, v, the gate, o."""

    q: object
    k: object
    v: object
    o: object
    q_norm: object
    k_norm: object
    gate: object | None = None

    def ops(self) -> list:
        gate = [self.gate] if self.gate is not None else []
        return [self.q, self.q_norm, self.k, self.k_norm, self.v, *gate, self.o]


class Ops:
    """The castable ops of one component by (architecture-native) path: `ops["input_blocks.1.0.in_layers.2"]`.
    A missing path says which file key was expected, so a truncated or foreign file fails clearly."""

    def __init__(self, by_path: Mapping[str, object], what: str):
        self.by_path = dict(by_path)
        self.what = what
        self.used: set[int] = set()  # the ids of the modules a binder took: the forward's layers

    def __getitem__(self, path: str):
        m = self.by_path.get(path)
        if m is None:
            raise UnsupportedModel(f"{self.what}: no module {path!r} — not a layout Loadout can run")
        self.used.add(id(m))
        return self._layer(path, m)

    def get(self, path: str):
        m = self.by_path.get(path)
        if m is None:
            return None
        self.used.add(id(m))
        return self._layer(path, m)

    def _layer(self, path: str, m):
        """`m` where it is an op. A bare holder of a `weight` (the component builds one where a module's
        tensors fit no op: a norm whose bias is int8, a conv weight of one dimension) is a damaged
        file, said here rather than as torch's missing `forward` or `kernel_size` mid-step; so is a
        holder of a `bias` alone (a layer whose weight is missing); holders of other tensors (SD3's
        `pos_embed`) are what some layouts keep beside their layers."""
        held_names = {*m._parameters, *m._buffers}
        if type(m) is torch.nn.Module and ("weight" in held_names or "bias" in held_names):
            held = ", ".join(
                f"{k} {str(t.dtype).removeprefix('torch.')} {list(t.shape)}"
                for k, t in (*m._parameters.items(), *m._buffers.items())
                if t is not None
            )
            raise FormatError(
                f"{self.what}: {path!r} holds {held or 'no tensors'}, not the tensors of a layer "
                "(a damaged or edited file?)"
            )
        return m

    def __contains__(self, path: str) -> bool:
        return path in self.by_path

    def renamed(self, by_path: Mapping[str, object]) -> Ops:
        """The same ops under other paths (a diffusers-named file read by its native paths), counting
        what is taken into the same `used`."""
        other = Ops(by_path, self.what)
        other.used = self.used
        return other

    def take(self, m) -> None:
        """Count `m` (a module a binder reads outside these ops: a plain holder of a table) as used."""
        self.used.add(id(m))

    def children(self, prefix: str) -> list[int]:
        """The numeric child indices under `prefix.` (e.g. the input blocks), sorted."""
        n = len(prefix) + 1
        found = set()
        for p in self.by_path:
            if p.startswith(prefix + "."):
                head = p[n:].split(".", 1)[0]
                if head.isdigit():
                    found.add(int(head))
        return sorted(found)

    def has_prefix(self, prefix: str) -> bool:
        return any(p == prefix or p.startswith(prefix + ".") for p in self.by_path)


class Taken(dict):
    """A path -> module mapping that counts what a binder reads from it into `ops.used` (Wan's plain
    holders of `modulation` tables)."""

    def __init__(self, mapping: Mapping[str, object], ops: Ops):
        super().__init__(mapping)
        self.ops = ops

    def __getitem__(self, path: str):
        m = super().__getitem__(path)
        self.ops.take(m)
        return m

    def get(self, path: str, default=None):
        m = super().get(path, default)
        if path in self:
            self.ops.take(m)
        return m


def unused_layers(mods: Mapping[str, object], ops: Ops) -> list[str]:
    """The paths of `mods` that hold tensors and that the bound forward never took: layers of a variant
    the forward does not compute (AnimateDiff's motion modules in an SD1 UNet, a Wan finetune's extra
    embedder). A forward that ran without them would be another model's, silently."""
    return sorted(
        p
        for p, m in mods.items()
        if id(m) not in ops.used
        and any(t is not None and t.numel() for t in (*m._parameters.values(), *m._buffers.values()))
    )
