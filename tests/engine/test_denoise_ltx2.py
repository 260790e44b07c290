"""LTX-2's audio-video transformer (engine.denoise.ltx2) against diffusers' LTX2VideoTransformer3DModel (and, for the
release's file, its LTX2TextConnectors before it) on the same weights, reduced width (32 heads of 4 for video, of 2 for
audio: widths with leading unrotated RoPE dimensions; connectors of 30 heads) and depth, float32, CPU: a short video
and its audio, a left-padded prompt, per-token video timesteps and the audio stream at its own; both streams'
outputs, in diffusers' naming (the transformer alone) and the release's (`model.diffusion_model.` with the text
connectors), for LTX-2.0's layout, LTX-2.3's (gated attention, cross-attention AdaLN, per-stream connectors), LTX-2.5's
(bias-free video feed-forward, keyframe embedding) and a KV-cacheable one (no prompt_adaln_single); its op order, a
step fully and partially resident (both outputs written), the real release layouts binding whole."""

from __future__ import annotations

import pytest
import torch
from denoise_files import check_op_order, rel_l2, step_full_and_partial, well_scaled, write

from engine import denoise
from engine.detect import detect_file
from engine.errors import FormatError, UnsupportedModel
from engine.model import Component

diffusers = pytest.importorskip("diffusers")

TOL = 1e-4
PREFIX = "model.diffusion_model."
TOKENS, REGISTERS = 16, 8  # the prompt's tokens, the connectors' registers (the release: 1024, 128)
SMALL = dict(in_channels=8, out_channels=8, num_attention_heads=32, attention_head_dim=4, cross_attention_dim=128,
             audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=32, audio_attention_head_dim=2,
             audio_cross_attention_dim=64, num_layers=2, caption_channels=120)  # fmt: skip
SMALL_CONNECTORS = dict(caption_channels=120, text_proj_in_factor=3, video_connector_attention_head_dim=4,
                        audio_connector_attention_head_dim=4, video_connector_num_layers=2, audio_connector_num_layers=1,
                        video_connector_num_learnable_registers=REGISTERS,
                        audio_connector_num_learnable_registers=REGISTERS)  # fmt: skip
# LTX-2.3's connectors: per-stream projections to the streams' widths, 32 gated heads (of 4 and 2 here)
SMALL_CONNECTORS_23 = {**SMALL_CONNECTORS, "audio_connector_attention_head_dim": 2, "video_hidden_dim": 128,
                       "audio_hidden_dim": 64}  # fmt: skip


def _variants():
    from layouts_2026.video import LTX2_CONNECTORS, LTX2_TRANSFORMER

    t20, t23 = LTX2_TRANSFORMER["2.0"], LTX2_TRANSFORMER["2.3"]
    c20 = {**LTX2_CONNECTORS["2.0"], **SMALL_CONNECTORS}
    c23 = {**LTX2_CONNECTORS["2.3"], **SMALL_CONNECTORS_23}
    return {
        "2.0": ({**t20, **SMALL}, c20),
        "2.3": ({**t23, **SMALL}, c23),
        "2.5": ({**t23, **SMALL, "ff_bias": False, "use_keyframes_abs_pos_embedding": True}, c23),
        "kv-cacheable": ({**t23, **SMALL, "use_prompt_adaln_single": False}, c23),
    }


VARIANTS = ("2.0", "2.3", "2.5", "kv-cacheable")


def _release(sd: dict, connectors: dict) -> dict:
    """diffusers' transformer and connectors in the release file's names (layouts_2026.video.ltx2_release_key)."""
    from layouts_2026.video import ltx2_release_key

    return {**{ltx2_release_key(k): v for k, v in sd.items()},
            **{ltx2_release_key(k, connectors=True): v for k, v in connectors.items()}}  # fmt: skip


@pytest.fixture(scope="module")
def ltx2(tmp_path_factory):
    """variant -> (files by naming, diffusers' transformer, its connectors, the transformer's state dict)."""
    from diffusers import LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    d = tmp_path_factory.mktemp("ltx2")
    out = {}
    for i, (name, (tcfg, ccfg)) in enumerate(_variants().items()):
        ref, sd = well_scaled(LTX2VideoTransformer3DModel(**tcfg), 20 + i)
        conn, csd = well_scaled(LTX2TextConnectors(**ccfg), 30 + i)
        if "keyframes_abs_pos_embedding" in sd:  # diffusers makes it zeros, which would hide it
            sd["keyframes_abs_pos_embedding"] = torch.randn(sd["keyframes_abs_pos_embedding"].shape)
            ref.load_state_dict(sd)
        files = {"diffusers": write(d / f"ltx2_{name}_diffusers.safetensors", sd),
                 "release": write(d / f"ltx-2-{name}-dev.safetensors", _release(sd, csd))}  # fmt: skip
        out[name] = (files, ref, conn, sd)
    return out


