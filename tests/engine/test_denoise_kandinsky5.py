"""Kandinsky 5's transformer (engine.denoise.kandinsky5) against diffusers' Kandinsky5Transformer3DModel on the same
weights, bare and under `model.diffusion_model.`; two reduced configs with the releases' two head layouts (Lite video:
64-wide heads, axes 16 / 24 / 24, visual conditioning, 33 channels in; Image: 128-wide heads, axes 32 / 48 / 48, 16
channels), 2 + 2 blocks, float32, CPU; its op order, a step fully and partially resident, the default-size layouts of
Lite, Pro and Image binding whole, a PEFT LoRA baked and on the fly, and `loadout step` on a tiny file."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from denoise_files import check_op_order, check_steps_alike, rel_l2, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
SMALL = dict(in_text_dim=96, in_text_dim2=48, time_dim=64, ff_dim=256, num_text_blocks=2, num_visual_blocks=2)
VIDEO = dict(
    SMALL, in_visual_dim=16, out_visual_dim=16, model_dim=128, axes_dims=(16, 24, 24), visual_cond=True
)
IMAGE = dict(
    SMALL, in_visual_dim=16, out_visual_dim=16, model_dim=256, axes_dims=(32, 48, 48), visual_cond=False
)


@pytest.fixture(scope="module")
def k5(tmp_path_factory):
    """{config name: (bare file, prefixed file, diffusers' model, state dict)}."""
    d = tmp_path_factory.mktemp("k5")
    out = {}
    for name, cfg, seed in (("video", VIDEO, 51), ("image", IMAGE, 52)):
        ref, sd = well_scaled(
            diffusers.Kandinsky5Transformer3DModel(**cfg), seed
        )  # modulations: no longer zeros
        out[name] = (
            write(d / f"{name}.safetensors", sd),
            write(d / f"{name}_prefixed.safetensors", {PREFIX + k: v for k, v in sd.items()}),
            ref,
            sd,
        )
    return out


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "kandinsky5"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "kandinsky5")


def _diffusers(ref, x: dict) -> torch.Tensor:
    """diffusers' forward as its pipelines call it: aranges for the positions, one scale_factor for the batch."""
    _, t, h, w, _ = x["hidden_states"].shape
    pos = [torch.arange(t), torch.arange(h // 2), torch.arange(w // 2)]
    scale = x["scale_factor"][0].tolist() if "scale_factor" in x else (1.0, 1.0, 1.0)
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], encoder_hidden_states=x["encoder_hidden_states"],
                   timestep=x["timestep"], pooled_projections=x["pooled_projections"], visual_rope_pos=pos,
                   text_rope_pos=torch.arange(x["encoder_hidden_states"].shape[1]), scale_factor=scale,
                   return_dict=False)  # fmt: skip


def _inputs(den, seed=1, frames=3, tokens=10):
    """Two items, `frames` latent frames of 6 × 4 (3 × 2 patches), the condition channels random too."""
    g = torch.Generator().manual_seed(seed)
    x = den.random_inputs(64, 96, batch=2, seed=seed)
    x["hidden_states"] = torch.randn(2, frames, 6, 4, den.model.in_channels, generator=g)
    x["encoder_hidden_states"] = x["encoder_hidden_states"][:, :tokens]
    return x


@pytest.mark.parametrize("name", ["video", "image"])
def test_kandinsky5_equals_diffusers_bare_and_prefixed(k5, name):
    bare, prefixed, ref, _ = k5[name]
    dens = [_bound(bare), _bound(prefixed)]
    assert dens[0].input_names == ("hidden_states", "encoder_hidden_states", "timestep", "pooled_projections")
    assert dens[0].model.visual_cond == (name == "video")
    base = _inputs(dens[0])
    with torch.inference_mode():
        for scale in (None, (1.0, 2.0, 2.0), (1.0, 3.16, 3.16)):
            x = dict(base) if scale is None else dict(base, scale_factor=torch.tensor([scale, scale]))
            x.pop("scale_factor") if scale is None else None
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(ref, x)
            for den, n in zip(dens, ("bare", "prefixed"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"kandinsky5 {name} ({n}, scale_factor {scale}): relative L2 {err:.2e}")
                assert out.shape == (2, 3, 6, 4, 16) and err <= TOL


def test_positions_scales_and_the_rounding_are_read_as_released(k5, monkeypatch):
    """Fails with the RoPE divisors ignored, the text positions or the 3-D axes out of order, the bfloat16 rounding of
    the rotated q / k left out, or a block's modulation read in another order."""
    from engine.denoise import kandinsky5 as K

    bare, _, ref, _ = k5["video"]
    den = _bound(bare)
    x = den.check_inputs(
        dict(_inputs(den, seed=4), scale_factor=torch.tensor([[1.0, 2.0, 2.0]] * 2)), "inputs"
    )
    want = _diffusers(ref, x)
    with torch.inference_mode():
        assert rel_l2(den(x), want) <= TOL
        # each item its own divisors: item 1 as it is alone
        y = dict(x, scale_factor=torch.tensor([[1.0, 3.16, 3.16], [1.0, 2.0, 2.0]]))
        assert rel_l2(den(y)[1], want[1]) <= TOL and rel_l2(den(y)[0], want[0]) > 10 * TOL
        rope1, rope3, residual = K._rope_1d, K._rope_3d, K._residual
        for name, wrong in (
            ("_rope_1d", lambda n, head, dev: rope1(n, head, dev).flip(0)),
            ("_rope_3d", lambda grid, axes, s, dev: rope3(grid, axes[::-1], s, dev)),
            ("_rope_3d", lambda grid, axes, s, dev: rope3(grid, axes, torch.ones_like(s), dev)),
            ("_rotate", _rotate_unrounded),
            ("_residual", lambda t, mod, f: residual(t, (mod[1], mod[0], mod[2]), f)),
        ):
            with monkeypatch.context() as mp:
                mp.setattr(K, name, wrong)
                err = rel_l2(den(x), want)
                print(f"kandinsky5 with {name} wrong: relative L2 {err:.2e}")
                assert err > TOL, name


def _rotate_unrounded(x, pe):
    xf = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    return (pe[..., 0] * xf[..., 0] + pe[..., 1] * xf[..., 1]).reshape(x.shape).to(x.dtype)


def test_a_latent_of_half_patches_and_bad_divisors_are_refused(k5):
    den = _bound(k5["image"][0])
    x = _inputs(den)
    with pytest.raises(FormatError, match="2×2 patches"):
        den.check_inputs(dict(x, hidden_states=x["hidden_states"][:, :, :5]), "in.safetensors")
    with pytest.raises(FormatError, match="scale_factor"):
        den.check_inputs(dict(x, scale_factor=torch.tensor([[1.0, 0.0, 2.0]] * 2)), "in.safetensors")


def test_a_head_width_of_no_release_is_refused(tmp_path):
    _, sd = well_scaled(
        diffusers.Kandinsky5Transformer3DModel(**dict(IMAGE, model_dim=192, axes_dims=(16, 16, 16))), 3
    )
    with pytest.raises(UnsupportedModel, match="head width 48"):
        _bound(write(tmp_path / "k5_48.safetensors", sd))


def test_kandinsky5_op_order_is_the_call_order(k5):
    check_op_order(k5["video"][1], "kandinsky5", PREFIX)


def test_kandinsky5_steps_fully_and_partially_alike(k5, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(k5["video"][1], tmp_path, 0.001, "kandinsky5", (1, 1, 8, 8, 16))


@pytest.mark.parametrize(
    "size, config, blocks, heads, channels",
    [
        # config_5s_sft.yaml (T2V Lite), k5_pro_t2v_5s_sft_hd.yaml (Pro), config_t2i.yaml (Image Lite)
        ("2b", dict(model_dim=1792, ff_dim=7168, time_dim=512, num_text_blocks=2, num_visual_blocks=32,
                    axes_dims=(16, 24, 24), visual_cond=True), (2, 32), 28, 33),
        ("19b", dict(model_dim=4096, ff_dim=16384, time_dim=1024, num_text_blocks=4, num_visual_blocks=60,
                     axes_dims=(32, 48, 48), visual_cond=True), (4, 60), 32, 33),
        ("6b", dict(model_dim=2560, ff_dim=10240, time_dim=512, num_text_blocks=2, num_visual_blocks=50,
                    axes_dims=(32, 48, 48), visual_cond=False), (2, 50), 20, 16),
    ],
)  # fmt: skip
def test_the_default_size_layouts_bind_whole(tmp_path, size, config, blocks, heads, channels):
    """Each release's transformer config in diffusers' class on the meta device, header only (bf16)."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.Kandinsky5Transformer3DModel, in_visual_dim=16, out_visual_dim=16, in_text_dim=3584,
                       in_text_dim2=768, **config)  # fmt: skip
    path = write_sparse(tmp_path / "k5.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    assert detect_file(str(path)).variant == f"normal-{size}"
    m = _bound(path).model
    got = ((len(m.text_blocks), len(m.visual_blocks)), m.heads, m.in_channels, m.text_dim, m.pooled_dim)
    assert got == (blocks, heads, channels, 3584, 768)


# The modules a LoRA adapts, in diffusers' names: every Linear of both kinds of block, the embedders and the head.
LORA_MODULES = ("visual_transformer_blocks.0.self_attention.to_query", "visual_transformer_blocks.1.self_attention.to_key",
                "visual_transformer_blocks.0.cross_attention.to_value", "visual_transformer_blocks.1.cross_attention.out_layer",
                "visual_transformer_blocks.0.feed_forward.in_layer", "visual_transformer_blocks.1.feed_forward.out_layer",
                "visual_transformer_blocks.0.visual_modulation.out_layer", "text_transformer_blocks.0.self_attention.to_value",
                "text_transformer_blocks.1.feed_forward.in_layer", "text_transformer_blocks.0.text_modulation.out_layer",
                "visual_embeddings.in_layer", "text_embeddings.in_layer", "time_embeddings.out_layer",
                "out_layer.out_layer")  # fmt: skip


@pytest.mark.parametrize("base, budget", [("prefixed", None), ("bare", 0.0)])
def test_a_peft_lora_lands_baked_and_on_the_fly(k5, tmp_path, base, budget):
    """PEFT (`transformer.` + diffusers' names), baked (resident) and on the fly (streamed): equal to diffusers' model
    with the LoRA merged by hand; every module of it placed."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    bare, prefixed, ref, sd = k5["video"]
    path = prefixed if base == "prefixed" else bare
    strength = 0.8
    names = {d: "transformer." + d for d in LORA_MODULES}
    lora, merged = lora_and_merged({k: v.clone() for k, v in sd.items()}, names, strength, seed=7)
    x = {k: v[:1] for k, v in _inputs(_bound(path), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"kandinsky5 LoRA (peft on {base}, budget {budget})"
    check_lora_step(
        path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, "kandinsky5", TOL
    )


def test_loadout_step_runs_a_tiny_file(k5, tmp_path):
    """From the command line, random inputs at 64×64 (one latent frame of 8×8): the output written, no traceback."""
    from engine.formats.safetensors import SafetensorsFile

    out = tmp_path / "out.safetensors"
    r = subprocess.run([sys.executable, "-m", "engine", "step", "--model", str(k5["image"][1]), "--size", "64x64",
                        "--cpu", "--out", str(out)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    t = SafetensorsFile(out).tensor("out")
    assert tuple(t.shape) == (1, 1, 8, 8, 16) and torch.isfinite(t).all()


def test_the_activation_estimate_counts_visual_tokens(k5):
    """A step's memory estimate grows with the latent's (1, 2, 2) patches (engine.stepping), not its frame count."""
    from engine.stepping import _units

    den = _bound(k5["video"][0])
    small, large = den.random_inputs(256, 256, batch=2), den.random_inputs(512, 512, batch=2)
    t, h, w = small["hidden_states"].shape[1:4]
    assert _units(den, small) == 2 * t * (h // 2) * (w // 2) and _units(den, large) == 4 * _units(den, small)
