"""Stable Cascade's Stage C and Stage B UNets (engine.denoise.stable_cascade) against diffusers' StableCascadeUNet on
the same weights, in diffusers' naming and the release's (Stability's files: each attention a torch
MultiheadAttention, `attention.attn.in_proj_weight` / `out_proj`, Stage B's `clip_mapper`: the inverse of diffusers'
convert_stable_cascade_unet_single_file_to_diffusers), reduced widths (64-wide heads, as every release's) and depths,
float32, CPU; the op order, and a step fully and partially resident."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_steps_alike, recorded_order, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

pytest.importorskip("diffusers")

TOL = 1e-4
TYPES = {"CT": ("SDCascadeResBlock", "SDCascadeTimestepBlock"),
         "CTA": ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock")}  # fmt: skip
# Stage C's shape (two levels joined by 1×1 mappings, sca and crp, text / pooled / image CLIP) and Stage B's (four
# levels joined by 2×2 strided convolutions, attention in the last two, sca, effnet and pixels), narrowed
STAGE_C = dict(in_channels=16, out_channels=16, patch_size=1, conditioning_dim=64, block_out_channels=(64, 128),
               num_attention_heads=(1, 2), down_num_layers_per_block=(1, 2), up_num_layers_per_block=(2, 1),
               down_blocks_repeat_mappers=(1, 1), up_blocks_repeat_mappers=(2, 1),
               block_types_per_layer=(TYPES["CTA"], TYPES["CTA"]), clip_text_in_channels=32,
               clip_text_pooled_in_channels=48, clip_image_in_channels=24, timestep_conditioning_type=("sca", "crp"),
               dropout=(0.0, 0.0), switch_level=(False,))  # fmt: skip
STAGE_B = dict(in_channels=4, out_channels=4, patch_size=2, conditioning_dim=64, block_out_channels=(32, 32, 64, 64),
               num_attention_heads=(0, 0, 1, 1), down_num_layers_per_block=(1, 1, 1, 1),
               up_num_layers_per_block=(1, 1, 1, 1), down_blocks_repeat_mappers=(1, 1, 1, 1),
               up_blocks_repeat_mappers=(2, 2, 1, 1), block_types_per_layer=(TYPES["CT"], TYPES["CT"], TYPES["CTA"],
               TYPES["CTA"]), clip_text_pooled_in_channels=48, effnet_in_channels=16, pixel_mapper_in_channels=3,
               timestep_conditioning_type=("sca",), dropout=(0.0,) * 4)  # fmt: skip
ARCH = {"c": "stable_cascade_c", "b": "stable_cascade_b"}


def release(sd: dict, stage: str) -> dict:
    """diffusers' names back in the release's: q / k / v fused row-wise into a MultiheadAttention's in_proj, its output
    projection `attn.out_proj`; Stage B's pooled mapper `clip_mapper`."""
    out = {}
    for k, v in sd.items():
        if ".attention.to_k." in k or ".attention.to_v." in k:
            continue
        if ".attention.to_q." in k:
            attr = k.rsplit(".", 1)[1]
            base = k.split(".attention.to_q.")[0] + ".attention"
            out[f"{base}.attn.in_proj_{attr}"] = torch.cat([sd[f"{base}.to_{n}.{attr}"] for n in "qkv"])
            continue
        k = k.replace(".attention.to_out.0.", ".attention.attn.out_proj.")
        if stage == "b":
            k = k.replace("clip_txt_pooled_mapper.", "clip_mapper.")
        out[k] = v
    return out


@pytest.fixture(scope="module")
def cascade(tmp_path_factory):
    from diffusers import StableCascadeUNet

    d = tmp_path_factory.mktemp("cascade")
    out = {}
    for stage, cfg in (("c", STAGE_C), ("b", STAGE_B)):
        ref, sd = well_scaled(StableCascadeUNet(**cfg), seed=11 if stage == "c" else 12)
        out[stage] = {
            "ref": ref,
            "diffusers": write(d / f"stage_{stage}_diffusers.safetensors", sd),
            "release": write(d / f"stage_{stage}.safetensors", release(sd, stage)),
        }
    return out