def _bound(path):
    det = detect_file(str(path))
    assert det.architecture == "ltx2"
    comp = det.components["transformer"]
    return denoise.bind(Component("transformer", path, comp.prefix), "ltx2")


def _inputs(den, variant: str, seed: int = 5) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """Inputs for a clip of 3 latent frames (2×3 latent pixels) and its 18 audio tokens, two items: per-token
    video timesteps (the first frame a conditioning one, at 0), the audio at its own; Gemma's per-layer states
    [B, T, 120, 3] and their mask (the second prompt left-padded); for LTX-2.5 a keyframes mask. (inputs without
    the texts, the states, the mask)."""
    g = torch.Generator().manual_seed(seed)
    x = den.random_inputs(96, 64, batch=2, seed=seed)
    assert x["video_latent"].shape == (2, 8, 3, 2, 3) and x["audio_latent"].shape == (2, 18, 8)
    t = torch.tensor([0.6, 0.9])[:, None].repeat(1, 18)
    t[:, :6] = 0.0
    x.update(video_timesteps=t, audio_timesteps=torch.tensor([0.5, 0.8]), fps=torch.tensor([25.0, 25.0]))
    if variant == "2.5":
        x["video_keyframes_mask"] = (torch.arange(18) < 6).float()[None].repeat(2, 1)
    states = torch.randn(2, TOKENS, 120, 3, generator=g)
    mask = torch.ones(2, TOKENS)
    mask[1, :5] = 0
    return x, states, mask


def _reference(ref, conn, x: dict, states, mask, variant: str) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """diffusers' LTX2TextConnectors on the states, then its transformer as its pipelines call it (sigma: the step's
    sigma, the cross-modal modulations on the other stream's for LTX-2.3 on): ((the connectors' inputs, video's and
    audio's), the video output [B, C, F, H, W], the audio output)."""
    taken = []
    hooks = [c.register_forward_pre_hook(lambda m, args: taken.append(args[0]))
             for c in (conn.video_connector, conn.audio_connector)]  # fmt: skip
    try:
        ve, ae, m = conn(states, mask)
    finally:
        for h in hooks:
            h.remove()
    b, c, f, h, w = x["video_latent"].shape
    sigma = x["video_timesteps"].amax(dim=1)
    kw = {}
    if "video_keyframes_mask" in x:
        kw["video_keyframes_mask"] = x["video_keyframes_mask"][..., None]
    v, a = ref(hidden_states=x["video_latent"].flatten(2).transpose(1, 2), audio_hidden_states=x["audio_latent"],
               encoder_hidden_states=ve, audio_encoder_hidden_states=ae, timestep=x["video_timesteps"] * 1000,
               audio_timestep=x["audio_timesteps"] * 1000, sigma=sigma * 1000, audio_sigma=x["audio_timesteps"] * 1000,
               encoder_attention_mask=m, audio_encoder_attention_mask=m, num_frames=f, height=h, width=w,
               fps=float(x["fps"][0]), audio_num_frames=x["audio_latent"].shape[1],
               use_cross_timestep=variant != "2.0", return_dict=False, **kw)  # fmt: skip
    return {"connected": (ve, ae), "features": tuple(taken)}, v.transpose(1, 2).reshape(b, c, f, h, w), a


