"""LongCat-Image's and Ovis-Image's transformers (engine.denoise.longcat_image, one module for both) against diffusers'
LongCatImageTransformer2DModel and OvisImageTransformer2DModel on the same weights, bare and under `transformer.`;
2 double and 2 single blocks, 2 heads of 128, float32, CPU (LongCat's text stays 3584 wide: detection tells it by that
width). Each family: its op order, its random positions as its pipeline makes them, a step fully and partially
resident, through the command line too, the default-size layout binding whole, a PEFT LoRA baked and on the fly."""

from __future__ import annotations

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
PREFIX = "transformer."
SMALL = dict(num_layers=2, num_single_layers=2, num_attention_heads=2)
FAMILIES = {
    "longcat_image": ("LongCatImageTransformer2DModel", dict(SMALL, joint_attention_dim=3584)),
    "ovis_image": ("OvisImageTransformer2DModel", dict(SMALL, joint_attention_dim=64)),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def tiny(request, tmp_path_factory):
    arch = request.param
    cls, cfg = FAMILIES[arch]
    ref, sd = well_scaled(getattr(diffusers, cls)(**cfg), 47)
    d = tmp_path_factory.mktemp(arch)
    bare = write(d / f"{arch}.safetensors", sd)
    prefixed = write(d / f"{arch}_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()})
    return arch, bare, prefixed, ref, sd


def _bound(path, arch):
    det = detect_file(str(path))
    assert det.architecture == arch
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), arch)


def _diffusers(ref, x: dict) -> torch.Tensor:
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                   timestep=x["timestep"], img_ids=x["img_ids"], txt_ids=x["txt_ids"], return_dict=False)[0]  # fmt: skip


def _inputs(den, seed=1, tokens=12):
    x = den.random_inputs(64, 96, batch=2, seed=seed)  # 6 x 4 tokens
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :tokens]
    x["txt_ids"] = x["txt_ids"][:tokens]
    return x


