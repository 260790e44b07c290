"""GGUF files of the families that stepped last (Bria 3.2 / FIBO, GLM-Image, Ideogram 4, PRX, JoyImage, LongCat-Image,
Ovis-Image, Kandinsky 5): the community's GGUFs of them (city96's convert and llama.cpp's quantize) keep the
safetensors release's keys, each Linear's weight in a block type, norms, biases and tables as they are. Each is
detected as the model it holds and steps like its dequantized safetensors twin — shapes written both as gguf-py
keeps them and as ggml's writer drops their leading axes of 1 — so a quantized file of a new family is not left to
chance. The tiny configurations are those of each family's own test (test_denoise_<family>.py)."""

from __future__ import annotations

import pytest
import test_denoise_bria as bria
import test_denoise_glm_image as glm
import test_denoise_ideogram4 as ideogram
import test_denoise_joyimage as joy
import test_denoise_kandinsky5 as k5
import test_denoise_longcat_image as longcat
import test_denoise_prx as prx
from denoise_files import check_gguf_like_its_twin, well_scaled

from engine.detect import detect_file

diffusers = pytest.importorskip("diffusers")
pytest.importorskip("gguf")

# architecture: (diffusers' class, its tiny config, a seed, the general.architecture a converter writes)
FAMILIES = {
    "bria": (*bria.CONFIGS["bria"], 71, "bria"),
    "bria_fibo": (*bria.CONFIGS["bria_fibo"], 72, "bria_fibo"),
    "glm_image": ("GlmImageTransformer2DModel", glm.CONFIG, 73, "glm_image"),
    "ideogram4": ("Ideogram4Transformer2DModel", ideogram.CONFIG, 74, "ideogram4"),
    "prx": ("PRXTransformer2DModel", prx.CONFIG, 75, "prx"),
    "joyimage": ("JoyImageEditTransformer3DModel", joy.CONFIG, 76, "joyimage"),
    "longcat_image": (*longcat.FAMILIES["longcat_image"], 77, "longcat_image"),
    "ovis_image": (*longcat.FAMILIES["ovis_image"], 78, "ovis_image"),
    "kandinsky5": ("Kandinsky5Transformer3DModel", k5.VIDEO, 79, "kandinsky5"),
}


def _linear_weight(key: str, t) -> bool:
    """What the converters quantize: a 2-D weight whose rows are made of whole blocks (32 values)."""
    return key.endswith(".weight") and t.dim() == 2 and t.shape[-1] % 32 == 0


# ggml's shapes differ from gguf-py's only where a tensor has leading axes of 1: JoyImage's modulation tables
CASES = [(arch, False) for arch in sorted(FAMILIES)] + [("joyimage", True)]


@pytest.mark.parametrize(("arch", "ggml_dims"), CASES, ids=[f"{a}{'-ggml_shapes' * g}" for a, g in CASES])
def test_a_gguf_steps_like_its_dequantized_twin(tmp_path, arch, ggml_dims):
    cls, cfg, seed, gguf_arch = FAMILIES[arch]
    _, sd = well_scaled(getattr(diffusers, cls)(**cfg), seed)
    quantized = check_gguf_like_its_twin(
        tmp_path, sd, gguf_arch, _linear_weight, arch, size=(64, 64), ggml_dims=ggml_dims, tol=1e-6
    )
    # the quantized file is read as the family it holds, and most of its weight is quantized
    det = detect_file(str(tmp_path / "model.gguf"))
    assert (det.format, det.architecture) == ("gguf", arch)
    big = [k for k, t in sd.items() if _linear_weight(k, t)]
    assert len(quantized) == len(big) > 0
