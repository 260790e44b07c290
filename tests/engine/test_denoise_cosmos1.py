"""Cosmos 1.0's transformer (engine.denoise.cosmos1) against diffusers' CosmosTransformer3DModel with a Cosmos 1.0
config (learnable position embeddings, the 1.0 RoPE scales) on the same weights, in diffusers' naming and NVIDIA's
1.0 release naming (`net.blocks.blockN.blocks.M.block…`, with its `logvar` head and RoPE table), reduced width (2
heads of 128) and depth, float32, CPU: Text2World, and Video2World on three latent frames with per-frame times, a
condition mask and an fps; its op order, a step fully and partially resident, the real layouts binding whole, a
PEFT LoRA on the fly, `loadout step`, and what it refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
ARCH = "cosmos_predict1"
# diffusers' names -> NVIDIA's 1.0 names: the inverse of diffusers' COSMOS_1_0 renames (checked below against its
# own converter)
_STEM = (("patch_embed.proj", "x_embedder.proj.1"), ("learnable_pos_embed", "extra_pos_embedder"),
         ("time_embed.t_embedder", "t_embedder.1"), ("time_embed.norm", "affline_norm"),
         ("norm_out.linear_", "final_layer.adaLN_modulation."), ("proj_out", "final_layer.linear"))  # fmt: skip
_BLOCK = (("attn1.to_q.", "blocks.0.block.attn.to_q.0."), ("attn1.norm_q.", "blocks.0.block.attn.to_q.1."),
          ("attn1.to_k.", "blocks.0.block.attn.to_k.0."), ("attn1.norm_k.", "blocks.0.block.attn.to_k.1."),
          ("attn1.to_v.", "blocks.0.block.attn.to_v.0."), ("attn1.to_out.0.", "blocks.0.block.attn.to_out.0."),
          ("ff.net.0.proj.", "blocks.2.block.layer1."), ("ff.net.2.", "blocks.2.block.layer2."),
          *((f"norm{j + 1}.linear_", f"blocks.{j}.adaLN_modulation.") for j in range(3)))  # fmt: skip
_BLOCK = _BLOCK + tuple(
    (a.replace("attn1", "attn2"), b.replace("blocks.0", "blocks.1")) for a, b in _BLOCK[:6]
)


def nvidia(sd: dict) -> dict:
    """The 1.0 release's checkpoint: `net.` + its names, its RoPE table and EDM's logvar head."""
    out = {}
    for k, v in sd.items():
        if k.startswith("transformer_blocks."):
            _, n, rest = k.split(".", 2)
            a, b = next((a, b) for a, b in _BLOCK if rest.startswith(a))
            k = f"blocks.block{n}.{b}{rest.removeprefix(a)}"
        else:
            k = next((k.replace(a, b, 1) for a, b in _STEM if k.startswith(a)), k)
        out["net." + k] = v
    out["net.pos_embedder.seq"] = torch.arange(128, dtype=torch.float32)
    out["net.logvar.0.freqs"], out["net.logvar.0.phases"] = torch.randn(128), torch.rand(128)
    out["net.logvar.1.weight"] = torch.randn(1, 128) / 12
    return out


def diffusers_cosmos1(video2world: bool = False, seed: int = 21, max_size=(128, 240, 240)):
    """A reduced Cosmos 1.0 (width 256: 2 heads of 128, 2 blocks, 64-wide text, AdaLN-LoRA 32) in diffusers' class
    with the 7B configs' RoPE scales and learnable position embeddings, well-scaled random weights."""
    from diffusers import CosmosTransformer3DModel

    model = CosmosTransformer3DModel(
        in_channels=16 + video2world, out_channels=16, num_attention_heads=2, attention_head_dim=128, num_layers=2,
        text_embed_dim=64, adaln_lora_dim=32, max_size=max_size, rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=True,
        extra_pos_embed_type="learnable",
    )  # fmt: skip
    model, sd = well_scaled(model, seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # zeros at init: give the position tables values that matter
        for a in "thw":
            getattr(model.learnable_pos_embed, f"pos_emb_{a}").copy_(
                torch.randn(getattr(model.learnable_pos_embed, f"pos_emb_{a}").shape, generator=g)
            )
    return model, {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def cosmos1(tmp_path_factory):
    d = tmp_path_factory.mktemp("cosmos1")
    out = {}
    for v2w in (False, True):
        ref, sd = diffusers_cosmos1(v2w)
        out[v2w] = (write(d / f"diffusers_{v2w}.safetensors", sd),
                    write(d / f"cosmos1_7b_{'v2w' if v2w else 't2w'}.safetensors", nvidia(sd)), ref, sd)  # fmt: skip
    return out


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == ARCH, det.evidence
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), ARCH)


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


