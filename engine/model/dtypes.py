"""Storage and compute dtypes, and the device each component runs on — all overridable.

The rules are ComfyUI's facts (comfy/model_management.py and comfy/sd.py, read, not copied):

* what a device computes in: the CPU only float32 (``supports_dtype``: the CPU gets fp32 only); CUDA
  fp16 always, bf16 from compute capability 8.0, fp8 from 8.9 (``supports_fp8_compute``); MPS fp16.
* diffusion models (``unet_dtype`` / ``unet_manual_cast``): each family runs in the dtypes its model
  config lists, in that order of preference (``supported_inference_dtypes``: fp16, bf16, fp32 unless
  the family says otherwise; the FLUX family and Chroma prefer bf16; Qwen-Image, Z-Image, Lumina 2,
  HiDream, HunyuanVideo, LTX and Mochi run in bf16 or fp32 only -- a Z-Image run in fp16 gives a flat
  image). fp8 weights stay fp8 in storage and are cast for compute unless the device computes fp8; a
  file in a dtype its family runs in and the device computes stays in it (zero-copy); otherwise
  storage is the family's first dtype the device computes, and on a device that cannot compute the
  storage dtype, weights are cast on the fly (the "manual cast") to the family's first dtype it does.
* text encoders (``text_encoder_dtype``, ``text_encoder_device``): fp16 storage; on the GPU only in the
  NORMAL / HIGH VRAM states and when the device computes fp16, and only when memory allows
  (``text_encoder_initial_device``: a model above 1 GiB goes to the device when it fits with 20% to spare
  and the device has more than half the CPU's free memory) — else on the CPU.
* the VAE (``vae_dtype`` with the SD VAE's working dtypes bf16 / fp32): bf16 where the device computes
  it, else fp32 (never fp16: the SD VAE overflows in fp16); ``--cpu-vae`` puts it on the CPU.

On the CPU everything is computed in fp32, but storage keeps the file's dtype, so an fp16 file stays
zero-copy on the mmap (disk tier) or as a half-size copy in RAM, and each op casts on the fly.
"""

from __future__ import annotations

from dataclasses import dataclass

