"""LoRAs in the trainers' namings against an independent peer: diffusers' own converters load the same
file into diffusers' model through PEFT, and that model's output is what `step --lora` must give on
the original-format base (where the module names, fused layers and alpha scaling are Loadout's own
key map). Reduced-depth models, float32, the CPU."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft", reason="peft (diffusers' LoRA loader; test-only reference) is not installed")

import denoise_files as df  # noqa: E402

from engine import denoise  # noqa: E402
from engine.formats.safetensors import save_tensors  # noqa: E402
from engine.model import Component  # noqa: E402
from engine.requests import StackItem  # noqa: E402

STRENGTH = 0.7


def _kohya(weights: dict, names, seed: int, strip: str = "") -> dict:
    """A rank-4 kohya LoRA (alpha 2) over the 2-D weights and 3x3/1x1 convs `names` picks."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for key, t in weights.items():
        module = names(key[len(strip) :], t)
        if module is None:
            continue
        o, i, *k = t.shape
        out[f"{module}.lora_down.weight"] = torch.randn(4, i, *k, generator=g) * 0.05
        out[f"{module}.lora_up.weight"] = torch.randn(o, 4, *([1] * len(k)), generator=g) * 0.05
        out[f"{module}.alpha"] = torch.tensor(2.0)
    return out


def _with_lora(model, diffusers_tensors: dict, prefix: str, **kw) -> None:
    """The reference: diffusers' model with the LoRA loaded through PEFT, at STRENGTH."""
    model.load_lora_adapter(dict(diffusers_tensors), prefix=prefix, adapter_name="k", **kw)
    model.set_adapters(["k"], weights=[STRENGTH])


def _run(base, prefix, component, arch, tensors, tmp_path, size, name="lora"):
    """`step --lora` with `tensors` written as a LoRA file, full and partial (bit-equal, every module
    placed): the output and the forward's inputs."""
    lora = tmp_path / f"{name}.safetensors"
    save_tensors(lora, tensors)
    runs = df.step_full_and_partial(
        base, tmp_path, 0.0005, loras=(StackItem(str(lora), STRENGTH, STRENGTH),), size=size
    )
    (full, out), (_, streamed) = runs["full"], runs["partial"]
    assert torch.equal(out, streamed)
    (placed,) = full.loras
    assert placed["mapped"] == placed["modules"], placed
    inputs = denoise.bind(Component(component, base, prefix), arch).random_inputs(*size, seed=0)
    return out, inputs


def test_a_kohya_flux_lora_and_its_diffusers_form_step_as_diffusers_loads_them(tmp_path):
    from diffusers.loaders.lora_conversion_utils import _convert_kohya_flux_lora_to_diffusers

    w = df.random_weights(df.flux_rows(df.FLUX_DEV_TINY), seed=4)
    base = df.write(tmp_path / "flux.safetensors", w)
    model, _ = df.diffusers_flux(df.FLUX_DEV_TINY, w)

    def names(key, t):
        # every linear of the blocks, fused q/k/v and the modulations included; not single blocks'
        # linear1, whose split diffusers' converter takes from the real model's widths (3072)
        if t.dim() != 2 or not key.startswith(("double_blocks.", "single_blocks.")) or "linear1" in key:
            return None
        return "lora_unet_" + key[: -len(".weight")].replace(".", "_")

    kohya = _kohya(w, names, seed=9)
    assert len(kohya) // 3 == 24
    diffusers_form = _convert_kohya_flux_lora_to_diffusers({k: v.clone() for k, v in kohya.items()})
    _with_lora(model, diffusers_form, "transformer")
    for form, tensors in (("kohya", kohya), ("diffusers", diffusers_form)):
        out, inputs = _run(base, "", "transformer", "flux1_dev", tensors, tmp_path, (128, 96), form)
        want = df.run_diffusers_flux(model, inputs)
        assert df.rel_l2(out, want) <= 1e-5, form
    model.set_adapters(["k"], weights=[0.0])
    assert df.rel_l2(df.run_diffusers_flux(model, inputs), want) > 1e-2  # the LoRA does change it


def test_a_kohya_sd1_lora_steps_as_diffusers_loads_it(tmp_path):
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_lora_to_diffusers

    w = df.random_weights(df.unet_rows(df.SD1_TINY), seed=3)
    base = df.write(tmp_path / "sd1.safetensors", w)
    model, dsd = df.diffusers_unet(df.SD1_TINY, "sd1", w)

    def names(key, t):
        # kohya sd-scripts names SD1 modules by their diffusers paths, underscored
        if t.dim() not in (2, 4) or not key.endswith(".weight"):
            return None
        if not any(s in key for s in ("attn", "proj_", "ff.net", "conv", "time_emb")):
            return None
        return "lora_unet_" + key[: -len(".weight")].replace(".", "_")

    kohya = _kohya(dsd, names, seed=11)
    assert len(kohya) // 3 > 60
    converted, alphas = _convert_non_diffusers_lora_to_diffusers({k: v.clone() for k, v in kohya.items()})
    _with_lora(model, converted, "unet", network_alphas=alphas)
    out, inputs = _run(base, df.PREFIX, "unet", "sd1", kohya, tmp_path, (96, 64))
    want = df.run_diffusers_unet(model, inputs, (96, 64))
    assert df.rel_l2(out, want) <= 1e-5
    model.set_adapters(["k"], weights=[0.0])
    assert df.rel_l2(df.run_diffusers_unet(model, inputs, (96, 64)), want) > 1e-2  # the LoRA does change it


