"""Adapters whose change depends on the weight they patch: OFT, BOFT, GLoRA and (IA)³, in fp32.

A LoRA adds ΔW whatever W is; these rotate, rescale or multiply W itself, so their patch is computed
from the weight (`AdapterModule.patch_weight` calls the functions below), and the header can only say
which weights they fit (`fits_weight`). Formulas (facts of LyCORIS `lycoris/modules/{diag_oft,boft,glora,ia3}.py` and
`lycoris/functional/{diag_oft,boft}.py`, the reference that writes these files; no code copied):

* Diag-OFT (`oft_blocks` (n, b, b), n·b = out): Q = B − Bᵀ per block (skew), scaled down to norm
  `constraint · out` when its Frobenius norm (over all blocks, +1e-8) exceeds that (`alpha` holds the
  constraint; 0: none); R = (I + Q)(I − Q)⁻¹ (Cayley: orthogonal). Each block of b output rows becomes
  Σ_n M[k, n, m] · W[k·b + n] with M = I + s·(R − I) at strength s (kohya sd-scripts `networks/oft.py`
  applies the same Rᵀ to each block). An optional `rescale` (out, 1, …) multiplies the rows after.
* BOFT (`oft_blocks` (m, n, b, b)): m butterfly stages; stage i views the rows as (-1, 2, k) with
  k = 2ⁱ·b/2, swaps the last two axes (a fixed permutation P), multiplies each run of b rows by
  Mᵢ = s·Rᵢ + (1 − s)·I (R @ rows, not Rᵀ), and undoes P. Then `rescale`.
* GLoRA (`a1`, `a2`, `b1`, `b2` [, Tucker `bm`]): ΔW = (alpha / r) · (W·A + B) with A = a1·a2 acting on
  the input channels (W·a1 then ·a2, as LyCORIS orders it) and B = b1·b2 (or Σ b1·bm·b2). LyCORIS ≥ 2
  stores a1 (in, r), a2 (r, in), b1 (out, r), b2 (r, in, *k); LyCORIS 1 stored a1 (r, in), a2 (in, r),
  b1 (r, in), b2 (out, r) with ΔW = W·a2·a1 + b2·b1 (ComfyUI `weight_adapter/glora.py` tells the two
  apart by the same shape relations, preferring the new one when both hold).
* (IA)³ (`weight`, `on_input`): W ⊙ (1 + s·v), v along the output rows (on_input 0) or the input
  channels (1); a conv's v is stored (1, C, 1, 1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .algos import _f32

WEIGHTED = frozenset({"oft", "boft", "glora", "ia3"})


# ---------------------------------------------------------------- header side (torch-free)


def glora_layout(sh: Mapping[str, tuple[int, ...]]) -> str | None:
    """'new' (LyCORIS ≥ 2), 'old' (LyCORIS 1) or None when the four factors fit neither layout."""
    a1, a2, b1, b2 = (tuple(sh.get(p) or ()) for p in ("glora_a1", "glora_a2", "glora_b1", "glora_b2"))
    if min(len(a1), len(a2), len(b1), len(b2)) < 2:
        return None
    if a1[1] == a2[0] == b1[1] == b2[0] and a1[0] == a2[1] == b2[1]:
        return "new"
    if a1[0] == a2[1] == b1[0] == b2[1] and a2[0] == a1[1] == b1[1]:
        return "old"
    return None


def facts(algo: str, sh: Mapping[str, tuple[int, ...]]) -> tuple[int | None, int | None, int | None]:
    """(rank, out, in) as far as the parts' shapes say (None where they do not); no validation."""
    if algo in ("oft", "boft"):
        b = tuple(sh.get("oft_blocks") or ())
        return None, (b[-3] * b[-1] if len(b) >= 3 else None), None
    if algo == "glora":
        layout = glora_layout(sh)
        if layout == "new":
            return sh["glora_a2"][0], sh["glora_b1"][0], sh["glora_a2"][1]
        if layout == "old":
            return sh["glora_a1"][0], sh["glora_b2"][0], sh["glora_b1"][1]
    return None, None, None


