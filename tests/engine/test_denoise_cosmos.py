"""Cosmos Predict2's transformer (engine.denoise.cosmos) against diffusers' CosmosTransformer3DModel on the same
weights, in diffusers' naming and the release's (`net.` + MiniTrainDIT's names, with the buffers it keeps beside
its layers), reduced width (2 heads of 128) and depth, float32, CPU: Text2Image, and Video2World on three latent
frames with per-frame times, a condition mask and an fps; its op order, a step fully and partially resident, and
what it refuses (an Anima file's LLM adapter)."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_op_order,
    check_steps_alike,
    lora_and_merged,
    lora_step,
    plain_and_merged,
    rel_l2,
    well_scaled,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.errors import UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
# diffusers' names -> the release's: the inverse of diffusers' COSMOS_2_0 renames (its convert_cosmos_to_diffusers)
RELEASE = (("patch_embed.proj", "x_embedder.proj.1"), ("time_embed.t_embedder", "t_embedder.1"),
           ("time_embed.norm", "t_embedding_norm"), ("transformer_blocks.", "blocks."),
           (".norm1.linear_", ".adaln_modulation_self_attn."), (".norm2.linear_", ".adaln_modulation_cross_attn."),
           (".norm3.linear_", ".adaln_modulation_mlp."), (".attn1.", ".self_attn."), (".attn2.", ".cross_attn."),
           (".to_q.", ".q_proj."), (".to_k.", ".k_proj."), (".to_v.", ".v_proj."), (".to_out.0.", ".output_proj."),
           (".norm_q.", ".q_norm."), (".norm_k.", ".k_norm."), (".ff.net.0.proj.", ".mlp.layer1."),
           (".ff.net.2.", ".mlp.layer2."), ("norm_out.linear_", "final_layer.adaln_modulation."),
           ("proj_out.", "final_layer.linear."))  # fmt: skip


def diffusers_cosmos(video2world: bool = False, seed: int = 14):
    """A reduced Cosmos Predict2 (width 256: 2 heads of 128, 2 blocks, 64-wide text, AdaLN-LoRA 32) in diffusers'
    class with the Predict2 2B configs' RoPE scales, well-scaled random weights: (model, its state dict)."""
    from diffusers import CosmosTransformer3DModel

    model = CosmosTransformer3DModel(
        in_channels=16 + video2world, out_channels=16, num_attention_heads=2, attention_head_dim=128, num_layers=2,
        text_embed_dim=64, adaln_lora_dim=32, rope_scale=(1.0, 3.0, 3.0) if video2world else (1.0, 4.0, 4.0),
        concat_padding_mask=True, extra_pos_embed_type=None,
    )  # fmt: skip
    return well_scaled(model, seed)


def release(sd: dict) -> dict:
    """The release's checkpoint: `net.` + its names, and the buffers MiniTrainDIT keeps (its RoPE table, its
    training counters), which no layer reads."""
    out = {}
    for k, v in sd.items():
        for a, b in RELEASE:
            k = k.replace(a, b)
        out["net." + k] = v
    out["net.pos_embedder.seq"] = torch.arange(128, dtype=torch.float32)
    out["net.accum_iteration"] = torch.tensor([1000], dtype=torch.int64)
    return out


@pytest.fixture(scope="module")
def cosmos(tmp_path_factory):
    d = tmp_path_factory.mktemp("cosmos")
    out = {}
    for v2w in (False, True):
        ref, sd = diffusers_cosmos(v2w)
        out[v2w] = (write(d / f"diffusers_{v2w}.safetensors", sd),
                    write(d / f"cosmos_predict2_2b_{'v2w' if v2w else 't2i'}.safetensors", release(sd)), ref, sd)  # fmt: skip
    return out


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "cosmos_predict2"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "cosmos_predict2")


@pytest.fixture(autouse=True)
def _nearest_resize(monkeypatch):
    """diffusers resizes the padding mask with torchvision (not installed here): the same nearest-neighbour
    resize through torch, for the reference's one call."""
    import types

    import torch.nn.functional as F
    from diffusers.models.transformers import transformer_cosmos

    if hasattr(transformer_cosmos, "transforms"):
        return

    def resize(t, size, interpolation=None):
        return F.interpolate(t, size=tuple(size), mode="nearest")

    shim = types.SimpleNamespace(functional=types.SimpleNamespace(resize=resize),
                                 InterpolationMode=types.SimpleNamespace(NEAREST="nearest"))  # fmt: skip
    monkeypatch.setattr(transformer_cosmos, "transforms", shim, raising=False)


def _diffusers(ref, x: dict) -> torch.Tensor:
    b, _, f, h, w = x["x"].shape
    t = x["timesteps"]
    fps = x.get("fps")
    return ref(hidden_states=x["x"], timestep=t if t.dim() == 1 else t[:, None, :, None, None],
               encoder_hidden_states=x["context"], condition_mask=x.get("condition_mask"),
               fps=None if fps is None else float(fps[0]), padding_mask=torch.zeros(1, 1, 8 * h, 8 * w)).sample  # fmt: skip


