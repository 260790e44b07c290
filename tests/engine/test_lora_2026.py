"""LoRAs of the 2025-26 families in each trainer's naming reach their base in either naming.

Each adapter is written the way its trainer names modules: the module paths come from the model class
that trainer trains (the original release's layout, written from the original codebases in
`layouts_2026`, or diffusers' class on the meta device), and the prefix / part names are the trainer's
(musubi-tuner `lora_unet_` + kohya parts; diffusion-pipe `diffusion_model.` + PEFT parts; ai-toolkit and
diffusers `transformer.` + PEFT parts; PEFT `base_model.model.`; OneTrainer `lora_transformer_`;
lightx2v / ComfyUI `.diff` / `.diff_b`). The base is the other source, so every cross-naming case
checks the key map against an independent layout.
"""

from __future__ import annotations

import diffusers
import pytest
import torch
from layouts_2026 import image as I  # noqa: E741
from layouts_2026 import video as V
from layouts_2026.common import meta_shapes

from engine.detect.keys import index_from_shapes
from engine.lora.coverage import coverage, fit_warning, label
from engine.lora.describe import describe_lora
from engine.lora.naming import underscored

RANK = 4


def _linears_of_class(cls, **cfg) -> dict[str, tuple[int, int]]:
    """Every nn.Linear of a diffusers class built on the meta device: module path -> (out, in)."""
    with torch.device("meta"):
        m = cls(**cfg)
    return {
        n: (x.out_features, x.in_features) for n, x in m.named_modules() if isinstance(x, torch.nn.Linear)
    }


def _linears_of_rows(rows) -> dict[str, tuple[int, int]]:
    """The 2-D weights of an original layout (its linear layers): module path -> (out, in)."""
    return {k[: -len(".weight")]: tuple(s) for k, s in rows.items() if k.endswith(".weight") and len(s) == 2}


def _adapter(linears: dict[str, tuple[int, int]], style: str, bias: set[str] = frozenset()):
    rows: dict[str, tuple[int, ...]] = {}
    meta = {}
    for path, (out, inp) in linears.items():
        u = underscored(path)
        if style in ("musubi", "onetrainer"):
            name = ("lora_unet_" if style == "musubi" else "lora_transformer_") + u
            rows[f"{name}.lora_down.weight"] = (RANK, inp)
            rows[f"{name}.lora_up.weight"] = (out, RANK)
            rows[f"{name}.alpha"] = ()
        elif style == "diff":
            rows[f"diffusion_model.{path}.diff"] = (out, inp)
            if path in bias:
                rows[f"diffusion_model.{path}.diff_b"] = (out,)
        else:
            prefix = {
                "diffusion-pipe": "diffusion_model.",
                "diffusers": "transformer.",
                "peft": "base_model.model.",
            }
            name = prefix[style] + path
            rows[f"{name}.lora_A.weight"] = (RANK, inp)
            rows[f"{name}.lora_B.weight"] = (out, RANK)
    if style == "musubi":
        meta["ss_network_module"] = "networks.lora_wan"
    return index_from_shapes(rows, meta, dtype="BF16")


def _biases(rows) -> set[str]:
    return {k[: -len(".bias")] for k in rows if k.endswith(".bias")}


# --- Wan: original (musubi-tuner, diffusion-pipe, lightx2v diffs) and diffusers (ai-toolkit, PEFT) ----------
WAN_SMALL = V.WAN21_T2V_1_3B.with_(layers=2)
WAN_I2V_SMALL = V.WAN21_I2V_14B.with_(dim=1536, ffn=8960, layers=2)


def _wan(c):
    original = V.wan_original(c)
    diffusers_rows = meta_shapes(diffusers.WanTransformer3DModel, **V.wan_diffusers_config(c))
    linears_d = _linears_of_class(diffusers.WanTransformer3DModel, **V.wan_diffusers_config(c))
    return original, diffusers_rows, _linears_of_rows(original), linears_d


@pytest.mark.parametrize("config", [WAN_SMALL, WAN_I2V_SMALL], ids=["t2v-1.3B", "i2v"])
@pytest.mark.parametrize("base_naming", ["original", "comfy-prefixed", "diffusers"])
@pytest.mark.parametrize("style", ["musubi", "diffusion-pipe", "diff", "diffusers", "peft", "onetrainer"])
def test_wan_loras_of_every_trainer_cover_either_base(config, base_naming, style):
    original, diffusers_rows, lin_o, lin_d = _wan(config)
    base = {
        "original": original,
        "comfy-prefixed": {"model.diffusion_model." + k: s for k, s in original.items()},
        "diffusers": diffusers_rows,
    }[base_naming]
    own = style in ("musubi", "diffusion-pipe", "diff")  # trainers of the original model
    lora = _adapter(lin_o if own else lin_d, style, _biases(original if own else diffusers_rows))
    cov = coverage(lora, base).to_json()
    t = cov["targets"]["transformer"]
    assert (cov["mapped"], t["unmatched"], t["shape_mismatch"]) == (cov["modules"], [], []), cov
    assert describe_lora(lora).base == "wan21"
    assert fit_warning(cov, "wan21", "wan21") is None


