"""Placement rules: which device and dtypes each component gets (ComfyUI's documented facts)."""

from engine.model import computes, place


def test_cpu_computes_fp32_only_and_keeps_the_file_dtype_in_storage():
    assert computes("cpu", "float32") and not computes("cpu", "float16")
    p = place("unet", "float16", "cpu")
    assert (p.device, p.storage_dtype, p.compute_dtype) == ("cpu", None, "float32")
    p = place("unet", "float8_e4m3fn", "cpu")
    assert p.storage_dtype is None and p.compute_dtype == "float32"  # fp8 kept, cast on the fly


def test_vae_on_cpu_and_cpu_vae_flag():
    assert place("vae", "float32", "cpu").compute_dtype == "float32"
    p = place("vae", "float16", "cuda:0", cpu_vae=True)  # --cpu-vae wins before any CUDA question
    assert p.device == "cpu" and p.compute_dtype == "float32"


def test_overrides_win():
    p = place("unet", "float16", "cpu", storage="bfloat16", compute="bfloat16")
    assert (p.storage_dtype, p.compute_dtype) == ("bfloat16", "bfloat16")
    p = place("clip_l", "float16", "cpu", force_device="cpu", storage="float32")
    assert p.storage_dtype == "float32" and p.compute_dtype == "float32"


def test_text_encoder_stays_on_cpu_without_vram_room():
    # a text encoder above 1 GiB goes to the GPU only when it fits with 20% to spare: decided before
    # any device query, so this runs without CUDA
    p = place("t5xxl", "float16", "cuda:0", vram_state="LOW_VRAM")
    assert p.device == "cpu"