def test_the_nvidia_naming_is_what_diffusers_converter_reads(cosmos1):
    from test_detect_cosmos1 import converted_1_0

    sd = cosmos1[False][3]
    got = converted_1_0({k: tuple(v.shape) for k, v in nvidia(sd).items()})
    assert got == {k: tuple(v.shape) for k, v in sd.items()}


def test_text2world_equals_diffusers_in_both_namings(cosmos1, monkeypatch):
    diff_path, nv_path, ref, _ = cosmos1[False]
    dens = {"diffusers": _bound(diff_path), "nvidia": _bound(nv_path)}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in dens}
    assert dens["nvidia"].input_names == ("x", "timesteps", "context")
    x = dens["nvidia"].random_inputs(96, 64, batch=2, seed=1)
    assert x["x"].shape == (2, 16, 1, 8, 12) and x["context"].shape == (2, 512, 64)
    x["context"] = x["context"][:, :24]
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for n, d in dens.items():
            err = rel_l2(d(x), want)
            print(f"cosmos 1.0 t2w ({n}): relative L2 {err:.2e}")
            assert err <= TOL
        # the position embeddings matter: without them (Predict2's forward) the output is another
        monkeypatch.setattr(type(dens["nvidia"].model), "_extra_pos", lambda *a: None)
        assert rel_l2(dens["nvidia"](x), want) > 100 * TOL


def test_video2world_with_frame_times_a_condition_mask_and_fps(cosmos1):
    diff_path, nv_path, ref, _ = cosmos1[True]
    den = _bound(nv_path)
    assert den.model.video2world and den.model.rope_scale == (2.0, 1.0, 1.0)
    assert den.input_names == ("x", "timesteps", "context")
    g = torch.Generator().manual_seed(5)
    mask = torch.zeros(1, 1, 3, 4, 6)
    mask[:, :, 0] = 1  # the first latent frame is given
    x = {"x": torch.randn(1, 16, 3, 4, 6, generator=g), "timesteps": torch.tensor([[-1.2, 0.3, 0.3]]),
         "context": torch.randn(1, 10, 64, generator=g), "condition_mask": mask, "fps": torch.tensor([16.0])}  # fmt: skip
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for d in (den, _bound(diff_path)):
            err = rel_l2(d(x), want)
            print(f"cosmos 1.0 v2w ({d.naming}): relative L2 {err:.2e}")
            assert err <= TOL
        assert rel_l2(den({**x, "fps": torch.tensor([4.0])}), want) > 100 * TOL  # the fps reaches RoPE


def test_cosmos1_op_order_is_the_call_order(cosmos1):
    # units never called: pos_embedder, extra_pos_embedder (read as plain tables) and EDM's logvar.0 and logvar.1
    check_op_order(cosmos1[False][1], ARCH, "net.", plain=4)


