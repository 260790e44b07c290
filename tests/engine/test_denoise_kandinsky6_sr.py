"""Kandinsky 6 SR's transformer (engine.denoise.kandinsky6_sr) against diffusers' Kandinsky6SRTransformer3DModel on the
same weights, bare and under `model.diffusion_model.`: a reduced config (128 wide, 64-wide heads, 8 latent channels,
a 2-way output), 2 blocks, float32, CPU; NABLA's sparse blocks on a grid wider than its window; its op order, a step
fully and partially resident, the default-size layout binding whole, a PEFT LoRA on the fly, `loadout step`.

On the CPU, torch's eager flex attention ignores a BlockMask's block lists (it attends everywhere: the mask only
reaches it through `mask_mod`), so for the sparse comparison diffusers' own block mask is handed to flex attention with
a `mask_mod` that reads it — the attention diffusers computes on a GPU, compiled."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-5
PREFIX = "model.diffusion_model."
CONFIG = dict(in_visual_dim=8, out_visual_dim=16, time_dim=32, model_dim=128, ff_dim=256, num_visual_blocks=2,
              axes_dims=(16, 24, 24))  # fmt: skip


@pytest.fixture(scope="module")
def sr(tmp_path_factory):
    d = tmp_path_factory.mktemp("k6sr")
    ref, sd = well_scaled(diffusers.Kandinsky6SRTransformer3DModel(**CONFIG), 71)
    bare = write(d / "sr.safetensors", sd)
    return bare, write(d / "sr_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}), ref, sd


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "kandinsky6_sr"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "kandinsky6_sr")


@pytest.fixture
def honoured_blocks(monkeypatch):
    """diffusers' NABLA block mask, its blocks read by eager flex attention through a mask_mod."""
    from diffusers.models.transformers import transformer_kandinsky6_sr as D
    from torch.nn.attention.flex_attention import BlockMask

    made = D.nabla_block_mask

    def nabla(q, k, sta, thr=0.9, block_size=64):
        dense = made(q, k, sta, thr, block_size).to_dense().bool()
        n, order = dense.sum(-1).to(torch.int32), dense.int().argsort(-1, descending=True).to(torch.int32)
        return BlockMask.from_kv_blocks(torch.zeros_like(n), order, n, order, BLOCK_SIZE=block_size,
                                        mask_mod=lambda b, h, i, j: dense[b, h, i // block_size, j // block_size])  # fmt: skip

    monkeypatch.setattr(D, "nabla_block_mask", nabla)


def _diffusers(ref, x):
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"], return_dict=False)[0]


def _inputs(t, h, w, seed=1, batch=2):
    g = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(batch, t, h, w, 17, generator=g),
            "timestep": torch.rand(batch, generator=g) * 1000}  # fmt: skip


def test_kandinsky6_sr_equals_diffusers_bare_and_prefixed(sr, honoured_blocks, monkeypatch):
    """A grid inside NABLA's window (every block kept) and one wider than it (9 tile columns): sparse blocks."""
    from engine.denoise import kandinsky6_sr as K

    bare, prefixed, ref, _ = sr
    dens = [_bound(bare), _bound(prefixed)]
    assert dens[0].input_names == ("hidden_states", "timestep")
    for what, x in (("within the window", _inputs(3, 16, 24)), ("wider", _inputs(2, 8, 72, seed=2, batch=1))):
        want = _diffusers(ref, x)
        for den, n in zip(dens, ("bare", "prefixed"), strict=True):
            with torch.inference_mode():
                err = rel_l2(den(den.check_inputs(x, "inputs")), want)
            print(f"kandinsky6_sr {what} ({n}): relative L2 {err:.2e}")
            assert err <= TOL
    with torch.inference_mode(), monkeypatch.context() as mp:  # one query block a band: the same output
        mp.setattr(K, "BAND_ELEMS", 1)
        assert rel_l2(dens[0](x), want) <= TOL
    # the wide grid's attention is sparse indeed: every block kept, or another threshold, is another output
    for name, wrong in (("_nabla", lambda q, k, sta: torch.ones(*q.shape[:2], *sta.shape, dtype=torch.bool)),
                        ("THRESHOLD", 0.5)):  # fmt: skip
        with torch.inference_mode(), monkeypatch.context() as mp:
            mp.setattr(K, name, wrong)
            assert rel_l2(dens[0](x), want) > 100 * TOL, name


def test_a_grid_of_partial_tiles_is_refused(sr):
    den = _bound(sr[0])
    with pytest.raises(FormatError, match="8×8 tiles"):
        den.check_inputs(_inputs(1, 12, 16), "in.safetensors")


def test_kandinsky6_sr_op_order_is_the_call_order(sr):
    check_op_order(sr[1], "kandinsky6_sr", PREFIX, plain=1)  # the root's pooled_bias, read directly


def test_kandinsky6_sr_steps_fully_and_partially_alike(sr, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(sr[1], tmp_path, 0.001, "kandinsky6_sr", (1, 1, 8, 8, 16))


def test_the_default_size_layout_binds_whole(tmp_path):
    """diffusers' default config (the release's: 1792 wide, 32 blocks, 64 K-VAE channels, a 640-wide piflow output) on
    the meta device, header only (bf16)."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.Kandinsky6SRTransformer3DModel)
    path = write_sparse(tmp_path / "sr.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.hidden, m.head, m.in_channels, m.latent_channels) == (32, 1792, 64, 129, 64)


LORA_MODULES = ("visual_transformer_blocks.0.self_attention.to_query", "visual_transformer_blocks.1.self_attention.out_layer",
                "visual_transformer_blocks.0.feed_forward.net.0.proj", "visual_transformer_blocks.1.visual_modulation.out_layer",
                "visual_embeddings.in_layer", "out_layer.out_layer")  # fmt: skip


def test_a_peft_lora_lands_on_the_fly(sr, tmp_path):
    """PEFT, streamed (budget 0): equal to diffusers' model with the LoRA merged by hand; its MLP's keys name the base."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    bare, _, ref, sd = sr
    names = {d: "transformer." + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, 0.8, seed=7)
    x = _inputs(1, 8, 8, seed=9, batch=1)
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    check_lora_step(
        bare,
        lora,
        0.8,
        x,
        tmp_path,
        0.0,
        want,
        len(LORA_MODULES),
        "kandinsky6_sr LoRA",
        "kandinsky6_sr",
        1e-4,
    )


def test_loadout_step_runs_a_tiny_file(sr, tmp_path):
    from engine.formats.safetensors import SafetensorsFile

    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(sr[1]), "--size", "128x128",
                        "--cpu", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    t = SafetensorsFile(out).tensor("out")
    assert tuple(t.shape) == (1, 1, 8, 8, 16) and torch.isfinite(t).all()
