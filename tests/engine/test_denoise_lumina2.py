"""Lumina-Image 2.0's transformer (engine.denoise.nextdit) against diffusers' Lumina2Transformer2DModel on
the same weights, in diffusers' naming and the release's (fused qkv, the unused `norm_final`), reduced width
(2 query heads of 96 on one K/V head: grouped-query attention) and depth, float32, CPU; captions of one
length and of several (masked), its op order, and a step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_op_order,
    check_steps_alike,
    diffusers_lumina2,
    lumina2_original,
    rel_l2,
    run_diffusers_lumina2,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

TOL = 1e-3


@pytest.fixture(scope="module")
def lumina(tmp_path_factory):
    ref, sd = diffusers_lumina2()
    d = tmp_path_factory.mktemp("lumina2")
    return (
        write(d / "lumina2_diffusers.safetensors", sd),
        write(d / "lumina_2.safetensors", lumina2_original(sd)),
        ref,
    )


def _bound(path):
    assert detect_file(str(path)).architecture == "lumina2"
    return denoise.bind(Component("transformer", path, ""), "lumina2")


@pytest.mark.parametrize(
    "lengths", [None, (45, 45), (30, 45), (45, 12)], ids=["no-mask", "equal", "a-b", "b-a"]
)
def test_lumina2_equals_diffusers_in_both_namings(lumina, lengths):
    diff_path, orig_path, ref = lumina
    inputs = _bound(diff_path).random_inputs(96, 160, batch=2, seed=1)  # a 6 x 10 patch grid
    inputs["cap_feats"] = inputs["cap_feats"][:, :45]
    if lengths is not None:
        inputs["cap_mask"] = (torch.arange(45)[None] < torch.tensor(lengths)[:, None]).float()
    with torch.inference_mode():
        want = run_diffusers_lumina2(ref, inputs)
        for path, naming in ((diff_path, "diffusers"), (orig_path, "original")):
            den = _bound(path)
            assert den.naming == naming and den.input_names == ("x", "t", "cap_feats")
            out = den(den.check_inputs(inputs, "in.safetensors"))
            err = rel_l2(out, want)
            print(f"lumina2 {naming} {lengths}: relative L2 {err:.2e}")
            assert out.shape == inputs["x"].shape and err <= TOL


def test_lumina2_op_order_is_the_call_order(lumina):
    check_op_order(
        lumina[1], "lumina2", plain=2
    )  # the caption norm (a plain holder) and the unused norm_final


def test_lumina2_steps_fully_and_partially_alike(lumina, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(lumina[1], tmp_path, 0.002, "lumina2", (1, 16, 8, 8))


@pytest.mark.parametrize(
    ("mask", "says"),
    [
        ([[1, 1, 0, 1]], "has a 0 before its last 1"),
        ([[0, 0, 0, 0]], "marks no token"),
        ([[1, 0.5, 0, 0]], "values other than 0 and 1"),
        ([[1, 1, 1]], r"input cap_mask has shape \[1, 3\]; expected \[·, 4\]"),
    ],
)
def test_a_caption_mask_says_what_is_wrong_with_it(lumina, mask, says):
    den = _bound(lumina[0])
    inputs = dict(den.random_inputs(64, 64), cap_mask=torch.tensor(mask, dtype=torch.float32))
    inputs["cap_feats"] = inputs["cap_feats"][:, :4]
    with pytest.raises(FormatError, match=says):
        den.check_inputs(inputs, "in.safetensors")
