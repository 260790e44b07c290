"""Small real files for the facade tests: dense small VAEs (standalone, inside a checkpoint, TAESD),
a latent, and the header-faithful SD1 checkpoint with a kohya LoRA."""

from __future__ import annotations

from pathlib import Path


def write_small_vae(path: Path, *, prefix: str = "", seed: int = 0, ch: int = 32) -> Path:
    """The SD VAE layout at width `ch`, fp16, under `prefix` (a checkpoint's `first_stage_model.`)."""
    from vae_fixtures import small_kl

    from engine.formats.safetensors import save_tensors

    sd = small_kl(ch=ch, seed=seed).state_dict()
    return save_tensors(path, {prefix + k: v.half().contiguous() for k, v in sd.items()})


def write_files(d: Path) -> dict[str, str]:
    import torch

    from engine.catalog import demo_weights as W
    from engine.formats.latent import write_latent
    from tests.support import synth

    g = torch.Generator().manual_seed(0)
    out = {
        "vae": write_small_vae(d / "small_vae.safetensors"),
        "vae2": write_small_vae(d / "other_vae.safetensors", seed=1),
        "ckpt_vae": write_small_vae(d / "vae_ckpt.safetensors", prefix="first_stage_model."),
        "taesd": synth.write("taesd_decoder", d / "taesd_decoder.safetensors", dense=True, seed=7),
        "sd1": synth.write("sd1_checkpoint", d / "sd15.safetensors"),
        "lora": W.write_kohya_lora(d / "style.safetensors"),
    }
    lat = d / "small.latent"
    write_latent(lat, torch.randn(1, 4, 16, 16, generator=g))
    out["latent"] = lat
    return {k: str(v) for k, v in out.items()}
