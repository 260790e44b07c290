"""Latent spaces per architecture: channels, spatial factor, and the scale/shift that map the VAE's
own latents to the diffusion model's (model = (vae - shift) * scale).

Decode and encode work in VAE space, as ComfyUI's `.latent` files do; these factors apply only where
latents enter or leave a diffusion model, and to the TAESD family, which is trained on model-space
latents. Values as published with each model (and as ComfyUI's latent_formats.py records them):
SD1/SD2 0.18215 (LDM configs `scale_factor`), SDXL 0.13025 (SDXL VAE config), SD3 1.5305 / 0.0609,
FLUX.1 0.3611 / 0.1159 (BFL's AutoEncoderParams). FLUX.2 normalises latents with a batch-norm over
2x2-patchified 128 channels instead of one scalar; its 32-channel VAE space is what TAEF2 works in.
The Wan-family video VAEs (and Qwen-Image's) normalise per channel with a published mean and std, as does
Mochi 1 (diffusers AutoencoderKLMochi's `latents_mean` / `latents_std`; 12 channels, 8x, 6x in time).
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
    # per-channel statistics where the family defines them (the Wan VAEs): model = (vae - mean) / std
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    time_factor: int = 1  # output frames per latent frame after the first (4 for the video VAEs)

    def _stats(self, latent):
        import torch

        shape = (1, self.channels) + (1,) * (latent.dim() - 2)
        mean = torch.tensor(self.mean, dtype=latent.dtype, device=latent.device).view(shape)
        std = torch.tensor(self.std, dtype=latent.dtype, device=latent.device).view(shape)
        return mean, std

    def to_model(self, latent):
        """VAE space -> the diffusion model's space."""
        if self.mean:
            mean, std = self._stats(latent)
            return (latent - mean) / std
        return (latent - self.shift) * self.scale

    def to_vae(self, latent):
        """The diffusion model's space -> VAE space."""
        if self.mean:
            mean, std = self._stats(latent)
            return latent * std + mean
        return latent / self.scale + self.shift

    def to_json(self) -> dict:
        out = {"name": self.name, "channels": self.channels, "scale": self.scale, "shift": self.shift}
        if self.mean:
            out.update(mean=list(self.mean), std=list(self.std), downscale=self.downscale,
                       time_factor=self.time_factor)  # fmt: skip
        return out


# Wan 2.1 VAE (also Qwen-Image's: its diffusers config repeats these values): Wan-Video/Wan2.1
# wan/modules/vae.py WanVAE mean/std, diffusers AutoencoderKLWan's latents_mean/latents_std defaults.
WAN21_MEAN = (-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
              0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921)  # fmt: skip
WAN21_STD = (2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
             3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160)  # fmt: skip
# Wan 2.2 TI2V-5B's 48-channel VAE: Wan2.2 wan/modules/vae2_2.py Wan2_2_VAE mean/std (the same values
# as Wan-AI/Wan2.2-TI2V-5B-Diffusers vae/config.json).
WAN22_MEAN = (
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
    0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
    -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
    -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
)  # fmt: skip
WAN22_STD = (
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
    0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
    0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
    0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
)  # fmt: skip

# Qwen-Image 2.1's 64-channel VAE: diffusers AutoencoderKLQwenImage21's latents_mean / latents_std defaults
# (its pipeline decodes latents * std + mean); 16x, one frame.
QWEN21_MEAN = (
    0.5126, 0.7721, -0.0631, 1.3506, -0.7855, -2.1025, -0.3458, 1.3722, 1.8873, -1.7177, -0.651, 0.2732,
    0.7562, -0.6163, -1.0277, 3.8363, 2.021, 0.0472, 0.932, 2.0087, 2.4954, -0.1391, -1.4249, 1.8464,
    -0.5236, 1.2826, 3.7046, -1.3035, 2.7286, -1.4518, -1.9036, -1.9955, -0.0342, -1.0265, -0.7636, 3.0555,
    0.0746, -3.0751, -0.1076, 1.7376, -1.0914, -1.9435, -0.2784, -1.368, 0.4809, -0.4433, 0.3764, 0.5729,
    -2.0595, 1.096, -1.326, -2.0211, -5.0179, 0.5275, 4.0162, 1.8505, 0.3026, 1.9373, 1.4937, 0.2632,
    0.5547, -1.7121, -0.1562, 0.0304,
)  # fmt: skip
QWEN21_STD = (
    3.2001, 3.2936, 3.4321, 3.0091, 3.1061, 4.0379, 4.0705, 3.791, 3.0785, 3.65, 3.9308, 3.0904,
    2.8778, 3.7675, 3.732, 5.0756, 3.2864, 4.0397, 3.1317, 4.0443, 2.9249, 3.9454, 3.0988, 4.2489,
    3.4896, 3.8513, 3.9323, 3.4719, 3.7498, 4.283, 3.5694, 4.2467, 3.9037, 3.2947, 5.077, 3.5075,
    3.27, 3.4767, 2.8063, 5.1125, 3.5327, 4.7833, 3.1286, 4.1819, 3.8527, 3.8312, 3.5605, 4.3875,
    3.9624, 4.0168, 3.5643, 4.055, 5.5614, 4.2963, 4.408, 3.4959, 3.8747, 3.7608, 3.5735, 3.149,
    3.7662, 3.6746, 3.4563, 3.8161,
)  # fmt: skip