def test_text2image_equals_diffusers_in_both_namings(cosmos):
    diff_path, rel_path, ref, _ = cosmos[False]
    dens = {"diffusers": _bound(diff_path), "release": _bound(rel_path)}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in dens}
    assert dens["release"].input_names == ("x", "timesteps", "context")
    x = dens["release"].random_inputs(96, 64, batch=2, seed=1)
    assert x["x"].shape == (2, 16, 1, 8, 12) and x["context"].shape == (2, 512, 64)
    x["context"] = x["context"][:, :24]
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"cosmos t2i ({n}): relative L2 {err:.2e}")
            assert err <= TOL


def test_video2world_with_frame_times_a_condition_mask_and_fps(cosmos):
    diff_path, rel_path, ref, _ = cosmos[True]
    den = _bound(rel_path)
    assert den.model.video2world and den.model.rope_scale == (1.0, 3.0, 3.0)
    g = torch.Generator().manual_seed(5)
    mask = torch.zeros(1, 1, 3, 4, 6)
    mask[:, :, 0] = 1  # the first latent frame is given
    x = {"x": torch.randn(1, 16, 3, 4, 6, generator=g), "timesteps": torch.tensor([[0.0, 0.7, 0.7]]),
         "context": torch.randn(1, 10, 64, generator=g), "condition_mask": mask, "fps": torch.tensor([16.0])}  # fmt: skip
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for d in (den, _bound(diff_path)):
            err = rel_l2(d(x), want)
            print(f"cosmos v2w ({d.naming}): relative L2 {err:.2e}")
            assert err <= TOL
        assert rel_l2(den({**x, "fps": torch.tensor([24.0])}), want) > 100 * TOL  # the fps reaches RoPE


def test_cosmos_op_order_is_the_call_order(cosmos):
    check_op_order(cosmos[False][1], "cosmos_predict2", "net.", plain=2)  # pos_embedder and the counters


