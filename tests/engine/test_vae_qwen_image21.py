"""Qwen-Image 2.1's VAE (engine.vae.qwen_image21: the Wan 2.2 network with 2-D convolutions) against diffusers'
AutoencoderKLQwenImage21 on the same random, well-scaled weights (a reduced-width config, float32, CPU):
decode and encode, tiled against untiled, a stopped decode, a multi-frame latent refused."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import FormatError
from engine.vae import decode, encode
from engine.vae import estimate as est
from engine.vae.loading import _build_wan
from engine.vae.run import RunInfo

diffusers = pytest.importorskip("diffusers")

SMALL = dict(base_dim=16, decoder_base_dim=24)  # the release's z 64, levels, RGBA; narrow widths


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


@pytest.fixture(scope="module")
def q21():
    ref = diffusers.AutoencoderKLQwenImage21(**SMALL)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.1 * r if n.endswith("gamma") else r * (0.5 / math.sqrt(p[0].numel())))
    ref.eval()
    return ref, _build_wan({k: v.clone() for k, v in ref.state_dict().items()}, "ref")


def _want(ref, z):
    with torch.inference_mode():
        return ref.decode(z[:, :, None]).sample[:, :, 0]  # the pipeline's image: frame 0


def test_the_config_read_from_the_weights(q21):
    _, mine = q21
    cfg = mine.cfg
    assert (cfg.z, cfg.patch, cfg.image_channels, cfg.residual, cfg.frame) == (64, 1, 4, True, True)
    assert (mine.latent_channels, mine.downscale, mine.time_factor) == (64, 16, 1)
    assert cfg.dec_dims == (192, 192, 192, 96, 48, 24)


def test_untiled_decode_equals_diffusers(q21):
    ref, mine = q21
    z = torch.randn(1, 64, 4, 6, generator=torch.Generator().manual_seed(1))
    want = _want(ref, z)  # (1, 4, 64, 96): RGBA
    info = RunInfo()
    got = decode(mine, z, tiled=False, info=info) * 2 - 1
    assert got.shape == (1, 3, 64, 96) and info.mode == "full"
    assert any("kept the first three (RGB)" in n for n in info.notes)
    rel = float((got - want[:, :3]).norm() / want[:, :3].norm())
    assert rel <= 1e-4 and psnr(got, want[:, :3]) >= 60
    # the 5-D (one-frame) latent too, through the Wan VAE's own whole pass with the alpha plane
    with torch.inference_mode():
        whole = mine.decode(z[:, :, None])[:, :, 0]
    assert psnr(whole, want) >= 60


def test_tiled_decode_is_seamless(q21):
    ref, mine = q21
    z = torch.randn(1, 64, 8, 10, generator=torch.Generator().manual_seed(2))
    full = decode(mine, z, tiled=False)
    info = RunInfo()
    tiled = decode(mine, z, tiled=True, tile=64, overlap=32, info=info)
    assert info.mode == "tiled" and info.tiles > 1
    assert psnr(tiled * 2 - 1, full * 2 - 1) >= 40


def test_encode_equals_diffusers(q21):
    ref, mine = q21
    img = torch.rand(1, 3, 64, 96, generator=torch.Generator().manual_seed(3))
    rgba = torch.cat([img, torch.ones(1, 1, 64, 96)], dim=1) * 2 - 1  # opaque alpha
    with torch.inference_mode():
        want = ref.encode(rgba[:, :, None]).latent_dist.mean[:, :, 0]
        got = mine.encode(rgba[:, :, None])[:, :, 0]
    assert got.shape == want.shape == (1, 64, 4, 6)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-4)
    # Loadout's encode takes RGB images: made opaque RGBA, as the pipeline's convert("RGBA") does
    assert torch.allclose(encode(mine, img), want, atol=1e-5, rtol=1e-4)


def test_a_multi_frame_latent_is_refused(q21):
    _, mine = q21
    with pytest.raises(FormatError, match="single images"):
        decode(mine, torch.randn(1, 64, 2, 4, 6))


def test_stop_mid_decode_raises_cancelled_and_the_next_decode_runs(q21):
    from engine.errors import Cancelled
    from engine.jobs import CancelToken

    _, mine = q21
    z = torch.randn(1, 64, 8, 10)
    token = CancelToken()
    seen = []

    def report(p):
        seen.append(p)
        if p.tile is not None:
            token.cancel("user")

    with pytest.raises(Cancelled):
        decode(mine, z, tiled=True, tile=64, overlap=32, token=token, report=report)
    assert len([p for p in seen if p.tile is not None]) == 1
    assert decode(mine, z).shape == (1, 3, 128, 160)


def test_the_estimate_knows_the_kind(q21):
    _, mine = q21
    spec = est.spec_of(mine)
    assert (spec.kind, spec.latent_channels, spec.downscale, spec.time_factor) == ("qwen_image21", 64, 16, 1)
    assert spec.video and spec.ch == 24 and spec.mid == 192
    pub = est.video_spec("qwen_image21")
    assert (pub.ch, pub.mid, pub.downscale, pub.time_factor) == (144, 1152, 16, 1)
    a = est.estimate_decode_bytes(1024, 1024, kind="qwen_image21", latent_channels=64)
    assert a > pub.weight_bytes


def test_the_decode_panels_estimate_reads_its_header(tmp_path):
    """The release layout (sparse, header only) gives the published widths and the 16x, one-frame
    figures; a reduced file's header gives its own, smaller ones."""
    from engine.formats.latent import write_latent
    from engine.formats.safetensors import write_sparse
    from engine.preflight import _vae_facts
    from engine.preflight import estimate as preflight
    from engine.requests import EstimateDecode

    paths = {}
    for name, kw in (("release", {}), ("small", SMALL)):
        with torch.device("meta"):
            ref = diffusers.AutoencoderKLQwenImage21(**kw)
        paths[name] = str(tmp_path / f"{name}.safetensors")
        write_sparse(paths[name], [(k, "BF16", tuple(v.shape)) for k, v in ref.state_dict().items()])
    assert est.video_widths(paths["release"], "qwen_image21") == (144, 1152)
    assert est.video_widths(paths["small"], "qwen_image21") == (24, 192)
    assert _vae_facts(paths["release"])[0] == "qwen_image21"
    write_latent(tmp_path / "img.latent", torch.zeros(1, 64, 64, 64))  # a 1024x1024 image
    big, small = (
        preflight(EstimateDecode(paths[n], str(tmp_path / "img.latent"))) for n in ("release", "small")
    )
    assert (big.width, big.height, big.frames) == (1024, 1024, 0)
    assert small.full_bytes < big.full_bytes and big.tiled_bytes < big.full_bytes


