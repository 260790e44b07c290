"""The weight change of each adapter algorithm, computed in fp32.

Formulas (facts, cited; no code copied):
* LoRA / LoCon (kohya `networks/lora.py`, LyCORIS `functional/locon.py`): ΔW = up @ down, flattened to
  2-D over the kernel; with a Tucker `lora_mid` (rank, rank, kh, kw):
  ΔW[o, i, …] = Σ_ab up[o, a] · mid[a, b, …] · down[b, i].
* LoHa (LyCORIS `functional/loha.py`): ΔW = (w1_a @ w1_b) ⊙ (w2_a @ w2_b); with Tucker cores
  hada_t1/t2 (w_a is (rank, out), w_b is (rank, in)): each half is Σ_ij t[i, j, …] · w_a[i, o] · w_b[j, in].
* LoKr (LyCORIS `functional/lokr.py`): ΔW = w1 ⊗ w2 (Kronecker), each half rebuilt from its `_a @ _b`
  factors; a Tucker `lokr_t2` rebuilds w2 as Σ_ij t2[i, j, …] · w2_a[i, o] · w2_b[j, in]; a conv w1 is
  broadcast over the kernel axes.
* Scale: alpha / rank per module (alpha absent → 1). LoKr with both halves stored whole uses scale 1
  (LyCORIS `modules/lokr.py` sets alpha = dim in that case); its rank is the inner dim of the factors.
* DoRA (LyCORIS `functional/general.py` `weight_decompose`, PEFT `tuners/lora/dora.py`):
  W' = m · (W + ΔW) / ‖W + ΔW‖, the norm taken per output row (LyCORIS `wd_on_out=True`, dora_scale
  shaped (out, 1, …); PEFT's `lora_magnitude_vector`, (out,) or (1, out, 1, 1) for convolutions) or per
  input column (LyCORIS `wd_on_out=False`, dora_scale shaped (1, in, …)). LyCORIS adds the dtype's eps
  to the norm. The strength s interpolates: W + s · (W' − W), so strength 0 leaves W untouched
  (as ComfyUI's `weight_decompose` does).
"""

from __future__ import annotations

import math


def _f32(t):
    import torch

    return None if t is None else t.to(torch.float32)


def lora_delta(up, down, mid=None):
    """ΔW of LoRA / LoCon, unscaled, shaped (out, in, *kernel)."""
    import torch

    up, down, mid = _f32(up), _f32(down), _f32(mid)
    rank = down.shape[0]
    u = up.reshape(up.shape[0], -1)
    if mid is None:
        d = down.reshape(rank, -1)
        kernel = tuple(down.shape[2:])
        return (u @ d).reshape(up.shape[0], down.shape[1], *kernel)
    d = down.reshape(rank, -1)  # (rank, in)
    out = torch.einsum("ab...,oa,bi->oi...", mid, u, d)
    return out


def _tucker(t, wa, wb):
    # t (r, r, *k), wa (r, out), wb (r, in) -> (out, in, *k)
    import torch

    return torch.einsum("ij...,io,jn->on...", t, wa, wb)


def loha_delta(w1a, w1b, w2a, w2b, t1=None, t2=None):
    """ΔW of LoHa, unscaled."""
    w1a, w1b, w2a, w2b, t1, t2 = map(_f32, (w1a, w1b, w2a, w2b, t1, t2))
    if t1 is not None and t2 is not None:
        return _tucker(t1, w1a, w1b) * _tucker(t2, w2a, w2b)
    return (w1a @ w1b.reshape(w1b.shape[0], -1)) * (w2a @ w2b.reshape(w2b.shape[0], -1))


def lokr_delta(w1=None, w1a=None, w1b=None, w2=None, w2a=None, w2b=None, t2=None):
    """ΔW of LoKr, unscaled (kron of the two halves)."""
    import torch

    w1, w1a, w1b, w2, w2a, w2b, t2 = map(_f32, (w1, w1a, w1b, w2, w2a, w2b, t2))
    if w1 is None:
        w1 = w1a @ w1b
    if w2 is None:
        if t2 is not None:
            w2 = _tucker(t2, w2a, w2b)
        else:
            rank = w2b.shape[0]
            w2 = (w2a @ w2b.reshape(rank, -1)).reshape(w2a.shape[0], *w2b.shape[1:])
    while w1.dim() < w2.dim():
        w1 = w1.unsqueeze(-1)
    # Standard strides, not just "contiguous": a Tucker w2 of a 1x1 kernel comes out of einsum with
    # strides (3, 1, 6, 6) on its size-1 dims, which .contiguous() keeps and torch.kron's view refuses
    # (found by tests/engine/test_lora_shapes.py). The flat view gives the same values with plain strides.
    return torch.kron(w1.reshape(-1).view(w1.shape), w2.reshape(-1).view(w2.shape))


def lokr_rank(w1a=None, w1b=None, w2a=None, w2b=None) -> int | None:
    """The LoKr module's dim (None when both halves are stored whole: scale 1)."""
    rank = None
    if w1b is not None:
        rank = w1b.shape[0]
    if w2b is not None:
        rank = w2b.shape[0]
    return rank


