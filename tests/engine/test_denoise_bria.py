"""Bria 3.2's and Bria FIBO's transformers (engine.denoise.bria) against diffusers' BriaTransformer2DModel and
BriaFiboTransformer2DModel on the same weights, bare and under `transformer.`; 2 double and 2 single blocks, 2 heads
of 128, float32, CPU (Bria 3.2's text is T5-XXL's 4096 wide: detection reads it); FIBO with a text-encoder layer per
block and padded prompts; op orders, steps fully and partially resident, the default-size layouts binding whole, a
PEFT LoRA, and a step from the command line."""

from __future__ import annotations

import json
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
BASE = dict(patch_size=1, num_layers=2, num_single_layers=2, attention_head_dim=128, num_attention_heads=2)
CONFIGS = {
    "bria": ("BriaTransformer2DModel", dict(BASE, in_channels=16, joint_attention_dim=4096)),
    "bria_fibo": (
        "BriaFiboTransformer2DModel",
        dict(BASE, in_channels=12, joint_attention_dim=64, text_encoder_dim=32),
    ),
}


@pytest.fixture(scope="module", params=["bria", "bria_fibo"])
def bria(request, tmp_path_factory):
    arch = request.param
    cls, cfg = CONFIGS[arch]
    ref, sd = well_scaled(getattr(diffusers, cls)(**cfg), 51)
    d = tmp_path_factory.mktemp(arch)
    bare = write(d / f"{arch}.safetensors", sd)
    prefixed = write(d / f"{arch}_prefixed.safetensors", {"transformer." + k: v for k, v in sd.items()})
    return arch, bare, prefixed, ref, sd


def _bound(path, arch):
    det = detect_file(str(path))
    assert det.architecture == arch
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), arch)


def _diffusers(ref, x: dict) -> torch.Tensor:
    kw = {}
    if "text_encoder_layers" in x:
        kw["text_encoder_layers"] = list(x["text_encoder_layers"].unbind(1))
        if "attention_mask" in x:
            n_img = x["hidden_states"].shape[1]
            keep = torch.cat(
                [x["attention_mask"] > 0.5, torch.ones(x["attention_mask"].shape[0], n_img).bool()], 1
            )
            kw["joint_attention_kwargs"] = {"attention_mask": keep[:, None, None, :]}
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                   timestep=x["timestep"], img_ids=x["img_ids"][0], txt_ids=x["txt_ids"][0], return_dict=False,
                   **kw)[0]  # fmt: skip


def _inputs(den, seed=1, tokens=10):
    x = den.random_inputs(64, 96, batch=2, seed=seed)  # a 6 x 4 grid of tokens
    for k in ("encoder_hidden_states", "txt_ids"):
        x[k] = x[k][:, :tokens]
    if "text_encoder_layers" in x:
        x["text_encoder_layers"] = x["text_encoder_layers"][:, :, :tokens]
    return x


def test_bria_equals_diffusers_bare_and_prefixed(bria):
    arch, bare, prefixed, ref, _ = bria
    dens = [_bound(bare, arch), _bound(prefixed, arch)]
    fibo = arch == "bria_fibo"
    assert dens[0].input_names[:5] == (
        "hidden_states",
        "encoder_hidden_states",
        "timestep",
        "img_ids",
        "txt_ids",
    )
    full = _inputs(dens[0])
    cases = [(full, "one length")]
    if fibo:
        cases.append((dict(full, attention_mask=torch.tensor([[1.0] * 10, [1.0] * 6 + [0.0] * 4])), "padded"))
    with torch.inference_mode():
        for x, what in cases:
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(ref, x)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"{arch} ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == want.shape == (2, 24, CONFIGS[arch][1]["in_channels"]) and err <= TOL
        if fibo:  # the mask and every block's text-encoder layer reach the output
            assert rel_l2(dens[0](cases[1][0]), dens[0](full)) > 1e-3
            late = dict(full, text_encoder_layers=full["text_encoder_layers"].clone())
            late["text_encoder_layers"][:, -1] += 1.0
            assert rel_l2(dens[0](late), dens[0](full)) > 1e-3