def test_its_latent_format_is_the_pipelines_normalisation():
    import inspect

    from engine.vae.latent_formats import LATENT_FORMATS

    fmt = LATENT_FORMATS["qwen_image21"]
    p = inspect.signature(diffusers.AutoencoderKLQwenImage21.__init__).parameters
    assert fmt.mean == tuple(p["latents_mean"].default) and fmt.std == tuple(p["latents_std"].default)
    assert (fmt.channels, fmt.downscale, fmt.time_factor) == (64, 16, 1)
    z = torch.randn(1, 64, 1, 4, 5)
    vae_space = z * torch.tensor(fmt.std).view(1, 64, 1, 1, 1) + torch.tensor(fmt.mean).view(1, 64, 1, 1, 1)
    assert torch.allclose(fmt.to_vae(z), vae_space)  # pipeline_qwenimage21: latents * std + mean


def test_the_plan_decodes_it_as_one_image_and_refuses_frames(tmp_path):
    from engine.errors import UnsupportedModel
    from engine.formats.safetensors import write_sparse
    from engine.plan import make_plan
    from tests.engine.test_plan import cpu_report

    with torch.device("meta"):
        ref = diffusers.AutoencoderKLQwenImage21(**SMALL)
    path = str(tmp_path / "q21.safetensors")
    write_sparse(path, [(k, "F32", tuple(v.shape)) for k, v in ref.state_dict().items()])
    plan = make_plan(path, decode=(1024, 1024), report=cpu_report(), free_bytes=64 << 30)
    step = plan["steps"][-1]
    assert step["step"] == "decode" and step["detail"]["frames"] == 1 and step["detail"]["latent_frames"] == 1
    with pytest.raises(UnsupportedModel, match="single images"):
        make_plan(path, decode=(1024, 1024, 5), report=cpu_report(), free_bytes=64 << 30)
