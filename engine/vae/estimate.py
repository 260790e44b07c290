"""Memory a VAE decode/encode will need, before running it (torch-free: `loadout plan` and the GUI
thread call it).

    peak = runtime + weights + k_act * pixels * bytes_per_element            (full)
    peak = runtime + weights + k_head * latent_pixels * bytes + k_act * tile_pixels * bytes
           + 16 * pixels (the float32 result: 12 for RGB, 4 to spare) [+ store, when states stay in RAM]

`pixels` are output (image) pixels for the batch. The coefficients are activation channels alive at
the worst moment, calibrated by measuring peak RSS of real decodes in fresh processes
(benchmarks/bench_vae.py prints estimate vs measured): for the SD-family AutoencoderKL decoder the
peak sits in the first full-resolution ResnetBlock, where the 256-channel upsampled input, its
normalised copy and the shortcut are alive together with 128-channel conv outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .frames import latent_frames_for, video_frames, vit_frames  # noqa: F401  (re-exported, as widths)
from .video_coeffs import (  # noqa: F401  (re-exported: callers read the coefficients here)
    K_VIDEO_CACHE,
    K_VIDEO_CHUNK,
    K_VIDEO_ENCODE,
    K_VIDEO_FRAME,
    K_VIDEO_HEAD,
    K_VIDEO_KV,
    K_VIT_TOKEN,
    LTX_ENCODE_FIXED,
    LTX_K_CHUNK,
    LTX_K_ENCODE,
    LTX_K_FRAME,
    VIDEO_KINDS,
    VIT_CHUNK,
    VIT_CHUNK_FRAMES,
    VIT_ENC_CH,
    VIT_KINDS,
    VIT_TILE,
)
from .widths import video_widths  # noqa: F401  (re-exported: the estimate's callers read widths here)

# Activation "channels" alive at the peak, per output pixel, per unit of the base width `ch` (128 for
# every SD/SDXL/SD3/FLUX VAE). Calibrated on CPU, float32, fresh processes: SD-layout decoder at
# ch=128, 128^2 and 256^2 output: 62.6 MB and 275 MB over the loaded process -> 955 and 1049 channels
# -> 8.6 per unit of ch. The encoder keeps fewer wide tensors at full resolution (estimated 6 / ch).
K_ACT = {("kl", "decode"): 8.6, ("kl", "encode"): 6.0}
K_ACT_TAESD = {"decode": 6 * 64, "encode": 6 * 64}  # TAESD: fixed width 64, ~6 tensors at the peak
# per latent pixel, the whole-latent part (mid block with attention: ~4 tensors of 4*ch channels)
K_HEAD = {"kl": 16.0, "taesd": 4 * 64}
# channels of a tile state waiting in the store (activation plus pending residual) per unit of ch
K_STORE = {("kl", "decode"): 3.0, ("kl", "encode"): 2.0}
# The DC-AE (engine.vae.dc_ae), per unit of its first decoder width (`ch`: 128 in the f32c32 releases):
# a full pass's activations per output pixel, its head's output per latent pixel (the attention stages,
# run whole: head_scale^2 pixels of their last width), a tiled pass's stored states per output pixel.
# Measured (benchmarks/bench_vae_dc_ae.py, ch 32, CPU fp32, fresh processes): a full decode's peak above the
# process 235 / 518 / 726 MiB at 512 / 768 / 1024 px, estimated 1.06x / 1.08x / 1.38x. The encode's and the
# head's / store's coefficients are the AutoencoderKL's, not yet measured for the DC-AE.
K_ACT_DC = {"decode": 7.8, "encode": 6.0}
K_HEAD_DC = 16.0
K_STORE_DC = 3.0
# TAESD: its tiled part is cut into passes too (engine.vae.halo); a state is one 64-channel activation
# (its Blocks run whole inside a pass, so nothing is pending), at full resolution in the last passes
K_STORE_TAESD = 64.0
# context each tile needs on each side (output pixels) for its core to match the full pass: 32 px
# gives 53 dB and 64 px 94 dB tiled-vs-full on a random-weight SD-layout decoder (see tests/bench);
# the encoder's receptive field is wider (its deepest convs see 8 px per tap)
CONTEXT_PX = {("kl", "decode"): 32, ("kl", "encode"): 64, ("taesd", "decode"): 32, ("taesd", "encode"): 64,
              ("dc_ae", "decode"): 32, ("dc_ae", "encode"): 64}  # fmt: skip
# HunyuanImage 2.1's VAE (engine.vae.hunyuan_image; `ch` its full-resolution width, the release's 128): `bench_vae.py
# --family hunyuan_image21` (ch 32: widths 32 x (1, 2, 4, 4, 8, 8), the release's blocks; CPU float32, 2 threads,
# fresh processes): peak RSS above the process before the pass, decode 57 / 199 / 466 / 684 MiB at 256^2 / 512^2 / 768^2
# / 1024^2 (7.1 / 6.2 / 6.5 / 5.3 per output pixel per unit of ch), encode 50 / 172 / 376 MiB (6.2 / 5.4 / 5.2); carried
# 13-50 % over. Tiled at 1024^2 in 512-px tiles, 361 MiB: the tiled estimate is ~2x over there.
# Its head: the mid block at 8 ch.
K_ACT[("hunyuan_image21", "decode")], K_ACT[("hunyuan_image21", "encode")] = 8.0, 7.0
K_HEAD["hunyuan_image21"], K_STORE[("hunyuan_image21", "decode")], K_STORE[("hunyuan_image21", "encode")] = (
    64.0,
    3.0,
    2.0,
)
CONTEXT_PX[("hunyuan_image21", "decode")] = CONTEXT_PX[("hunyuan_image21", "encode")] = 64  # 2 latent px
RUNTIME_BYTES = 280 << 20  # the torch runtime of a CPU process (measured RSS before any weights)
# RAM a CPU decode leaves to the rest of the machine (engine.vae.run.memory_budget, loadout plan)
CPU_RESERVE_BYTES = 1 << 30
SD_VAE_WEIGHTS = 334_643_238  # fp32 bytes of an SD1/SDXL AutoencoderKL (83.65 M parameters)
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class VaeSpec:
    kind: str  # "kl", "taesd", or a video VAE: "wan21" / "wan22"
    latent_channels: int
    weight_bytes: int
    ch: int = 128  # base width of an AutoencoderKL; a video VAE's last-level width per output pixel
    mid: int = 512  # a video VAE's middle-block width (its head output waits for every tile)
    time_factor: int = 1  # output frames per latent frame after the first (4 for Wan)
    downscale: int = 8
    time_context: int = 0  # latent frames of context a chunk decodes with on each side (LTX-Video)
    encode_fixed: int = 0  # what an encode holds whatever its size (LTX: LTX_ENCODE_FIXED)
    enc_ch: int = 0  # MiniMax-H3: its encoder's first width (the unit of its encode's activations), 0 if none

    @property
    def video(self) -> bool:
        return self.kind in VIDEO_KINDS

    def k_act(self, direction: str) -> float:
        if self.kind in VIT_KINDS and direction == "encode":  # a CNN encoder beside the ViT decoder
            return K_VIDEO_ENCODE[self.kind] * (self.enc_ch or VIT_ENC_CH)
        if (
            self.kind in VIT_KINDS
        ):  # per output pixel of 4 frames (a latent frame's): a chunk's 7 frames of tokens
            return K_VIT_TOKEN * self.ch * VIT_CHUNK_FRAMES / (self.downscale**2 * self.time_factor)
        if self.video:
            return (K_VIDEO_FRAME if direction == "decode" else K_VIDEO_ENCODE)[self.kind] * self.ch
        if self.kind == "taesd":
            return K_ACT_TAESD[direction]
        if self.kind == "dc_ae":
            return K_ACT_DC[direction] * self.ch
        return K_ACT.get((self.kind, direction), K_ACT[("kl", direction)]) * self.ch

    def k_head(self) -> float:
        if self.kind in VIT_KINDS:  # nothing runs whole before the tiles
            return 0.0
        if self.video:
            return K_VIDEO_HEAD * self.mid
        if self.kind == "dc_ae":  # `mid`: the head output's channels per latent pixel
            return K_HEAD_DC * self.mid
        return K_HEAD[self.kind] * self.ch if self.kind in ("kl", "hunyuan_image21") else K_HEAD["taesd"]

    def k_store(self, direction: str) -> float:
        if self.kind == "taesd":
            return K_STORE_TAESD
        if self.kind == "dc_ae":
            return K_STORE_DC * self.ch
        return K_STORE[(self.kind, direction)] * self.ch if (self.kind, direction) in K_STORE else 0.0

    def context_px(self, direction: str) -> int:
        if self.kind in (
            "ltxv",
            "ltx2",
        ):  # long reach at 32x: 2 latent pixels a side (tests/engine/test_vae_ltx)
            return 64
        if self.video:  # 32 px gives > 50 dB tiled-vs-full on random-weight Wan 2.1 / 2.2 decoders
            return 32 if direction == "decode" else 64
        return CONTEXT_PX[(self.kind, direction)]


def video_chunk_bytes(spec: VaeSpec, pixels: int, latent_frames: int, esize: int) -> int:
    """Activations of one temporal chunk of `latent_frames` over `pixels` output pixels (one tile): its
    output frames counted as time_factor per latent frame, the clip's first chunk too, though it decodes
    fewer (its first latent frame gives one frame: 5 frames from 2). Counted at its real frames, a short
    clip's estimate fell under the measured peak at small tiles (width 16, 832x480x5: 0.95 at 384 px,
    0.97-0.99 at 256 and 192, where tiles of several sizes fragment the heap), so the over-count stays
    as that margin (1.08-1.24 there, 1.5-1.65 at 512 px and whole frames)."""
    frames = spec.time_factor * max(1, latent_frames)
    k = K_VIDEO_FRAME[spec.kind] * frames + K_VIDEO_CHUNK[spec.kind]
    return int(k * spec.ch * pixels * esize)


def video_bytes(
    spec: VaeSpec, frame_pixels: int, latent_frames: int, esize: int, *, tile_px: int | None = None,
    tile_frames: int = 1, result_in_ram: bool = True, tile_area: int | None = None,
    snapshot_on_device: bool = False,
) -> int:  # fmt: skip
    """Predicted peak of a video decode: runtime, weights, the head's output for every latent frame, one
    chunk of `tile_frames` over the whole frame (or a tile_px tile) with the causal cache the chunks
    carry (twice with `snapshot_on_device`: a GPU's retry snapshot kept beside it), and the float32
    result when it lives in the same memory (a CPU decode, which keeps no snapshot). `tile_area`: the
    largest tile's box in output pixels where the caller planned the tiles (engine.vae.choice.Job), else
    tile_px squared."""
    if spec.kind in VIT_KINDS:
        return vit_video_bytes(spec, frame_pixels, latent_frames, esize, tile_area, result_in_ram)
    latent_px = frame_pixels // (spec.downscale**2)
    head_frames = tile_frames
    if spec.time_context:  # the head runs whole, a chunk with its context frames (engine.vae.video)
        tile_frames, head_frames = min(latent_frames, tile_frames + 2 * spec.time_context), latent_frames
    head = spec.mid * latent_frames * latent_px * esize + spec.k_head() * head_frames * latent_px * esize
    head += K_VIDEO_KV.get(spec.kind, 0.0) * spec.mid * latent_frames * latent_px * esize
    area = frame_pixels if tile_px is None else min(frame_pixels, tile_area or tile_px * tile_px)
    chunk = video_chunk_bytes(spec, area, tile_frames, esize)
    if tile_frames < latent_frames:
        chunk += int(K_VIDEO_CACHE[spec.kind] * (2 if snapshot_on_device else 1) * spec.ch * area * esize)
    frames = 1 + spec.time_factor * (latent_frames - 1)
    result = 12 * frames * frame_pixels if result_in_ram else 0
    return int(RUNTIME_BYTES + spec.weight_bytes + head + max(chunk, head // 2) + result)


def vit_video_bytes(spec: VaeSpec, frame_pixels: int, latent_frames: int, esize: int, tile_area: int | None,
                    result_in_ram: bool) -> int:  # fmt: skip
    """A ViT video decoder's peak: one tile's chunk of tokens (`tile_area` output pixels; None: whole frames)
    through a block, the chunk's output and the tiles and blends that make it (on the CPU), and the result."""
    chunk_frames = VIT_CHUNK_FRAMES
    area = frame_pixels if tile_area is None else min(frame_pixels, tile_area)
    tokens = chunk_frames * area // spec.downscale**2
    act = int(K_VIT_TOKEN * spec.ch * tokens * esize)
    clip_frames = chunk_frames * spec.time_factor
    # a chunk's float32 output, and beside it (in units of it) the tiles and blends that make it: two rows of raw
    # tiles, the chunk's frames cross-faded into the result (CPU, fresh processes, a 512-wide 4-block decoder at
    # 832x480 x 7 latent frames: `bench_vae_vit.py` prints estimate vs measured, 1.1-1.2 with these)
    tiles = 12 * clip_frames * frame_pixels * (2.6 if tile_area is not None else 2.0)
    frames = vit_frames(latent_frames)
    result = 12 * frames * frame_pixels if result_in_ram else 0
    return int(RUNTIME_BYTES + spec.weight_bytes + act + tiles + result)


def spec_of(vae) -> VaeSpec:
    """The estimate's view of a loaded model."""
    if hasattr(vae, "vae_spec"):  # a VAE that describes itself (minimax_h3, dc_ae, hunyuan_image)
        return vae.vae_spec()
    if getattr(vae, "video", False) and hasattr(vae, "time_context"):  # LTX-Video (engine.vae.ltx)
        cfg = vae.cfg
        wbytes = sum(p.numel() * p.element_size() for p in vae.parameters())
        enc = getattr(
            vae, "encoder", None
        )  # LTX_ENCODE_FIXED: its widest convolution's weight, twice, float32
        fixed = (
            8 * max((p.numel() for p in enc.parameters() if p.dim() == 5), default=0)
            if enc is not None
            else 0
        )
        return VaeSpec(cfg.generation, cfg.z, wbytes, max(1, cfg.last_width // cfg.patch**2), cfg.width, cfg.time_factor,
                       cfg.downscale, vae.time_context, fixed)  # fmt: skip
    if getattr(vae, "video", False):
        cfg = vae.cfg
        wbytes = sum(p.numel() * p.element_size() for p in vae.parameters())
        if hasattr(vae, "spec_widths"):  # a video VAE that is no Wan network names its kind and widths
            return VaeSpec(vae.spec_kind, cfg.z, wbytes, *vae.spec_widths, vae.time_factor, vae.downscale)
        kind = "qwen_image21" if cfg.frame else "wan22" if cfg.residual else "wan21"
        return VaeSpec(kind, cfg.z, wbytes, cfg.dec_dims[-1] // cfg.patch**2, cfg.dec_dims[0], cfg.time_factor,
                       cfg.downscale)  # fmt: skip
    kind = "kl" if hasattr(vae, "cfg") else "taesd"
    wbytes = sum(p.numel() * p.element_size() for p in vae.parameters())
    return VaeSpec(kind, vae.latent_channels, wbytes, vae.cfg.ch if kind == "kl" else 64)


def act_pixels(spec: VaeSpec, direction: str, pixels: int) -> int:
    """Pixels whose activations live at once: MiniMax-H3's encode runs the release's 256-px tiles one at a time."""
    if spec.kind in VIT_KINDS and direction == "encode":
        return min(pixels, VIT_TILE[0] ** 2)
    return pixels


def activation_bytes(spec: VaeSpec, direction: str, pixels: int, esize: int) -> int:
    """What a full pass adds on top of a process that already holds the runtime and the weights."""
    fixed = spec.encode_fixed if direction == "encode" else 0
    return int(spec.k_act(direction) * act_pixels(spec, direction, pixels) * esize + fixed)


def full_bytes(spec: VaeSpec, direction: str, pixels: int, esize: int) -> int:
    """Predicted peak RSS (CPU) / device bytes of a full pass, runtime and weights included."""
    return int(RUNTIME_BYTES + spec.weight_bytes + activation_bytes(spec, direction, pixels, esize))


def tile_bytes(spec: VaeSpec, tile_px: int, esize: int, direction: str = "decode") -> int:
    return int(spec.k_act(direction) * tile_px * tile_px * esize)


def store_bytes(spec: VaeSpec, direction: str, pixels: int, esize: int, overhead: float = 1.5) -> int:
    return int(spec.k_store(direction) * pixels * esize * overhead)


def one_tile_px(tile_px: int, hw: tuple[int, int]) -> int:
    """Output pixels of one `tile_px` tile of an (h, w) image: never more than the image -- a 256x192
    image in 512-px tiles is one 256x192 tile (counted as 512^2 it read 2x the full decode's estimate,
    and a 4096-px tile of a 2048x768 latent 10x)."""
    return min(tile_px, hw[0]) * min(tile_px, hw[1])


def tiled_bytes(
    spec: VaeSpec, direction: str, pixels: int, tile_px: int, esize: int, *, ram_store: bool = False,
    computed_px: int = 0,
) -> int:  # fmt: skip
    """Predicted peak of a tiled pass: the head's output, what runs at once -- one `tile_px` tile, or
    `computed_px` output pixels where the caller knows the run's largest batch of tile boxes
    (engine.vae.choice.computed_px), whichever is more (`tile_px` 0: `computed_px` alone) -- the
    float32 result, and the tile states where they wait in the same memory (`ram_store`). Counting one
    tile of a batched run read 0.93 of the measured peak."""
    latent_px = pixels // (spec.downscale**2)
    total = RUNTIME_BYTES + spec.weight_bytes + spec.k_head() * latent_px * esize
    total += spec.k_act(direction) * act_pixels(spec, direction, max(tile_px * tile_px, computed_px)) * esize
    total += 16 * pixels
    if ram_store:
        total += store_bytes(spec, direction, pixels, esize)
    return int(total)


# Published widths (Wan2.1 vae.py: dim 96, z 16; Wan2.2 vae2_2.py: dim 160, dec_dim 256, z 48, patch 2)
VIDEO_SPECS = {
    "wan21": VaeSpec("wan21", 16, 253_806_118, 96, 384, 4, 8),  # 127 M parameters in fp16
    "wan22": VaeSpec("wan22", 48, 1_409_400_000, 64, 1024, 4, 16),  # 705 M parameters in fp16
    # diffusers AutoencoderKLQwenImage21's defaults: z 64, decoder 144 x [8, 8, 4, 2, 1], 16x, one frame
    "qwen_image21": VaeSpec("qwen_image21", 64, 675_480_808, 144, 1152, 1, 16),  # 338 M parameters in fp16
    # diffusers AutoencoderKLMiniMaxH3's defaults: a 36-block ViT decoder of width 2048 and the CNN encoder (128 ..
    # 1024), 2.60 B parameters, 0.18 B of them the encoder's; z 24, 16x, 4 frames a latent frame; its release is float32
    "minimax_h3": VaeSpec("minimax_h3", 24, 10_415_475_936, 2048, 2048, 4, 16, enc_ch=128),
    # diffusers AutoencoderKLHunyuanVideo's defaults: widths (128, 256, 512, 512), z 16, 8x, 4x; the decoder's
    # 146 M parameters in fp16 (a file's header counts its encoder's as well, built where it encodes)
    "hunyuan_video": VaeSpec("hunyuan_video", 16, 292_272_678, 128, 512, 4, 8),
    # diffusers AutoencoderKLHunyuanVideo15's defaults: decoder widths (1024, 1024, 512, 256, 128), z 32, 16x, 4x
    "hunyuan_video15": VaeSpec("hunyuan_video15", 32, 1_742_619_142, 128, 1024, 4, 16),  # 871 M in fp16
    # diffusers AutoencoderKLCosmos's defaults (CV8x8x8-1.0): decoder widths 512 .. 256 (its last block at 1/4 size:
    # 16 a pixel), z 16, 8x, 8x in time; the decoder's 62.7 M parameters in bf16 (the encoder's 42.9 M beside them)
    "cosmos_predict1": VaeSpec("cosmos_predict1", 16, 125_477_664, 16, 512, 8, 8),
}
# LTX-Video 0.9.5+'s decoder (diffusers' config for Lightricks/LTX-Video-0.9.5: decoder widths 1024 -> 128,
# z 128, 32x, 8x in time): ~ 0.43 G parameters in bf16 with its encoder; reach from LTXConfig.reach()
VIDEO_SPECS["ltxv"] = VaeSpec("ltxv", 128, 838_000_000, 8, 1024, 8, 32, 12, LTX_ENCODE_FIXED)
# LTX-2's (diffusers AutoencoderKLLTX2Video defaults: the same decoder, non-causal per its metadata config):
# the decoder's figures; its own weight bytes come from the file's header where known
VIDEO_SPECS["ltx2"] = VaeSpec("ltx2", 128, 838_000_000, 8, 1024, 8, 32, 12, LTX_ENCODE_FIXED)
# Mochi 1 (engine.vae.mochi; diffusers AutoencoderKLMochi's defaults): decoder widths 768 .. 128, z 12, 6x time
# (the decoder's 362.5 M parameters and the encoder's 97.2 M, in bf16: both load where the file has both)
VIDEO_SPECS["mochi"] = VaeSpec("mochi", 12, 919_497_222, 128, 768, 6, 8)
# diffusers Kandinsky6SRVAE's defaults: decoder (16, 256, 512, 1024, 2048), encoder (16, 128, 256, 512, 1024), z 64,
# 16x, 4x in time; its 1.46 B decoder and 0.28 B encoder parameters (both load where the file has both) counted in
# float32 (a file's header gives its own bytes); the head's output is the middle block's 2048 channels and the
# latent's 64
VIDEO_SPECS["kandinsky6_sr"] = VaeSpec("kandinsky6_sr", 64, 6_955_512_972, 16, 2048 + 64, 4, 16)


# The image VAEs whose layout is not an AutoencoderKL's, by the architecture detection names (what `loadout plan`
# estimates a file with; spec_of reads a loaded model's own): the f32c32 DC-AE (its head's output 8192 channels a
# latent pixel: 4x4 pixels of the 512-wide third stage) and HunyuanImage 2.1's, their released widths (spec_of of the
# release layouts, tests/engine/test_vae_dc_ae / test_vae_hunyuan_image RELEASE)
IMAGE_SPECS = {
    "sana": VaeSpec("dc_ae", 32, 1_249_001_100, 128, 8192, downscale=32),
    "hunyuan_image21": VaeSpec("hunyuan_image21", 64, 1_622_301_964, 128, downscale=32),
}


def image_spec(architecture: str | None, latent_channels: int, weight_bytes: int) -> VaeSpec:
    """An image VAE's estimate by its detected architecture: its release's widths and compression, this file's
    weights; an AutoencoderKL's otherwise."""
    spec = IMAGE_SPECS.get(architecture or "")
    if spec is None:
        return VaeSpec("kl", latent_channels, weight_bytes)
    return replace(spec, weight_bytes=weight_bytes)


def video_spec(kind: str, weight_bytes: int | None = None, widths: tuple[int, int] | None = None) -> VaeSpec:
    """The spec of a video VAE family without loading it (`loadout plan`, the Decode panel); `widths`
    (ch, mid) from the file's header (`video_widths`) where it has them, else the published ones."""
    spec = VIDEO_SPECS[kind]
    ch, mid = widths if widths is not None else (spec.ch, spec.mid)
    wb = spec.weight_bytes if weight_bytes is None else weight_bytes
    return VaeSpec(spec.kind, spec.latent_channels, wb, ch, mid, spec.time_factor, spec.downscale,
                   spec.time_context, encode_fixed=spec.encode_fixed, enc_ch=spec.enc_ch)  # fmt: skip


# The decoder's last convolution (its input: the last level's width) and first one (its output: the
# middle block's width), in the original naming and diffusers'
# (LTX-Video's convolutions wrap a `conv`: the last key of each)
def _spec(kind: str, latent_channels: int, weight_bytes: int | None, widths=None) -> VaeSpec:
    if kind in VIDEO_SPECS:
        return video_spec(kind, weight_bytes, widths)
    if kind in IMAGE_SPECS:  # by the detected architecture (sana's DC-AE, hunyuan_image21)
        return image_spec(
            kind, latent_channels, IMAGE_SPECS[kind].weight_bytes if weight_bytes is None else weight_bytes
        )
    k = "taesd" if kind in ("taesd", "vae_approx") else "kl"
    wb = weight_bytes if weight_bytes is not None else (SD_VAE_WEIGHTS if k == "kl" else 5_000_000)
    return VaeSpec(k, latent_channels, wb)  # SD-family width 128


def _estimate(
    direction, px, kind, latent_channels, dtype, tile, weight_bytes, latent_frames=1, widths=None, tile_area=None,
    batch=1, hw=None,
) -> int:  # fmt: skip
    spec = _spec(kind, latent_channels, weight_bytes, widths)
    esize = DTYPE_BYTES[dtype]
    if spec.video and direction == "decode":
        n = min(4, latent_frames) if tile is None else 1
        return video_bytes(spec, px, latent_frames, esize, tile_px=tile, tile_frames=n, tile_area=tile_area)
    if tile is None:
        return full_bytes(spec, direction, px, esize)
    one = tile * tile if hw is None else one_tile_px(tile, hw)
    return tiled_bytes(spec, direction, px, 0, esize, computed_px=one * batch)  # each image's tile


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
    latent_frames: int = 1,
    widths: tuple[int, int] | None = None,
    tile_area: int | None = None,
) -> int:
    """Predicted peak bytes of decoding `batch` width x height images (full, or with `tile`-px tiles run
    one at a time, each through every image, their states spilled to disk); `weight_bytes` from the
    VAE's header when known. A video VAE (`kind` wan21 / wan22) decodes `latent_frames` (in chunks of
    up to 4, one with tiles), at `widths` (ch, mid: `video_widths`) when known, its tiles' largest box
    `tile_area` (engine.vae.choice.largest_box_px) when the caller planned them, else tile squared."""
    return _estimate("decode", width * height * batch, kind, latent_channels, dtype, tile, weight_bytes,
                     latent_frames, widths, tile_area, batch, (height, width))  # fmt: skip


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
    frames: int = 1,
    widths: tuple[int, int] | None = None,
) -> int:
    """As estimate_decode_bytes, for encoding a width x height image, or a clip of `frames` frames with a
    video VAE (encoded untiled: the same figure with or without `tile`); `widths` the file's (video_widths:
    its decoder's, which the encoder's follow)."""
    spec = _spec(kind, latent_channels, weight_bytes, widths)
    if spec.video and frames > 1:
        from .clip_estimate import encode_clip_bytes

        return encode_clip_bytes(spec, width * height * batch, frames, DTYPE_BYTES[dtype])
    return _estimate("encode", width * height * batch, kind, latent_channels, dtype, tile, weight_bytes,
                     widths=widths, batch=batch, hw=(height, width))  # fmt: skip