def test_time_and_positions_are_read_as_released(bria, monkeypatch):
    """Fails with the timestep scaled as FLUX.1's (1000·t), the sines first, or the rows' and columns' swapped."""
    from engine.denoise import bria as B

    arch, bare, _, ref, _ = bria
    den = _bound(bare, arch)
    x = den.check_inputs(_inputs(den, seed=4), "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        assert rel_l2(den(x), want) <= TOL
        temb, table = B.timestep_embedding, B.rope_table
        for name, wrong in (
            ("timestep_embedding", lambda t, d, p: temb(t / 1000.0, d, p)),
            ("timestep_embedding", lambda t, d, p: temb(t, d, p).roll(d // 2, dims=-1)),
            ("rope_table", lambda ids: table(ids[..., [0, 2, 1]])),
        ):
            with monkeypatch.context() as mp:
                mp.setattr(B, name, wrong)
                assert rel_l2(den(x), want) > 10 * TOL, name


def test_bria_op_order_is_the_call_order(bria):
    check_op_order(bria[2], bria[0], "transformer.")


def test_bria_steps_fully_and_partially_alike(bria, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    arch = bria[0]
    check_steps_alike(bria[1], tmp_path, 0.004, arch, (1, 16, CONFIGS[arch][1]["in_channels"]))


@pytest.mark.parametrize("arch", ["bria", "bria_fibo"])
def test_the_default_size_layout_binds_whole(arch, tmp_path):
    """diffusers' default config (19 double and 38 single blocks, 24 heads of 128, 4096-wide text; FIBO: a 2048-wide
    text-encoder layer per block), header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(getattr(diffusers, CONFIGS[arch][0]))
    path = write_sparse(tmp_path / f"{arch}.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path, arch).model
    assert (len(m.doubles), len(m.singles), m.heads, m.in_channels, m.context_dim) == (19, 38, 24, 64, 4096)
    if arch == "bria_fibo":
        assert (len(m.captions), m.text_dim) == (57, 2048)


def test_a_fibo_missing_a_caption_projection_is_refused(tmp_path):
    cls, cfg = CONFIGS["bria_fibo"]
    _, sd = well_scaled(getattr(diffusers, cls)(**cfg), 52)
    path = write(
        tmp_path / "cut.safetensors",
        {k: v for k, v in sd.items() if not k.startswith("caption_projection.3")},
    )
    with pytest.raises(UnsupportedModel, match="caption projections"):
        _bound(path, "bria_fibo")


def test_step_from_the_command_line(bria):
    arch = bria[0]
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(bria[2]), "--size", "64x32",
                        "--steps", "1", "--cpu", "--json"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["architecture"] == arch and got["mode"] == "full" and got["steps"] == 1


# The modules a PEFT LoRA (diffusers' names) adapts: both streams of a double block, a single block, the stem, the
# time embedding, the head and (FIBO) a caption projection.
LORA_MODULES = ("transformer_blocks.0.attn.to_q", "transformer_blocks.1.attn.add_k_proj", "transformer_blocks.0.ff.net.2",
                "transformer_blocks.1.norm1_context.linear", "single_transformer_blocks.0.attn.to_v",
                "single_transformer_blocks.1.proj_mlp", "single_transformer_blocks.0.proj_out", "x_embedder",
                "context_embedder", "time_embed.timestep_embedder.linear_1", "norm_out.linear", "proj_out")  # fmt: skip


@pytest.mark.parametrize("budget", [None, 0.0])
def test_a_peft_lora_lands_baked_and_on_the_fly(bria, tmp_path, budget):
    """A PEFT LoRA (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers'
    model with the LoRA merged by hand, every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    arch, bare, _, ref, sd = bria
    modules = LORA_MODULES + (("caption_projection.2.linear",) if arch == "bria_fibo" else ())
    names = {d: "transformer." + d for d in modules}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, 0.8, seed=7)
    x = {k: v[:1] for k, v in _inputs(_bound(bare, arch), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(bare, lora, 0.8, x, tmp_path, budget, want, len(modules), f"{arch} LoRA (budget {budget})",
                    None, TOL)  # fmt: skip