def test_each_equals_diffusers_bare_and_prefixed(tiny):
    arch, bare, prefixed, ref, _ = tiny
    dens = [_bound(bare, arch), _bound(prefixed, arch)]
    assert dens[0].input_names == ("hidden_states", "encoder_hidden_states", "timestep", "img_ids", "txt_ids")
    x = dens[0].check_inputs(_inputs(dens[0]), "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        for den, n in zip(dens, ("bare", "prefixed"), strict=True):
            out = den(x)
            err = rel_l2(out, want)
            print(f"{arch} ({n}): relative L2 {err:.2e}")
            assert out.shape == (2, 24, 64) and err <= TOL
        # the positions reach the output
        assert rel_l2(dens[0](dict(x, img_ids=x["img_ids"].flip(0))), want) > 1e-3


def test_an_edit_step_with_reference_tokens_equals_diffusers(tiny):
    """LongCat-Image-Edit's call: the reference image's tokens after the image's, their ids at modality 2."""
    arch, bare, _, ref, _ = tiny
    den = _bound(bare, arch)
    x = _inputs(den, seed=2)
    refs = den.random_inputs(64, 96, batch=2, seed=5)
    ref_ids = x["img_ids"].clone()
    ref_ids[:, 0] = 2
    x = den.check_inputs(dict(x, hidden_states=torch.cat([x["hidden_states"], refs["hidden_states"]], dim=1),
                              img_ids=torch.cat([x["img_ids"], ref_ids])), "inputs")  # fmt: skip
    with torch.inference_mode():
        err = rel_l2(den(x), _diffusers(ref, x))
    print(f"{arch} (reference tokens): relative L2 {err:.2e}")
    assert err <= TOL


def test_random_positions_are_the_pipelines(tiny):
    """Text token i at (0, i, i); LongCat's image at (1, 512 + row, 512 + column), Ovis' at (0, row, column)."""
    arch, bare, *_ = tiny
    den = _bound(bare, arch)
    x = den.random_inputs(48, 32, batch=1)  # 2 rows of 3 tokens
    if arch == "longcat_image":
        from diffusers.pipelines.longcat_image.pipeline_longcat_image import prepare_pos_ids

        txt = prepare_pos_ids(modality_id=0, type="text", start=(0, 0), num_token=512)
        img = prepare_pos_ids(modality_id=1, type="image", start=(512, 512), height=2, width=3)
    else:
        from diffusers import OvisImagePipeline

        txt = torch.zeros(256, 3)
        txt[:, 1] = txt[:, 2] = torch.arange(256)
        img = OvisImagePipeline._prepare_latent_image_ids(1, 2, 3, "cpu", torch.float32)
    assert torch.equal(x["txt_ids"], txt) and torch.equal(x["img_ids"], img)
    assert x["encoder_hidden_states"].shape[1] == txt.shape[0]


def test_ids_of_another_length_are_refused(tiny):
    from engine.errors import FormatError

    arch, bare, *_ = tiny
    den = _bound(bare, arch)
    x = _inputs(den)
    with pytest.raises(FormatError, match="input img_ids has shape"):
        den.check_inputs(dict(x, img_ids=x["img_ids"][:-1]), "in.safetensors")


def test_op_order_is_the_call_order(tiny):
    arch, _, prefixed, *_ = tiny
    check_op_order(prefixed, arch, PREFIX)


def test_steps_fully_and_partially_alike(tiny, tmp_path, monkeypatch):
    arch, _, prefixed, *_ = tiny
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(prefixed, tmp_path, 0.004, arch, (1, 16, 64))


def test_loadout_step_runs_it_from_the_command_line(tiny, tmp_path):
    from engine.formats.safetensors import SafetensorsFile

    arch, bare, *_ = tiny
    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(bare), "--size", "32x48", "--cpu",
                        "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert SafetensorsFile(out).tensor("out").shape == (1, 6, 64)


def test_ovis_without_its_text_norm_is_refused(tmp_path):
    cls, cfg = FAMILIES["ovis_image"]
    _, sd = well_scaled(getattr(diffusers, cls)(**cfg), 48)
    path = write(
        tmp_path / "ovis.safetensors", {k: v for k, v in sd.items() if "context_embedder_norm" not in k}
    )
    with pytest.raises(UnsupportedModel, match="context_embedder_norm"):
        _bound(path, "ovis_image")


@pytest.mark.parametrize(
    "arch, sizes", [("longcat_image", (19, 38, 24, 3584)), ("ovis_image", (6, 27, 24, 2048))]
)
def test_the_default_size_layout_binds_whole(tmp_path, arch, sizes):
    """diffusers' default config, under transformer., header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(getattr(diffusers, FAMILIES[arch][0]))
    path = write_sparse(tmp_path / "t.safetensors", [(PREFIX + k, "BF16", s) for k, s in rows.items()])
    m = _bound(path, arch).model
    assert (len(m.doubles), len(m.singles), m.heads, m.context_dim, m.in_channels) == (*sizes, 64)


# The modules a PEFT LoRA adapts (diffusers' names): both streams' attention and MLPs, the single blocks', their
# modulations, the stem and the head.
LORA_MODULES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_k_proj", "transformer_blocks.0.attn.to_out.0",
                "transformer_blocks.1.attn.to_add_out", "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.1.ff_context.net.2",
                "transformer_blocks.0.norm1.linear", "single_transformer_blocks.0.attn.to_v", "single_transformer_blocks.1.proj_mlp",
                "single_transformer_blocks.0.proj_out", "single_transformer_blocks.1.norm.linear", "x_embedder", "context_embedder",
                "norm_out.linear", "proj_out")  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_baked_and_on_the_fly(tiny, tmp_path, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed; its base told from its names and widths (LongCat's
    3584-wide context_embedder, Ovis' gated MLPs)."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    arch, bare, _, ref, sd = tiny
    names = {d: PREFIX + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, 0.8, seed=7)
    x = _inputs(_bound(bare, arch), seed=9)
    x["hidden_states"], x["encoder_hidden_states"], x["timestep"] = (x[k][:1] for k in ("hidden_states",
                                                                     "encoder_hidden_states", "timestep"))  # fmt: skip
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(bare, lora, 0.8, x, tmp_path, budget, want, len(LORA_MODULES), f"{arch} LoRA (budget {budget})",
                    arch, TOL)  # fmt: skip
