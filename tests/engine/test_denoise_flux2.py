"""FLUX.2's transformer (engine.denoise.flux2) against diffusers' Flux2Transformer2DModel on the same weights,
in BFL's naming (the releases') and diffusers' (its own converter's output), [dev] with its guidance
embedder and [klein] without, reduced width (2 heads of 128) and depth, float32, CPU; its op order, a step
fully and partially resident, and a GGUF of it."""

from __future__ import annotations

import math

import pytest
import torch
from denoise_files import check_gguf_like_its_twin, check_op_order, check_steps_alike, rel_l2, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component
from tests.support.synth._build import Builder
from tests.support.synth.flux import Flux2Config, flux2_bfl

diffusers = pytest.importorskip("diffusers")

TINY = Flux2Config(context_in_dim=64, hidden_size=256, num_heads=2, depth=2, depth_single_blocks=2)


def _bfl(c: Flux2Config, seed: int = 2) -> dict[str, torch.Tensor]:
    b = Builder("F32")
    flux2_bfl(b, c)
    g = torch.Generator().manual_seed(seed)
    out = {}
    for k, _, s in b.rows:
        r = torch.randn(s, generator=g)
        out[k] = r / math.sqrt(s[1]) if len(s) == 2 else 1 + 0.1 * r
    return out


@pytest.fixture(scope="module", params=[True, False], ids=["dev", "klein"])
def flux2(request, tmp_path_factory):
    from diffusers.loaders.single_file_utils import convert_flux2_transformer_checkpoint_to_diffusers

    c = TINY if request.param else Flux2Config(**{**TINY.__dict__, "guidance_embed": False})
    bfl = _bfl(c)
    ref = diffusers.Flux2Transformer2DModel(
        num_layers=c.depth, num_single_layers=c.depth_single_blocks, attention_head_dim=128,
        num_attention_heads=c.num_heads, joint_attention_dim=c.context_in_dim, guidance_embeds=c.guidance_embed,
    ).eval()  # fmt: skip
    converted = convert_flux2_transformer_checkpoint_to_diffusers(dict(bfl))
    ref.load_state_dict(converted, strict=True)
    d = tmp_path_factory.mktemp("flux2")
    return write(d / "flux2_bfl.safetensors", bfl), write(d / "flux2_diffusers.safetensors", converted), ref


def _run_diffusers(model, x: dict) -> torch.Tensor:
    return model(hidden_states=x["img"], encoder_hidden_states=x["txt"], timestep=x["timesteps"],
                 img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0], guidance=x.get("guidance"), return_dict=False)[0]  # fmt: skip


def test_flux2_equals_diffusers_in_both_namings(flux2):
    bfl, diff, ref = flux2
    for path, naming in ((bfl, "bfl"), (diff, "diffusers")):
        assert detect_file(str(path)).architecture == "flux2"
        den = denoise.bind(Component("transformer", path, ""), "flux2")
        assert den.naming == naming
        inputs = den.random_inputs(64, 96, batch=2, seed=1)  # 4 x 6 patches
        assert inputs["img_ids"].shape == (2, 24, 4) and inputs["txt_ids"][0, 5].tolist() == [0, 0, 0, 5]
        assert ("guidance" in den.input_names) == (ref.time_guidance_embed.guidance_embedder is not None)
        inputs["txt"], inputs["txt_ids"] = inputs["txt"][:, :20], inputs["txt_ids"][:, :20]
        with torch.inference_mode():
            err = rel_l2(den(inputs), _run_diffusers(ref, inputs))
        print(f"flux2 {naming}: relative L2 {err:.2e}")
        assert err <= 1e-3


def test_flux2_op_order_is_the_call_order(flux2):
    check_op_order(flux2[0], "flux2")


def test_flux2_steps_fully_and_partially_alike(flux2, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(flux2[0], tmp_path, 0.004, "flux2", (1, 16, 128))


def test_a_gguf_flux2_steps_like_its_dequantized_twin(tmp_path):
    """FLUX.2 [klein] GGUFs (BFL naming): the blocks' Linears Q8_0, the rest as it is."""
    pytest.importorskip("gguf")

    def blocks(k, t):
        return k.endswith(".weight") and t.dim() == 2 and k.startswith(("double_blocks.", "single_blocks."))

    c = Flux2Config(**{**TINY.__dict__, "guidance_embed": False})
    assert check_gguf_like_its_twin(tmp_path, _bfl(c, seed=4), "flux", blocks, "flux2", size=(32, 64))
