"""Wan-Animate-2's transformer (engine.denoise.wan_animate2) against diffusers' WanAnimate2Transformer3DModel on the
same weights, in the release's naming (layouts_2026.video.wan_animate2_release, checked through diffusers' own
single-file converter in test_detect_wan) and in diffusers', at reduced width and depth, float32, CPU: diffusers'
two calls (the reference pass, `kv_cache_mode="extract"`, then a step, `"cached"`) against our one forward, its
cache across steps, its inputs, its op order, a step fully and partially resident, the release layout binding whole.

diffusers' cached self-attention runs on the flex backend through a BlockMask built with `create_block_mask(...,
_compile=True)`; on this CPU the mask is built by the same mask function evaluated eagerly (`_compile=False`, patched
in diffusers' module for these tests) and flex attention runs its eager path: the same attention, unfused."""

from __future__ import annotations

import functools

import pytest
import torch
from denoise_files import check_op_order, random_weights, rel_l2, step_full_and_partial, write
from layouts_2026.video import (
    WAN_ANIMATE2_14B,
    WanConfig,
    wan_animate2_diffusers_config,
    wan_animate2_release,
)

from engine import denoise
from engine.errors import FormatError
from engine.model import Component

diffusers = pytest.importorskip("diffusers")
pytestmark = pytest.mark.filterwarnings("ignore:.*flex_attention called without torch.compile")

TOL = 1e-3
# 2 heads of 128; 10 blocks: the unconditional branch skips block 9
TINY = WanConfig(dim=256, ffn=512, layers=10, in_dim=36, clip_image=True, text_dim=64)


@pytest.fixture(scope="module")
def animate2(tmp_path_factory):
    from diffusers.loaders.single_file_utils import convert_wan_animate_2_transformer_to_diffusers
    from diffusers.models.transformers import transformer_wan_animate_2 as mod
    from torch.nn.attention.flex_attention import create_block_mask

    w = random_weights([(k, "F32", s) for k, s in wan_animate2_release(TINY).items()], seed=1)
    ref = diffusers.WanAnimate2Transformer3DModel(**wan_animate2_diffusers_config(TINY), text_dim=64).eval()
    sd = convert_wan_animate_2_transformer_to_diffusers({k: v.clone() for k, v in w.items()})
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not missing and not unexpected
    d = tmp_path_factory.mktemp("animate2")
    files = {"original": write(d / "wan_animate2_tiny.safetensors", w),
             "diffusers": write(d / "wan_animate2_diffusers.safetensors",
                                {k: v.contiguous() for k, v in ref.state_dict().items()})}  # fmt: skip
    eager = functools.partial(create_block_mask, _compile=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            mod,
            "create_block_mask",
            lambda *a, **k: eager(*a, **{n: v for n, v in k.items() if n != "_compile"}),
        )
        yield files, ref


def _bind(path):
    return denoise.bind(Component("transformer", str(path), "", compute_dtype="float32"), "wan22")


def _clip(den, frames: int, seed: int) -> dict:
    """`frames` latent frames at 64×96 px (the reference slot and frames − 1 more), the driving video's frames − 1."""
    x = den.random_inputs(64, 96, seed=seed)
    g = torch.Generator().manual_seed(seed)
    for n in ("hidden_states", "condition_latents", "driving_video_latents", "driving_video_condition"):
        b, c, f, h, w = x[n].shape
        x[n] = torch.randn(b, c, frames - (n.startswith("driving")), h, w, generator=g)
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :7]  # a short prompt, padded inside
    return den.check_inputs(x, "inputs")


