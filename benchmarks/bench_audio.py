"""LTX-2's sound decode at the releases' widths: Loadout's audio VAE decoder and vocoder (engine.vae.audio_loading,
weights bf16 as the release stores them, cast to float32 per op) against diffusers' AutoencoderKLLTX2Audio and
LTX2Vocoder / LTX2VocoderWithBWE run in float32 on the same weights, in the same process, rounds interleaved.

Random weights (the releases' shapes: diffusers' defaults are the conversion script's configs), a latent of
`--seconds` of sound (25 latent frames a second), batch 1, on the CPU.

Lines: audio_<ltx2|ltx23>_time_vs_diffusers (the ratio of the best decode times; goal <= 1.1: the same arithmetic,
ours reading bf16 weights), with the largest sample difference from diffusers' waveform; audio_ltx2_encode_time_vs_
diffusers, the audio encoder on the same log mels.

Usage: bench_audio.py [--seconds S] [--repeat N]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _record import record  # noqa: E402

NAMES = {"upsamplers": "ups", "resnets": "resblocks", "conv_in": "conv_pre", "conv_out": "conv_post", "act_out": "act_post"}  # fmt: skip


def _release_file(version: str, folder: Path):
    """diffusers' classes at the release's config with random weights, written as the release's checkpoint
    (`audio_vae.`, `vocoder.`, bf16); returns (file, diffusers' audio VAE, vocoder), both float32."""
    import torch
    from diffusers import AutoencoderKLLTX2Audio
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder, LTX2VocoderWithBWE

    from engine.formats.safetensors import save_tensors

    g = torch.Generator().manual_seed(0)
    vae = AutoencoderKLLTX2Audio().eval()
    voc = (LTX2Vocoder() if version == "2.0" else LTX2VocoderWithBWE()).eval()
    sd = {}
    with torch.no_grad():
        for prefix, m in (("audio_vae.", vae), ("vocoder.", voc)):
            for n, p in m.named_parameters():
                scale = 0.3 if n.endswith(("alpha", "beta")) else 0.7 / p[0].numel() ** 0.5
                p.copy_((torch.randn(p.shape, generator=g) * scale).bfloat16().float())
            for n, b in m.named_buffers():
                if n.endswith("mel_basis") or n.endswith("forward_basis"):
                    b.copy_((0.05 * torch.rand(b.shape, generator=g)).bfloat16().float())
                elif n.endswith("latents_std"):
                    b.fill_(1.0)
            for k, v in m.state_dict().items():
                if prefix == "vocoder.":
                    seg = [NAMES.get(s, s) for s in k.split(".")]
                    k = ".".join(
                        [*seg[:-1], "lowpass", "filter"] if seg[-2:] == ["downsample", "filter"] else seg
                    )
                else:
                    k = k.replace("latents_mean", "per_channel_statistics.mean-of-means")
                    k = k.replace("latents_std", "per_channel_statistics.std-of-means")
                sd[prefix + k] = v.bfloat16().contiguous() if not k.endswith("filter") else v.contiguous()
    path = folder / f"ltx-{version}.safetensors"
    save_tensors(path, sd)
    return path, vae, voc


def run(version: str, seconds: float, repeat: int, folder: Path) -> None:
    import torch

    from engine.vae.audio_loading import load_audio

    path, vae, voc = _release_file(version, folder)
    ours = load_audio(str(path))
    z = torch.randn(1, 8, round(25 * seconds), 16, generator=torch.Generator().manual_seed(1))
    best = {"ours": float("inf"), "diffusers": float("inf")}
    with torch.inference_mode():
        for _ in range(repeat):
            t0 = time.perf_counter()
            a = ours(ours.latent(z))
            best["ours"] = min(best["ours"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = voc(vae.decode(z).sample)  # latents_mean 0, std 1: the same latent
            best["diffusers"] = min(best["diffusers"], time.perf_counter() - t0)
    name = "ltx2" if version == "2.0" else "ltx23"
    if version == "2.0":  # the encoder is the same in both releases: timed once
        encode(path, vae, seconds, repeat)
    record(f"audio_{name}_time_vs_diffusers", best["ours"], "s", baseline="diffusers_float32",
           baseline_value=best["diffusers"], goal=1.1, slack=0.05, seconds_of_sound=round(a.shape[-1] / ours.sample_rate, 3),
           sample_rate=ours.sample_rate, max_abs_diff=float((a - b).abs().max()))  # fmt: skip


def encode(path: Path, vae, seconds: float, repeat: int) -> None:
    """LTX-2's audio encoder on the log mels of `seconds` of noise: ours (bf16 weights cast per op) against diffusers'
    encode and the pipeline's normalisation, float32."""
    import torch

    from engine.vae.ltx2_audio_encoder import load_encoder

    ours = load_encoder(str(path))
    wave = 0.3 * torch.randn(1, 2, round(16000 * seconds), generator=torch.Generator().manual_seed(2))
    mel = ours.mels(wave, 16000)
    best = {"ours": float("inf"), "diffusers": float("inf")}
    with torch.inference_mode():
        for _ in range(repeat):
            t0 = time.perf_counter()
            a = ours(mel)
            best["ours"] = min(best["ours"], time.perf_counter() - t0)
            t0 = time.perf_counter()
            b = vae.encode(mel).latent_dist.mode()  # latents_mean 0, std 1: the same normalisation
            best["diffusers"] = min(best["diffusers"], time.perf_counter() - t0)
    record("audio_ltx2_encode_time_vs_diffusers", best["ours"], "s", baseline="diffusers_float32",
           baseline_value=best["diffusers"], goal=1.1, slack=0.05, latent_frames=a.shape[2],
           max_abs_diff=float((a - b).abs().max()))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        for version in ("2.0", "2.3"):
            run(version, args.seconds, args.repeat, Path(d))


if __name__ == "__main__":
    main()
