"""MiniMax-H3 in the release's naming (bare and under `model.diffusion_model.`) and diffusers' (MiniMaxH3Transformer3DModel
built on the meta device), the default size and a small one, whole and sharded; its video and audio VAEs name it and are
refused on decode."""

from __future__ import annotations

import pytest
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes, shard
from minimax_files import config, to_release

diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")


@pytest.fixture(scope="module")
def layouts():
    return {
        "default": meta_shapes(diffusers.MiniMaxH3Transformer3DModel),
        "small": meta_shapes(diffusers.MiniMaxH3Transformer3DModel, **config()),
    }


def _convert(rows, cfg):
    return converted(sfu.convert_minimax_h3_transformer_checkpoint_to_diffusers, rows, config=cfg)


def test_the_inverse_converter_is_diffusers_converter_backwards(layouts):
    default = {"num_attention_heads": 56, "attention_head_dim": 128}
    assert_same(_convert(to_release(layouts["default"]), default), layouts["default"])
    assert_same(_convert(to_release(layouts["small"]), config()), layouts["small"])


@pytest.mark.parametrize("name", ["default", "small"])
@pytest.mark.parametrize("naming", ["release", "release_prefixed", "diffusers"])
def test_minimax_h3_in_both_namings(layouts, name, naming):
    ref = layouts[name]
    rows = ref if naming == "diffusers" else to_release(ref)
    prefix = "model.diffusion_model." if naming == "release_prefixed" else ""
    d = detect({prefix + k: s for k, s in rows.items()})
    want = "normal" if name == "default" else None
    assert (d.kind, d.architecture, d.variant, d.prediction) == (
        "diffusion_model",
        "minimax_h3",
        want,
        "flow",
    ), d.evidence
    assert d.components["transformer"].prefix == prefix
    reasons = " | ".join(e.reason for e in d.evidence)
    hidden = 5376 if name == "default" else 48
    assert "MiniMax-H3" in reasons and f"hidden {hidden}" in reasons
    assert ("not the released MiniMax-H3" in reasons) == (name == "small")
    assert all(e.key is not None for e in d.evidence)


def test_the_default_size_is_the_release_size(layouts):
    d = detect(to_release(layouts["default"]))
    reasons = " | ".join(e.reason for e in d.evidence)
    assert "50 blocks" in reasons and "56 heads of 128" in reasons and "SwiGLU 14336" in reasons
    assert "video rows 96 wide, audio rows 32 wide, text 5120 wide" in reasons
    assert abs(d.params - 33.12e9) / 33.12e9 < 0.01, d.params


@pytest.mark.parametrize("naming", ["release", "diffusers"])
def test_shards_are_minimax_h3_from_their_own_keys(layouts, naming):
    ref = layouts["default"]
    rows = ref if naming == "diffusers" else to_release(ref)
    blocks = "transformer_blocks." if naming == "diffusers" else "blocks."
    d = detect(blocks_only(rows, blocks, 20, 30))
    assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "minimax_h3", "normal"), d.evidence
    reasons = " | ".join(e.reason for e in d.evidence)
    assert "part of a sharded model" in reasons and "no timestep embedder" in reasons
    stem = shard(rows, lambda k: not k.startswith(blocks))
    d = detect(stem)
    assert (d.architecture, d.variant) == ("minimax_h3", "normal"), d.evidence
    assert any("token refiner" in e.reason for e in d.evidence)


def test_the_pruned_checkpoint_is_named_and_has_no_variant(layouts):
    rows = {k: s for k, s in to_release(layouts["small"]).items() if not k.startswith("time_embedder.")}
    d = detect({**rows, "adaln_t_table": (1000, 24)})
    assert (d.architecture, d.variant) == ("minimax_h3", None)
    assert any("pruned" in e.reason for e in d.evidence)


def _small_vae(which: str):
    if which == "video":
        return diffusers.AutoencoderKLMiniMaxH3(
        block_out_channels=(8, 8), layers_per_block=1, spatial_downsample_factors=(2, 1),
        temporal_downsample_factors=(1, 1), norm_num_groups=4, decoder_num_layers=1, decoder_num_attention_heads=2,
        decoder_attention_head_dim=16, latents_mean=(0.0,) * 24, latents_std=(1.0,) * 24,
        )  # fmt: skip
    return diffusers.AutoencoderKLMiniMaxH3Audio(
        encoder_dim=4, encoder_rates=(2, 2), latent_dim=64, num_attention_heads=2, decoder_dim=8,
        decoder_rates=(2, 2), decoder_kernel_sizes=(4, 4), resblock_kernel_sizes=(3,), resblock_dilation_sizes=((1,),),
    )  # fmt: skip


@pytest.mark.parametrize("which", ["video", "audio"])
def test_its_vaes_name_it_and_variants_not_run_are_refused_on_decode(tmp_path, which):
    """The audio VAE is not decoded; this reduced video VAE (16-wide heads, 2x spatial) is not the release's
    network (engine.vae.minimax_h3 decodes the release's: tests/engine/test_vae_minimax_h3.py)."""
    import warnings

    from safetensors.torch import save_file

    from engine.detect import detect_file
    from engine.errors import UnsupportedModel
    from engine.vae.loading import load_vae

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # weight_norm's deprecation in the audio VAE
        full = meta_shapes(
            diffusers.AutoencoderKLMiniMaxH3 if which == "video" else diffusers.AutoencoderKLMiniMaxH3Audio
        )
        d = detect(full)
        model = _small_vae(which)
    assert (d.kind, d.architecture, d.also) == ("vae", "minimax_h3", ()), d.evidence
    z = "24-channel" if which == "video" else "32 latent channels"
    assert f"MiniMax-H3's {which} VAE" in d.evidence[0].reason and z in d.evidence[0].reason
    path = tmp_path / f"minimax_h3_{which}_vae.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    assert detect_file(path).architecture == "minimax_h3"
    with pytest.raises(UnsupportedModel, match="MiniMax-H3"):
        load_vae(path)