TEXT_ENCODERS = ("clip_l", "clip_g", "clip_h", "t5xxl", "text_encoder")
# The component names detection gives the text encoders of the 2025-26 families (umt5_xxl, qwen25_vl_7b,
# qwen3_4b, llama31_8b, mistral3_24b, gemma2_2b, ...): engine/detect/text_encoders.py.
TEXT_ENCODER_FAMILIES = ("clip", "t5", "umt5", "qwen", "llama", "mistral", "gemma")
DIFFUSION = ("unet", "transformer")
GIB = 1024**3
# The dtypes a family's diffusion model runs in, best first: ComfyUI's `supported_inference_dtypes`
# (comfy/supported_models.py, read for the 2026 releases; BASE's default for every family not listed:
# the UNets, SD3, AuraFlow, PixArt, Hunyuan-DiT). Keys: engine.detect's architecture names.
DEFAULT_INFERENCE_DTYPES = ("float16", "bfloat16", "float32")
_BF16_FIRST = ("bfloat16", "float16", "float32")
_BF16_ONLY = ("bfloat16", "float32")  # their configs leave fp16 out (NaNs / a flat image in fp16)
INFERENCE_DTYPES = {
    "flux1_dev": _BF16_FIRST,
    "flux1_schnell": _BF16_FIRST,
    "flux2": _BF16_FIRST,
    # FLUX.3: diffusers' model and pipelines name no fp16 and keep the QK norms in fp32 (`_keep_in_fp32_modules`);
    # until fp16 is shown to run it, bf16 or fp32
    "flux3": _BF16_ONLY,
    "chroma": _BF16_FIRST,
    "krea2": _BF16_FIRST,
    "cosmos": _BF16_FIRST,
    "cosmos_predict2": _BF16_FIRST,
    "lumina2": _BF16_ONLY,
    "z_image": _BF16_ONLY,
    "qwen_image": _BF16_ONLY,
    # diffusers clips its residual stream to fp16's range in every block, as it does Qwen-Image's; its pipeline runs bf16
    "qwen_image21": _BF16_ONLY,
    "hidream": _BF16_ONLY,
    "hunyuan_video": _BF16_ONLY,
    "hunyuan_image21": _BF16_ONLY,
    "ltxv": _BF16_ONLY,
    "ltx2": _BF16_ONLY,  # ComfyUI's LTXAV, an LTXV
    "ltxav": _BF16_ONLY,
    "mochi": _BF16_ONLY,
    "minimax_h3": _BF16_ONLY,  # its release: bfloat16 blocks (float32 patch projections, timestep MLP and heads)
    # Stability ships bf16 files; diffusers runs the prior in bf16 and shows the decoder in fp16 too
    "stable_cascade_c": _BF16_ONLY,
    "stable_cascade_b": _BF16_FIRST,
    # 2026 families Loadout detects: diffusers' pipelines run them in bf16 and name no fp16 (as ERNIE-Image's);
    # Kandinsky 6 (and its SR model) and Cosmos 3 also keep their time embedding / modulation in fp32
    # (`_keep_in_fp32_modules`); SANA-WM's blocks add its fp32-sensitive modulation inline (its model's note)
    "kandinsky6": _BF16_ONLY,
    "kandinsky6_sr": _BF16_ONLY,
    "cosmos3": _BF16_ONLY,
    "sana_wm": _BF16_ONLY,
    "nucleus_image": _BF16_ONLY,
    "motif_video": _BF16_ONLY,
    "wan21": DEFAULT_INFERENCE_DTYPES,
    "wan22": DEFAULT_INFERENCE_DTYPES,
    "hunyuan_video15": DEFAULT_INFERENCE_DTYPES,
    # ERNIE-Image: diffusers' model works its AdaLN arithmetic in fp32 and names no fp16; bf16 or fp32
    "ernie_image": _BF16_ONLY,
    "bria": _BF16_FIRST,  # Bria 3.2: bf16 weights and pipeline (FLUX.1's blocks, clipped in fp16 as FLUX's)
    "bria_fibo": _BF16_FIRST,  # Bria FIBO: bf16 weights and pipeline
    "glm_image": _BF16_ONLY,  # its pipeline's example loads bf16
    "ideogram4": _BF16_ONLY,  # its pipeline's example loads bf16
    "prx": _BF16_ONLY,  # PRX: its pipelines' examples load bfloat16 and name no fp16
    "joyimage": _BF16_ONLY,  # its pipeline loads bfloat16 and keeps the time embedder and norms in fp32
    # LongCat-Image and Ovis-Image ship bf16 weights and their pipelines run bf16; fp16 not shown to run them
    "longcat_image": _BF16_ONLY,
    "ovis_image": _BF16_ONLY,
    # Kandinsky 5: bf16 releases whose attention rounds the rotated q / k to bf16 (the original's apply_rotary)
    "kandinsky5": _BF16_ONLY,
    "sana_video": _BF16_ONLY,  # its pipelines' examples run the transformer in bf16 and name no fp16
    "cosmos_predict1": _BF16_ONLY,  # Cosmos 1.0: bf16 releases, its diffusers pipelines run bf16 and name no fp16
    "bria_fibo2": _BF16_ONLY,  # its pipeline's example loads bf16
}


def inference_dtypes(architecture: str | None) -> tuple[str, ...]:
    return INFERENCE_DTYPES.get(architecture or "", DEFAULT_INFERENCE_DTYPES)


@dataclass(frozen=True)
class Placement:
    """Where a component runs and in which dtypes (None storage = the file's own dtype)."""

    device: str
    storage_dtype: str | None
    compute_dtype: str


def role_of(component: str) -> str:
    if component in DIFFUSION:
        return "diffusion"
    if component in TEXT_ENCODERS or component.startswith(TEXT_ENCODER_FAMILIES):
        return "text_encoder"
    if component == "vae":
        return "vae"
    return "other"


