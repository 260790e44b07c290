"""Memory a VAE decode/encode will need, before running it (torch-free: `loadout plan` and the GUI
thread call it).

    peak = weights + k_act * pixels * bytes_per_element            (full)
    peak = weights + k_head * latent_pixels * bytes + k_tile * tile_pixels * bytes
           + 16 * pixels (float32 output and blend weights) [+ store, when tile states stay in RAM]

`pixels` are output (image) pixels for the batch. The coefficients are activation channels alive at
the worst moment, calibrated by measuring peak RSS of real decodes in fresh processes
(benchmarks/bench_vae.py prints estimate vs measured): for the SD-family AutoencoderKL decoder the
peak sits in the first full-resolution ResnetBlock, where the 256-channel upsampled input, its
normalised copy and the shortcut are alive together with 128-channel conv outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

# activation channels alive at the peak, per output pixel (see module docstring)
K_ACT = {("kl", "decode"): 1200, ("kl", "encode"): 800, ("taesd", "decode"): 320, ("taesd", "encode"): 320}
# per latent pixel for the whole-latent part (mid block with attention, or TAESD's head)
K_HEAD = {"kl": 4 * 512, "taesd": 4 * 64}
# channels of a tile state waiting in the store (activation plus pending residual), per pixel
K_STORE = {("kl", "decode"): 384, ("kl", "encode"): 256, ("taesd", "decode"): 0, ("taesd", "encode"): 0}
# context each tile needs on each side (output pixels) for its core to match the full pass
CONTEXT_PX = {"kl": 32, "taesd": 32}
SD_VAE_WEIGHTS = 334_643_238  # fp32 bytes of an SD1/SDXL AutoencoderKL (83.65 M parameters)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class VaeSpec:
    kind: str  # "kl" or "taesd"
    latent_channels: int
    weight_bytes: int
    context_px: int


def spec_of(vae) -> VaeSpec:
    """The estimate's view of a loaded model."""
    kind = "kl" if hasattr(vae, "cfg") else "taesd"
    wbytes = sum(p.numel() * p.element_size() for p in vae.parameters())
    return VaeSpec(kind, vae.latent_channels, wbytes, CONTEXT_PX[kind])


def full_bytes(spec: VaeSpec, direction: str, pixels: int, esize: int) -> int:
    return spec.weight_bytes + K_ACT[(spec.kind, direction)] * pixels * esize


def tile_bytes(spec: VaeSpec, tile_px: int, esize: int, direction: str = "decode") -> int:
    return K_ACT[(spec.kind, direction)] * tile_px * tile_px * esize


def store_bytes(spec: VaeSpec, direction: str, pixels: int, esize: int, overhead: float = 1.5) -> int:
    return int(K_STORE[(spec.kind, direction)] * pixels * esize * overhead)


def tiled_bytes(
    spec: VaeSpec, direction: str, pixels: int, tile_px: int, esize: int, *, ram_store: bool = False
) -> int:
    latent_px = pixels // 64
    total = (
        spec.weight_bytes
        + K_HEAD[spec.kind] * latent_px * esize
        + tile_bytes(spec, tile_px, esize, direction)
    )
    total += 16 * pixels
    if ram_store:
        total += store_bytes(spec, direction, pixels, esize)
    return total


def _spec(kind: str, latent_channels: int, weight_bytes: int | None) -> VaeSpec:
    k = "taesd" if kind in ("taesd", "vae_approx") else "kl"
    wb = weight_bytes if weight_bytes is not None else (SD_VAE_WEIGHTS if k == "kl" else 5_000_000)
    return VaeSpec(k, latent_channels, wb, CONTEXT_PX[k])


def estimate_decode_bytes(
    width: int,
    height: int,
    *,
    kind: str = "kl",
    latent_channels: int = 4,
    dtype: str = "float32",
    tile: int | None = None,
    batch: int = 1,
    weight_bytes: int | None = None,
) -> int:
    """Predicted peak bytes of decoding a width x height image (full, or with `tile`-px tiles whose
    states are spilled to disk); `weight_bytes` from the VAE's header when known."""
    spec = _spec(kind, latent_channels, weight_bytes)
    esize = DTYPE_BYTES[dtype]
    px = width * height * batch
    if tile is None:
        return full_bytes(spec, "decode", px, esize)
    return tiled_bytes(spec, "decode", px, tile, esize)


def estimate_encode_bytes(
    width: int,
    height: int,
    *,
    kind: str = "kl",
    latent_channels: int = 4,
    dtype: str = "float32",
    tile: int | None = None,
    batch: int = 1,
    weight_bytes: int | None = None,
) -> int:
    """As estimate_decode_bytes, for encoding a width x height image."""
    spec = _spec(kind, latent_channels, weight_bytes)
    esize = DTYPE_BYTES[dtype]
    px = width * height * batch
    if tile is None:
        return full_bytes(spec, "encode", px, esize)
    return tiled_bytes(spec, "encode", px, tile, esize)
