"""Fused release modules: the one place that says which of a release's weights are diffusers' weights stacked by rows.

Where the original release fuses what diffusers splits (NextDiT's `attention.qkv`, PixArt's `attn.qkv`, Mochi's
`qkv_x`, Hunyuan-DiT's `Wqkv` and `kv_proj`, Wan Animate's `linear1_kv`, MiniMax-H3's `qkv_proj`, Qwen-Image 2.1's
ComfyUI `gate_up`), the fused module's weight is diffusers' weights stacked by rows, in the order listed here. Both
directions read these entries:
* `row_views`: a base holding the fused weight answers diffusers' names as row views of it (a PEFT LoRA on a
  release-named file);
* `split_names`: a module trained on the fused weight (musubi-tuner, kohya, diffusion-pipe and ComfyUI name the
  release's modules) names the split weights of a diffusers-named base, each receiving its own row block of the
  module's change. The row lengths are the split weights' own rows.
Row lengths on a fused weight: equal blocks, except NextDiT's grouped-query qkv (Lumina 2): q as wide as the block's
output projection, k and v sharing the rest. Facts from the converters of the rename tables (diffusers
`loaders/single_file_utils.py`: `convert_z_image_transformer_checkpoint_to_diffusers`, `convert_lumina2_to_diffusers`,
`convert_mochi_transformer_checkpoint_to_diffusers`, `convert_wan_transformer_to_diffusers`,
`convert_qwen_image21_transformer_checkpoint_to_diffusers`; `scripts/convert_hunyuandit_to_diffusers.py`,
`convert_sana_transformer_to_diffusers`); tests/engine/test_lora_fused.py holds both directions to one answer.
"""

from __future__ import annotations

from collections.abc import Mapping

from .dit_names import View
from .family_names import LUMINA2, WAN, Z_IMAGE, tables_for
from .family_names_dits import HUNYUAN_DIT, MINIMAX_H3, MOCHI, PIXART, SANA, template_pattern

# A piece: (base path, view of the base weight, first row of the module's change it receives, rows).
Piece = tuple[str, View, int, int]

_NEXTDIT = ("layers", "noise_refiner", "context_refiner")
_QKV = tuple("qkv")
_PIXART = (
    ("blocks.{n}.attn.qkv", tuple(f"transformer_blocks.{{n}}.attn1.to_{c}" for c in _QKV)),
    (
        "blocks.{n}.cross_attn.kv_linear",
        ("transformer_blocks.{n}.attn2.to_k", "transformer_blocks.{n}.attn2.to_v"),
    ),
)
# table -> (the release's fused module, diffusers' modules its rows are, in order)
_FUSED: dict[int, tuple[tuple[str, tuple[str, ...]], ...]] = {
    id(Z_IMAGE): tuple(
        (f"{s}.{{n}}.attention.qkv", tuple(f"{s}.{{n}}.attention.to_{c}" for c in _QKV))
        for s in (*_NEXTDIT, "siglip_refiner")
    ),
    id(LUMINA2): tuple(
        (f"{s}.{{n}}.attention.qkv", tuple(f"{s}.{{n}}.attn.to_{c}" for c in _QKV)) for s in _NEXTDIT
    ),
    id(PIXART): _PIXART,
    id(SANA): _PIXART,
    id(MOCHI): (
        ("blocks.{n}.attn.qkv_x", tuple(f"transformer_blocks.{{n}}.attn1.to_{c}" for c in _QKV)),
        ("blocks.{n}.attn.qkv_y", tuple(f"transformer_blocks.{{n}}.attn1.add_{c}_proj" for c in _QKV)),
    ),
    id(HUNYUAN_DIT): (
        ("blocks.{n}.attn1.Wqkv", tuple(f"blocks.{{n}}.attn1.to_{c}" for c in _QKV)),
        ("blocks.{n}.attn2.kv_proj", ("blocks.{n}.attn2.to_k", "blocks.{n}.attn2.to_v")),
    ),
    id(WAN): (
        ("face_adapter.fuser_blocks.{n}.linear1_kv", ("face_adapter.{n}.to_k", "face_adapter.{n}.to_v")),
    ),
    # MiniMax-H3's single files stack [q; k; v], in both its stacks
    id(MINIMAX_H3): tuple(
        (f"{o}.{{n}}.attn.qkv_proj", tuple(f"{d}.{{n}}.attn.to_{c}" for c in _QKV))
        for o, d in (
            ("blocks", "transformer_blocks"),
            ("token_refiner.blocks", "token_refiner.refiner_blocks"),
        )
    ),
}
# Qwen-Image 2.1 has no table (its release keeps diffusers' names); ComfyUI's files fuse each SwiGLU, gate rows first.
_GATE_UP = (
    (
        "transformer_blocks.{n}.img_mlp.gate_up",
        ("transformer_blocks.{n}.img_mlp.gate_layer", "transformer_blocks.{n}.img_mlp.proj"),
    ),
)
_COMPILED: dict[tuple, list] = {}
_COMPILED_FUSED: dict[tuple, list] = {}
# The last name of every first piece: a base with none of them (any release-named one) has nothing to split.
_FIRSTS = tuple({"." + pieces[0].rsplit(".", 1)[1] for e in (*_FUSED.values(), _GATE_UP) for _, pieces in e})
# The last name of every fused module: a base with none of them has no row views to give.
_FUSED_LASTS = tuple({"." + fused.rsplit(".", 1)[1] for e in (*_FUSED.values(), _GATE_UP) for fused, _ in e})