def check(algo: str, sh: Mapping[str, tuple[int, ...]]) -> None:
    """A ValueError naming what is wrong when the parts cannot patch any weight."""
    if algo in ("oft", "boft"):
        b = tuple(sh["oft_blocks"])
        want = 3 if algo == "oft" else 4
        if len(b) != want or b[-1] != b[-2]:
            raise ValueError(f"oft_blocks {list(b)} are not {'n' if want == 3 else 'm, n'} square blocks")
        out = b[-3] * b[-1]
        if algo == "boft":
            stages, size = b[0], b[-1]
            if stages < 1 or size % 2 or out % (size << (stages - 1)):
                raise ValueError(
                    f"{stages} butterfly stages of {size}-wide blocks do not divide {out} rows "
                    f"(each stage pairs rows 2^i·{size // 2} apart)"
                )
        r = sh.get("rescale")
        if r is not None and math.prod(r) != out:
            raise ValueError(f"rescale {list(r)} holds {math.prod(r)} values for {out} rows")
    elif algo == "glora":
        layout = glora_layout(sh)
        if layout is None:
            listed = ", ".join(f"{p[6:]} {list(sh[p])}" for p in sh if p.startswith("glora_"))
            raise ValueError(f"the GLoRA factors ({listed}) do not share a rank")
        bm = sh.get("glora_bm")
        if bm is not None and (
            layout != "new" or len(bm) < 2 or bm[0] != bm[1] or bm[0] != sh["glora_b1"][1]
        ):
            raise ValueError(f"the Tucker core bm {list(bm)} joins neither b1 nor b2")
        if layout == "old" and len(sh["glora_b2"]) != 2:
            raise ValueError(f"a LyCORIS 1 GLoRA is linear; b2 is {list(sh['glora_b2'])}")
    elif algo == "ia3":
        on = sh.get("on_input")
        if on is not None and math.prod(on) != 1:
            raise ValueError(f"on_input holds {math.prod(on)} values, not one flag")


def fits_weight(algo: str, sh: Mapping[str, tuple[int, ...]], target: tuple[int, ...]) -> bool:
    """Whether the module can patch a weight of shape `target` (header-only: an (IA)³ vector may fit
    either side; the patch reads `on_input` and refuses the wrong one)."""
    if len(target) < 2:
        return False
    if algo in ("oft", "boft"):
        b = sh["oft_blocks"]
        return b[-3] * b[-1] == target[0]
    if algo == "glora":
        layout = glora_layout(sh)
        if layout == "new":
            kernel = tuple(sh["glora_bm"][2:]) if "glora_bm" in sh else tuple(sh["glora_b2"][2:])
            change = (sh["glora_b1"][0], sh["glora_b2"][1], *kernel)
        else:
            change = (sh["glora_b2"][0], sh["glora_b1"][1])
        ins = sh["glora_a1"][0] if layout == "new" else sh["glora_a2"][0]
        return change[0] == target[0] and target[1] == ins and math.prod(change) == math.prod(target)
    if algo == "ia3":
        n = math.prod(sh["ia3"])
        return n in (target[0], target[1])
    return False


# ---------------------------------------------------------------- the math (torch, fp32)


def cayley(blocks, constraint: float):
    """R = (I + Q)(I − Q)⁻¹ per block for Q = B − Bᵀ, Q scaled to `constraint` when its norm is larger
    (constraint ≤ 0: never). I − Q is invertible for any real skew Q (its eigenvalues are 1 − iλ)."""
    import torch

    b = _f32(blocks)
    q = b - b.transpose(-1, -2)
    if constraint > 0:
        norm = torch.linalg.vector_norm(q) + 1e-8
        if norm > constraint:
            q = q * constraint / norm
    eye = torch.eye(b.shape[-1], dtype=torch.float32, device=b.device)
    return (eye + q) @ torch.linalg.inv(eye - q)


def _rescaled(w, rescale):
    """w (a fresh result) times the per-row rescale, in place."""
    return w if rescale is None else w.mul_(_f32(rescale).reshape(w.shape[0], *[1] * (w.dim() - 1)))


