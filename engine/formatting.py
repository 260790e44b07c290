"""Text for people, shared by the command line and the window: one way to write a size or a duration.

Torch-free and cheap to import (the GUI thread imports it before torch has loaded)."""

from __future__ import annotations


def human_bytes(n: float | None) -> str:
    """1536 -> '1.5 KiB'. Sizes are binary, as ComfyUI's 'GB' flags are."""
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def tiles_text(tiles: int, tile_px: int) -> str:
    """How a tiled run cut its image: '12 tiles of 512 px', or 'one tile (the whole image)' when the
    tile asked for covers it all."""
    return "one tile (the whole image)" if tiles == 1 else f"{tiles} tiles of {tile_px} px"


# How adapter algorithms are written (the names their authors use: LyCORIS' README, the DoRA and
# (IA)³ papers); an id not listed (full, norm, set) is shown as it is.
_ALGO_NAMES = {
    "lora": "LoRA",
    "locon": "LoCon",
    "loha": "LoHa",
    "lokr": "LoKr",
    "dora": "DoRA",
    "oft": "OFT",
    "boft": "BOFT",
    "glora": "GLoRA",
    "ia3": "IA³",
    "tlora": "T-LoRA",
}


def algo_names(algos) -> str:
    """'LoKr, DoRA' for ('lokr', 'dora')."""
    return ", ".join(_ALGO_NAMES.get(a, a) for a in algos)