def test_a_kohya_sdxl_lora_in_sgm_names_steps_as_diffusers_loads_it(tmp_path):
    """SDXL LoRAs from kohya name modules by the original (SGM) paths, `lora_unet_input_blocks_4_1_…`:
    diffusers maps them by its own block arithmetic (`lora_state_dict` with the UNet's config)."""
    from diffusers.loaders.lora_pipeline import StableDiffusionXLLoraLoaderMixin

    w = df.random_weights(df.unet_rows(df.SDXL_TINY), seed=5)
    base = df.write(tmp_path / "sdxl.safetensors", w)
    model, _ = df.diffusers_unet(df.SDXL_TINY, "sdxl", w)
    parts = ("attn", "proj_", "ff.net", "in_layers.2", "out_layers.3", "emb_layers.1", "skip_connection", "op.",
             "time_embed", "label_emb")  # fmt: skip

    def names(key, t):
        if t.dim() not in (2, 4) or not key.endswith(".weight") or not any(s in key for s in parts):
            return None
        return "lora_unet_" + key[: -len(".weight")].replace(".", "_")

    kohya = _kohya(w, names, seed=3, strip=df.PREFIX)
    assert len(kohya) // 3 > 200
    sd, alphas = StableDiffusionXLLoraLoaderMixin.lora_state_dict(
        {k: v.clone() for k, v in kohya.items()}, unet_config=model.config
    )
    _with_lora(model, sd, "unet", network_alphas=alphas)
    out, inputs = _run(base, df.PREFIX, "unet", "sdxl", kohya, tmp_path, (64, 64))
    want = df.run_diffusers_unet(model, inputs, (64, 64))
    assert df.rel_l2(out, want) <= 1e-5


@pytest.mark.parametrize("form", ["original", "musubi"])
def test_wan_loras_of_two_trainers_step_as_diffusers_loads_them(form, tmp_path):
    """Wan 2.1 LoRAs as diffusion-pipe / ComfyUI write them (`diffusion_model.blocks.N.self_attn.q.lora_A`)
    and as musubi-tuner does (`lora_unet_blocks_N_self_attn_q`), each through diffusers' converter for
    that form, against step --lora on the original-named file."""
    import diffusers
    from diffusers.loaders import lora_conversion_utils as conv
    from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
    from layouts_2026.video import WanConfig, wan_original

    c = WanConfig(dim=256, ffn=512, layers=2, text_dim=64)
    w = df.random_weights([(k, "F32", s) for k, s in wan_original(c).items()], seed=1)
    base = df.write(tmp_path / "wan.safetensors", w)
    ref = diffusers.WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=c.dim // 128, attention_head_dim=128, in_channels=16,
        out_channels=16, text_dim=c.text_dim, freq_dim=256, ffn_dim=c.ffn, num_layers=c.layers,
        cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6,
    ).eval()  # fmt: skip
    ref.load_state_dict(convert_wan_transformer_to_diffusers(dict(w)), strict=False)

    def names(key, t):
        if t.dim() != 2 or not key.startswith("blocks.") or not any(s in key for s in ("_attn.", "ffn.")):
            return None
        m = key[: -len(".weight")]
        return f"diffusion_model.{m}" if form == "original" else "lora_unet_" + m.replace(".", "_")

    lora_t = _kohya(w, names, seed=7)
    if form == "original":  # diffusion-pipe writes PEFT's names
        lora_t = {k.replace("lora_down", "lora_A").replace("lora_up", "lora_B"): v for k, v in lora_t.items()}
    assert len(lora_t) // 3 == 20
    to_diffusers = (
        conv._convert_non_diffusers_wan_lora_to_diffusers
        if form == "original"
        else conv._convert_musubi_wan_lora_to_diffusers
    )
    _with_lora(ref, to_diffusers({k: v.clone() for k, v in lora_t.items()}), "transformer")
    out, inputs = _run(base, "", "transformer", "wan21", lora_t, tmp_path, (96, 64), form)
    with torch.inference_mode():
        want = ref(
            hidden_states=inputs["x"],
            timestep=inputs["t"],
            encoder_hidden_states=inputs["context"],
            return_dict=False,
        )[0]
    assert df.rel_l2(out, want) <= 1e-5