def _diffusers(ref, x: dict, is_uncondtion: bool = False) -> torch.Tensor:
    """diffusers' pipeline's two calls: the reference pass into a fresh cache, then the step against it."""
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    cache = WanAnimate2KVCache(len(ref.blocks))
    _, _, f, h, w = x["hidden_states"].shape
    grid = torch.tensor([[f - 1, h // 2, w // 2]])
    ref([x["driving_video_latents"][0]], timestep=x["timestep"], encoder_hidden_states=[x["prompt_ref_embeds"][0]],
        encoder_hidden_states_image=x["condition_clip_context"], condition_latents=[x["driving_video_condition"][0]],
        kv_cache=cache, kv_cache_mode="extract", seq_len=(f - 1) * h * w // 4, offset_grid_sizes=grid)  # fmt: skip
    out = ref([x["hidden_states"][0]], timestep=x["timestep"], encoder_hidden_states=[x["encoder_hidden_states"][0]],
              encoder_hidden_states_image=x["encoder_hidden_states_image"], condition_latents=[x["condition_latents"][0]],
              kv_cache=cache, kv_cache_mode="cached", seq_len=f * h * w // 4, reference_grid_sizes=grid,
              origin_len=4 * (f - 2) + 1, origin_area=[8 * h, 8 * w], is_uncondtion=is_uncondtion)  # fmt: skip
    return out.sample[0][None]


def test_both_namings_equal_diffusers_two_calls(animate2):
    files, ref = animate2
    for naming, path in files.items():
        den = _bind(path)
        assert den.naming == naming and den.kind == "wan" and len(den.model.blocks) == 10
        x = _clip(den, frames=3, seed=5)
        with torch.inference_mode():
            got, want = den(x), _diffusers(ref, x)
        err = rel_l2(got, want)
        print(f"wan animate 2 ({naming}): relative L2 {err:.2e}")
        assert got.shape == want.shape == (1, 16, 3, 12, 8)
        assert err <= TOL, naming
    with torch.inference_mode():
        again = den(x)  # the later steps of a run: the reference's keys and values from the cache
        x["driving_video_latents"].add_(1.0)  # not read again while the same tensors come
        cached = den(x)
        other = den({**x, "driving_video_latents": x["driving_video_latents"].clone()})  # another run's
    assert rel_l2(again, got) < 1e-5 and torch.equal(cached, again)
    assert rel_l2(other, got) > 1e-2  # the driving video reaches the output


def test_inputs_are_made_and_checked(animate2):
    den = _bind(animate2[0]["original"])
    assert den.input_names == (
        "hidden_states", "timestep", "encoder_hidden_states", "condition_latents", "driving_video_latents",
        "driving_video_condition", "prompt_ref_embeds", "encoder_hidden_states_image", "condition_clip_context",
    )  # fmt: skip
    x = den.check_inputs(den.random_inputs(64, 64, seed=1), "in.safetensors")
    assert x["hidden_states"].shape == (1, 16, 2, 8, 8) and x["condition_latents"].shape == (1, 20, 2, 8, 8)
    assert x["driving_video_latents"].shape == (1, 16, 1, 8, 8) and x["condition_clip_context"].shape == (
        1,
        257,
        1280,
    )
    bad = {
        "driving_video_latents": x["driving_video_latents"][..., :4],  # not the generation's size
        "driving_video_condition": torch.cat(
            [x["driving_video_condition"]] * 2, dim=2
        ),  # as many frames as x
        "prompt_ref_embeds": torch.zeros(1, 513, 64),  # past the 512 text tokens
    }
    for name, t in bad.items():
        with pytest.raises(FormatError, match=name):
            den.check_inputs({**x, name: t}, "in.safetensors")
    with pytest.raises(FormatError, match="condition_clip_context"):
        den.check_inputs({k: v for k, v in x.items() if k != "condition_clip_context"}, "in.safetensors")
    one = {k: v[:, :, :1] if k in ("hidden_states", "condition_latents") else v for k, v in x.items()}
    with pytest.raises(FormatError, match="driving_video_latents .* no values"):  # the slot and no frame
        den.check_inputs({**one, "driving_video_latents": x["driving_video_latents"][:, :, :0],
                          "driving_video_condition": x["driving_video_condition"][:, :, :0]}, "in.safetensors")  # fmt: skip


def test_the_unconditional_branch_skips_block_9_as_diffusers(animate2):
    """diffusers' `is_uncondtion` (CFG's unconditional call leaves out block 9): a batch of a conditional and an
    unconditional sample, each equal to diffusers' call with its flag."""
    files, ref = animate2
    den = _bind(files["diffusers"])
    x = _clip(den, frames=2, seed=6)
    both = den.check_inputs({k: torch.cat([v, v]) for k, v in x.items()} | {"is_uncondtion": torch.tensor([0.0, 1.0])},
                            "inputs")  # fmt: skip
    with torch.inference_mode():
        got = den(both)
        want = [_diffusers(ref, x, is_uncondtion=u) for u in (False, True)]
    for i in range(2):
        assert rel_l2(got[i : i + 1], want[i]) <= TOL
    assert rel_l2(want[1], want[0]) > 1e-3
    with pytest.raises(FormatError, match="is_uncondtion"):
        den.check_inputs({**both, "is_uncondtion": torch.tensor([0.0, 2.0])}, "in.safetensors")


@pytest.mark.parametrize("naming", ["original", "diffusers"])
def test_op_order_is_the_call_order(animate2, naming):
    """Each op runs once in the first call, the reference's tokens beside the generation's; the blocks' and the
    head's modulations are read from their plain holders."""
    check_op_order(animate2[0][naming], "wan22", plain=TINY.layers + 1)


def test_two_steps_full_and_partial_give_the_same_bits(animate2, tmp_path, monkeypatch):
    """Through the Engine, fully resident and under a 4 MB budget, two steps (the extraction in the first, the cache
    in the second): the same output."""
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    path = animate2[0]["original"]
    inputs = write(tmp_path / "in.safetensors", _clip(_bind(path), frames=3, seed=7))
    runs = step_full_and_partial(path, tmp_path, 0.004, inputs=str(inputs), steps=2)
    (full, a), (partial, b) = runs["full"], runs["partial"]
    assert (full.architecture, full.output_shape, full.naming) == ("wan22", (1, 16, 3, 12, 8), "original")
    assert partial.streamed_bytes_per_step > 0
    assert torch.equal(a, b)


@pytest.mark.parametrize("naming", ["original", "diffusers"])
def test_the_release_layouts_bind_whole(tmp_path, naming):
    """Wan-Animate-2 14B in the release's names (header-faithful, no data) and in diffusers' own (the class at its
    default config): every layer is one the forward computes with."""
    from layouts_2026.common import meta_shapes

    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse

    if naming == "original":
        rows = wan_animate2_release(WAN_ANIMATE2_14B).under("model.diffusion_model.")
    else:
        rows = meta_shapes(diffusers.WanAnimate2Transformer3DModel)
    path = write_sparse(tmp_path / "animate2.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    d = detect_file(str(path))
    assert (d.architecture, d.variant) == ("wan22", "animate2-14b")
    den = denoise.bind(Component("transformer", str(path), d.components["transformer"].prefix), "wan22")
    assert den.naming == naming
    assert (len(den.model.blocks), den.model.in_channels, den.model.heads) == (40, 36, 40)


# diffusers' name -> the release's for modules a Wan-Animate-2 LoRA reaches: the blocks' attentions (the projections
# diffusers renames, the image keys), feed-forwards (the same name inside the release's wrapper), the stem and head.
LORA_MODULES = {
    "blocks.0.self_attn.to_q": "blocks.0.block.self_attn.q", "blocks.1.self_attn.to_out.0": "blocks.1.block.self_attn.o",
    "blocks.1.cross_attn.add_k_proj": "blocks.1.block.cross_attn.k_img", "blocks.2.cross_attn.to_v": "blocks.2.block.cross_attn.v",
    "blocks.2.ffn.0": "blocks.2.block.ffn.0", "time_projection.1": "time_projection.1", "img_emb.proj.3": "img_emb.proj.3",
    "patch_embedding": "patch_embedding", "head.head": "head.head",
}  # fmt: skip


@pytest.mark.parametrize("naming", ["diffusers", "original"])
def test_a_lora_in_either_naming_on_the_other_file_equals_diffusers_merged(animate2, tmp_path, naming):
    """A PEFT LoRA in diffusers' names (`transformer.blocks.0.self_attn.to_q`) on the release's file, baked; a kohya
    one in the release's names (`lora_unet_blocks_0_block_self_attn_q`) on diffusers' file, on the fly: equal to
    diffusers' model with the ΔW merged by hand, both read as LoRAs for wan22."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    files, ref = animate2
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    if naming == "diffusers":
        keys = {d: f"transformer.{d}" for d in LORA_MODULES}
    else:
        keys = {d: "lora_unet_" + o.replace(".", "_") for d, o in LORA_MODULES.items()}
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=17, kohya=naming == "original")
    base = files["original" if naming == "diffusers" else "diffusers"]
    x = _clip(_bind(base), frames=3, seed=5)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 1e-2
    budget = None if naming == "diffusers" else 0.0
    check_lora_step(base, lora, strength, x, tmp_path, budget, want, len(keys),
                    f"wan animate 2 LoRA in {naming}'s names", base="wan22")  # fmt: skip


def test_the_memory_a_step_asks_for_counts_the_reference_tokens(animate2):
    """The first step runs the driving video's tokens beside the generation's: the activations Loadout makes room
    for at load count both (the 2 generation frames' 2·24 tokens and the driving frame's 24)."""
    from engine.catalog.measured import activation_bytes
    from engine.stepping import _activation_bytes

    den = _bind(animate2[0]["original"])
    x = _clip(den, frames=2, seed=1)
    assert _activation_bytes(den, x, torch.float32) == activation_bytes("wan", 3 * 24, 4)