def test_wan_sizes_name_their_release():
    for c, base in ((V.WAN22_TI2V_5B, "wan22"), (V.WAN21_T2V_14B, "wan21")):
        lin = _linears_of_rows(V.wan_original(c.with_(layers=1)))
        assert describe_lora(_adapter(lin, "musubi")).base == base
    info = describe_lora(_adapter(_linears_of_rows(V.wan_original(WAN_SMALL)), "musubi"))
    assert info.format == "musubi-tuner" and info.targets == ("transformer",)


# --- Qwen-Image: the release is in diffusers naming; trainers name it so under their prefixes ---------------
@pytest.mark.parametrize("style", ["musubi", "diffusion-pipe", "diffusers", "peft", "onetrainer"])
def test_qwen_image_loras_cover_the_base(style):
    cfg = dict(num_layers=2)
    base = meta_shapes(diffusers.QwenImageTransformer2DModel, **cfg)
    lin = {
        k: v
        for k, v in _linears_of_class(diffusers.QwenImageTransformer2DModel, **cfg).items()
        if k.startswith("transformer_blocks.")
    }
    lora = _adapter(lin, style)
    cov = coverage(lora, base).to_json()
    assert cov["mapped"] == cov["modules"] == len(lin)
    assert describe_lora(lora).base == "qwen_image"


# --- Z-Image and Lumina 2: original fused qkv <-> diffusers q / k / v ----------------------------------------
@pytest.mark.parametrize(
    ("config", "cls", "kw", "arch"),
    [
        (I.Z_IMAGE.with_(layers=2), diffusers.ZImageTransformer2DModel, {"n_layers": 2}, "z_image"),
        (
            I.LUMINA2.with_(layers=2),
            diffusers.Lumina2Transformer2DModel,
            {"num_layers": 2, "cap_feat_dim": 2304},
            "lumina2",
        ),
    ],
    ids=["z_image", "lumina2"],
)
@pytest.mark.parametrize(
    "direction", ["diffusers-lora-on-original", "original-lora-on-original", "diffusers-on-diffusers"]
)
def test_nextdit_loras_reach_fused_qkv(config, cls, kw, arch, direction):
    original = I.nextdit_original(config)
    lin_d = {
        k: v
        for k, v in _linears_of_class(cls, **kw).items()
        if k.startswith(("layers.", "noise_refiner.", "context_refiner."))
    }
    if direction == "original-lora-on-original":
        lin = {k: v for k, v in _linears_of_rows(original).items() if k.startswith("layers.")}
        lora, base = _adapter(lin, "diffusion-pipe"), original
    else:
        lora = _adapter(lin_d, "diffusers")
        base = original if direction == "diffusers-lora-on-original" else meta_shapes(cls, **kw)
    cov = coverage(lora, base).to_json()
    t = cov["targets"]["transformer"]
    assert (cov["mapped"], t["unmatched"], t["shape_mismatch"]) == (cov["modules"], [], [])
    assert describe_lora(lora).base == arch


def test_a_diffusers_q_lands_on_its_rows_of_the_fused_qkv():
    from engine.lora.keymap import KeyMap

    original = I.nextdit_original(I.LUMINA2.with_(layers=1))
    km = KeyMap(original)
    q, k, v = (km.resolve(f"transformer.layers.0.attn.to_{n}") for n in "qkv")
    assert {q.key, k.key, v.key} == {"layers.0.attention.qkv.weight"}
    # 24 heads of 96 for the queries, 8 K/V heads of 96 (grouped-query attention).
    assert (q.view, k.view, v.view) == (("rows", 0, 2304), ("rows", 2304, 768), ("rows", 3072, 768))


# --- XLabs and OneTrainer FLUX.1 LoRAs --------------------------------------------------------------------------
def _flux_base():
    from tests.support import synth

    return {k: tuple(s) for k, _, s in synth.layout("flux1_dev")}