def test_a_diffusers_sd35_medium_lora_steps_on_the_sai_file_as_diffusers_loads_it(tmp_path):
    """A diffusers-format LoRA for SD3.5 Medium (MMDiT-X: a second attention in the first blocks) over
    every linear of the transformer blocks, on the SAI-named file (q/k/v fused, adaLN modulations in
    SAI's order): diffusers' SD3Transformer2DModel with the LoRA through PEFT is the reference."""
    from diffusers import SD3Transformer2DModel
    from diffusers.loaders.single_file_utils import convert_sd3_transformer_checkpoint_to_diffusers

    from tests.support.synth import mmdit as _mmdit
    from tests.support.synth._build import Builder

    c = _mmdit.MMDiTConfig(depth=3, pos_embed_max_size=16, qk_norm=True, dual_attention_layers=(0, 1))
    b = Builder("F32", "model.diffusion_model.")
    _mmdit.mmdit_native(b, c)
    w = df.random_weights(b.rows, seed=8)
    base = df.write(tmp_path / "sd35m.safetensors", w)
    dsd = convert_sd3_transformer_checkpoint_to_diffusers(dict(w))
    ref = SD3Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=16, out_channels=16, num_layers=c.depth, attention_head_dim=64,
        num_attention_heads=c.depth, joint_attention_dim=4096, caption_projection_dim=c.hidden,
        pooled_projection_dim=2048, pos_embed_max_size=16, qk_norm="rms_norm",
        dual_attention_layers=c.dual_attention_layers,
    ).eval()  # fmt: skip
    ref.load_state_dict(dsd, strict=True)

    def names(key, t):
        if t.dim() != 2 or not key.startswith("transformer_blocks.") or "norm_" in key:
            return None
        return "transformer." + key[: -len(".weight")]

    lora_t = _kohya(dsd, names, seed=5)
    lora_t = {  # PEFT's names, no alpha (PEFT's alpha then equals the rank: scale 1)
        k.replace("lora_down", "lora_A").replace("lora_up", "lora_B"): v
        for k, v in lora_t.items()
        if not k.endswith(".alpha")
    }
    assert len(lora_t) // 2 > 40
    _with_lora(ref, lora_t, "transformer")
    out, inputs = _run(
        base, "model.diffusion_model.", "transformer", "sd3.5_medium", lora_t, tmp_path, (96, 64)
    )
    with torch.inference_mode():
        want = ref(
            hidden_states=inputs["x"], encoder_hidden_states=inputs["context"], pooled_projections=inputs["y"],
            timestep=inputs["t"],
        ).sample  # fmt: skip
        ref.set_adapters(["k"], weights=[0.0])
        plain = ref(
            hidden_states=inputs["x"], encoder_hidden_states=inputs["context"], pooled_projections=inputs["y"],
            timestep=inputs["t"],
        ).sample  # fmt: skip
    assert df.rel_l2(out, want) <= 1e-5 and df.rel_l2(plain, want) > 1e-2


def test_a_kohya_qwen_image_lora_steps_as_diffusers_loads_it(tmp_path):
    """Qwen-Image LoRAs from musubi-tuner / kohya (`lora_unet_transformer_blocks_N_attn_to_q`, the image and
    text streams' modulations and MLPs) through diffusers' Qwen converter and PEFT."""
    from diffusers.loaders.lora_conversion_utils import _convert_non_diffusers_qwen_lora_to_diffusers

    ref, sd = df.diffusers_qwen_image()
    base = df.write(tmp_path / "qwen_image.safetensors", sd)

    def names(key, t):
        if t.dim() != 2 or not key.startswith("transformer_blocks."):
            return None
        return "lora_unet_" + key[: -len(".weight")].replace(".", "_")

    kohya = _kohya(sd, names, seed=12)
    assert len(kohya) // 3 > 20
    _with_lora(
        ref,
        _convert_non_diffusers_qwen_lora_to_diffusers({k: v.clone() for k, v in kohya.items()}),
        "transformer",
    )
    out, inputs = _run(base, "", "transformer", "qwen_image", kohya, tmp_path, (64, 96))
    b, c, h, w = inputs["x"].shape
    packed = inputs["x"].reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, -1, c * 4)
    with torch.inference_mode():
        want = ref(
            hidden_states=packed, encoder_hidden_states=inputs["context"], timestep=inputs["timesteps"],
            img_shapes=[(1, h // 2, w // 2)] * b,
        ).sample  # fmt: skip
        ref.set_adapters(["k"], weights=[0.0])
        plain = ref(
            hidden_states=packed, encoder_hidden_states=inputs["context"], timestep=inputs["timesteps"],
            img_shapes=[(1, h // 2, w // 2)] * b,
        ).sample  # fmt: skip
    want = want.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    plain = plain.reshape(b, h // 2, w // 2, c, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(b, c, h, w)
    assert df.rel_l2(out, want) <= 1e-5 and df.rel_l2(plain, want) > 1e-2
