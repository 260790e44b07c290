"""Sound: LTX-2's audio VAE decoder and vocoders (engine.vae.audio_loading) against diffusers' AutoencoderKLLTX2Audio,
LTX2Vocoder (LTX-2.0's HiFi-GAN) and LTX2VocoderWithBWE (LTX-2.3's BigVGAN v2 and bandwidth extender) on the same
weights, in Lightricks' single-file names and diffusers' folders; MiniMax-H3's audio VAE against
AutoencoderKLMiniMaxH3Audio; `loadout decode --out X.wav` and a clip's MP4 with its sound; the release layouts."""

from __future__ import annotations

import json
import math
import wave

import pytest
import torch

from engine.errors import FormatError
from engine.formats.safetensors import save_tensors, write_sparse
from engine.vae.audio_loading import load_audio

diffusers = pytest.importorskip("diffusers")
from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE  # noqa: E402

# base 128 (the release's, so the latent statistics are its 128 values), narrower levels than its (1, 2, 4)
AUDIO = dict(base_channels=128, ch_mult=(1, 1, 2))
VOCODERS = {"2.0": lambda: LTX2Vocoder(hidden_channels=64), "2.3": lambda: LTX2VocoderWithBWE(hidden_channels=64, bwe_hidden_channels=32)}  # fmt: skip
RATES = {"2.0": 24000, "2.3": 48000}


