"""LTX-2's audio encoder (engine.vae.ltx2_audio_encoder): its network against diffusers' LTX2AudioEncoder on the same
weights and mels, its front end (the Slaney filterbank against diffusers' MMAudio one, the resampler on a tone, the
frames a clip gives), `loadout encode --audio` on a WAV, and what it refuses."""

from __future__ import annotations

import json
import math
import wave

import numpy as np
import pytest
import torch

from engine.errors import FormatError
from engine.vae.ltx2_audio_encoder import load_encoder, log_mels, resample, slaney_mels

diffusers = pytest.importorskip("diffusers")


@pytest.fixture(scope="module")
def vae_path(tmp_path_factory):
    g = torch.Generator().manual_seed(0)
    vae = diffusers.AutoencoderKLLTX2Audio(base_channels=128, ch_mult=(1, 1, 2)).eval()
    with torch.no_grad():
        for p in vae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.7 / p[0].numel() ** 0.5)
        vae.latents_mean.normal_(generator=g)
        vae.latents_std.uniform_(0.5, 2.0, generator=g)
    folder = tmp_path_factory.mktemp("ltx2") / "audio_vae"
    vae.save_pretrained(folder)
    return vae, str(folder / "diffusion_pytorch_model.safetensors")


def test_the_encoder_matches_diffusers_and_normalises_as_comfyui(vae_path):
    vae, path = vae_path
    m = load_encoder(path)
    mel = torch.randn(1, 2, 37, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mode = vae.encode(mel).latent_dist.mode()  # [1, 8, 10, 16]
        t = mode.shape[2]
        want = (mode.transpose(1, 2).reshape(1, t, 128) - vae.latents_mean) / vae.latents_std
        want = want.reshape(1, t, 8, 16).transpose(1, 2)
        got = m(mel)
    assert got.shape == want.shape == (1, 8, 10, 16)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def test_the_front_end():
    from diffusers.models.autoencoders.autoencoder_mmaudio import mel_filterbank

    ref = mel_filterbank(16000, 1024, 64, 0.0, 8000.0)  # librosa's Slaney filterbank, as diffusers writes it
    assert (slaney_mels(16000, 1024, 64) - ref).abs().max() <= 1e-5 * ref.max()  # float32 rounding there
    tone = torch.sin(2 * math.pi * 440 * torch.arange(44100) / 44100)[None, None]
    down = resample(tone, 44100, 16000)
    assert down.shape[-1] == 16000
    want = torch.sin(2 * math.pi * 440 * torch.arange(16000) / 16000)
    assert (down[0, 0, 100:-100] - want[100:-100]).abs().max() < 2e-3  # the band-limited filter's ripple
    mels = log_mels(0.5 * want[None, None].expand(1, 2, -1), 16000, 1024, 160, 64)
    assert mels.shape == (1, 2, 101, 64)  # centred frames: 1 + 16000 / 160
    freq = (slaney_mels(16000, 1024, 64) * torch.linspace(0, 8000, 513)).sum(1) / slaney_mels(
        16000, 1024, 64
    ).sum(1)
    assert abs(freq[mels[0, 0, 50].argmax()] - 440) < 60  # the tone's bin


def _wav(path, seconds=1.0, rate=22050, channels=1):
    t = np.arange(int(seconds * rate)) / rate
    x = 0.4 * np.sin(2 * math.pi * 330 * t)
    pcm = (np.repeat(x[:, None], channels, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return path


def test_the_cli_encodes_a_wav_to_a_latent_the_decoder_reads(vae_path, tmp_path, capsys):
    from engine.cli import main
    from engine.formats.latent import audio_latent_key, read_audio_latent

    _, path = vae_path
    sound = _wav(tmp_path / "tone.wav", seconds=2.0)
    out = tmp_path / "tone.latent"
    assert (
        main(
            ["encode", "--vae", path, "--audio", str(sound), "--out", str(out), "--seconds", "1.5", "--json"]
        )
        == 0
    )
    res = json.loads(capsys.readouterr().out)
    assert res["latent_shape"] == [1, 8, 38, 16] and res["source_rate"] == 22050 and res["channels"] == 1
    assert res["audio_seconds"] == pytest.approx(1.5) and res["normalised"]
    assert audio_latent_key(out) == "latent_tensor" and read_audio_latent(out).shape == (1, 8, 38, 16)
    m = load_encoder(path)  # a mono sound feeds both channels, as ComfyUI's encode expands it
    from engine.formats.audio_in import read_audio

    x, rate = read_audio(str(sound), 1.5)
    mono = m.mels(torch.from_numpy(x)[None], rate)
    assert torch.equal(mono[:, 0], mono[:, 1])


def test_a_sound_encode_is_marked_on_the_graph(vae_path, tmp_path):
    """DecodeStarted / DecodeFinished named an encode of a sound; what it made is the latent's float32 bytes."""
    from engine.devices import DeviceOptions
    from engine.facade import Engine
    from engine.formats.latent import read_audio_latent
    from engine.requests import DetectDevices, EncodeAudio

    _, path = vae_path
    events = []
    engine = Engine(on_event=events.append)
    engine.run(DetectDevices(DeviceOptions()))
    out = tmp_path / "tone.latent"
    engine.run(EncodeAudio(path, str(_wav(tmp_path / "tone.wav", seconds=0.5)), str(out)))
    marks = [ev for ev in events if ev.kind in ("DecodeStarted", "DecodeFinished")]
    assert [(ev.kind, ev.direction, ev.media, ev.component) for ev in marks] == [
        ("DecodeStarted", "encode", "sound", "audio_vae_encoder"),
        ("DecodeFinished", "encode", "sound", "audio_vae_encoder"),
    ]
    assert marks[1].bytes_moved == read_audio_latent(out).numel() * 4 > 0
    engine.close()


def test_which_files_encode_a_sound_is_read_from_the_names(vae_path):
    """engine.detect.audio_vaes.encodes_sound (the Decode panel's choice of a VAE for a dropped sound) says yes where
    load_sound_encoder runs: LTX-2's audio VAE with its encoder, in diffusers' and the release's names, and
    MiniMax-H3's; no for a decoder alone, for MMAudio's (Kandinsky 6: not run) and for an image VAE."""
    from engine.detect.audio_vaes import encodes_sound
    from tests.support import synth

    vae, _ = vae_path
    names = list(vae.state_dict())
    assert encodes_sound(names) and encodes_sound(
        ["audio_vae." + k for k in names] + ["vocoder.conv_pre.weight"]
    )
    assert not encodes_sound([k for k in names if not k.startswith("encoder.")])
    with torch.device("meta"):
        h3 = diffusers.AutoencoderKLMiniMaxH3Audio(encoder_dim=8, latent_dim=64, latent_channels=32,
                                                   num_attention_heads=2, decoder_dim=256)  # fmt: skip
        mma = diffusers.MMAudioVAE(mel_bins=32, latent_channels=8, hidden_channels=32)
    h3_names = list(h3.state_dict())
    assert encodes_sound(h3_names) and not encodes_sound(
        [k for k in h3_names if not k.startswith("encoder.")]
    )
    assert not encodes_sound(mma.state_dict()) and not encodes_sound([r[0] for r in synth.layout("sd_vae")])


def test_what_is_refused(vae_path, tmp_path):
    from engine.formats.audio_in import read_audio
    from engine.formats.safetensors import save_tensors

    vae, _ = vae_path
    save_tensors(
        tmp_path / "dec.safetensors",
        {k: v.contiguous() for k, v in vae.state_dict().items() if not k.startswith("encoder.")},
    )
    with pytest.raises(FormatError, match="encoder is not in this file"):
        load_encoder(str(tmp_path / "dec.safetensors"))
    (tmp_path / "noise.wav").write_bytes(b"RIFF not really")
    with pytest.raises(FormatError, match="not a sound FFmpeg can read"):
        read_audio(str(tmp_path / "noise.wav"))


def test_minimax_h3_s_encoder_matches_diffusers_and_its_rows_decode(tmp_path, capsys):
    """MiniMax-H3's reference soundtrack (modular_pipelines/minimax_h3 encoders.py): stereo at 32 kHz as two mono batch
    items, the posterior's mean normalised by the config's statistics, channel-major rows; `loadout encode --audio`
    writes them as `audio_hidden_states`, which `loadout decode` reads back to a WAV."""
    from engine.cli import main
    from engine.vae.audio_loading import load_sound_encoder

    g = torch.Generator().manual_seed(4)
    stats = dict(
        latents_mean=torch.randn(32, generator=g).tolist(),
        latents_std=(0.5 + torch.rand(32, generator=g)).tolist(),
    )
    ref = diffusers.AutoencoderKLMiniMaxH3Audio(encoder_dim=8, latent_dim=64, latent_channels=32, num_attention_heads=2,
                                                decoder_dim=256, **stats).eval()  # fmt: skip
    with torch.no_grad():
        for n, p in ref.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * r if n.endswith("alpha") and p.dim() == 3 else 0.3 * r if n.endswith(("alpha", "beta")) else r * 0.5 / max(1, p[0].numel()) ** 0.5)  # fmt: skip
    ref.save_pretrained(tmp_path / "audio_vae")
    path = str(tmp_path / "audio_vae" / "diffusion_pytorch_model.safetensors")
    m = load_sound_encoder(path)
    signal = torch.randn(1, 2, 7000, generator=g) * 0.3
    with torch.no_grad():
        x = m.mels(signal, 32000)  # padded to whole 800-sample frames
        mean = ref.encode(x).latent_dist.mode().transpose(1, 2)
        want = ((mean - torch.tensor(stats["latents_mean"])) / torch.tensor(stats["latents_std"])).reshape(
            1, -1, 32
        )
        got = m(x)
    assert x.shape == (2, 1, 7200) and got.shape == want.shape == (1, 18, 32)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    sound = _wav(tmp_path / "tone.wav", seconds=0.5, rate=16000, channels=2)
    rows = tmp_path / "rows.safetensors"
    assert main(["encode", "--vae", path, "--audio", str(sound), "--out", str(rows), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["latent_shape"] == [
        1,
        40,
        32,
    ]  # 0.5 s at 40 frames a second, x 2
    assert main(["decode", "--vae", path, "--latent", str(rows), "--out", str(tmp_path / "back.wav")]) == 0
    with wave.open(str(tmp_path / "back.wav")) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 32000, 16000)
