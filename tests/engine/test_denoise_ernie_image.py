"""ERNIE-Image's transformer (engine.denoise.ernie_image) against diffusers' ErnieImageTransformer2DModel on the same
weights, in the release's single-file naming (diffusers' names under `model.diffusion_model.`: its converter only
strips the prefix) and bare; 2 layers, 2 heads of 128, float32, CPU; prompts of two lengths (padding masked); its op
order, a step fully and partially resident, the default-size layout binding whole, and a GGUF twin."""

from __future__ import annotations

import pytest
import torch
from denoise_files import (
    check_gguf_like_its_twin,
    check_op_order,
    check_steps_alike,
    rel_l2,
    well_scaled,
    write,
)

from engine import denoise
from engine.detect import detect_file
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
CONFIG = dict(hidden_size=256, num_attention_heads=2, num_layers=2, ffn_hidden_size=512, text_in_dim=96)


@pytest.fixture(scope="module")
def ernie(tmp_path_factory):
    ref, sd = well_scaled(diffusers.ErnieImageTransformer2DModel(**CONFIG), 43)
    d = tmp_path_factory.mktemp("ernie")
    return (
        write(d / "ernie_diffusers.safetensors", sd),
        write(d / "ernie_release.safetensors", {PREFIX + k: v for k, v in sd.items()}),
        ref,
        sd,
    )


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "ernie_image"
    return denoise.bind(Component("transformer", path, det.components["transformer"].prefix), "ernie_image")


def _diffusers(ref, x: dict) -> torch.Tensor:
    lens = x.get("text_lens", torch.full((x["text_bth"].shape[0],), x["text_bth"].shape[1]))
    with torch.inference_mode():
        return ref(hidden_states=x["hidden_states"], timestep=x["timestep"], text_bth=x["text_bth"],
                   text_lens=lens.long(), return_dict=False)[0]  # fmt: skip


def _inputs(den, seed=1, tokens=10):
    x = den.random_inputs(64, 96, batch=2, seed=seed)  # a 6 x 4 latent
    x["text_bth"] = x["text_bth"][:, :tokens]
    return x


def test_ernie_image_equals_diffusers_in_both_namings_with_padded_prompts(ernie):
    diff_path, release_path, ref, _ = ernie
    dens = [_bound(diff_path), _bound(release_path)]
    assert dens[0].input_names == ("hidden_states", "timestep", "text_bth")
    full = _inputs(dens[0])
    padded = dict(full, text_lens=torch.tensor([10.0, 6.0]))
    with torch.inference_mode():
        for x, what in ((full, "one length"), (padded, "padded")):
            x = dens[0].check_inputs(x, "inputs")
            want = _diffusers(ref, x)
            for den, n in zip(dens, ("bare", "release"), strict=True):
                out = den(x)
                err = rel_l2(out, want)
                print(f"ernie_image ({n}, {what}): relative L2 {err:.2e}")
                assert out.shape == (2, 128, 6, 4) and err <= TOL
        # the prompt's length reaches the output (the image positions and the mask read it)
        assert rel_l2(dens[0](padded), dens[0](full)) > 1e-3