def _bound(path, stage: str):
    det = detect_file(str(path))
    assert det.architecture == ARCH[stage]
    name, comp = next(iter(det.components.items()))
    return denoise.bind(Component(name, path, comp.prefix), ARCH[stage])


def _diffusers(ref, stage: str, x: dict) -> torch.Tensor:
    """diffusers' forward on the original's inputs: sample = x, timestep_ratio = r, Stage B's clip its pooled text."""
    with torch.inference_mode():
        if stage == "c":
            return ref(x["x"], x["r"], clip_text_pooled=x["clip_text_pooled"], clip_text=x["clip_text"],
                       clip_img=x["clip_img"], return_dict=False)[0]  # fmt: skip
        return ref(x["x"], x["r"], clip_text_pooled=x["clip"], effnet=x["effnet"], pixels=x.get("pixels"),
                   return_dict=False)[0]  # fmt: skip


@pytest.mark.parametrize("naming", ["diffusers", "release"])
@pytest.mark.parametrize("stage", ["c", "b"])
def test_equals_diffusers(cascade, stage, naming):
    den = _bound(cascade[stage][naming], stage)
    assert den.naming == naming
    want_names = (
        ("x", "r", "clip_text", "clip_text_pooled", "clip_img")
        if stage == "c"
        else ("x", "r", "effnet", "clip")
    )
    assert den.input_names == want_names
    x = den.check_inputs(den.random_inputs(512, 384, batch=2, seed=3), "inputs")
    if (
        stage == "c"
    ):  # ceil(px / 42.67): a 12 x 9 latent, 77 prompt tokens, one pooled and one image embedding
        assert x["x"].shape == (2, 16, 9, 12) and x["clip_text"].shape == (2, 77, 32)
        x["clip_text"] = x["clip_text"][:, :20]
    else:  # int(12 · 10.67) x int(9 · 10.67), made even; Stage C's latent as effnet
        assert x["x"].shape == (2, 4, 96, 128) and x["effnet"].shape == (2, 16, 9, 12)
        x["x"] = x["x"][..., :34, :46]  # odd sizes on the way down: resized on the way up
    want = _diffusers(cascade[stage]["ref"], stage, x)
    with torch.inference_mode():
        out = den(x)
        err = rel_l2(out, want)
        print(f"stable cascade stage {stage} ({naming}): relative L2 {err:.2e}")
        assert out.shape == x["x"].shape and err <= TOL
        if stage == "b":  # given pixels reach the output
            x["pixels"] = torch.randn(2, 3, 8, 8)
            want = _diffusers(cascade[stage]["ref"], stage, x)
            assert rel_l2(den(x), want) <= TOL
        x["r"] = x["r"].flip(0)
        assert rel_l2(den(x), want) > 1e-3  # the noise ratio counts


@pytest.mark.parametrize("stage", ["c", "b"])
def test_op_order_is_the_call_order(cascade, stage):
    """op_order() is the call order with each op at its first call (a level's later passes over its blocks, one per
    repeat mapper, call them again: the streamer reads those on demand), and names every layer but the plain holders
    the forward reads itself (GlobalResponseNorm's, the release's in_proj, a transposed convolution widening)."""
    path = cascade[stage]["release"]
    det = detect_file(str(path))
    name, comp = next(iter(det.components.items()))
    c = Component(name, path, comp.prefix)
    den = denoise.bind(c, ARCH[stage])
    seen = recorded_order(den, c, den.random_inputs(64, 64))
    first = list({id(o): o for o in seen}.values())
    assert len(seen) > len(first)  # the tiny models repeat a level
    assert [id(o) for o in first] == [id(o) for o in den.op_order()]
    m = den.model
    plain = sum(1 for lv in m.down + m.up for b in lv.blocks if type(b).__name__ in ("Res", "Attn"))
    plain += sum(1 for lv in m.up if lv.up is not None and not hasattr(lv.up, "cast_params"))
    assert len(first) == len(c.units) - plain


