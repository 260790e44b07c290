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


def _gpu(**kw):
    from engine.devices import DeviceInfo

    base = dict(kind="cuda", index=0, name="Test GPU", total_memory=24 << 30, torch_device="cuda:0")
    base.update(kw)
    return DeviceInfo(**base)


def test_gpu_rules_from_detected_device_facts():
    ampere = _gpu(capability=(8, 6), fp16=True, bf16=True)
    turing = _gpu(capability=(7, 5), fp16=True)
    assert place("vae", "float32", "cuda:0", info=ampere).storage_dtype == "bfloat16"
    assert place("vae", "float32", "cuda:0", info=turing).storage_dtype is None  # stays fp32, never fp16
    p = place("unet", "float32", "cuda:0", info=turing)
    assert (p.storage_dtype, p.compute_dtype) == ("float16", "float16")
    p = place("unet", "float8_e4m3fn", "cuda:0", info=ampere)  # fp8 kept, computed in fp16
    assert (p.storage_dtype, p.compute_dtype) == (None, "float16")
    ada = _gpu(capability=(8, 9), fp16=True, bf16=True, fp8_compute=True)
    assert place("unet", "float8_e4m3fn", "cuda:0", info=ada).compute_dtype == "float8_e4m3fn"
    p = place("clip_l", "float32", "cuda:0", info=ampere, size_bytes=500 << 20)
    assert (p.device, p.storage_dtype) == ("cuda:0", "float16")
    big_te = dict(info=ampere, size_bytes=9 << 30, free_cpu=32 << 30)
    assert place("t5xxl", "float16", "cuda:0", free_device=20 << 30, **big_te).device == "cuda:0"
    assert place("t5xxl", "float16", "cuda:0", free_device=10 << 30, **big_te).device == "cpu"


def test_overrides_from_device_options():
    from engine.devices import DeviceOptions
    from engine.model.dtypes import overrides_from_options

    o = DeviceOptions(cpu_vae=True, unet_dtype="fp8_e4m3fn", force_dtype="fp32")
    assert overrides_from_options("vae", o) == {"cpu_vae": True, "compute": "float32", "storage": "float32"}
    assert overrides_from_options("unet", o)["storage"] == "float8_e4m3fn"


def test_the_2026_text_encoders_are_placed_as_text_encoders():
    from engine.model import role_of

    for name in (
        "umt5_xxl",
        "qwen25_vl_7b",
        "qwen3_4b",
        "qwen3_vl_4b",
        "llama31_8b",
        "mistral3_24b",
        "gemma2_2b",
    ):
        assert role_of(name) == "text_encoder", name
    assert (role_of("transformer"), role_of("vae"), role_of("other")) == ("diffusion", "vae", "other")


def test_each_family_runs_in_the_dtypes_its_model_config_lists():
    """ComfyUI's supported_inference_dtypes: FLUX.1 prefers bf16; Qwen-Image, Z-Image and HunyuanVideo
    never run in fp16 (their lists leave it out); Wan and the UNets prefer fp16; a file already in a
    dtype its family runs in stays in it."""
    ampere = _gpu(capability=(8, 6), fp16=True, bf16=True)
    turing = _gpu(capability=(7, 5), fp16=True)
    ada = _gpu(capability=(8, 9), fp16=True, bf16=True, fp8_compute=True)

    def dt(arch, file_dtype, info, name="transformer"):
        p = place(name, file_dtype, "cuda:0", info=info, architecture=arch)
        return p.storage_dtype or file_dtype, p.compute_dtype

    assert dt("flux1_dev", "float32", ampere) == ("bfloat16", "bfloat16")
    assert dt("flux1_dev", "float16", ampere) == ("float16", "float16")  # zero-copy: flux runs in fp16 too
    assert dt("flux1_dev", "float32", turing) == ("float16", "float16")
    assert dt("qwen_image", "float16", ampere) == ("bfloat16", "bfloat16")
    assert dt("qwen_image", "float16", turing) == ("float16", "float32")  # cast on the fly, never fp16
    assert dt("z_image", "float8_e4m3fn", ampere) == ("float8_e4m3fn", "bfloat16")
    assert dt("z_image", "float8_e4m3fn", ada) == ("float8_e4m3fn", "float8_e4m3fn")
    assert dt("flux1_schnell", "float32", ampere) == ("bfloat16", "bfloat16")
    assert dt("hunyuan_video", "float16", ampere) == ("bfloat16", "bfloat16")
    assert dt("wan21", "float32", ampere) == ("float16", "float16")
    # the 2026 families' pipelines run bf16 and name no fp16: never fp16, even from an fp16 file
    assert dt("kandinsky6", "float16", ampere) == ("bfloat16", "bfloat16")
    assert dt("motif_video", "float16", turing) == ("float16", "float32")
    assert dt("sdxl", "bfloat16", ampere, "unet") == ("bfloat16", "bfloat16")
    assert dt(None, "float32", ampere, "unet") == ("float16", "float16")
    # only the diffusion model follows its family: the text encoder and the VAE keep their own rules
    assert dt("qwen_image", "float32", ampere, "t5xxl") == ("float16", "float16")
    assert dt("qwen_image", "float32", ampere, "vae") == ("bfloat16", "bfloat16")
    # on the CPU everything computes in fp32, the file's dtype kept
    p = place("transformer", "bfloat16", "cpu", architecture="qwen_image")
    assert (p.storage_dtype, p.compute_dtype) == (None, "float32")