@pytest.mark.parametrize("variant", VARIANTS)
def test_both_namings_equal_diffusers_on_a_clip_and_its_audio(ltx2, variant):
    """The release's file runs its text connectors first (its contexts are their inputs: the Gemma features'
    projection); diffusers' transformer alone takes the connectors' outputs. Both streams' outputs equal diffusers'."""
    files, ref, conn, _ = ltx2[variant]
    dens = {n: _bound(p) for n, p in files.items()}
    assert {n: d.naming for n, d in dens.items()} == {n: n for n in files}
    assert dens["release"].input_names == ("video_latent", "video_timesteps", "video_context", "audio_latent",
                                           "audio_timesteps", "audio_context")  # fmt: skip
    x, states, mask = _inputs(dens["release"], variant)
    with torch.inference_mode():
        ctx, want_v, want_a = _reference(ref, conn, x, states, mask, variant)
        for naming, (vctx, actx) in (("release", ctx["features"]), ("diffusers", ctx["connected"])):
            given = {**x, "video_context": vctx, "audio_context": actx}
            if naming == "release":
                given.update(video_context_mask=mask, audio_context_mask=mask)
            den = dens[naming]
            got = den.outputs(den.check_inputs(given, "inputs"))
            errs = rel_l2(got["out"], want_v), rel_l2(got["audio_out"], want_a)
            print(f"ltx2 {variant} ({naming}): relative L2 video {errs[0]:.2e}, audio {errs[1]:.2e}")
            assert max(errs) <= TOL
            assert torch.equal(den(given), got["out"])


def test_the_audio_stream_and_the_text_mask_reach_the_video(ltx2):
    """Without its connectors (diffusers' file) the masked tokens are left out of the text attentions; the audio
    tokens and their timesteps change the video's output (through the audio-to-video attention)."""
    files, ref, _, _ = ltx2["2.0"]
    den = _bound(files["diffusers"])
    x = den.random_inputs(64, 64, seed=7)
    x["video_context"], x["audio_context"] = x["video_context"][:, :TOKENS], x["audio_context"][:, :TOKENS]
    x["video_context_mask"] = x["audio_context_mask"] = (torch.arange(TOKENS) < 10).float()[None]
    x = den.check_inputs(x, "inputs")
    with torch.inference_mode():
        out = den.outputs(x)
        b, c, f, h, w = x["video_latent"].shape
        v, a = ref(hidden_states=x["video_latent"].flatten(2).transpose(1, 2), audio_hidden_states=x["audio_latent"],
                   encoder_hidden_states=x["video_context"], audio_encoder_hidden_states=x["audio_context"],
                   timestep=x["video_timesteps"] * 1000, encoder_attention_mask=x["video_context_mask"],
                   audio_encoder_attention_mask=x["audio_context_mask"], num_frames=f, height=h, width=w,
                   audio_num_frames=x["audio_latent"].shape[1], return_dict=False)  # fmt: skip
        assert rel_l2(out["out"], v.transpose(1, 2).reshape(b, c, f, h, w)) <= TOL
        assert rel_l2(out["audio_out"], a) <= TOL
        padded = {**x, "video_context": x["video_context"].clone()}
        padded["video_context"][:, 10:] = 30.0  # the padding does not reach the output
        assert rel_l2(den(padded), out["out"]) <= TOL
        for change in (
            {"audio_latent": x["audio_latent"] + 1},
            {"audio_timesteps": x["audio_timesteps"] * 0.5},
        ):
            assert rel_l2(den({**x, **change}), out["out"]) > 100 * TOL


def test_random_inputs_make_a_clip_and_its_audio(ltx2):
    """--size gives 3 latent frames (17 at 24 fps), their 18 audio latent frames (25 a second) and 1024 text tokens
    (a multiple of the connectors' registers); both streams' outputs come back."""
    den = _bound(ltx2["2.3"][0]["release"])
    x = den.random_inputs(128, 64)
    shapes = {k: tuple(v.shape) for k, v in x.items()}
    assert shapes == {"video_latent": (1, 8, 3, 2, 4), "video_timesteps": (1,), "video_context": (1, 1024, 128),
                      "audio_latent": (1, 18, 8), "audio_timesteps": (1,), "audio_context": (1, 1024, 64)}  # fmt: skip
    with torch.inference_mode():
        out = den.outputs(x)
    assert out["out"].shape == (1, 8, 3, 2, 4) and out["audio_out"].shape == (1, 18, 8)


def test_inputs_a_release_file_cannot_take_are_refused(ltx2):
    den = _bound(ltx2["2.0"][0]["release"])
    x = den.random_inputs(64, 64)
    with pytest.raises(FormatError, match="multiple of 8"):
        den.check_inputs({**x, "video_context": x["video_context"][:, :12]}, "in.safetensors")
    with pytest.raises(FormatError, match="audio_context_mask of item 0 marks no token"):
        den.check_inputs({**x, "audio_context_mask": torch.zeros(1, 1024)}, "in.safetensors")
    with pytest.raises(FormatError, match="audio_latent has shape"):
        den.check_inputs({**x, "audio_latent": x["audio_latent"][..., :4]}, "in.safetensors")
    assert "video_keyframes_mask" not in den.check_inputs(
        {**x, "video_keyframes_mask": torch.ones(1, 4)}, "in"
    )


