"""A layout nobody knows is never guessed: a denoiser of unknown structure is a diffusion_model with
architecture null and the facts its keys show; a new size of a known block structure stays in its family."""

from __future__ import annotations

import pytest
from layouts_2026.common import Rows, detect


def _mystery(blocks=30, hidden=3072, patch=(2, 2), timestep=True) -> Rows:
    r = Rows()
    r.conv("x_embedder.proj", hidden, 16, patch)
    if timestep:
        r.lin("t_embedder.mlp.0", hidden, 256)
    for i in range(blocks):
        r.lin(f"blocks.{i}.attn.qkv", 3 * hidden, hidden)
        r.lin(f"blocks.{i}.attn.proj", hidden, hidden)
        r.lin(f"blocks.{i}.mlp.fc1", 4 * hidden, hidden)
        r.lin(f"blocks.{i}.mlp.fc2", hidden, 4 * hidden)
    return r


def test_an_unknown_denoiser_is_null_with_its_shape_in_the_evidence():
    d = detect(_mystery().under("model.diffusion_model."))
    assert (d.kind, d.architecture, d.variant, d.also) == ("diffusion_model", None, None, ())
    assert [e.reason for e in d.evidence] == [
        "transformer, 30 blocks, hidden 3072, patch 2×2: no known release"
    ]
    assert d.components["transformer"].prefix == "model.diffusion_model."


def test_attention_blocks_without_a_timestep_are_no_denoiser():
    assert detect(_mystery(timestep=False)).kind == "unknown"


torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")


@pytest.mark.parametrize(
    "cls", ["QwenImage21Transformer2DModel", "OvisImageTransformer2DModel", "Flux3Transformer2DModel"]
)
def test_structures_no_rule_knows_are_never_guessed(cls):
    from layouts_2026.common import meta_shapes

    d = detect(meta_shapes(getattr(diffusers, cls)))
    assert (d.kind, d.architecture) == ("diffusion_model", None), d.evidence
    assert "no known release" in d.evidence[0].reason
