"""The HunyuanVideo 1.5 VAE (engine.vae.hunyuan_video15) against diffusers' AutoencoderKLHunyuanVideo15 on the
same weights; chunked exactly (every op per position or causal) and tiled; strict loading; the released layout
read from a header-faithful file."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import FormatError
from engine.events import Tiling
from engine.vae import decode
from engine.vae.loading import load_vae
from engine.vae.run import RunInfo
from engine.vae.video import decode_video

diffusers = pytest.importorskip("diffusers")

# 4 blocks: 8x space (the third block doubles space only), 4x time
SMALL = dict(
    latent_channels=4, block_out_channels=(8, 8, 16, 16), layers_per_block=1, spatial_compression_ratio=8
)


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


@pytest.fixture(scope="module")
def hv15(tmp_path_factory):
    from safetensors.torch import save_file

    ref = diffusers.AutoencoderKLHunyuanVideo15(**SMALL).eval()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, v in ref.state_dict().items():
        r = torch.randn(v.shape, generator=g)
        sd[k] = 1 + 0.1 * r if k.endswith("gamma") else r * (0.5 / math.sqrt(v[0].numel()))
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("hv15") / "hunyuanvideo15_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def test_the_decode_equals_diffusers(hv15):
    ref, path, _ = hv15
    vae = load_vae(path)
    assert (vae.latent_channels, vae.downscale, vae.time_factor) == (4, 8, 4)
    assert [u if u is None else u[1] for u in vae.cfg.ups] == [True, True, False, None]
    z = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = vae.decode(z)  # one latent frame at a time
        want = ref.decode(z).sample.clamp(-1, 1)
    assert got.shape == want.shape == (1, 3, 9, 32, 48)
    assert (got - want).abs().max() < 2e-5  # 1e-6 measured


def test_chunks_are_exact_and_tiles_close(hv15):
    _, path, _ = hv15
    vae = load_vae(path)
    z = torch.randn(1, 4, 3, 4, 6, generator=torch.Generator().manual_seed(2))
    cpu = torch.device("cpu")
    with torch.inference_mode():
        whole = decode_video(vae, z, Tiling("full", tile_frames=3), device=cpu, dtype=torch.float32)
        one = decode_video(vae, z, Tiling("full", tile_frames=1), device=cpu, dtype=torch.float32)
        two = decode_video(vae, z, Tiling("full", tile_frames=2), device=cpu, dtype=torch.float32)
    assert (one - whole).abs().max() < 1e-5 and (two - whole).abs().max() < 1e-5
    info = RunInfo()
    tiled = decode(vae, z, tiled=True, tile=32, overlap=16, info=info) * 2 - 1
    assert info.mode == "tiled" and info.tiles > 1
    print(f"tiled vs whole: {psnr(tiled, whole.clamp(-1, 1)):.1f} dB")
    assert psnr(tiled, whole.clamp(-1, 1)) >= 35


def test_a_missing_or_misshapen_key_is_named(hv15, tmp_path):
    from safetensors.torch import save_file

    _, _, sd = hv15
    dec = {k: v for k, v in sd.items() if not k.startswith("encoder.")}
    broken = dict(dec)
    broken.pop("decoder.up_blocks.2.resnets.0.norm2.gamma")
    save_file(broken, tmp_path / "missing.safetensors")
    with pytest.raises(FormatError, match=r"missing .*up_blocks\.2\.resnets\.0\.norm2\.gamma"):
        load_vae(tmp_path / "missing.safetensors")
    bad = dict(dec)
    bad["decoder.mid_block.attentions.0.proj_out.weight"] = torch.zeros(16, 16, 1, 1)
    save_file(bad, tmp_path / "shape.safetensors")
    with pytest.raises(FormatError, match=r"wrong shape .*attentions\.0\.proj_out\.weight"):
        load_vae(tmp_path / "shape.safetensors")


def test_the_released_layout_reads_its_config_from_a_header_faithful_file(tmp_path):
    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse
    from engine.vae.estimate import spec_of
    from engine.vae.latent_formats import LATENT_FORMATS
    from tests.engine.layouts_2026.common import meta_shapes

    rows = [(k, "BF16", s) for k, s in meta_shapes(diffusers.AutoencoderKLHunyuanVideo15).items()]
    path = write_sparse(tmp_path / "hunyuanvideo15_vae.safetensors", rows)
    assert detect_file(path).architecture == "hunyuan_video15"
    vae = load_vae(path)
    c = vae.cfg
    assert (c.z, c.widths, c.layers) == (32, (1024, 1024, 512, 256, 128), 3)
    assert c.ups == ((1024, True), (512, True), (256, False), (128, False), None)
    assert (vae.downscale, vae.time_factor) == (16, 4)
    spec = spec_of(vae)
    assert spec.kind == "hunyuan_video15" and spec.video and (spec.ch, spec.mid) == (128, 1024)
    fmt = LATENT_FORMATS["hunyuan_video15"]
    assert (fmt.channels, fmt.scale, fmt.downscale) == (32, 1.03682, 16)