@pytest.mark.parametrize("stage", ["c", "b"])
def test_steps_fully_and_partially_alike(cascade, stage, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    shape = (1, 16, 2, 2) if stage == "c" else (1, 4, 20, 20)
    check_steps_alike(cascade[stage]["release"], tmp_path, 0.00001, ARCH[stage], shape)


# (levels, the first level's width, the deepest level's heads, its ResBlocks on the way down): the original configs
@pytest.mark.parametrize(
    "name,shape",
    [
        ("stable_cascade_c", (2, 2048, 32, 24)),
        ("stable_cascade_c_lite", (2, 1536, 24, 12)),
        ("stable_cascade_b", (4, 320, 20, 6)),
        ("stable_cascade_b_lite", (4, 320, 18, 4)),
    ],
)
@pytest.mark.parametrize("naming", ["release", "diffusers"])
def test_the_release_layouts_bind_whole(tmp_path, name, shape, naming):
    """Stability's four files (tests/support/synth/cascade.py, from the original configs, checked against diffusers'
    converter by test_synth_dits) and diffusers' conversion of them: every layer is one the forward computes with."""
    from diffusers.loaders.single_file_utils import convert_stable_cascade_unet_single_file_to_diffusers

    from engine.denoise.common import wshape
    from engine.formats.safetensors import write_sparse
    from tests.support import synth

    rows = {k: s for k, _, s in synth.layout(name)}
    if naming == "diffusers":
        meta = {k: torch.empty(s, device="meta") for k, s in rows.items()}
        rows = {
            k: tuple(v.shape) for k, v in convert_stable_cascade_unet_single_file_to_diffusers(meta).items()
        }
    path = write_sparse(tmp_path / f"{name}.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    den = _bound(path, name.split("_")[2])
    m = den.model
    deepest = m.down[-1].blocks
    heads = next(wshape(b.out)[0] // 64 for b in deepest if type(b).__name__ == "Attn")
    res = sum(type(b).__name__ == "Res" for b in deepest)
    assert den.naming == naming
    assert (len(m.down), wshape(m.embedding)[0], heads, res) == shape


# Modules of every kind a LoRA trains: ResBlocks' convolutions and MLPs, time mappers, condition mappers, the attention's
# kv_mapper and output projection, repeat mappers and level mappings, the embedding and clf convolutions
LORA_NAMES = ("embedding.1", "clip_txt_mapper", "down_blocks.0.0.depthwise", "down_blocks.0.0.channelwise.0",
              "down_blocks.0.0.channelwise.4", "down_blocks.0.1.mapper", "down_blocks.0.1.mapper_crp",
              "down_blocks.0.2.kv_mapper.1", "down_blocks.1.2.attention.to_out.0", "up_repeat_mappers.0.0",
              "down_downscalers.1.1.blocks.0", "clf.1")  # fmt: skip


def _lora_case(cascade, tmp_path, budget, base: str, keys: dict, kohya: bool):
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    ref = cascade["c"]["ref"]
    sd = {k: v.clone() for k, v in ref.state_dict().items()}
    lora, merged = lora_and_merged(sd, keys, 0.8, seed=7, kohya=kohya)
    den = _bound(cascade["c"][base], "c")
    x = den.random_inputs(128, 128, seed=5)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, "c", x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"stable cascade C LoRA on the {base} file (budget {budget})"
    # the LoRA's own names say Stable Cascade's Stage C (its mapper_crp, the kv_mappers' width being the tiny model's)
    check_lora_step(
        cascade["c"][base], lora, 0.8, x, tmp_path, budget, want, len(keys), what, "stable_cascade_c", TOL
    )


@pytest.mark.parametrize(("base", "budget"), [("release", None), ("release", 0.0), ("diffusers", 0.0)])
def test_a_kohya_lora_lands(cascade, tmp_path, base, budget):
    """A LoRA in the release's names, kohya's `lora_unet_` with underscores, on either file, baked (resident) and on the
    fly (streamed): equal to diffusers' model with the LoRA merged by hand (each op the forward computes with is
    patched; on diffusers' file attn.out_proj reaches to_out.0)."""
    keys = {d: "lora_unet_" + d.replace("attention.to_out.0", "attention.attn.out_proj").replace(".", "_")
            for d in LORA_NAMES}  # fmt: skip
    _lora_case(cascade, tmp_path, budget, base, keys, kohya=True)


@pytest.mark.parametrize("base", ["diffusers", "release"])
def test_a_peft_lora_lands(cascade, tmp_path, base):
    """A PEFT LoRA in diffusers' names (`unet.`) on either file (on the release's, to_out.0 reaches attn.out_proj)."""
    _lora_case(cascade, tmp_path, None, base, {d: f"unet.{d}" for d in LORA_NAMES}, kohya=False)


def test_stage_b_pooled_mapper_in_either_naming():
    """Stage B's clip_mapper (release) and clip_txt_pooled_mapper (diffusers) reach each other; Stage C keeps its
    clip_txt_pooled_mapper in both namings, so nothing is renamed there."""
    from engine.lora.keymap import KeyMap

    b_release = {"embedding.1.weight": (32, 16, 1, 1), "clf.1.weight": (16, 32, 1, 1), "clip_mapper.weight": (256, 48),
                 "down_downscalers.1.1.weight": (32, 32, 2, 2), "effnet_mapper.0.weight": (128, 16, 1, 1),
                 "down_blocks.0.0.depthwise.weight": (32, 1, 3, 3), "up_blocks.0.0.depthwise.weight": (32, 1, 3, 3)}  # fmt: skip
    b_diffusers = {k.replace("clip_mapper", "clip_txt_pooled_mapper"): v for k, v in b_release.items()}
    c = {**{k: v for k, v in b_diffusers.items() if "effnet" not in k}, "clip_txt_mapper.weight": (64, 32)}
    assert KeyMap(b_release).aliases["lora_unet_clip_txt_pooled_mapper"].key == "clip_mapper.weight"
    assert KeyMap(b_diffusers).aliases["unet.clip_mapper"].key == "clip_txt_pooled_mapper.weight"
    assert "lora_unet_clip_mapper" not in KeyMap(c).aliases


def test_a_lora_of_the_release_in_proj_is_said_to_change_nothing(cascade, tmp_path):
    """The release's MultiheadAttention in_proj is read from its plain holder, which no patch reaches: a LoRA of it
    is not counted as placed (it would change nothing), and the step says so."""
    from denoise_files import lora_step

    c, name = 128, "lora_unet_down_blocks_1_2_attention_attn_in_proj"
    g = torch.Generator().manual_seed(9)
    lora = {f"{name}.lora_down.weight": torch.randn(4, c, generator=g),
            f"{name}.lora_up.weight": torch.randn(3 * c, 4, generator=g), f"{name}.alpha": torch.tensor(4.0)}  # fmt: skip
    den = _bound(cascade["c"]["release"], "c")
    x = den.random_inputs(128, 128, seed=5)
    r, out = lora_step(cascade["c"]["release"], lora, 1.0, x, tmp_path)
    assert r.loras[0]["mapped"] == 0 and "change nothing" in r.loras[0]["warning"]
    with torch.inference_mode():
        assert torch.equal(out, den(x))


@pytest.mark.parametrize(
    ("names", "width", "base"),
    [
        (("down_blocks.1.3.kv_mapper.1", "up_blocks.0.2.attention.attn.out_proj"), 2048, "stable_cascade_c"),
        (("down_blocks.1.3.kv_mapper.1", "down_blocks.0.0.channelwise.0"), 1536, "stable_cascade_c"),
        (("down_blocks.2.2.kv_mapper.1", "down_blocks.2.2.attention.to_q"), 1280, "stable_cascade_b"),
        (
            ("down_blocks.0.0.channelwise.0", "down_blocks.0.0.channelwise.4"),
            64,
            None,
        ),  # nothing says the stage
    ],
)
def test_a_cascade_lora_names_its_stage(tmp_path, names, width, base):
    """A LoRA's base from its names (Stable Cascade's block modules) and the kv_mappers' input width (c_cond)."""
    g = torch.Generator().manual_seed(3)
    lora = {}
    for n in names:
        k = "lora_unet_" + n.replace(".", "_")
        lora[f"{k}.lora_down.weight"] = torch.randn(4, width, generator=g)
        lora[f"{k}.lora_up.weight"] = torch.randn(width, 4, generator=g)
    assert detect_file(str(write(tmp_path / "lora.safetensors", lora))).lora.base == base