@pytest.mark.parametrize("variant", ["2.0", "2.5"])
def test_ltx2_op_order_is_the_call_order(ltx2, variant):
    """The connectors' ops first, then the streams' stems and modulations, the blocks', the heads'; plain holders:
    each block's tables, the root's, the connectors' registers."""
    check_op_order(ltx2[variant][0]["release"], "ltx2", PREFIX, plain=2 + 1 + 2)


def test_ltx2_steps_fully_and_partially_alike_and_writes_both_outputs(ltx2, tmp_path, monkeypatch):
    """A random step (--size) of the release's LTX-2.3 file: the full and the partial one give the same bits for
    the video (`out`) and the audio (`audio_out`, written beside it)."""
    from engine.formats.safetensors import SafetensorsFile

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    runs = step_full_and_partial(ltx2["2.3"][0]["release"], tmp_path, 0.002, size=(64, 64), steps=1)
    (full, a), (partial, b) = runs["full"], runs["partial"]
    assert (full.architecture, full.output_shape) == ("ltx2", (1, 8, 3, 2, 2))
    assert partial.streamed_bytes_per_step > 0 and torch.equal(a, b)
    audio = [SafetensorsFile(tmp_path / f"{n}.safetensors").tensor("audio_out").clone() for n in runs]
    assert audio[0].shape == (1, 18, 8) and torch.equal(*audio)


def test_a_step_records_its_tokens_and_pixel_size_for_the_plan(ltx2, tmp_path, monkeypatch):
    """The plan's units for a size are a random step's: its 3 latent frames of 1x1 tokens of a 32x VAE."""
    import json

    from engine.catalog import measured
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.requests import Step

    monkeypatch.setenv("LOADOUT_CACHE_DIR", str(tmp_path / "cache"))
    e = Engine()
    e.detect(DeviceOptions(cpu=True))
    try:
        e.run(Step(str(ltx2["2.0"][0]["release"]), size=(64, 96), steps=1))
    finally:
        e.close()
    rec = json.loads(measured._path().read_text().splitlines()[-1])
    assert (rec["kind"], rec["width"], rec["height"], rec["units"]) == ("ltx2", 64, 96, 18)
    assert measured.units("ltx2", 64, 96) == 18


def test_a_layer_the_forward_does_not_compute_is_refused(ltx2, tmp_path):
    sd = dict(ltx2["2.0"][3])
    sd["transformer_blocks.0.audio_attn1.extra.weight"] = torch.zeros(64, 64)
    with pytest.raises(UnsupportedModel, match="not computed by Loadout's ltx2 forward"):
        _bound(write(tmp_path / "edited.safetensors", sd))