def _groups(shapes: Mapping[str, tuple[int, ...]], gate_up: str) -> list:
    """The fused-module entries of the tables a base's paths call for (and Qwen-Image 2.1's SwiGLU, told by `gate_up`:
    the last name its base holds in the direction asked)."""
    groups = [_FUSED[id(t)] for t in tables_for(shapes) if id(t) in _FUSED]
    if any(p.endswith(gate_up) for p in shapes):
        groups.append(_GATE_UP)
    return groups


def row_views(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, View]]:
    """For a base's module paths (path -> weight shape): every diffusers name of a row block of a fused weight the base
    holds -> (the fused path, its rows view)."""
    if not any(p.endswith(_FUSED_LASTS) for p in shapes):
        return {}
    out: dict[str, tuple[str, View]] = {}
    for entries in _groups(shapes, ".img_mlp.gate_up"):
        compiled = _COMPILED_FUSED.get(entries)
        if compiled is None:
            compiled = _COMPILED_FUSED[entries] = [(template_pattern(f), pieces) for f, pieces in entries]
        for path, shape in shapes.items():
            for fused, pieces in compiled:
                m = fused.match(path)
                rows = _rows(path, shape, len(pieces), shapes) if m else None
                if rows is None:
                    continue
                start = 0
                for piece, n in zip(pieces, rows, strict=True):
                    out.setdefault(piece.replace("{n}", m.group(1)), (path, ("rows", start, n)))
                    start += n
                break
    return out


def _rows(
    path: str, shape: tuple[int, ...], parts: int, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[int, ...] | None:
    """Each piece's rows in a fused weight of `shape` (None: not a weight of that many pieces)."""
    if len(shape) < 2:
        return None
    total = shape[0]
    if path.endswith(".attention.qkv"):  # NextDiT: grouped-query attention where k / v are narrower than q
        q = shapes.get(path.removesuffix("qkv") + "out", (0,))[0]
        if not q or total <= q or (total - q) % 2:
            return None
        return (q, (total - q) // 2, (total - q) // 2)
    return (total // parts,) * parts if total % parts == 0 else None


def _compiled(entries: tuple[tuple[str, tuple[str, ...]], ...]) -> list:
    c = _COMPILED.get(entries)
    if c is None:
        c = _COMPILED[entries] = [(template_pattern(pieces[0]), fused, pieces) for fused, pieces in entries]
    return c


def split_names(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[Piece, ...]]:
    """For a base's module paths (path -> weight shape): each fused module name of the other naming whose every row
    block the base holds as a weight of its own -> its pieces, in row order. The pieces must share their other
    dimensions (one fused weight's)."""
    if not any(p.endswith(_FIRSTS) for p in shapes):
        return {}
    out: dict[str, tuple[Piece, ...]] = {}
    for entries in _groups(shapes, ".img_mlp.gate_layer"):
        compiled = _compiled(entries)
        for path in shapes:
            for first, fused, pieces in compiled:
                m = first.match(path)
                if not m:
                    continue
                paths = [p.replace("{n}", m.group(1)) for p in pieces]
                got = [tuple(shapes.get(p) or ()) for p in paths]
                if all(len(s) >= 2 and s[1:] == got[0][1:] for s in got):
                    starts = [sum(s[0] for s in got[:i]) for i in range(len(got))]
                    out.setdefault(
                        fused.replace("{n}", m.group(1)),
                        tuple((p, None, a, s[0]) for p, a, s in zip(paths, starts, got, strict=True)),
                    )
                break
    return out
