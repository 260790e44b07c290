"""NucleusMoE-Image's transformer (engine.denoise.nucleus_image) against diffusers' NucleusMoEImageTransformer2DModel on
the same weights, bare and under `model.diffusion_model.`; 6 blocks (the first 3 dense, as the release), 2 query heads
of 128 over 1 key head, 16 experts, the release's capacity factors and route scale, float32, CPU; with and without a
text mask; its op order, a step fully and partially resident, the default-size layout binding whole, a PEFT LoRA and
`loadout step` from the command line."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
# the release's capacity factors by block (transformer/config.json), cut to 6 blocks
CONFIG = dict(num_layers=6, out_channels=16, attention_head_dim=128, num_attention_heads=2, num_key_value_heads=1,
              joint_attention_dim=48, num_experts=16, moe_intermediate_dim=32,
              dense_moe_strategy="leave_first_three_blocks_dense", capacity_factors=[0.0, 0.0, 0.0, 4.0, 4.0, 2.0],
              route_scale=2.5, use_sigmoid=False)  # fmt: skip


@pytest.fixture(scope="module")
def nucleus(tmp_path_factory):
    torch.manual_seed(0)
    ref, sd = well_scaled(diffusers.NucleusMoEImageTransformer2DModel(**CONFIG), 17)
    d = tmp_path_factory.mktemp("nucleus")
    return (
        write(d / "nucleus_diffusers.safetensors", sd),
        write(d / "nucleus_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "nucleus_image"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "nucleus_image")


def _diffusers(ref, x: dict) -> torch.Tensor:
    f, h, w = (int(v) for v in x["img_shapes"][0])
    mask = x.get("encoder_hidden_states_mask")
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"],
                   encoder_hidden_states=x["encoder_hidden_states"], img_shapes=[(f, h, w)] * len(x["timestep"]),
                   encoder_hidden_states_mask=None if mask is None else mask.bool(), return_dict=False)[0]  # fmt: skip


def _inputs(den, seed=1, batch=2):
    """A 96 x 64 px step (6 x 4 patches) with 12 prompt tokens; the second prompt's last 5 masked."""
    x = den.random_inputs(64, 96, batch=batch, seed=seed)
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :12]
    mask = torch.ones(batch, 12)
    mask[-1, 7:] = 0
    return x, mask


def test_nucleus_equals_diffusers_in_both_namings_with_and_without_a_text_mask(nucleus):
    diff_path, prefixed_path, ref, _ = nucleus
    dens = [_bound(diff_path), _bound(prefixed_path)]
    x, mask = _inputs(dens[0])
    with torch.inference_mode():
        for inputs, what in ((x, "unmasked"), (dict(x, encoder_hidden_states_mask=mask), "masked")):
            inputs = dens[0].check_inputs(inputs, "inputs")
            want = _diffusers(ref, inputs)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(inputs)
                err = rel_l2(out, want)
                print(f"nucleus_image ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 24, 64) and err <= TOL
        # the mask matters: the masked tokens are not attended to
        assert rel_l2(dens[0](x), _diffusers(ref, dict(x, encoder_hidden_states_mask=mask))) > 100 * TOL


def test_routing_is_expert_choice_with_the_release_capacity(nucleus, monkeypatch):
    """Fails with another capacity factor, route scale or an unnormalised gate."""
    from engine.denoise import nucleus_image as N

    den = _bound(nucleus[0])
    x, _ = _inputs(den, seed=4)
    with torch.inference_mode():
        want = _diffusers(nucleus[2], x)
        assert rel_l2(den(x), want) <= TOL
        with monkeypatch.context() as mp:
            mp.setattr(N, "ROUTE_SCALE", 1.0)
            assert rel_l2(den(x), want) > 100 * TOL
        for blk in den.model.blocks[3:]:
            blk.mlp.capacity = 1.0
        assert rel_l2(den(x), want) > 100 * TOL


def test_bad_inputs_are_refused(nucleus):
    from engine.errors import FormatError

    den = _bound(nucleus[0])
    x, _ = _inputs(den)
    with pytest.raises(FormatError, match="img_shapes says"):
        den.check_inputs(dict(x, img_shapes=torch.tensor([[1.0, 5, 4], [1.0, 5, 4]])), "in.safetensors")
    with pytest.raises(FormatError, match="one whole"):
        den.check_inputs(dict(x, img_shapes=torch.tensor([[1.0, 6, 4], [1.0, 4, 6]])), "in.safetensors")


def test_nucleus_op_order_is_the_call_order(nucleus):
    check_op_order(nucleus[1], "nucleus_image", PREFIX, plain=6)  # the unused norm_added_q


def test_nucleus_steps_fully_and_partially_alike(nucleus, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(nucleus[0], tmp_path, 0.0005, "nucleus_image", (1, 16, 64))