def oft_weight(w, blocks, rescale, constraint: float, strength: float, rows: tuple[int, int] | None = None):
    """`rows`: w is rows (start, length) of the weight the blocks rotate (a fused weight's split share); the blocks
    are made from all of them (the constraint is over every block), those of its own rows rotate it."""
    n, size, _ = blocks.shape
    start, length = rows or (0, n * size)
    if length != w.shape[0] or start % size or length % size or start + length > n * size:
        raise ValueError(f"{n} OFT blocks of {size} rows cannot rotate a weight of {w.shape[0]} rows")
    r = cayley(blocks, constraint * n * size)[start // size : (start + length) // size]
    n = length // size
    if strength != 1.0:
        eye = _eye(size, r)
        r = eye + strength * (r - eye)
    # Σ_n M[k, n, m] · W[k, n, :] = Mᵀ @ W per block of rows
    out = r.transpose(1, 2) @ w.reshape(n, size, -1)
    return _rescaled(out.reshape(w.shape), rescale)


def boft_weight(w, blocks, rescale, constraint: float, strength: float):
    import torch

    stages, n, size, _ = blocks.shape
    rows = w.shape[0]
    if stages < 1 or n * size != rows or size % 2 or rows % (size << (stages - 1)):
        raise ValueError(f"{stages}×{n} BOFT blocks of {size} rows cannot rotate a weight of {rows} rows")
    r = cayley(blocks, constraint * rows)
    x = w.reshape(rows, -1)
    cols = x.shape[1]
    if strength != 1.0:
        r = strength * r + (1 - strength) * _eye(size, r)
    # Stage i permutes the rows (viewed (-1, 2, span), the last two axes swapped), mixes each run of
    # `size` permuted rows by its block and permutes back. The way back of one stage and the way into
    # the next are one gather of rows: stages + 1 row copies instead of two per stage (a quarter to a
    # third faster on SDXL's layers, the same bits).
    perms = [
        torch.arange(rows, device=w.device).view(-1, 2, (size // 2) << i).transpose(1, 2).reshape(-1)
        for i in range(stages)
    ]
    gathers = [
        perms[0],
        *(torch.argsort(perms[i])[perms[i + 1]] for i in range(stages - 1)),
        torch.argsort(perms[-1]),
    ]
    # Every stage mixes rows only, so the columns go through all the stages a slice at a time, the slice
    # small enough to stay in the CPU's cache across the 2·stages passes: SDXL's 10240 × 1280 feed-forward
    # weight (10 stages) 5.8× as fast as whole (each pass then streamed 52 MB from RAM), its 1280² layers
    # 4.8×, the same bits. Slices of 32 to 256 columns measured here: 128 within 20 % of the best on each
    # of SDXL's shapes.
    out = torch.empty_like(x)
    step = cols if w.device.type != "cpu" else BOFT_SLICE_COLUMNS
    for c in range(0, cols, step):
        z = x[:, c : c + step].index_select(0, gathers[0])
        width = z.shape[1]
        for i in range(stages):
            z = torch.matmul(r[i], z.view(n, size, width)).view(rows, width).index_select(0, gathers[i + 1])
        out[:, c : c + step] = z
    return _rescaled(out.reshape(w.shape), rescale)


BOFT_SLICE_COLUMNS = 128  # the columns a CPU rotates through every BOFT stage at once (see boft_weight)


def _eye(size: int, like):
    import torch

    return torch.eye(size, dtype=like.dtype, device=like.device)


def glora_delta(w, a1, a2, b1, b2, bm=None):
    """ΔW of GLoRA, unscaled (alpha / rank not applied), shaped like `w`."""
    import torch

    a1, a2, b1, b2, bm = map(_f32, (a1, a2, b1, b2, bm))
    shapes = {"glora_a1": a1.shape, "glora_a2": a2.shape, "glora_b1": b1.shape, "glora_b2": b2.shape}
    if glora_layout(shapes) == "new":
        first, second, up, down = a1, a2, b1, b2
    else:
        first, second, up, down = a2, a1, b2, b1
    first, second = first.reshape(first.shape[0], -1), second.reshape(second.shape[0], -1)
    # W acting on the input channels: move them last, multiply, move back
    wi = w.movedim(1, -1)
    wa = ((wi @ first) @ second).movedim(-1, 1)
    u = up.reshape(up.shape[0], -1)
    if bm is not None:
        wb = torch.einsum("ab...,oa,bi->oi...", bm, u, down.reshape(down.shape[0], -1))
    else:
        wb = u @ down.reshape(down.shape[0], -1)
    return wa.add_(wb.reshape(w.shape))


def ia3_weight(w, vec, on_input: bool, strength: float, *, in_place: bool = False):
    axis = 1 if on_input else 0
    v = _f32(vec).reshape(-1)
    if v.numel() != w.shape[axis]:
        side = "input channels" if on_input else "output rows"
        raise ValueError(f"an (IA)³ vector of {v.numel()} values for {w.shape[axis]} {side}")
    shape = [1] * w.dim()
    shape[axis] = -1
    scale = (v * strength + 1).view(shape)
    return w.mul_(scale) if in_place else w * scale