def test_time_positions_and_the_mlp_are_read_as_released(ernie, monkeypatch):
    """Fails with the timestep embedding's halves in the other order, the rows' and columns' positions swapped, or the
    MLP's gate and up projections swapped."""
    from engine.denoise import ernie_image as E

    diff_path, _, ref, _ = ernie
    den = _bound(diff_path)
    x = den.check_inputs(_inputs(den, seed=4), "inputs")
    with torch.inference_mode():
        want = _diffusers(ref, x)
        assert rel_l2(den(x), want) <= TOL
        temb, positions = E.timestep_embedding, E._positions
        for name, wrong in (
            ("timestep_embedding", lambda t, d: temb(t, d).roll(d // 2, dims=-1)),
            ("_positions", lambda *a: positions(*a)[..., [0, 2, 1]]),
        ):
            with monkeypatch.context() as mp:
                mp.setattr(E, name, wrong)
                assert rel_l2(den(x), want) > 10 * TOL, name
        m = den.model
        m.layers[0].gate, m.layers[0].up = m.layers[0].up, m.layers[0].gate
        try:
            assert rel_l2(den(x), want) > 10 * TOL
        finally:
            m.layers[0].gate, m.layers[0].up = m.layers[0].up, m.layers[0].gate


def test_bad_text_lens_are_refused(ernie):
    from engine.errors import FormatError

    den = _bound(ernie[0])
    x = _inputs(den)
    for bad in ([11.0, 3.0], [2.5, 3.0], [-1.0, 3.0]):
        with pytest.raises(FormatError, match="text_lens"):
            den.check_inputs(dict(x, text_lens=torch.tensor(bad)), "in.safetensors")


def test_ernie_image_op_order_is_the_call_order(ernie):
    check_op_order(ernie[1], "ernie_image", PREFIX, plain=2 * CONFIG["num_layers"])


def test_ernie_image_steps_fully_and_partially_alike(ernie, tmp_path, monkeypatch):
    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    check_steps_alike(ernie[1], tmp_path, 0.004, "ernie_image", (1, 128, 4, 4))


def test_the_default_size_release_layout_binds_whole(tmp_path):
    """diffusers' default config (24 layers, 24 heads of 128, MLP 8192, text 2560), under model.diffusion_model.,
    header only."""
    from layouts_2026.common import meta_shapes

    from engine.formats.safetensors import write_sparse

    rows = meta_shapes(diffusers.ErnieImageTransformer2DModel)
    path = write_sparse(tmp_path / "ernie.safetensors", [(PREFIX + k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.layers), m.heads, m.in_channels, m.context_dim, m.patch) == (24, 24, 128, 2560, 1)


def test_a_gguf_ernie_image_steps_like_its_dequantized_twin(tmp_path):
    """A GGUF in the release's names (the Linears' weights Q8_0, the rest as they are): the same output as its
    dequantized safetensors twin."""
    pytest.importorskip("gguf")
    _, sd = well_scaled(diffusers.ErnieImageTransformer2DModel(**CONFIG), 44)
    quantized = check_gguf_like_its_twin(
        tmp_path, sd, "ernie_image", lambda k, t: t.dim() == 2 and t.shape[-1] % 32 == 0, "ernie_image"
    )
    assert (
        "layers.0.self_attention.to_q.weight" in quantized and "layers.1.mlp.linear_fc2.weight" in quantized
    )


# The modules a LoRA adapts (the release's and diffusers' names are one): every Linear of a layer, the shared
# modulation, the stem and the head.
LORA_MODULES = ("layers.0.self_attention.to_q", "layers.1.self_attention.to_k", "layers.0.self_attention.to_v",
                "layers.1.self_attention.to_out.0", "layers.0.mlp.gate_proj", "layers.1.mlp.up_proj",
                "layers.0.mlp.linear_fc2", "adaLN_modulation.1", "text_proj", "time_embedding.linear_1",
                "final_norm.linear", "final_linear")  # fmt: skip


@pytest.mark.parametrize(
    "fmt, base, budget",
    [("peft", "release", None), ("peft", "bare", 0.0), ("release", "bare", None), ("release", "release", 0.0),
     ("kohya", "release", None), ("kohya", "bare", 0.0)],
)  # fmt: skip
def test_a_lora_in_either_naming_lands_on_a_base_in_either_naming(ernie, tmp_path, fmt, base, budget):
    """PEFT (`transformer.` + diffusers' names), the release's (`diffusion_model.` + lora_down / up + alpha) and kohya's
    (`lora_unet_`, underscored), baked (resident) and on the fly (streamed): equal to diffusers' model with the LoRA
    merged by hand; every module of it placed; its base told from its names."""
    from denoise_files import check_lora_step, lora_and_merged, plain_and_merged

    diff_path, release_path, ref, sd = ernie
    path = release_path if base == "release" else diff_path
    prefix = {"peft": "transformer.", "release": "diffusion_model.", "kohya": "lora_unet_"}[fmt]
    names = {d: prefix + (d.replace(".", "_") if fmt == "kohya" else d) for d in LORA_MODULES}
    strength = 0.8
    lora, merged = lora_and_merged(
        {k: v.clone() for k, v in sd.items()}, names, strength, seed=7, kohya=fmt != "peft"
    )
    x = {k: v[:1] for k, v in _inputs(_bound(path), seed=9).items()}
    plain, want = plain_and_merged(ref, sd, merged, lambda: _diffusers(ref, x))
    assert rel_l2(plain, want) > 100 * TOL
    what = f"ernie_image LoRA ({fmt} on {base}, budget {budget})"
    check_lora_step(
        path, lora, strength, x, tmp_path, budget, want, len(LORA_MODULES), what, "ernie_image", TOL
    )


def test_the_activation_estimate_counts_image_tokens(ernie):
    """A step's memory estimate grows with the image's tokens (engine.stepping), not with the latent's 128 channels."""
    from engine.stepping import _units

    den = _bound(ernie[0])
    small, large = den.random_inputs(256, 256, batch=2), den.random_inputs(512, 512, batch=2)
    assert _units(den, small) == 2 * (256 // 16) ** 2 and _units(den, large) == 4 * _units(den, small)