@pytest.mark.parametrize("version", ["2.0", "2.3"], ids=["ltx-2-19b", "ltx-2.3-22b"])
def test_the_release_layouts_bind_whole(tmp_path, version):
    """LTX-2 19B and LTX-2.3 22B as their release files hold them (header-faithful, no data: the transformer and
    the text connectors under `model.diffusion_model.`, the feature extractor's projection outside it; shapes from
    diffusers' classes at the conversion script's configs, names from its converters): every layer of the
    transformer's component is one the forward computes with."""
    from diffusers.loaders import single_file_utils as sfu
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from layouts_2026.common import assert_same, converted, meta_shapes
    from layouts_2026.video import LTX2_CONNECTORS, LTX2_TRANSFORMER, ltx2_release

    from engine.formats.safetensors import write_sparse

    transformer = meta_shapes(diffusers.LTX2VideoTransformer3DModel, **LTX2_TRANSFORMER[version])
    rows = ltx2_release(transformer, meta_shapes(LTX2TextConnectors, **LTX2_CONNECTORS[version]))
    if version == "2.0":  # diffusers' single-file converter: the transformer's, the connectors dropped
        dit = {k: s for k, s in rows.items() if k.startswith(PREFIX)}
        assert_same(converted(sfu.convert_ltx2_transformer_to_diffusers, dit), transformer)
    path = write_sparse(tmp_path / f"ltx-{version}.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    m = _bound(path).model
    assert (len(m.blocks), m.in_channels, m.audio_channels) == (48, 128, 128)
    assert (m.video.width, m.audio.width, m.video.heads, m.audio.heads) == (4096, 2048, 32, 32)
    assert (m.video.connector.heads, len(m.video.connector.blocks), m.registers) == (
        (30, 2, 128) if version == "2.0" else (32, 8, 128)
    )
    assert (m.context_dim, m.audio_context_dim, m.cross_sigma) == (
        (3840, 3840, False) if version == "2.0" else (4096, 2048, True)
    )


# Modules LTX-2's LoRA trainers target (Lightricks' ltx-trainer: the attentions' to_q / to_k / to_v / to_out.0, the
# feed-forwards if asked; musubi-tuner's LTX-2 network: every linear of the blocks, the cross-modal attentions
# included, and the adaLN linears), and the stems and modulations the release renames.
LORA_MODULES = ("transformer_blocks.0.attn1.to_q", "transformer_blocks.1.audio_attn1.to_k",
                "transformer_blocks.0.audio_to_video_attn.to_v", "transformer_blocks.1.video_to_audio_attn.to_out.0",
                "transformer_blocks.0.attn2.to_gate_logits", "transformer_blocks.1.audio_attn2.to_q",
                "transformer_blocks.0.ff.net.0.proj", "transformer_blocks.1.audio_ff.net.2", "proj_in", "audio_proj_in",
                "time_embed.linear", "audio_time_embed.emb.timestep_embedder.linear_1",
                "av_cross_attn_video_scale_shift.linear", "av_cross_attn_audio_v2a_gate.linear",
                "prompt_adaln.linear")  # fmt: skip


def _release_module(d: str) -> str:
    from layouts_2026.video import ltx2_release_key

    return ltx2_release_key(d + ".weight")[len(PREFIX) : -len(".weight")]


@pytest.mark.parametrize("naming", ["diffusers", "release"])
def test_a_lora_in_either_naming_on_the_other_file_equals_diffusers_merged(ltx2, tmp_path, naming):
    """A PEFT LoRA in diffusers' names (`transformer.time_embed.linear`: ai-toolkit, diffusers) on the release's file,
    baked; a kohya one in the release's (`lora_unet_adaln_single_linear`, `lora_unet_av_ca_…`: musubi-tuner) on
    diffusers' file, on the fly: both streams equal diffusers' model with the ΔW merged by hand."""
    from denoise_files import lora_and_merged, lora_step, plain_and_merged

    from engine.formats.safetensors import SafetensorsFile

    files, ref, conn, sd = ltx2["2.3"]
    keys = {d: f"transformer.{d}" if naming == "diffusers" else "lora_unet_" + _release_module(d).replace(".", "_")
            for d in LORA_MODULES}  # fmt: skip
    strength = 0.8
    lora, merged = lora_and_merged(sd, keys, strength, seed=11, kohya=naming == "release")
    base = files["release" if naming == "diffusers" else "diffusers"]
    x, states, mask = _inputs(_bound(files["release"]), "2.3")
    (ctx, v0, a0), (ctx, want_v, want_a) = plain_and_merged(
        ref, sd, merged, lambda: _reference(ref, conn, x, states, mask, "2.3")
    )
    assert min(rel_l2(v0, want_v), rel_l2(a0, want_a)) > 100 * TOL
    if naming == "diffusers":  # the release's file: the connectors' inputs
        given = {**x, "video_context": ctx["features"][0], "audio_context": ctx["features"][1],
                 "video_context_mask": mask, "audio_context_mask": mask}  # fmt: skip
    else:
        given = {**x, "video_context": ctx["connected"][0], "audio_context": ctx["connected"][1]}
    budget = None if naming == "diffusers" else 0.0
    r, out = lora_step(base, lora, strength, given, tmp_path, budget)
    assert r.loras and r.loras[0]["mapped"] == len(LORA_MODULES), r.loras
    audio = SafetensorsFile(tmp_path / f"out_{budget}.safetensors").tensor("audio_out")
    errs = rel_l2(out, want_v), rel_l2(audio, want_a)
    print(f"ltx2 LoRA in {naming}'s names: relative L2 video {errs[0]:.2e}, audio {errs[1]:.2e}")
    assert max(errs) <= TOL
