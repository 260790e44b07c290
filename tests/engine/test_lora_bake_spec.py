"""`--lora FILE[:S_MODEL[:S_CLIP]]`: strengths read from the right, only numbers count."""

from __future__ import annotations

import pytest

from engine.cli.bake import parse_lora_spec


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        ("x.safetensors", ("x.safetensors", 1.0, 1.0)),
        ("x.safetensors:0.8", ("x.safetensors", 0.8, 0.8)),
        ("x.safetensors:0.8:0.3", ("x.safetensors", 0.8, 0.3)),
        ("C:\\loras\\x.safetensors:0.8", ("C:\\loras\\x.safetensors", 0.8, 0.8)),
        ("C:\\loras\\x.safetensors", ("C:\\loras\\x.safetensors", 1.0, 1.0)),
        ("C:\\x.safetensors:-1:2e-1", ("C:\\x.safetensors", -1.0, 0.2)),
        ("a:b:c.safetensors:1:2", ("a:b:c.safetensors", 1.0, 2.0)),
        ("x.safetensors:1:2:3", ("x.safetensors:1", 2.0, 3.0)),  # at most two strengths
        ("x.safetensors:nan", ("x.safetensors:nan", 1.0, 1.0)),  # not a usable number: part of the name
        ("x.safetensors:", ("x.safetensors:", 1.0, 1.0)),
    ],
)
def test_parse_lora_spec(spec, want):
    assert parse_lora_spec(spec) == want
