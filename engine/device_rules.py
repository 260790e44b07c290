"""Which dtypes a device is worth computing in, as pure functions of facts about it.

Each function returns (fp16, bf16, fp8_compute): True means "fast and correct enough to compute in by
default", not merely "torch accepts tensors of that dtype" (every device stores every dtype). The
rules and their sources are stated beside each function; ComfyUI's model_management.py
(`should_use_fp16`, `should_use_bf16`, `supports_fp8_compute`) is the main one (facts only).
"""

from __future__ import annotations

Support = tuple[bool, bool, bool]

# ComfyUI should_use_fp16: fp16 gives NaNs / black images on these Turing cards without tensor cores.
FP16_BROKEN_NVIDIA = (
    "1660",
    "1650",
    "1630",
    "T500",
    "T550",
    "T600",
    "MX550",
    "MX450",
    "CMP 30HX",
    "T2000",
    "T1000",
    "T1200",
)
# ComfyUI AMD_RDNA2_AND_OLDER_ARCH: these ROCm architectures have no bf16 support.
NO_BF16_AMD = ("gfx1030", "gfx1031", "gfx1010", "gfx1011", "gfx1012", "gfx906", "gfx900", "gfx803")
# ComfyUI enables fp8 ops on ROCm for these architectures (with torch >= 2.7 and ROCm >= 6.4).
FP8_AMD = ("gfx1200", "gfx1201", "gfx950")


def version_tuple(text: str | None) -> tuple[int, int]:
    """'2.13.0+cu130' -> (2, 13); anything unreadable -> (0, 0)."""
    try:
        major, minor = (text or "").split("+")[0].split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return (0, 0)


def cuda_support(capability: tuple[int, int], name: str, torch_version: str) -> Support:
    """NVIDIA CUDA, by compute capability.

    fp16: capability >= 7.0 (Volta and later have fp16 tensor cores), except the GTX 16 / T-series
      names above (ComfyUI should_use_fp16). Pascal (6.x) runs fp16 but ComfyUI finds it slower than
      fp32 on Linux, so it is not a default here.
    bf16: capability >= 8.0 (Ampere introduced bf16 tensor cores; ComfyUI should_use_bf16; older
      cards only emulate it, which torch.cuda.is_bf16_supported(including_emulation=True) admits).
    fp8 compute: capability >= 8.9 (Ada sm_89, Hopper sm_90 and later have fp8 tensor cores, which
      torch._scaled_mm needs) with torch >= 2.3 (ComfyUI supports_fp8_compute).
    """
    cap = tuple(capability)
    fp16 = cap >= (7, 0) and not any(n in name for n in FP16_BROKEN_NVIDIA)
    bf16 = cap >= (8, 0)
    fp8 = cap >= (8, 9) and version_tuple(torch_version) >= (2, 3)
    return fp16, bf16, fp8


def rocm_support(arch: str | None, torch_version: str, hip_version: str | None) -> Support:
    """AMD ROCm (torch.version.hip set), by gcnArchName.

    fp16: always (ComfyUI should_use_fp16 returns True under HIP). bf16: all but RDNA2 and older
    (list above). fp8 compute: gfx1200 / gfx1201 / gfx950 with torch >= 2.7 and ROCm >= 6.4 (ComfyUI).
    """
    a = arch or ""
    bf16 = not any(x in a for x in NO_BF16_AMD)
    fp8 = (
        any(x in a for x in FP8_AMD)
        and version_tuple(torch_version) >= (2, 7)
        and version_tuple(hip_version) >= (6, 4)
    )
    return True, bf16, fp8


def xpu_support(has_fp16: bool, bf16_supported: bool) -> Support:
    """Intel XPU: what the device reports (torch.xpu.get_device_properties().has_fp16 and
    torch.xpu.is_bf16_supported(), as ComfyUI asks on torch >= 2.3); no fp8 compute path."""
    return bool(has_fp16), bool(bf16_supported), False


def mps_support(mac_version: tuple[int, ...] | None) -> Support:
    """Apple MPS: fp16 always; bf16 from macOS 14 (Metal gained bfloat in macOS Sonoma; ComfyUI
    should_use_bf16 checks mac_version >= 14); no fp8 compute."""
    return True, bool(mac_version) and tuple(mac_version) >= (14,), False


def npu_support() -> Support:
    """Ascend NPU (torch_npu): ComfyUI uses fp16 and bf16 there unconditionally; no fp8 compute."""
    return True, True, False


def cpu_support() -> Support:
    """CPU: torch computes fp16/bf16 there but slowly (ComfyUI: "bf16 works but is extremely slow"),
    so neither is a default; fp32 it is."""
    return False, False, False