def computes(device: str, dtype: str, info=None) -> bool:
    """Whether `device` (a torch device string) computes natively in `dtype` (torch dtype name). With
    `info` (an engine.devices.DeviceInfo for that device) its detected fp16 / bf16 / fp8 facts decide."""
    if info is not None and info.torch_device == device:
        if dtype == "float32":
            return True
        if dtype == "float16":
            return bool(info.fp16)
        if dtype == "bfloat16":
            return bool(info.bf16)
        return dtype.startswith("float8") and bool(info.fp8_compute)
    import torch

    dev = torch.device(device)
    if dtype == "float32":
        return True
    if dev.type == "cpu":
        return False
    if dev.type == "cuda":
        major, minor = torch.cuda.get_device_capability(dev)
        if dtype == "float16":
            return True
        if dtype == "bfloat16":
            return major >= 8
        if dtype.startswith("float8"):
            return (major, minor) >= (8, 9)
        return False
    if dev.type == "mps":
        return dtype == "float16"
    return dtype in ("float16", "bfloat16")


def place(
    component: str,
    file_dtype: str,
    device: str,
    *,
    vram_state: str = "NORMAL_VRAM",
    cpu_vae: bool = False,
    size_bytes: int = 0,
    free_device: int | None = None,
    free_cpu: int | None = None,
    storage: str | None = None,
    compute: str | None = None,
    force_device: str | None = None,
    info=None,
    architecture: str | None = None,
) -> Placement:
    """Choose device, storage and compute dtypes for one component (torch dtype names); the keyword
    overrides win over every rule. `architecture` (the file's, as engine.detect names it) picks the
    dtypes a diffusion model runs in."""
    role = role_of(component)
    dev = force_device or device
    if force_device is None:
        if role == "vae" and cpu_vae:
            dev = "cpu"
        elif role == "text_encoder" and device != "cpu":
            on_gpu = vram_state in ("NORMAL_VRAM", "HIGH_VRAM") and computes(device, "float16", info)
            if on_gpu and size_bytes > GIB and free_device is not None and free_cpu is not None:
                on_gpu = free_device > 0.5 * free_cpu and size_bytes * 1.2 < free_device
            dev = device if on_gpu else "cpu"
    order = inference_dtypes(architecture) if role == "diffusion" else DEFAULT_INFERENCE_DTYPES
    st = storage or _storage_rule(role, file_dtype, dev, info, order)
    cp = compute or compute_rule(role, st, dev, info, order)
    return Placement(dev, None if st == file_dtype else st, cp)


def _storage_rule(role: str, file_dtype: str, dev: str, info=None, order=DEFAULT_INFERENCE_DTYPES) -> str:
    if dev == "cpu":
        return file_dtype
    if role == "vae":
        return "bfloat16" if computes(dev, "bfloat16", info) else "float32"
    if file_dtype.startswith("float8"):
        return file_dtype
    if role == "text_encoder":
        return "float16" if file_dtype == "float32" else file_dtype
    half = [d for d in order if d != "float32"]
    if file_dtype in half and computes(dev, file_dtype, info):
        return file_dtype
    return next((d for d in half if computes(dev, d, info)), file_dtype)


def compute_rule(role: str, storage: str, dev: str, info=None, order=DEFAULT_INFERENCE_DTYPES) -> str:
    if role == "vae":
        return storage if computes(dev, storage, info) else next(
            (d for d in ("bfloat16", "float32") if computes(dev, d, info)), "float32"
        )  # fmt: skip
    if computes(dev, storage, info) and (storage in order or storage.startswith("float8")):
        return storage
    return next((d for d in order if computes(dev, d, info)), "float32")


_FLAG_DTYPES = {
    "fp32": "float32",
    "fp16": "float16",
    "bf16": "bfloat16",
    "fp8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}


def overrides_from_options(component: str, options) -> dict:
    """place() keywords from engine.devices.DeviceOptions: --cpu-vae, --gpu-only, the per-role dtype
    flags and --force-fp16/bf16/fp32 (which sets the compute dtype of every component)."""
    role = role_of(component)
    kw: dict = {"cpu_vae": bool(options.cpu_vae)}
    flag = {
        "diffusion": options.unet_dtype,
        "vae": options.vae_dtype,
        "text_encoder": options.text_encoder_dtype,
    }.get(role)
    if flag:
        kw["storage"] = _FLAG_DTYPES[flag]
    if options.force_dtype:
        kw["compute"] = _FLAG_DTYPES[options.force_dtype]
        kw.setdefault("storage", _FLAG_DTYPES[options.force_dtype])
    return kw