def test_xlabs_flux_lora_is_a_flux_lora_and_covers_its_base():
    from engine.detect import detect_index

    rows = {}
    for i in (0, 1):
        for n, (out, inp) in {
            "qkv_lora1": (9216, 3072),
            "qkv_lora2": (9216, 3072),
            "proj_lora1": (3072, 3072),
            "proj_lora2": (3072, 3072),
        }.items():
            rows[f"double_blocks.{i}.processor.{n}.down.weight"] = (16, inp)
            rows[f"double_blocks.{i}.processor.{n}.up.weight"] = (out, 16)
    rows["single_blocks.0.processor.qkv_lora.down.weight"] = (16, 3072)
    rows["single_blocks.0.processor.qkv_lora.up.weight"] = (9216, 16)
    lora = index_from_shapes(rows, dtype="BF16")
    det = detect_index(lora)
    assert (det.kind, det.lora.format, det.lora.base) == ("lora", "xlabs", "flux1")
    cov = coverage(lora, _flux_base()).to_json()
    assert cov["mapped"] == cov["modules"] == 9, cov


def test_onetrainer_t5_modules_land_on_flux_t5xxl():
    base = _flux_base()
    rows = {}
    for n, (out, inp) in {
        "encoder_block_0_layer_0_SelfAttention_q": (4096, 4096),
        "encoder_block_0_layer_0_SelfAttention_o": (4096, 4096),
        "encoder_block_0_layer_1_DenseReluDense_wi_0": (10240, 4096),
        "encoder_block_0_layer_1_DenseReluDense_wo": (4096, 10240),
    }.items():
        rows[f"lora_te2_{n}.lora_down.weight"] = (8, inp)
        rows[f"lora_te2_{n}.lora_up.weight"] = (out, 8)
    rows["lora_transformer_transformer_blocks_0_attn_to_q.lora_down.weight"] = (8, 3072)
    rows["lora_transformer_transformer_blocks_0_attn_to_q.lora_up.weight"] = (3072, 8)
    lora = index_from_shapes(rows, dtype="BF16")
    cov = coverage(lora, base).to_json()
    assert cov["targets"]["t5xxl"]["mapped"] == 4 and cov["mapped"] == cov["modules"] == 5, cov
    assert describe_lora(lora).targets == ("transformer", "t5xxl")


# --- A LoRA that does not fit its base is said so ---------------------------------------------------------------
def test_a_lora_for_another_family_warns_it_would_change_nothing():
    lin = _linears_of_rows(V.wan_original(WAN_SMALL))
    cov = coverage(_adapter(lin, "musubi"), _flux_base()).to_json()
    assert cov["mapped"] == 0
    w = fit_warning(cov, "wan21", "flux1_dev")
    assert (
        w
        == f"made for Wan 2.1: 0/{cov['modules']} modules map onto this FLUX.1 [dev] model; it would change nothing"
    )
    assert cov["warning"] is None  # coverage() alone does not know the base's architecture


def test_partial_coverage_warns_with_the_counts():
    assert fit_warning({"mapped": 10, "modules": 12}, "sdxl", "sdxl") == (
        "only 10/12 modules map onto this SDXL model: the other 2 would be skipped"
    )
    assert fit_warning({"mapped": 12, "modules": 12}, "sdxl", "sdxl") is None


def test_an_ai_toolkit_wan_lora_bakes_onto_an_original_named_wan_file(tmp_path):
    """The numbers, not only the names: a diffusers-named (ai-toolkit) LoRA baked into a tiny original-
    named Wan file changes `blocks.0.self_attn.q` by strength · B·A and `blocks.0.ffn.0` likewise, and
    nothing else."""
    from safetensors.torch import load_file, save_file

    from engine.bake import bake
    from engine.requests import StackItem

    g = torch.Generator().manual_seed(0)
    c = V.WAN21_T2V_1_3B.with_(dim=64, ffn=128, layers=1, text_dim=32)
    base = {k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in V.wan_original(c).items()}
    save_file(base, tmp_path / "wan.safetensors")
    a_q, b_q = torch.randn(4, 64, generator=g), torch.randn(64, 4, generator=g)
    a_f, b_f = torch.randn(4, 64, generator=g), torch.randn(128, 4, generator=g)
    lora = {
        "transformer.blocks.0.attn1.to_q.lora_A.weight": a_q,
        "transformer.blocks.0.attn1.to_q.lora_B.weight": b_q,
        "transformer.blocks.0.ffn.net.0.proj.lora_A.weight": a_f,
        "transformer.blocks.0.ffn.net.0.proj.lora_B.weight": b_f,
    }
    save_file(lora, tmp_path / "lora.safetensors")
    out = tmp_path / "baked.safetensors"
    bake(
        str(tmp_path / "wan.safetensors"),
        (StackItem(str(tmp_path / "lora.safetensors"), 0.5, 1.0, True),),
        str(out),
    )
    baked = load_file(out)
    for key, delta in (("blocks.0.self_attn.q.weight", b_q @ a_q), ("blocks.0.ffn.0.weight", b_f @ a_f)):
        want = (base[key].float() + 0.5 * delta).to(torch.bfloat16)
        assert torch.equal(baked[key], want), key
    changed = {k for k in base if not torch.equal(baked[k], base[k])}
    assert changed == {"blocks.0.self_attn.q.weight", "blocks.0.ffn.0.weight"}