# Mochi 1 (diffusers AutoencoderKLMochi's config `latents_mean` / `latents_std`)
MOCHI_MEAN = (
    -0.06730895953510081, -0.038011381506090416, -0.07477820912866141, -0.05565264470995561, 0.012767231469026969,
    -0.04703542746246419, 0.043896967884726704, -0.09346305707025976, -0.09918314763016893, -0.008729793427399178,
    -0.011931556316503654, -0.0321993391887285,
)  # fmt: skip
MOCHI_STD = (
    0.9263795028493863, 0.9248894543193766, 0.9393059390890617, 0.959253732819592, 0.8244560132752793,
    0.917259975397747, 0.9294154431013696, 1.3720942357788521, 0.881393668867029, 0.9168315692124348,
    0.9185249279345552, 0.9274757570805041,
)  # fmt: skip


LATENT_FORMATS: dict[str, LatentFormat] = {
    "sd1": LatentFormat("sd1", 4, 0.18215),
    "sd2": LatentFormat("sd2", 4, 0.18215),
    "sdxl": LatentFormat("sdxl", 4, 0.13025),
    "sd3": LatentFormat("sd3", 16, 1.5305, 0.0609),
    "flux1": LatentFormat("flux1", 16, 0.3611, 0.1159),
    # FLUX.2: per-channel batch-norm statistics of the patchified latent live in the VAE file
    # (`bn.running_mean/var`); scalar scale 1 / shift 0 in VAE space.
    "flux2": LatentFormat("flux2", 32, 1.0, 0.0),
    # video latents [B, C, T, h, w] (a still image: T = 1)
    "wan21": LatentFormat("wan21", 16, 1.0, 0.0, 8, WAN21_MEAN, WAN21_STD, 4),
    "qwen_image": LatentFormat("qwen_image", 16, 1.0, 0.0, 8, WAN21_MEAN, WAN21_STD, 4),
    "wan22": LatentFormat("wan22", 48, 1.0, 0.0, 16, WAN22_MEAN, WAN22_STD, 4),
    "qwen_image21": LatentFormat("qwen_image21", 64, 1.0, 0.0, 16, QWEN21_MEAN, QWEN21_STD, 1),
    # diffusers Kandinsky6SRVAE: scaling_factor 0.910344004631042 (its pipeline divides by it before decoding)
    "kandinsky6_sr": LatentFormat("kandinsky6_sr", 64, 0.910344004631042, 0.0, 16, time_factor=4),
    # HunyuanVideo (also Kandinsky 5's and SkyReels-V1's VAE): one scalar, diffusers AutoencoderKLHunyuanVideo's
    # scaling_factor 0.476986 (its pipeline multiplies and divides by it alone)
    "hunyuan_video": LatentFormat("hunyuan_video", 16, 0.476986, 0.0, 8, time_factor=4),
    # HunyuanVideo 1.5: diffusers AutoencoderKLHunyuanVideo15's scaling_factor 1.03682
    "hunyuan_video15": LatentFormat("hunyuan_video15", 32, 1.03682, 0.0, 16, time_factor=4),
}
# LTX-Video: 128 channels, 32x, 8x in time; its per-channel mean / std are in each file
# (`per_channel_statistics.mean-of-means` / `std-of-means`, diffusers `latents_mean` / `latents_std`; the
# loaded VAE's `latent_stats`), not one published table, and its scaling_factor is 1.0
LATENT_FORMATS["ltxv"] = LatentFormat("ltxv", 128, 1.0, 0.0, 32, (), (), 8)
LATENT_FORMATS["ltx2"] = LatentFormat("ltx2", 128, 1.0, 0.0, 32, (), (), 8)  # LTX-2's video VAE, alike
LATENT_FORMATS["mochi"] = LatentFormat("mochi", 12, 1.0, 0.0, 8, MOCHI_MEAN, MOCHI_STD, 6)

# The architecture a VAE most likely belongs to, from its latent channels alone (4-channel VAEs of SD1
# and SDXL have identical layouts; the caller may know better from the checkpoint).
DEFAULT_FOR_CHANNELS = {4: "sd1", 16: "flux1", 32: "flux2"}

# TAESD-family names -> the latent format they decode.
TAESD_FORMATS = {"taesd": "sd1", "taesdxl": "sdxl", "taesd3": "sd3", "taef1": "flux1", "taef2": "flux2"}