def test_cosmos1_steps_fully_and_partially_alike(cosmos1, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(cosmos1[False][1], tmp_path, 0.002, ARCH, (1, 16, 1, 8, 8))


def test_a_latent_beyond_the_position_tables_is_refused(cosmos1):
    den = _bound(cosmos1[False][0])
    x = den.random_inputs(64, 64, seed=2)
    with pytest.raises(ValueError, match="position embeddings cover at most 128 frames"):
        den({**x, "x": torch.zeros(1, 16, 129, 2, 2)})


def test_a_layer_the_forward_does_not_compute_is_refused(cosmos1, tmp_path):
    sd = nvidia(cosmos1[False][3])
    sd["net.blocks.block0.blocks.0.block.attn.extra.weight"] = torch.zeros(64, 64)
    path = write(tmp_path / "edited.safetensors", sd)
    comp = detect_file(str(path)).components["transformer"]
    with pytest.raises(
        UnsupportedModel, match=r"not computed by Loadout's cosmos_predict1 forward \(.*extra"
    ):
        denoise.bind(Component("transformer", path, comp.prefix), ARCH)


@pytest.mark.parametrize("config", ["T2W_7B", "V2W_14B"])
def test_the_release_layouts_bind_whole(tmp_path, config):
    """The 7B Text2World (28 blocks at 4096) and 14B Video2World (36 at 5120) layouts in NVIDIA's naming under
    `net.` (header-faithful, no data): every layer is one the forward computes with, with that model's RoPE."""
    from layouts_2026 import cosmos1 as C

    from engine.formats.safetensors import write_sparse

    c = getattr(C, config)
    rows = C.cosmos1_original(c)
    path = write_sparse(tmp_path / "cosmos1.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.heads, m.context_dim, m.video2world) == (
        c.layers,
        c.dim // 128,
        1024,
        c.in_channels == 17,
    )
    assert m.rope_scale == ((2.0, 2.0, 2.0) if c.dim == 5120 else (2.0, 1.0, 1.0))


def test_step_from_the_command_line(cosmos1, tmp_path):
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(cosmos1[True][1]), "--size", "64x32",
                        "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "LOADOUT_CACHE_DIR": str(tmp_path)})  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["architecture"], got["mode"], got["output_shape"]) == (ARCH, "full", [1, 16, 1, 4, 8])


# Every Linear of a block (its three modulation pairs, both attentions' q / k / v / out, the MLP), the stems and
# the head, in diffusers' names (PEFT's)
LORA_MODULES = ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.attn1.to_k", "transformer_blocks.0.attn1.to_v",
                "transformer_blocks.1.attn1.to_out.0", "transformer_blocks.0.attn2.to_q", "transformer_blocks.1.attn2.to_k",
                "transformer_blocks.0.attn2.to_v", "transformer_blocks.1.attn2.to_out.0", "transformer_blocks.0.ff.net.0.proj",
                "transformer_blocks.1.ff.net.2", "transformer_blocks.0.norm1.linear_1", "transformer_blocks.1.norm2.linear_2",
                "transformer_blocks.0.norm3.linear_1", "patch_embed.proj", "time_embed.t_embedder.linear_1",
                "norm_out.linear_2", "proj_out")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("nvidia", None), ("nvidia", 0.0), ("diffusers", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(cosmos1, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names) on either naming's file, baked (resident) and on the fly (streamed):
    equal to diffusers' model with the LoRA merged by hand; every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, nv_path, ref, sd = cosmos1[False]
    strength = 0.8
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, {d: "transformer." + d for d in LORA_MODULES},
                                   strength, seed=7)  # fmt: skip
    x = _bound(nv_path).random_inputs(64, 64, seed=9)
    x["context"] = x["context"][:, :16]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"cosmos 1.0 LoRA (peft on {base}, budget {budget})"
    path = nv_path if base == "nvidia" else diff_path
    check_lora_step(path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, None, TOL)


def test_a_kohya_lora_in_nvidias_naming_names_its_base_and_lands(cosmos1, tmp_path):
    """kohya's `lora_unet_` + NVIDIA's 1.0 names (`blocks_block0_blocks_0_block_attn_to_q_0`): read as made for
    Cosmos 1.0 from its keys alone, placed whole on the release file and equal to diffusers' merged model."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    _, nv_path, ref, sd = cosmos1[False]

    def nvidia_name(d: str) -> str:  # the first key nvidia() writes is the module's own
        return (
            next(iter(nvidia({f"{d}.weight": sd[f"{d}.weight"]})))
            .removeprefix("net.")
            .removesuffix(".weight")
        )

    keys = {d: "lora_unet_" + nvidia_name(d).replace(".", "_") for d in LORA_MODULES}
    assert len(set(keys.values())) == len(LORA_MODULES)
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, keys, 0.7, seed=8, kohya=True)
    x = _bound(nv_path).random_inputs(64, 64, seed=10)
    x["context"] = x["context"][:, :16]
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(nv_path, lora, 0.7, x, tmp_path, 0.0, want, len(keys), "cosmos 1.0 LoRA (kohya, nvidia names)",
                    ARCH, TOL)  # fmt: skip


def test_predict2_names_with_the_position_tables_step_as_1_0(cosmos1, tmp_path):
    """A 1.0 model written in Predict2's MiniTrainDIT names (`blocks.N.self_attn.q_proj`) with its
    `extra_pos_embedder`: read as Cosmos 1.0, equal to diffusers."""
    from test_denoise_cosmos import release

    _, _, ref, sd = cosmos1[False]
    sd2 = {k.replace("learnable_pos_embed", "extra_pos_embedder"): v for k, v in release(sd).items()}
    den = _bound(write(tmp_path / "predict2_names.safetensors", sd2))
    assert den.naming == "release"
    x = den.random_inputs(64, 64, seed=4)
    with torch.inference_mode():
        assert rel_l2(den(x), _diffusers(ref, x)) <= TOL


def test_a_predict2_file_is_not_bound_as_1_0(tmp_path):
    from test_denoise_cosmos import diffusers_cosmos

    _, sd = diffusers_cosmos()
    path = write(tmp_path / "predict2.safetensors", sd)
    comp = detect_file(str(path)).components["transformer"]
    with pytest.raises(UnsupportedModel, match="no learnable position embeddings.*steps as cosmos_predict2"):
        denoise.bind(Component("transformer", path, comp.prefix), ARCH)