def _randomised(m: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            small = n.endswith(("alpha", "beta", "gain"))  # log-scale Snake parameters, MMAudio's output gain
            p.copy_(0.3 * r if small else r * (0.7 / math.sqrt(p[0].numel())))
        for n, b in m.named_buffers():
            if n.endswith("latents_mean"):
                b.copy_(torch.randn(b.shape, generator=g))
            elif n.endswith("latents_std"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
            elif n.endswith("mel_basis"):
                b.copy_(0.05 * torch.rand(b.shape, generator=g))
            elif n.endswith(("forward_basis", "inverse_basis")):
                b.copy_(0.05 * torch.randn(b.shape, generator=g))
    return m.eval()


@pytest.fixture(scope="module")
def models():
    vae = _randomised(diffusers.AutoencoderKLLTX2Audio(**AUDIO), 0)
    return vae, {v: _randomised(make(), 1) for v, make in VOCODERS.items()}


def _lightricks_vocoder(sd: dict) -> dict:
    """diffusers' vocoder names as the release's (the reverse of convert_ltx2_to_diffusers' vocoder renames, written
    out per name here)."""
    names = {"upsamplers": "ups", "resnets": "resblocks", "conv_in": "conv_pre", "conv_out": "conv_post", "act_out": "act_post"}  # fmt: skip
    out = {}
    for k, v in sd.items():
        seg = [names.get(s, s) for s in k.split(".")]
        if seg[-2:] == ["downsample", "filter"]:
            seg = [*seg[:-1], "lowpass", "filter"]
        out[".".join(seg)] = v
    return out


def _single_file(vae, voc, path, drop_filters: bool = False):
    """The release's checkpoint layout: `audio_vae.` (statistics as `per_channel_statistics.*-of-means`) and
    `vocoder.`."""
    sd = {}
    for k, v in vae.state_dict().items():
        k = k.replace("latents_mean", "per_channel_statistics.mean-of-means")
        sd["audio_vae." + k.replace("latents_std", "per_channel_statistics.std-of-means")] = v
    for k, v in _lightricks_vocoder(voc.state_dict()).items():
        if not (drop_filters and k.endswith(".filter")):
            sd["vocoder." + k] = v
    save_tensors(path, {k: v.contiguous() for k, v in sd.items()})
    return path


def _reference(vae, voc, z: torch.Tensor) -> torch.Tensor:
    """diffusers' pipeline (pipeline_ltx2): denormalise the packed latent, decode the mel, run the vocoder."""
    b, c, t, f = z.shape
    packed = z.transpose(1, 2).flatten(2, 3)
    packed = packed * vae.latents_std + vae.latents_mean
    with torch.no_grad():
        return voc(vae.decode(packed.unflatten(2, (c, f)).transpose(1, 2)).sample)


def _z(t: int = 12, seed: int = 3) -> torch.Tensor:
    return torch.randn(1, 8, t, 16, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("version", ["2.0", "2.3"])
@pytest.mark.parametrize("naming", ["lightricks", "diffusers"])
def test_decode_matches_diffusers(models, version, naming, tmp_path):
    vae, vocs = models
    voc = vocs[version]
    if naming == "lightricks":  # LTX-2.3's without its anti-aliasing filters: computed as BigVGAN's
        path = _single_file(vae, voc, tmp_path / "ltx-2.safetensors", drop_filters=version == "2.3")
    else:
        vae.save_pretrained(tmp_path / "audio_vae")
        voc.save_pretrained(tmp_path / "vocoder")
        path = tmp_path / "audio_vae" / "diffusion_pytorch_model.safetensors"
    m = load_audio(str(path))
    assert m.sample_rate == RATES[version]
    z = _z()
    ref = _reference(vae, voc, z)
    with torch.no_grad():
        ours = m(m.latent(z))
        tokens = m(m.latent(z.transpose(1, 2).flatten(2, 3)))  # the denoiser's [B, T, 128] tokens
    assert ours.shape == ref.shape == (1, 2, (4 * 12 - 3) * RATES[version] // 100)
    scale = ref.abs().max()
    assert scale > 1e-3
    assert (ours - ref).abs().max() <= 1e-5 * scale
    assert torch.equal(ours, tokens)


def test_a_raw_latent_skips_the_statistics(models, tmp_path):
    vae, vocs = models
    m = load_audio(str(_single_file(vae, vocs["2.0"], tmp_path / "a.safetensors")))
    z = _z(6)
    with torch.no_grad():
        raw = m(m.latent(z, raw=True))
        ref = vocs["2.0"](vae.decode(z).sample)
    assert (raw - ref).abs().max() <= 1e-5 * ref.abs().max()


def test_the_cli_writes_a_wav(models, tmp_path, capsys):
    from engine.cli import main

    vae, vocs = models
    path = _single_file(vae, vocs["2.3"], tmp_path / "ltx-2.3.safetensors")
    z = _z(10)
    save_tensors(tmp_path / "in.safetensors", {"audio_latent": z.transpose(1, 2).flatten(2, 3).contiguous()})
    out = tmp_path / "sound.wav"
    args = [
        "decode",
        "--vae",
        str(path),
        "--latent",
        str(tmp_path / "in.safetensors"),
        "--out",
        str(out),
        "--json",
    ]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert (res["sample_rate"], res["channels"], res["vocoder"], res["normalised"]) == (48000, 2, "bwe", True)
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getsampwidth()) == (2, 48000, 2)
        frames = w.readframes(w.getnframes())
    ref = _reference(vae, vocs["2.3"], z)[0]
    pcm = torch.frombuffer(bytearray(frames), dtype=torch.int16).reshape(-1, 2).T.float() / 32767
    assert pcm.shape == ref.shape and (pcm - ref.clamp(-1, 1)).abs().max() <= 1.5 / 32767
    assert res["audio_seconds"] == pytest.approx(ref.shape[-1] / 48000, abs=1e-3)
    assert (
        main([*args[:-3], "--out", str(tmp_path / "sound.png")]) != 0
    )  # a picture of a sound: said how it decodes
    assert "holds an audio latent (audio_latent): decode it to a .wav" in capsys.readouterr().err


def test_a_sound_decode_is_marked_on_the_graph_and_a_cancel_keeps_its_component(models, tmp_path):
    """DecodeStarted / DecodeFinished (media "sound") around the decode, as an image's; a cancel inside the vocoder
    says JobCancelled, emits no DecodeFinished and leaves the audio VAE loaded and unchanged in the ledger."""
    from engine.devices import DeviceOptions
    from engine.errors import Cancelled
    from engine.facade import Engine
    from engine.jobs import CancelToken
    from engine.requests import DecodeAudio, DetectDevices

    vae, vocs = models
    path = _single_file(vae, vocs["2.0"], tmp_path / "ltx-2.safetensors")
    save_tensors(
        tmp_path / "in.safetensors", {"audio_latent": _z(6).transpose(1, 2).flatten(2, 3).contiguous()}
    )
    events = []
    engine = Engine(on_event=events.append)
    engine.events = events
    engine.run(DetectDevices(DeviceOptions()))
    res = engine.run(DecodeAudio(str(path), str(tmp_path / "in.safetensors")))
    marks = [ev for ev in engine.events if ev.kind in ("DecodeStarted", "DecodeFinished")]
    assert [(ev.kind, ev.media, ev.direction, ev.component) for ev in marks] == [
        ("DecodeStarted", "sound", "decode", "audio_vae"),
        ("DecodeFinished", "sound", "decode", "audio_vae"),
    ]
    assert marks[0].latent_shape == (1, 6, 128) and marks[0].downscale == 0
    assert marks[1].bytes_moved == len(res.samples) > 0 and marks[1].dtype == "float32"
    kinds = [ev.kind for ev in engine.events]
    assert kinds.index("Loaded") < kinds.index("DecodeStarted")
    before = engine.snapshot()
    token = CancelToken()

    def report(p):
        if p.stage == "audio decode" and p.done == 0:
            token.cancel("test")

    n = len(engine.events)
    with pytest.raises(Cancelled):
        engine.decode_audio(
            DecodeAudio(str(path), str(tmp_path / "in.safetensors")), token=token, report=report
        )
    after = [ev.kind for ev in engine.events[n:] if ev.bytes_moved or ev.kind != "Loaded"]  # (already loaded)
    assert after == ["DecodeStarted", "Cancelled"], after
    assert engine.events[-1].at == "decode"
    rows = lambda snap: [(c.path, c.name, c.device_bytes, c.full_bytes) for c in snap.components]  # noqa: E731
    assert rows(engine.snapshot()) == rows(before) and rows(before)[0][1] == "audio_vae"
    c = engine.components[(str(path), "audio_vae")]
    assert c.measured_tiers() == c.tier_bytes()
    again = engine.run(DecodeAudio(str(path), str(tmp_path / "in.safetensors")))  # still usable, same sound
    assert again.samples == res.samples
    engine.close()


def _estimate_is_the_module_s(vae: str, latent: torch.Tensor, tmp_path) -> None:
    """The Decode panel's estimate of a sound (engine.preflight, the module built on the meta device from the headers)
    is the loaded module's own figure: its weights plus its working_bytes for that latent."""
    from engine.preflight import estimate
    from engine.requests import EstimateDecode

    src = tmp_path / "sound_latent.safetensors"
    save_tensors(src, {"audio_latent": latent.contiguous()})
    est = estimate(EstimateDecode(vae, str(src)))
    m = load_audio(vae)
    weights = sum(p.numel() * p.element_size() for p in m.parameters())
    assert est.media == "sound" and est.full_bytes == est.tiled_bytes == weights + m.working_bytes(
        m.latent(latent)
    )


def test_a_sound_decode_s_estimate_is_the_module_s(models, tmp_path):
    vae, vocs = models
    for version in ("2.0", "2.3"):
        path = _single_file(vae, vocs[version], tmp_path / f"ltx-{version}.safetensors")
        _estimate_is_the_module_s(str(path), _z(40).transpose(1, 2).flatten(2, 3), tmp_path)


def test_what_is_missing_is_said(models, tmp_path):
    vae, vocs = models
    sd = {"audio_vae." + k: v.contiguous() for k, v in vae.state_dict().items()}
    save_tensors(tmp_path / "no_vocoder.safetensors", sd)
    with pytest.raises(FormatError, match="no vocoder.*--vocoder"):
        load_audio(str(tmp_path / "no_vocoder.safetensors"))
    vocs["2.0"].save_pretrained(tmp_path / "v")
    m = load_audio(
        str(tmp_path / "no_vocoder.safetensors"), str(tmp_path / "v" / "diffusion_pytorch_model.safetensors")
    )
    assert m.sample_rate == 24000
    save_tensors(tmp_path / "image_vae.safetensors", {"decoder.conv_in.weight": torch.zeros(4, 4, 3, 3)})
    with pytest.raises(FormatError, match="holds no audio VAE Loadout decodes"):
        load_audio(str(tmp_path / "image_vae.safetensors"))
    bwe = _lightricks_vocoder(vocs["2.3"].state_dict())
    sd.update({"vocoder." + k: v.contiguous() for k, v in bwe.items() if "mel_basis" not in k})
    save_tensors(tmp_path / "no_mels.safetensors", sd)
    with pytest.raises(FormatError, match="mel basis"):
        load_audio(str(tmp_path / "no_mels.safetensors"))


def _release_rows(version: str) -> dict:
    """LTX-2's audio VAE and vocoder as the release's checkpoint holds them: shapes of diffusers' classes at the
    releases' configs (their defaults: diffusers convert_ltx2_to_diffusers), the release's names."""
    with torch.device("meta"):
        vae = diffusers.AutoencoderKLLTX2Audio()
        voc = LTX2Vocoder() if version == "2.0" else LTX2VocoderWithBWE()
    rows = {}
    for k, v in vae.state_dict().items():
        k = k.replace("latents_mean", "per_channel_statistics.mean-of-means")
        rows["audio_vae." + k.replace("latents_std", "per_channel_statistics.std-of-means")] = tuple(v.shape)
    rows.update({"vocoder." + k: tuple(v.shape) for k, v in _lightricks_vocoder(voc.state_dict()).items()})
    return rows


@pytest.mark.parametrize("version", ["2.0", "2.3"])
def test_the_release_layouts_are_detected_and_decode(version, tmp_path):
    """Header-faithful: alone, the sound decoders are an LTX-2 VAE file; beside the transformer (the release's
    checkpoint) their bytes are "other", with their evidence. The sparse file builds the release's modules and runs."""
    from layouts_2026.common import meta_shapes
    from layouts_2026.video import LTX2_CONNECTORS, LTX2_TRANSFORMER, ltx2_release

    from engine.detect import detect_file

    audio = _release_rows(version)
    alone = write_sparse(tmp_path / "audio.safetensors", [(k, "BF16", s) for k, s in audio.items()])
    d = detect_file(str(alone))
    assert (d.kind, d.architecture) == ("vae", "ltx2")
    reasons = " ".join(e.reason for e in d.evidence)
    assert (
        "LTX-2's audio VAE" in reasons
        and ("LTX-2.0's HiFi-GAN" if version == "2.0" else "LTX-2.3's BigVGAN") in reasons
    )
    m = load_audio(str(alone))
    cfg = m.audio_vae.decoder.cfg
    assert (cfg.z, cfg.top, cfg.ups, cfg.norm, cfg.out_ch) == (8, 512, 2, "pixel", 2)
    assert m.sample_rate == RATES[version]
    with torch.no_grad():
        wav = m(m.latent(torch.zeros(1, 8, 2, 16)))
    assert wav.shape == (1, 2, 5 * RATES[version] // 100)
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    transformer = meta_shapes(diffusers.LTX2VideoTransformer3DModel, **LTX2_TRANSFORMER[version])
    rows = {**ltx2_release(transformer, meta_shapes(LTX2TextConnectors, **LTX2_CONNECTORS[version])), **audio}
    ckpt = write_sparse(tmp_path / "ckpt.safetensors", [(k, "BF16", s) for k, s in rows.items()])
    d = detect_file(str(ckpt))
    assert (d.kind, d.architecture) == ("checkpoint", "ltx2")
    assert d.components["other"].tensors >= len(audio)
    assert any("vocoder" in e.reason for e in d.evidence)
    # `loadout plan --decode WxHxF` of the checkpoint: the clip's sound (121 frames at 24 fps: 5.04 s, 126 latent
    # frames as diffusers' LTX2Pipeline counts them) at the module's own estimate, from the header alone
    from engine.devices import DeviceOptions, HardwareFacts, build_report
    from engine.plan import make_plan

    report = build_report(HardwareFacts(platform="linux", ram_total=64 << 30), DeviceOptions())
    plan = make_plan(str(ckpt), decode=(768, 512, 121), report=report, free_bytes=64 << 30)
    (sound,) = [st for st in plan["steps"] if st["step"] == "sound"]
    det = sound["detail"]
    assert (det["seconds"], det["latent_frames"], det["sample_rate"]) == (5.042, 126, RATES[version])
    assert det["working_bytes"] == m.working_bytes(torch.zeros(1, 8, 126, 16)) > 0
    params = sum(p.numel() for p in m.parameters())
    size = {"float32": 4, "bfloat16": 2}[det["storage_dtype"]]  # the placement's, on this CPU
    assert det["weights_bytes"] == params * size
    assert sound["peak_bytes"] == det["weights_bytes"] + det["working_bytes"] and plan["fits"]
    assert not [
        st for st in make_plan(str(ckpt), decode=(768, 512), report=report)["steps"] if st["step"] == "sound"
    ]


def test_a_clip_with_its_sound_in_one_mp4(models, tmp_path, capsys):
    """The release's checkpoint layout (video VAE under `vae.`, audio VAE, vocoder, Lightricks' metadata): `loadout
    decode --latent VIDEO --audio-latent AUDIO --out clip.mp4` writes the frames and an AAC track of the sound."""
    import av
    from safetensors.torch import save_file

    from engine.cli import main
    from engine.formats.latent import write_latent
    from tests.engine.test_vae_ltx import _reference as video_reference
    from tests.engine.test_vae_ltx23 import LTX23, META, _lightricks

    vae, vocs = models
    video = video_reference(LTX23, cls=diffusers.AutoencoderKLLTX2Video)
    _single_file(vae, vocs["2.3"], tmp_path / "audio.safetensors")
    from safetensors.torch import load_file

    sd = load_file(tmp_path / "audio.safetensors")
    sd.update(_lightricks({k: v.contiguous() for k, v in video.state_dict().items()}))  # its keys: `vae.*`
    save_file(sd, tmp_path / "ltx-2.3.safetensors", {"config": json.dumps(META)})
    write_latent(
        tmp_path / "v.latent", torch.randn(1, 16, 2, 2, 2, generator=torch.Generator().manual_seed(5))
    )
    save_tensors(
        tmp_path / "a.safetensors", {"audio_latent": _z(8).transpose(1, 2).flatten(2, 3).contiguous()}
    )
    out = tmp_path / "clip.mp4"
    args = ["decode", "--vae", str(tmp_path / "ltx-2.3.safetensors"), "--latent", str(tmp_path / "v.latent"),
            "--audio-latent", str(tmp_path / "a.safetensors"), "--out", str(out), "--json"]  # fmt: skip
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 9 and res["sample_rate"] == 48000 and res["audio_seconds"] == pytest.approx(0.29)
    with av.open(str(out)) as box:
        kinds = {s.type: s for s in box.streams}
        assert kinds["audio"].codec_context.name == "aac" and kinds["audio"].rate == 48000
        assert kinds["audio"].codec_context.channels == 2
        got = sum(f.samples for f in box.decode(audio=0))
    assert abs(got - 0.29 * 48000) <= 2048  # the AAC encoder's priming and last frame
    assert main([*args[:-3], "--out", str(tmp_path / "clip.webp")]) != 0
    assert "goes to a .mp4" in capsys.readouterr().err


# MiniMax-H3's audio VAE (diffusers' AutoencoderKLMiniMaxH3Audio at narrow widths: the release's 7 upsamplers)
H3 = dict(encoder_dim=8, latent_dim=64, latent_channels=32, num_attention_heads=2, decoder_dim=256)


@pytest.fixture(scope="module")
def h3(tmp_path_factory):
    g = torch.Generator().manual_seed(7)
    stats = dict(
        latents_mean=torch.randn(32, generator=g).tolist(),
        latents_std=(0.5 + torch.rand(32, generator=g)).tolist(),
    )
    m = _randomised(diffusers.AutoencoderKLMiniMaxH3Audio(**H3, **stats), 8)
    folder = tmp_path_factory.mktemp("h3") / "audio_vae"
    m.save_pretrained(folder)
    return m, folder / "diffusion_pytorch_model.safetensors"


def test_minimax_h3_s_audio_vae_matches_diffusers(h3, tmp_path):
    """The pipeline's decode (modular_pipelines/minimax_h3/decoders.py): channel-major stereo rows -> [2, 32, T],
    un-normalised with the config's statistics, decoded as a batch of two mono waveforms, then stereo."""
    import shutil

    ref, path = h3
    m = load_audio(str(path))
    assert (m.sample_rate, m.describe(), m.notes) == (32000, "bigvgan", [])
    rows = torch.randn(1, 2 * 5, 32, generator=torch.Generator().manual_seed(9))
    lat = rows[0].reshape(2, 5, 32).transpose(1, 2)
    mean, std = (torch.tensor(ref.config[k]).view(1, -1, 1) for k in ("latents_mean", "latents_std"))
    with torch.no_grad():
        want = ref.decode(lat * std + mean).sample.permute(1, 0, 2)
        got = m(m.latent(rows))
        raw = m(m.latent(lat * std + mean, raw=True))
    assert got.shape == want.shape == (1, 2, 5 * 800)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert (raw - want).abs().max() <= 1e-5 * want.abs().max()
    _estimate_is_the_module_s(str(path), rows, tmp_path)
    shutil.copy(path, tmp_path / "alone.safetensors")  # no config.json beside: no statistics, and it says so
    assert "no latents_mean" in load_audio(str(tmp_path / "alone.safetensors")).notes[0]
    with pytest.raises(FormatError, match="2 channels"):
        m.latent(torch.zeros(1, 5, 32))


def test_minimax_h3_s_rows_from_a_step_inputs_file_to_a_wav(h3, tmp_path, capsys):
    from engine.cli import main

    _, path = h3
    rows = torch.randn(1, 2 * 4, 32, generator=torch.Generator().manual_seed(2))
    save_tensors(
        tmp_path / "in.safetensors", {"audio_hidden_states": rows, "hidden_states": torch.zeros(1, 4, 96)}
    )
    out = tmp_path / "h3.wav"
    assert (
        main(["decode", "--vae", str(path), "--latent", str(tmp_path / "in.safetensors"), "--out", str(out)])
        == 0
    )
    assert "0.10 s of stereo at 32000 Hz" in capsys.readouterr().out
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 32000, 3200)


# Kandinsky 6's MMAudio mel VAE and BigVGAN vocoder (diffusers' classes at narrow widths, the release's levels and rates)
MMA = dict(mel_bins=32, latent_channels=8, hidden_channels=32, channel_multipliers=(1, 2, 4))


def test_kandinsky6_s_mmaudio_matches_diffusers(tmp_path):
    """The pipeline's decode (pipeline_kandinsky6_ti2va): the transformer's audio tokens [B, T, C] transposed, divided
    by the VAE's scaling factor, decoded to mels, through the vocoder: 44.1 kHz mono."""
    vae = _randomised(diffusers.MMAudioVAE(**MMA), 11)
    with torch.no_grad():
        vae.vae.data_mean.normal_(generator=torch.Generator().manual_seed(1))
        vae.vae.data_std.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(2))
    voc = _randomised(diffusers.MMAudioVocoder(num_mels=32, upsample_initial_channel=128), 12)
    vae.save_pretrained(tmp_path / "audio_vae")
    voc.save_pretrained(tmp_path / "vocoder")
    m = load_audio(str(tmp_path / "audio_vae" / "diffusion_pytorch_model.safetensors"))
    assert (m.sample_rate, m.describe()) == (44100, "bigvgan")
    tokens = torch.randn(1, 7, 8, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = voc(vae.decode(tokens.transpose(1, 2) / vae.config.scaling_factor).sample).sample
        got = m(m.latent(tokens))
    assert got.shape == want.shape == (1, 1, 7 * 1024)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    from engine.detect import detect_file

    for part, what in (("audio_vae", "MMAudio's"), ("vocoder", "BigVGAN v2 vocoder")):
        d = detect_file(str(tmp_path / part / "diffusion_pytorch_model.safetensors"))
        assert d.kind == "vae" and any(what in e.reason for e in d.evidence)
    _estimate_is_the_module_s(
        str(tmp_path / "audio_vae" / "diffusion_pytorch_model.safetensors"), tokens, tmp_path
    )
    alone = tmp_path / "elsewhere" / "audio_vae" / "a.safetensors"  # no vocoder/ beside its folder
    alone.parent.mkdir(parents=True)
    alone.write_bytes((tmp_path / "audio_vae" / "diffusion_pytorch_model.safetensors").read_bytes())
    with pytest.raises(FormatError, match="without its vocoder"):
        load_audio(str(alone))


def test_kandinsky6_s_release_layout_is_detected():
    from layouts_2026.common import detect

    with torch.device("meta"):
        vae, voc = diffusers.MMAudioVAE(), diffusers.MMAudioVocoder()
    for m, what in ((vae, "Kandinsky 6's audio VAE"), (voc, "Kandinsky 6's")):
        d = detect({k: tuple(v.shape) for k, v in m.state_dict().items()})
        assert (d.kind, d.architecture) == ("vae", "kandinsky6") and any(what in e.reason for e in d.evidence)
