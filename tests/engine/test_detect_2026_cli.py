"""`loadout inspect --json` on header-faithful sparse files of every 2026 family (real key names and shapes,
a hole for the data): the kind, architecture, variant, also and evidence a user gets, in one CLI run."""

from __future__ import annotations

import json

import pytest
from flux3_files import to_bfl
from layouts_2026 import image as I
from layouts_2026 import parts as P
from layouts_2026 import video as V
from layouts_2026.common import blocks_only, meta_shapes

from engine.formats.safetensors import write_sparse

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")


def _cases() -> list[tuple[str, dict, dict | None, tuple]]:
    """(file name, key -> shape, metadata, (kind, architecture, variant, also))."""
    d = diffusers
    qwen_vae = meta_shapes(d.AutoencoderKLQwenImage)
    qwen3 = transformers.Qwen3Config(
        hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936,
    )  # fmt: skip
    return [
        ("wan2.1_t2v_14B_fp16.safetensors", V.wan_original(V.WAN21_T2V_14B), None,
         ("diffusion_model", "wan21", "t2v-14b", ["wan22", "skyreels_v2"])),
        ("wan2.1_i2v_720p_14B-00003-of-00007.safetensors", blocks_only(V.wan_original(V.WAN21_I2V_14B), "blocks.", 12, 18),
         None, ("diffusion_model", "wan21", "i2v-14b", ["skyreels_v2", "chronoedit"])),
        ("wan2.2_ti2v_5B_diffusers.safetensors", meta_shapes(d.WanTransformer3DModel, **V.wan_diffusers_config(V.WAN22_TI2V_5B)),
         None, ("diffusion_model", "wan22", "ti2v-5b", [])),
        ("flux1-fill-dev.safetensors", I.flux_bfl(I.FLUX1_FILL), None, ("diffusion_model", "flux1_dev", "fill", [])),
        ("flux1-kontext-dev.safetensors", I.flux_bfl(I.FLUX1_DEV), {"modelspec.architecture": "flux-1-dev/kontext"},
         ("diffusion_model", "flux1_dev", "kontext", [])),
        ("flux-2-klein-4b.safetensors", I.flux_bfl(I.FLUX2_KLEIN_4B), None, ("diffusion_model", "flux2", "klein-4b", [])),
        ("chroma1-hd.safetensors", I.flux_bfl(I.CHROMA), None, ("diffusion_model", "chroma", "normal", [])),
        ("qwen_image_edit_2511_bf16.safetensors", {**meta_shapes(d.QwenImageTransformer2DModel), "__index_timestep_zero__": (0,)},
         None, ("diffusion_model", "qwen_image", "edit", [])),
        ("qwen_image_2.1_bf16.safetensors", {f"model.diffusion_model.{k}": v for k, v in meta_shapes(d.QwenImage21Transformer2DModel).items()},
         None, ("diffusion_model", "qwen_image21", "normal", [])),
        ("hunyuan_video_t2v_720p_bf16.safetensors", V.hunyuan(V.HUNYUAN_VIDEO), None, ("diffusion_model", "hunyuan_video", "t2v", [])),
        ("hunyuanvideo1.5_720p_t2v.safetensors", V.hunyuan(V.HUNYUAN_VIDEO15), None, ("diffusion_model", "hunyuan_video15", "normal", [])),
        ("hunyuanimage2.1_bf16.safetensors", V.hunyuan(V.HUNYUAN_IMAGE21), None, ("diffusion_model", "hunyuan_image21", "normal", [])),
        ("ltx-video-2b-v0.9.safetensors", V.ltx_original(meta_shapes(d.LTXVideoTransformer3DModel)), None,
         ("diffusion_model", "ltxv", "normal-2b", [])),
        ("ltx-2-19b-dev.safetensors", V.ltx_original(meta_shapes(d.LTX2VideoTransformer3DModel), ltx2=True), None,
         ("diffusion_model", "ltx2", "normal", [])),
        ("lumina_2_model_bf16.safetensors", I.nextdit_original(I.LUMINA2), None, ("diffusion_model", "lumina2", "normal", [])),
        ("z_image_turbo_bf16.safetensors", I.nextdit_original(I.Z_IMAGE), None, ("diffusion_model", "z_image", "normal", [])),
        ("cosmos_predict2_2B_t2i.safetensors", V.cosmos_original(V.COSMOS2_2B_T2I, prefix=""), None,
         ("diffusion_model", "cosmos_predict2", "t2i-2b", [])),
        ("anima-preview.safetensors", V.cosmos_original(V.ANIMA), None, ("diffusion_model", "cosmos_predict2", "anima-2b", [])),
        ("mochi_preview_bf16.safetensors", V.mochi_original(), None, ("diffusion_model", "mochi", "normal", [])),
        ("Sana_1600M_1024px.safetensors", I.sana_original(I.SANA_1600M), None, ("diffusion_model", "sana", "normal-1.6b", [])),
        ("krea2_raw.safetensors", I.krea2_original(I.KREA2), None, ("diffusion_model", "krea2", "normal", [])),
        ("wan_2.1_vae.safetensors", P.wan_vae_original("2.1"), None,
         ("vae", "wan21", "normal", ["wan22", "qwen_image", "cosmos_predict2", "krea2"])),
        ("qwen_image_vae.safetensors", qwen_vae, None, ("vae", "wan21", "normal", ["wan22", "qwen_image", "cosmos_predict2", "krea2"])),
        ("wan2.2_vae.safetensors", P.wan_vae_original("2.2"), None, ("vae", "wan22", "normal", [])),
        ("hunyuan_video_vae_bf16.safetensors", P.hunyuan_vae_ldm(meta_shapes(d.AutoencoderKLHunyuanVideo)), None,
         ("vae", "hunyuan_video", "normal", [])),
        ("ltx2_vae.safetensors", P.ltx_vae_original(meta_shapes(d.AutoencoderKLLTX2Video), P.LTX2_STAGES, ltx2=True), None,
         ("vae", "ltx2", "normal", [])),
        ("flux2-vae.safetensors", meta_shapes(d.AutoencoderKLFlux2), None, ("vae", "flux2", "normal", ["flux3", "ernie_image"])),
        ("flux3_distilled_bf16.safetensors", {"model.diffusion_model." + k: v for k, v in
                                             to_bfl(meta_shapes(d.Flux3Transformer2DModel, flow_map=True)).items()},
         None, ("diffusion_model", "flux3", "distilled", [])),
        ("ernie_image_bf16.safetensors", {"model.diffusion_model." + k: v for k, v in
                                          meta_shapes(d.ErnieImageTransformer2DModel).items()},
         None, ("diffusion_model", "ernie_image", None, [])),
        ("mochi_vae.safetensors", P.mochi_vae_decoder(), None, ("vae", "mochi", "normal", [])),
        ("umt5_xxl_fp16.safetensors", P.umt5_wan(), None, ("text_encoder", None, "normal", [])),
        ("qwen_3_4b.safetensors", meta_shapes(transformers.Qwen3ForCausalLM, qwen3), None, ("text_encoder", None, "normal", [])),
    ]  # fmt: skip


def test_inspect_json_on_every_2026_family(cli, tmp_path):
    cases = _cases()
    paths = []
    for name, rows, metadata, _ in cases:
        dtype = "F8_E4M3" if "fp8" in name else "BF16"
        entries = [(k, "F32" if k.startswith("__") else dtype, tuple(s)) for k, s in rows.items()]
        paths.append(str(write_sparse(tmp_path / name, entries, metadata)))
    r = cli("inspect", "--json", *paths, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    for (name, _, _, want), got in zip(cases, out, strict=True):
        assert (got["kind"], got["architecture"], got["variant"], got["also"]) == want, (
            name,
            got["evidence"],
        )
        assert got["error"] is None and got["evidence"], name
        assert all(e["reason"] for e in got["evidence"])
    texts = {json.dumps(o["components"]) for o in out}
    assert any("umt5_xxl" in t for t in texts) and any("qwen3_4b" in t for t in texts)
