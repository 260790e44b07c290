"""Wan 2.2 Animate's transformer (engine.denoise.wan_animate) against diffusers' WanAnimateTransformer3DModel on the
same weights, in the release's naming (the layout of layouts_2026.video.wan_animate_original, checked through
diffusers' own single-file converter) and in diffusers', at reduced width, depth and motion-encoder size, float32,
CPU; its inputs, its op order, a step fully and partially resident, and the release layouts binding whole."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_lora_step,
    check_op_order,
    random_weights,
    rel_l2,
    step_full_and_partial,
    write,
)
from layouts_2026.video import WAN22_ANIMATE_14B, WanConfig, wan_animate_original

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-3
APP = "motion_encoder.enc.net_app.convs"
TINY = WanConfig(dim=256, ffn=512, layers=4, in_dim=36, clip_image=True, text_dim=64)  # 2 heads of 128
# a 32-px motion encoder (3 residual blocks of 8 channels), 8 motion coefficients of 32-wide styles, a 64-wide
# motion vector, a face encoder of 4 heads of 64, a face adapter after every 2nd block
FACE = dict(
    size=32, channels={32: 8, 16: 8, 8: 8, 4: 8}, style=32, motion=8, face_in=64, face_hidden=64, inject=2
)


def _diffusers_config(c: WanConfig, size: int, channels: dict, style: int, motion: int, face_in: int,
                      face_hidden: int, inject: int) -> dict:  # fmt: skip
    return dict(
        num_attention_heads=c.dim // 128, attention_head_dim=128, in_channels=36, latent_channels=16,
        out_channels=16, text_dim=c.text_dim, ffn_dim=c.ffn, num_layers=c.layers, image_dim=1280,
        added_kv_proj_dim=c.dim, motion_encoder_channel_sizes={str(k): v for k, v in channels.items()},
        motion_encoder_size=size, motion_style_dim=style, motion_dim=motion, motion_encoder_dim=face_in,
        face_encoder_hidden_dim=face_hidden, face_encoder_num_heads=4, inject_face_latents_blocks=inject,
    )  # fmt: skip


def _release_weights(c: WanConfig, face: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random weights in the release's layout; the motion encoder's equalized-lr weights unit normal (as it
    initialises them: the 1/√fan-in is applied at run time), its blur kernels the (1,3,3,1) ones it builds."""
    w = random_weights([(k, "F32", s) for k, s in wan_animate_original(c, **face).items()], seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    k1 = torch.tensor([1.0, 3.0, 3.0, 1.0])
    for k in w:
        if k.endswith(".kernel"):
            w[k] = k1[:, None] * k1[None, :] / 64
        elif k.startswith("motion_encoder.") and k.endswith(".weight"):
            w[k] = torch.randn(w[k].shape, generator=g)
    return w


def _converted(w: dict, conv_out: str | None = None) -> dict:
    """diffusers' single-file converter on the release's tensors: the blur kernels are the only keys it leaves
    (diffusers builds them); `conv_out`: where a motion encoder of other than 512 px keeps its last conv (the
    converter knows the release's, convs.8)."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers

    out = convert_wan_transformer_to_diffusers({k: v.clone() for k, v in w.items()})
    left = sorted(k for k in out if k.endswith(".kernel"))
    assert left and all(k.startswith(APP) for k in left)
    for k in left:
        del out[k]
    if conv_out is not None:
        out["motion_encoder.conv_out.weight"] = out.pop(conv_out)
    return out


def _load(ref, sd: dict) -> None:
    missing, unexpected = ref.load_state_dict(sd, strict=False)
    assert not missing and not unexpected


@pytest.fixture(scope="module")
def animate(tmp_path_factory):
    w = _release_weights(TINY, FACE, seed=1)
    ref = diffusers.WanAnimateTransformer3DModel(**_diffusers_config(TINY, **FACE)).eval()
    _load(ref, _converted(w, conv_out=f"{APP}.4.weight"))
    d = tmp_path_factory.mktemp("animate")
    files = {"original": write(d / "wan2.2_animate_tiny.safetensors", w),
             "diffusers": write(d / "wan_animate_diffusers.safetensors",
                                {k: v.contiguous() for k, v in ref.state_dict().items()})}  # fmt: skip
    return files, ref


def _bind(path):
    return denoise.bind(Component("transformer", str(path), "", compute_dtype="float32"), "wan22")


def _clip(den, frames: int, seed: int) -> dict:
    """Inputs of `frames` latent frames at 64×96 px: the face video 4·(F − 2) + 1 frames (9 for 4: two batches
    of the motion encoder's 8)."""
    x = den.random_inputs(64, 96, seed=seed)
    g = torch.Generator().manual_seed(seed)
    b, c, _, h, w = x["x"].shape
    x["x"] = torch.randn(b, c, frames, h, w, generator=g)
    x["pose_latents"] = torch.randn(b, 16, frames - 1, h, w, generator=g)
    x["face_pixel_values"] = torch.rand(b, 3, 4 * (frames - 2) + 1, 32, 32, generator=g) * 2 - 1
    return den.check_inputs(x, "inputs")


def _diffusers(ref, x: dict) -> torch.Tensor:
    return ref(hidden_states=x["x"], timestep=x["t"], encoder_hidden_states=x["context"],
               encoder_hidden_states_image=x["clip_fea"], pose_hidden_states=x["pose_latents"],
               face_pixel_values=x["face_pixel_values"], return_dict=False)[0]  # fmt: skip


def test_the_release_names_are_what_diffusers_converter_reads():
    """Wan2.2-Animate-14B's release layout, through diffusers' convert_wan_transformer_to_diffusers (on meta
    tensors), is WanAnimateTransformer3DModel's state dict at the Diffusers release's config, key for key and
    shape for shape (5 of its blocks), but for the 14 stored blur kernels (2 per residual block), which diffusers builds itself."""
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from layouts_2026.common import converted, meta_shapes

    c = WAN22_ANIMATE_14B.with_(layers=5)  # 5 of its 40 blocks: one face adapter block
    got = converted(convert_wan_transformer_to_diffusers, wan_animate_original(c))
    kernels = {k for k in got if k.endswith(".kernel")}
    assert len(kernels) == 14 and all(k.startswith(APP) and got[k] == (4, 4) for k in kernels)
    want = meta_shapes(diffusers.WanAnimateTransformer3DModel, added_kv_proj_dim=5120, num_layers=5)
    assert {k: s for k, s in got.items() if k not in kernels} == want


def test_both_namings_equal_diffusers(animate):
    files, ref = animate
    for naming, path in files.items():
        den = _bind(path)
        assert den.naming == naming and den.kind == "wan"
        assert den.input_names == ("x", "t", "context", "clip_fea", "pose_latents", "face_pixel_values")
        m = den.model
        assert (m.face_size, m.inject, len(m.face_blocks)) == (32, 2, 2)
        x = _clip(den, frames=4, seed=5)
        with torch.inference_mode():
            got, want = den(x), _diffusers(ref, x)
        err = rel_l2(got, want)
        print(f"wan animate ({naming}): relative L2 {err:.2e}")
        assert got.shape == want.shape == (1, 16, 4, 12, 8)
        assert err <= TOL, naming
    with torch.inference_mode():  # the face video and the pose latents reach the output
        still = den({**x, "face_pixel_values": torch.full_like(x["face_pixel_values"], 0.8)})
        posed = den({**x, "pose_latents": torch.zeros_like(x["pose_latents"])})
    assert rel_l2(still, got) > 1e-2 and rel_l2(posed, got) > 1e-2


def test_inputs_are_made_and_checked(animate):
    den = _bind(animate[0]["original"])
    x = den.check_inputs(den.random_inputs(64, 64, seed=1), "in.safetensors")
    assert x["x"].shape == (1, 36, 3, 8, 8) and x["pose_latents"].shape == (1, 16, 2, 8, 8)
    assert x["face_pixel_values"].shape == (1, 3, 5, 32, 32) and x["face_pixel_values"].abs().max() <= 1
    bad = {
        "face_pixel_values": x["face_pixel_values"][:, :, :4],  # 4 frames make 1 motion frame, not 2
        "pose_latents": x["pose_latents"][:, :, :1],  # one frame fewer than x's driven ones
    }
    for name, t in bad.items():
        with pytest.raises(FormatError, match=name):
            den.check_inputs({**x, name: t}, "in.safetensors")
    with pytest.raises(FormatError, match="face_pixel_values"):  # the motion encoder's size
        den.check_inputs({**x, "face_pixel_values": x["face_pixel_values"][..., :16, :16]}, "in.safetensors")
    with pytest.raises(FormatError, match="pose_latents"):
        den.check_inputs({k: v for k, v in x.items() if k != "pose_latents"}, "in.safetensors")
    one = {**x, "x": x["x"][:, :, :1], "pose_latents": x["pose_latents"][:, :, :0]}
    with pytest.raises(FormatError):  # a clip needs the reference frame and a driven one
        den.check_inputs(one, "in.safetensors")


@pytest.mark.parametrize("naming", ["original", "diffusers"])
def test_op_order_is_the_call_order(animate, naming):
    """Every castable op runs once, in op_order(); the plain holders (modulations, the activations' biases, the
    blur kernels, the padding tokens, diffusers' motion_synthesis_weight) are read as they are."""
    from engine import ops

    path = animate[0][naming]
    units = Component("transformer", str(path), "").units
    plain = sum(not isinstance(u.module, ops.Castable) for u in units)
    # 4 blocks' and the head's modulation, the face padding tokens, 7 biases; the release's 6 kernels,
    # diffusers' direction
    assert plain == {"original": 19, "diffusers": 14}[naming]
    check_op_order(path, "wan22", plain=plain)


def test_a_step_full_and_partial_give_the_same_bits(animate, tmp_path, monkeypatch):
    """Through the Engine, fully resident and under a 4 MB budget, a clip whose face video takes two batches of the
    motion encoder (its ops run again for the second, read on demand when streamed): the same output."""
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    path = animate[0]["original"]
    inputs = write(tmp_path / "in.safetensors", _clip(_bind(path), frames=4, seed=7))
    runs = step_full_and_partial(path, tmp_path, 0.004, inputs=str(inputs), steps=1)
    (full, a), (partial, b) = runs["full"], runs["partial"]
    assert (full.architecture, full.output_shape) == ("wan22", (1, 16, 4, 12, 8))
    assert partial.streamed_bytes_per_step > 0
    assert torch.equal(a, b)


@pytest.mark.parametrize("naming", ["original", "diffusers"])
def test_the_release_layouts_bind_whole(tmp_path, naming):
    """Wan2.2-Animate-14B in the release's names (Wan-AI's file; header-faithful, no data) and in diffusers' own
    (WanAnimateTransformer3DModel at the Diffusers release's config: the blocks' image keys and values): every
    layer is one the forward computes with."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    if naming == "original":
        rows = wan_animate_original(WAN22_ANIMATE_14B)
    else:
        rows = meta_shapes(diffusers.WanAnimateTransformer3DModel, added_kv_proj_dim=5120)
    path = write_sparse(tmp_path / "animate.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    d = detect_file(str(path))
    assert (d.architecture, d.variant) == ("wan22", "animate-14b")
    den = denoise.bind(Component("transformer", str(path), d.components["transformer"].prefix), "wan22")
    m = den.model
    assert den.naming == naming
    assert (len(m.blocks), len(m.face_blocks), m.inject, m.face_size, m.in_channels) == (40, 8, 5, 512, 36)


def test_a_gguf_wan_animate_steps_like_its_dequantized_twin(tmp_path):
    """ComfyUI-GGUF's Wan files: the block and face adapter Linears Q8_0, the rest as they are (the motion
    encoder's biases and kernels, the padding tokens: plain holders), shapes as ggml's writer stores them
    (leading axes of 1 dropped); the forward equals the dequantized twin's."""
    pytest.importorskip("gguf")

    def pick(k: str, t: torch.Tensor) -> bool:
        return (
            k.endswith(".weight")
            and t.dim() == 2
            and k.startswith(("blocks.", "face_adapter."))
            and t.shape[1] % 32 == 0
        )

    quantized = check_gguf_like_its_twin(
        tmp_path, _release_weights(TINY, FACE, seed=9), "wan", pick, "wan22", ggml_dims=True
    )
    assert any(k.startswith("face_adapter.") for k in quantized)


def test_face_adapters_not_spread_over_the_blocks_are_refused(tmp_path):
    """3 face adapter blocks over 4 blocks: no every-k-th spread the release's and diffusers' configs make."""
    from engine.errors import UnsupportedModel

    w = _release_weights(TINY, {**FACE, "inject": 1}, seed=2)
    path = write(tmp_path / "odd.safetensors", {k: v for k, v in w.items() if ".fuser_blocks.3." not in k})
    with pytest.raises(UnsupportedModel, match="3 face adapter blocks over 4 blocks"):
        _bind(path)


# diffusers' name -> the release's for the modules a Wan Animate LoRA reaches: the blocks' attentions and
# feed-forwards (musubi-tuner, DiffSynth-Studio: q, k, v, o, ffn.0, ffn.2), the face adapter's projections (a diffusers
# LoRA on to_q / to_k / to_v reaches them; to_k and to_v are the release's fused linear1_kv), the face encoder's, the
# motion encoder's mapping network and convs (its residual block i the release's convs.i+1, conv_out its last), the
# pose embedding.
LORA_MODULES = {
    "blocks.0.attn1.to_q": "blocks.0.self_attn.q", "blocks.1.attn2.add_k_proj": "blocks.1.cross_attn.k_img",
    "blocks.3.ffn.net.0.proj": "blocks.3.ffn.0", "face_adapter.0.to_q": "face_adapter.fuser_blocks.0.linear1_q",
    "face_adapter.1.to_out": "face_adapter.fuser_blocks.1.linear2", "face_encoder.out_proj": "face_encoder.out_proj",
    "face_encoder.conv2": "face_encoder.conv2.conv", "motion_encoder.motion_network.2": "motion_encoder.enc.fc.2",
    "motion_encoder.res_blocks.1.conv2": f"{APP}.2.conv2.1", "motion_encoder.conv_out": f"{APP}.4",
    "pose_patch_embedding": "pose_patch_embedding", "condition_embedder.time_proj": "time_projection.1",
}  # fmt: skip
FUSED_KV = ("face_adapter.0.to_k", "face_adapter.1.to_v")  # row blocks of linear1_kv: diffusers' names only


@pytest.mark.parametrize("naming", ["diffusers", "original"])
def test_a_lora_in_either_naming_on_the_other_file_equals_diffusers_merged(animate, tmp_path, naming):
    """A PEFT LoRA in diffusers' names (`transformer.face_adapter.0.to_k`: ai-toolkit, diffusers) on the release's
    file, baked (to_k and to_v reaching the fused linear1_kv's halves); a kohya one in the release's names
    (`lora_unet_face_adapter_fuser_blocks_0_linear1_q`: musubi-tuner) on diffusers' file, on the fly: equal to
    diffusers' model with the ΔW merged by hand."""
    from denoise_files import lora_and_merged, plain_and_merged

    files, ref = animate
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    if naming == "diffusers":
        keys = {d: f"transformer.{d}" for d in (*LORA_MODULES, *FUSED_KV)}
    else:
        keys = {d: "lora_unet_" + o.replace(".", "_") for d, o in LORA_MODULES.items()}
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=17, kohya=naming == "original")
    base = files["original" if naming == "diffusers" else "diffusers"]
    x = _clip(_bind(base), frames=4, seed=5)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 1e-2
    budget = None if naming == "diffusers" else 0.0
    check_lora_step(
        base, lora, strength, x, tmp_path, budget, want, len(keys), f"wan animate LoRA in {naming}'s names"
    )
