"""What "Try a step" is told before anything loads: a family Loadout detects but cannot step, a file with no
denoiser, an unreadable file — from the detection alone (engine.catalog.step_families.step_refusal)."""

from __future__ import annotations

import diffusers

from engine.catalog.step_families import STEP_KINDS, step_refusal
from engine.detect.result import Detection, Failure
from tests.engine.layouts_2026.common import detect, meta_shapes

# Cosmos 3, reduced: a family Loadout detects but has no forward for (Kandinsky 6, which these tests used, now steps)
COSMOS3_SMALL = dict(head_dim=32, hidden_size=64, intermediate_size=128, num_attention_heads=2, num_hidden_layers=1,
                     num_key_value_heads=1, vocab_size=64)  # fmt: skip


def test_a_detected_family_without_a_forward_is_refused_by_name():
    d = detect(meta_shapes(diffusers.Cosmos3OmniTransformer, **COSMOS3_SMALL))
    assert d.architecture == "cosmos3" and "cosmos3" not in STEP_KINDS
    assert step_refusal(d) == (
        "Loadout has no forward pass for cosmos3 yet: it detects, loads and patches it, but cannot step it"
    )


def test_a_family_with_a_forward_and_an_unnamed_denoiser_may_try():
    d = detect(meta_shapes(diffusers.SanaTransformer2DModel, num_layers=1))
    assert d.architecture == "sana" and step_refusal(d) is None
    unnamed = Detection(
        "x.safetensors", 1, "safetensors", "diffusion_model", None, components={"transformer": {}}
    )
    assert step_refusal(unnamed) is None  # read from its shapes when it runs (an MMDiT of no release's size)


def test_a_file_without_a_denoiser_or_one_that_cannot_be_read():
    vae = detect(meta_shapes(diffusers.AutoencoderKL))
    assert set(vae.components) == {"vae"}
    assert (
        step_refusal(vae)
        == "this file holds no denoiser (UNet or diffusion transformer) or text encoder to step"
    )
    broken = Detection("x.safetensors", 1, None, error=Failure("format", "x.safetensors: truncated header"))
    assert step_refusal(broken) == "x.safetensors: truncated header"