def fit(delta, shape):
    """ΔW reshaped onto the target's shape (a Linear LoRA on a 1×1 conv, a LoKr conv folded in w2)."""
    if tuple(delta.shape) == tuple(shape):
        return delta
    if delta.numel() != math.prod(shape):
        raise ValueError(
            f"a change of shape {tuple(delta.shape)} cannot patch a weight of shape {tuple(shape)}"
        )
    return delta.reshape(shape)


def dora_apply(weight, delta, magnitude, strength: float, *, peft: bool):
    """W + s · (m · (W + ΔW) / ‖W + ΔW‖ − W), all fp32; the norm axis follows the magnitude's shape."""
    import torch

    w = _f32(weight)
    merged = w + _f32(delta)
    m = _f32(magnitude)
    if w.dim() < 2:
        raise ValueError(f"a DoRA magnitude cannot decompose a weight of shape {list(w.shape)}")
    out_ch = w.shape[0]
    on_out = peft or (m.numel() == out_ch and (m.dim() <= 1 or m.shape[0] == out_ch))
    if m.numel() != (out_ch if on_out else w.shape[1]):
        raise ValueError(
            f"a DoRA magnitude of shape {list(m.shape)} fits neither the output nor the input channels "
            f"of a weight of shape {list(w.shape)}"
        )
    rest = [1] * (w.dim() - 1)
    eps = torch.finfo(torch.float32).eps
    if on_out:
        norm = merged.reshape(out_ch, -1).norm(dim=1).reshape(out_ch, *rest) + eps
        m = m.reshape(out_ch, *rest)
    else:
        in_ch = w.shape[1]
        norm = (
            merged.transpose(0, 1).reshape(in_ch, -1).norm(dim=1).reshape(in_ch, *rest).transpose(0, 1) + eps
        )
        m = m.reshape(1, in_ch, *rest[1:])
    decomposed = merged * (m / norm)
    return w + strength * (decomposed - w)


def delta_shape(p: dict, algo: str) -> tuple[int, ...] | None:
    """The shape lora_delta / loha_delta / lokr_delta give for parts of these shapes (part -> shape),
    without computing anything; a ValueError where they would fail, or where the factors are not the
    matrices the formats write (2-D `_a` / `_b` halves, an up of (out, rank) or (out, rank, 1, 1)).
    None for parts that are not one of those three (a full `diff`, a norm: their own shape)."""
    if algo in ("lora", "locon"):
        up, down, mid = p["up"], p["down"], p.get("mid")
        if len(up) < 2 or len(down) < 2:
            raise ValueError(f"up {list(up)} and down {list(down)} are not matrices")
        cols, rank, ins = math.prod(up[1:]), down[0], math.prod(down[1:])
        if mid is None:
            if cols != rank:
                raise ValueError(f"up {list(up)} does not multiply down {list(down)}")
            return (up[0], down[1], *down[2:])
        if len(mid) < 2 or mid[0] != cols or mid[1] != rank:
            raise ValueError(f"the Tucker core {list(mid)} joins neither up {list(up)} nor down {list(down)}")
        return (up[0], ins, *mid[2:])
    if algo == "loha":
        if "hada_t1" in p and "hada_t2" in p:
            one = _tucker_shape(p["hada_t1"], p["hada_w1_a"], p["hada_w1_b"])
            two = _tucker_shape(p["hada_t2"], p["hada_w2_a"], p["hada_w2_b"])
        else:
            one = _product_shape(p["hada_w1_a"], p["hada_w1_b"])
            two = _product_shape(p["hada_w2_a"], p["hada_w2_b"])
        if one != two:
            raise ValueError(f"the two halves are {list(one)} and {list(two)}")
        return one
    if algo == "lokr":
        w1 = p.get("lokr_w1") or _product_shape(p["lokr_w1_a"], p["lokr_w1_b"], whole=True)
        w2 = p.get("lokr_w2")
        if w2 is None:
            if "lokr_t2" in p:
                w2 = _tucker_shape(p["lokr_t2"], p["lokr_w2_a"], p["lokr_w2_b"])
            else:
                w2 = (p["lokr_w2_a"][0], *p["lokr_w2_b"][1:])
                _product_shape(p["lokr_w2_a"], p["lokr_w2_b"])
        if not w1 or not w2:
            raise ValueError(f"a Kronecker half of no dimension ({list(w1)}, {list(w2)})")
        w1 = tuple(w1) + (1,) * (len(w2) - len(w1))  # lokr_delta's trailing unsqueeze
        w2 = (1,) * (len(w1) - len(w2)) + tuple(w2)  # torch.kron's leading one
        return tuple(a * b for a, b in zip(w1, w2, strict=True))
    return None


def _product_shape(a, b, whole: bool = False) -> tuple[int, ...]:
    """a @ b.reshape(b[0], -1) (`whole`: a @ b, both matrices)."""
    if len(a) != 2 or len(b) < (2 if whole else 1) or (whole and len(b) != 2) or a[1] != b[0]:
        raise ValueError(f"{list(a)} @ {list(b)} do not multiply")
    return (a[0], math.prod(b[1:]))


def _tucker_shape(t, wa, wb) -> tuple[int, ...]:
    if len(t) < 2 or len(wa) != 2 or len(wb) != 2 or wa[0] != t[0] or wb[0] != t[1]:
        raise ValueError(f"the Tucker core {list(t)} joins neither {list(wa)} nor {list(wb)}")
    return (wa[1], wb[1], *t[2:])