# --- HunyuanVideo: Tencent's names (musubi-tuner, diffusion-pipe) <-> ComfyUI's ------------------------------
@pytest.mark.parametrize(
    ("lora_naming", "base_naming"), [("tencent", "comfy"), ("comfy", "tencent"), ("tencent", "tencent")]
)
@pytest.mark.parametrize("style", ["musubi", "diffusion-pipe"])
def test_hunyuan_video_loras_cover_either_naming(lora_naming, base_naming, style):
    c = V.HUNYUAN_VIDEO.with_(double=20, single=2)
    lin = {k: v for k, v in _linears_of_rows(V.hunyuan(c, lora_naming)).items() if "blocks." in k}
    base = {"model.diffusion_model." + k: s for k, s in V.hunyuan(c, base_naming).items()}
    lora = _adapter(lin, style)
    cov = coverage(lora, base).to_json()
    t = cov["targets"]["transformer"]
    assert (cov["mapped"], t["unmatched"], t["shape_mismatch"]) == (cov["modules"], [], [])
    assert describe_lora(lora).base == "hunyuan_video"


# --- AuraFlow / Pony V7: the release's `double_layers` <-> diffusers' `joint_transformer_blocks` -------------
@pytest.mark.parametrize("lora_naming", ["release", "diffusers"])
@pytest.mark.parametrize("base_naming", ["release", "diffusers"])
@pytest.mark.parametrize("style", ["musubi", "diffusion-pipe", "diffusers"])
def test_auraflow_loras_cover_either_naming(lora_naming, base_naming, style):
    """Every Linear of AuraFlow's blocks and the final modulation (held (scale, shift) by diffusers, (shift,
    scale) by the release: a swapped view) reaches a base of either naming; the LoRA is AuraFlow's."""
    from denoise_files import auraflow_release

    cfg = dict(num_mmdit_layers=2, num_single_dit_layers=2, attention_head_dim=64, num_attention_heads=2)
    with torch.device("meta"):
        sd = diffusers.AuraFlowTransformer2DModel(**cfg).state_dict()
    named = {"release": auraflow_release(sd), "diffusers": sd}
    lin = _linears_of_rows({k: tuple(t.shape) for k, t in named[lora_naming].items()})
    lin = {
        k: s for k, s in lin.items() if "blocks." in k or "layers." in k or k in ("modF.1", "norm_out.linear")
    }
    base = {"model.diffusion_model." + k: tuple(t.shape) for k, t in named[base_naming].items()}
    lora = _adapter(lin, style)
    cov = coverage(lora, base).to_json()
    t = cov["targets"]["transformer"]
    assert (cov["mapped"], t["unmatched"], t["shape_mismatch"]) == (cov["modules"], [], [])
    assert describe_lora(lora).base == "auraflow"


# --- Mochi 1 and Hunyuan-DiT: their trainers' names say the family (the stepping tests: test_denoise_mochi /
# test_denoise_hunyuan_dit) ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("linears", "style", "base"),
    [
        ({"blocks.0.attn.qkv_x": (9216, 3072), "blocks.0.attn.proj_y": (1536, 3072)}, "musubi", "mochi"),
        ({"transformer_blocks.3.attn1.add_q_proj": (3072, 1536)}, "diffusers", "mochi"),
        (
            {"blocks.0.attn1.Wqkv": (4224, 1408), "blocks.0.attn2.kv_proj": (2816, 1024)},
            "peft",
            "hunyuan_dit",
        ),
        (
            {"blocks.0.attn1.to_q": (1408, 1408), "blocks.0.attn2.to_k": (1408, 1024)},
            "diffusers",
            "hunyuan_dit",
        ),
        ({"blocks.0.attn1.to_q": (1536, 1536), "blocks.0.attn2.to_k": (1536, 1536)}, "diffusers", "wan21"),
    ],
)
def test_mochi_and_hunyuan_dit_loras_name_their_family(linears, style, base):
    """Mochi's release streams (qkv_x, proj_y) or diffusers' attn1.add_q_proj; Hunyuan-DiT's release Wqkv / kv_proj
    (Tencent's PEFT LoRAs) or, under Wan's diffusers names, its 1408 width; Wan's own width still Wan."""
    assert describe_lora(_adapter(linears, style)).base == base
    w = fit_warning({"mapped": 0, "modules": 2}, base, "flux1_dev")
    assert w.startswith(f"made for {label(base)}: ") and label(base) != base