def test_cosmos_steps_fully_and_partially_alike(cosmos, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(cosmos[False][1], tmp_path, 0.002, "cosmos_predict2", (1, 16, 1, 8, 8))


def test_a_layer_the_forward_does_not_compute_is_refused(cosmos, tmp_path):
    sd = release(cosmos[False][3])
    sd["net.blocks.0.self_attn.extra.weight"] = torch.zeros(64, 64)
    path = write(tmp_path / "edited.safetensors", sd)
    comp = detect_file(str(path)).components["transformer"]
    with pytest.raises(
        UnsupportedModel, match=r"not computed by Loadout's cosmos_predict2 forward \(.*extra"
    ):
        denoise.bind(Component("transformer", path, comp.prefix), "cosmos_predict2")


@pytest.mark.parametrize("config", ["COSMOS2_2B_T2I", "COSMOS2_14B_V2W"])
def test_the_release_layouts_bind_whole(tmp_path, config):
    """The 2B Text2Image (28 blocks at 2048) and 14B Video2World (36 at 5120) layouts, `net.` + the release's
    names (header-faithful, no data): every layer is one the forward computes with, with that model's RoPE."""
    from layouts_2026 import video as V

    from engine.formats.safetensors import write_sparse

    c = getattr(V, config)
    rows = V.cosmos_original(c)
    path = write_sparse(tmp_path / "cosmos.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.heads, m.context_dim, m.video2world) == (
        c.layers,
        c.dim // 128,
        1024,
        c.in_channels == 17,
    )
    assert m.rope_scale == ((20 / 24, 2.0, 2.0) if c.in_channels == 17 else (1.0, 4.0, 4.0))


def test_anima_runs_its_llm_adapter_and_equals_diffusers(tmp_path):
    """Anima's file: the Cosmos DiT and its `llm_adapter` under `net.`; its context is made from Qwen3 states and
    T5 token ids. Equal to diffusers' AnimaTextConditioner feeding its CosmosTransformer3DModel (reduced: the
    adapter 128 wide in 2 heads of 64 over 96-wide states, 2 blocks, a 100-token vocabulary), with and without
    ComfyUI's per-token weights."""
    from diffusers import AnimaTextConditioner, CosmosTransformer3DModel

    dit, sd = well_scaled(CosmosTransformer3DModel(
        in_channels=16, out_channels=16, num_attention_heads=2, attention_head_dim=128, num_layers=2, text_embed_dim=128,
        adaln_lora_dim=32, rope_scale=(1.0, 4.0, 4.0), concat_padding_mask=True, extra_pos_embed_type=None), 15)  # fmt: skip
    adapter, asd = well_scaled(AnimaTextConditioner(source_dim=96, target_dim=128, model_dim=128, num_layers=2,
                                                    num_attention_heads=2, target_vocab_size=100), 16)  # fmt: skip
    path = write(tmp_path / "anima-preview.safetensors",
                 {**release(sd), **{f"net.llm_adapter.{k}": v for k, v in asd.items()}})  # fmt: skip
    den = _bound(path)
    assert den.input_names == ("x", "timesteps", "context", "t5xxl_ids")
    x = den.random_inputs(64, 32, seed=7)
    assert x["context"].shape == (1, 128, 96) and int(x["t5xxl_ids"].max()) < 100
    x["context"], x["t5xxl_ids"] = x["context"][:, :20], x["t5xxl_ids"][:, :12]
    weights = torch.tensor([[1.0] * 6 + [0.0] * 6])  # the prompt's second half weighted out
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        ctx = adapter(x["context"], x["t5xxl_ids"].long())
        assert ctx.shape == (1, 512, 128)
        want = _diffusers(dit, {**x, "context": ctx})
        err = rel_l2(den(x), want)
        print(f"anima: relative L2 {err:.2e}")
        assert err <= TOL
        weighted = ctx.clone()
        weighted[:, :12] *= weights[..., None]
        got = den({**x, "t5xxl_weights": weights})
        assert rel_l2(got, _diffusers(dit, {**x, "context": weighted})) <= TOL
        assert rel_l2(got, want) > 10 * TOL
    check_op_order(path, "cosmos_predict2", "net.", plain=2)  # the adapter's ops first, then the DiT's


@pytest.mark.parametrize("budget", [None, 0.002])
@pytest.mark.parametrize("naming", ["diffusers", "kohya"])
def test_loras_in_either_naming_on_the_release_file_equal_diffusers_merged(cosmos, tmp_path, naming, budget):
    """A PEFT LoRA in diffusers' names (ai-toolkit, diffusers) and a kohya one in the release's (sd-scripts'
    `lora_unet_blocks_0_self_attn_q_proj`), on the release file, baked and on the fly: equal to diffusers' model
    with the same ΔW merged by hand."""
    _, rel_path, ref, sd = cosmos[False]
    names = {"transformer_blocks.0.attn1.to_q": "blocks.0.self_attn.q_proj",
             "transformer_blocks.1.attn2.to_out.0": "blocks.1.cross_attn.output_proj",
             "transformer_blocks.1.ff.net.2": "blocks.1.mlp.layer2",
             "transformer_blocks.0.norm3.linear_2": "blocks.0.adaln_modulation_mlp.2",
             "patch_embed.proj": "x_embedder.proj.1"}  # fmt: skip
    strength = 0.8
    keys = {
        d: f"transformer.{d}" if naming == "diffusers" else "lora_unet_" + o.replace(".", "_")
        for d, o in names.items()
    }
    lora, merged = lora_and_merged(sd, keys, strength, seed=19, kohya=naming != "diffusers")
    x = _bound(rel_path).random_inputs(32, 32, seed=8)
    x["context"] = x["context"][:, :16]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(rel_path, lora, strength, x, tmp_path, budget)
    assert r.loras and r.loras[0]["mapped"] == len(names), r.loras
    assert rel_l2(out, want) <= TOL


@pytest.mark.parametrize("base", ["diffusers", "release"])
def test_norm_diffs_in_the_other_naming_land_on_the_norms(cosmos, tmp_path, base):
    """LyCORIS norm diffs (`w_norm`, trained with its norm modules on) on the q / k RMS norms and the timestep
    embedding's norm, named as the other file names them (the release's on a diffusers file and back): every one
    placed, equal to diffusers' model with the diffs added by hand. The norms are in the rename table the binder
    and the LoRA key map share (engine.lora.family_names.COSMOS); without them none of the three is placed."""
    diff_path, rel_path, ref, sd = cosmos[False]
    names = {"transformer_blocks.0.attn1.norm_q": "blocks.0.self_attn.q_norm",
             "transformer_blocks.1.attn2.norm_k": "blocks.1.cross_attn.k_norm", "time_embed.norm": "t_embedding_norm"}  # fmt: skip
    g = torch.Generator().manual_seed(23)
    strength, lora, merged = 0.9, {}, dict(sd)
    for d, o in names.items():
        w = torch.randn(sd[f"{d}.weight"].shape, generator=g) * 0.2
        lora[f"lycoris_{(o if base == 'diffusers' else d).replace('.', '_')}.w_norm"] = w
        merged[f"{d}.weight"] = sd[f"{d}.weight"] + strength * w
    x = _bound(rel_path).random_inputs(32, 32, seed=8)
    x["context"] = x["context"][:, :16]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    r, out = lora_step(diff_path if base == "diffusers" else rel_path, lora, strength, x, tmp_path)
    assert r.loras and r.loras[0]["mapped"] == len(names), r.loras
    assert rel_l2(out, want) <= TOL
