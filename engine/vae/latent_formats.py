"""Latent spaces per architecture: channels, spatial factor, and the scale/shift that map the VAE's
own latents to the diffusion model's (model = (vae - shift) * scale).

Decode and encode work in VAE space, as ComfyUI's `.latent` files do; these factors apply only where
latents enter or leave a diffusion model, and to the TAESD family, which is trained on model-space
latents. Values as published with each model (and as ComfyUI's latent_formats.py records them):
SD1/SD2 0.18215 (LDM configs `scale_factor`), SDXL 0.13025 (SDXL VAE config), SD3 1.5305 / 0.0609,
FLUX.1 0.3611 / 0.1159 (BFL's AutoEncoderParams). FLUX.2 normalises latents with a batch-norm over
2x2-patchified 128 channels instead of one scalar; its 32-channel VAE space is what TAEF2 works in.
Torch-free, so the GUI thread may import it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LatentFormat:
    name: str
    channels: int
    scale: float
    shift: float = 0.0
    downscale: int = 8

    def to_model(self, latent):
        """VAE space -> the diffusion model's space."""
        return (latent - self.shift) * self.scale

    def to_vae(self, latent):
        """The diffusion model's space -> VAE space."""
        return latent / self.scale + self.shift

    def to_json(self) -> dict:
        return {"name": self.name, "channels": self.channels, "scale": self.scale, "shift": self.shift}


LATENT_FORMATS: dict[str, LatentFormat] = {
    "sd1": LatentFormat("sd1", 4, 0.18215),
    "sd2": LatentFormat("sd2", 4, 0.18215),
    "sdxl": LatentFormat("sdxl", 4, 0.13025),
    "sd3": LatentFormat("sd3", 16, 1.5305, 0.0609),
    "flux1": LatentFormat("flux1", 16, 0.3611, 0.1159),
    # FLUX.2: per-channel batch-norm statistics of the patchified latent live in the VAE file
    # (`bn.running_mean/var`); scalar scale 1 / shift 0 in VAE space.
    "flux2": LatentFormat("flux2", 32, 1.0, 0.0),
}

# The architecture a VAE most likely belongs to, from its latent channels alone (4-channel VAEs of SD1
# and SDXL have identical layouts; the caller may know better from the checkpoint).
DEFAULT_FOR_CHANNELS = {4: "sd1", 16: "flux1", 32: "flux2"}

# TAESD-family names -> the latent format they decode.
TAESD_FORMATS = {"taesd": "sd1", "taesdxl": "sdxl", "taesd3": "sd3", "taef1": "flux1", "taef2": "flux2"}
