"""The HunyuanVideo VAE (engine.vae.hunyuan_video) against diffusers' AutoencoderKLHunyuanVideo on the same
weights: whole, chunked and tiled; strict loading; the released layout read from a header-faithful file; the
command line (HunyuanVideo 1.5's VAE: test_vae_hunyuan_video15)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine.errors import FormatError
from engine.events import Tiling
from engine.vae import decode
from engine.vae.causal_conv import Stream
from engine.vae.loading import load_vae
from engine.vae.run import RunInfo
from engine.vae.video import Counters, Snapshots, decode_video

diffusers = pytest.importorskip("diffusers")

# 3 blocks (4x space, 4x time), 32 channels: the release's 32 groups divide them
SMALL = dict(latent_channels=4, block_out_channels=(32, 32, 64), layers_per_block=1, spatial_compression_ratio=4,
             down_block_types=("HunyuanVideoDownBlock3D",) * 3, up_block_types=("HunyuanVideoUpBlock3D",) * 3)  # fmt: skip


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


@pytest.fixture(scope="module")
def hv(tmp_path_factory):
    """A reduced HunyuanVideo VAE with random weights in diffusers' naming (the Tencent release's too), and
    diffusers' model on them."""
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLHunyuanVideo(**SMALL).eval()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, v in ref.state_dict().items():
        r = torch.randn(v.shape, generator=g)
        sd[k] = 1 + 0.1 * r if "norm" in k and k.endswith("weight") else r * (0.5 / math.sqrt(v[0].numel()))
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("hv") / "hunyuan_video_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def _reference(ref, z):
    with torch.inference_mode():
        return ref.decode(z).sample.clamp(-1, 1)


def test_the_whole_decode_equals_diffusers(hv):
    ref, path, _ = hv
    vae = load_vae(path)
    assert (vae.latent_channels, vae.downscale, vae.time_factor) == (4, 4, 4)
    z = torch.randn(1, 4, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        got = vae.decode(z)
    want = _reference(ref, z)
    assert got.shape == want.shape == (1, 3, 9, 32, 32)
    assert (got - want).abs().max() < 1e-4 and psnr(got, want) >= 80  # float32 rounding: 3e-5, 105 dB


class _Given(torch.nn.Module):
    """A norm that returns the given normalised frames."""

    def __init__(self, out: torch.Tensor):
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out


def test_the_middle_blocks_attention_is_causal_over_frames_and_chunks_carry_it(hv):
    """Each frame's tokens see their own frame's and earlier ones: chunk by chunk (the keys and values of
    earlier chunks in the stream, a chunk's queries never seeing later frames) equals the whole where the
    GroupNorm's statistics are the same (one frame a chunk against frames normalised one by one)."""
    _, path, _ = hv
    vae = load_vae(path)
    attn = vae.decoder.mid_block.attentions[0]
    x = torch.randn(1, 64, 3, 4, 4, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        s = Stream()
        chunked = torch.cat([attn.step(x[:, :, i : i + 1], s) for i in range(3)], dim=2)
        # the keys and values are one tensor, as video.Snapshots copies a stream's entries
        assert Snapshots(torch.device("cpu"), "host", Counters()).take(s).frames[id(attn)].shape[0] == 2
        gn = attn.group_norm
        per_frame = torch.cat([gn(x[:, :, i : i + 1]) for i in range(3)], dim=2)
        attn.group_norm = _Given(per_frame)
        try:
            want = attn.step(x, Stream())
        finally:
            attn.group_norm = gn
    assert (chunked - want).abs().max() < 1e-5


def test_chunked_and_tiled_decodes_come_close_to_the_whole(hv):
    """The GroupNorms' statistics are each chunk's (or tile's): near the whole pass, not equal to it (as
    diffusers' own temporal tiles of 5 latent frames, and its spatial tiles, are near its whole pass)."""
    _, path, _ = hv
    vae = load_vae(path)
    z = torch.randn(1, 4, 3, 8, 12, generator=torch.Generator().manual_seed(3))
    cpu = torch.device("cpu")
    with torch.inference_mode():
        whole = vae.decode(z)
        one, three = (
            decode_video(vae, z, Tiling("full", tile_frames=n), device=cpu, dtype=torch.float32).transpose(
                1, 2
            )
            for n in (1, 3)
        )
    assert (three.clamp(-1, 1) - whole).abs().max() < 1e-5  # one chunk: the whole pass
    # random weights, one latent frame a chunk: ~36 dB (the clip's first frame normalised alone)
    print(f"one frame a chunk vs whole: {psnr(one.clamp(-1, 1), whole):.1f} dB")
    assert 30 <= psnr(one.clamp(-1, 1), whole) < 60
    info = RunInfo()
    tiled = (decode(vae, z, tiled=True, tile=32, overlap=16, info=info) * 2 - 1).transpose(1, 2)
    assert info.mode == "tiled" and info.tiles > 1
    # each tile normalised on its own statistics as well: ~25 dB with random weights at these tiny tiles
    print(f"tiled vs whole: {psnr(tiled, whole):.1f} dB")
    assert 20 <= psnr(tiled, whole) < 60


def test_comfyuis_ldm_naming_loads_and_decodes_the_same(hv, tmp_path):
    """ComfyUI's repackaged file names the decoder as LDM's AutoencoderKL (`mid.attn_1.q` as 1x1 convs,
    `up.0` the full-resolution level): written here by the engine's own diffusers-to-LDM renaming of the
    image VAEs, it decodes bit for bit as the diffusers-named file; an unknown LDM key is named."""
    from safetensors.torch import save_file

    from engine.vae.loading import diffusers_to_ldm

    ref, path, sd = hv
    ldm = diffusers_to_ldm({k: v for k, v in sd.items() if k.startswith(("decoder.", "post_quant_conv."))})
    assert "decoder.mid.attn_1.q.weight" in ldm and "decoder.up.1.block.0.nin_shortcut.conv.weight" in ldm
    save_file(ldm, tmp_path / "hunyuan_video_vae_bf16.safetensors")
    z = torch.randn(1, 4, 2, 4, 4, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        assert torch.equal(
            load_vae(tmp_path / "hunyuan_video_vae_bf16.safetensors").decode(z), load_vae(path).decode(z)
        )
    ldm["decoder.mid.attn_1.extra.weight"] = torch.zeros(1)
    save_file(ldm, tmp_path / "extra.safetensors")
    with pytest.raises(FormatError, match=r"unexpected .*mid\.attn_1\.extra\.weight"):
        load_vae(tmp_path / "extra.safetensors")


def test_a_missing_or_misshapen_decoder_key_is_named_and_the_encoder_is_not_needed(hv, tmp_path):
    from safetensors.torch import save_file

    _, _, sd = hv
    dec = {k: v for k, v in sd.items() if not k.startswith(("encoder.", "quant_conv."))}
    save_file(dec, tmp_path / "decoder.safetensors")
    assert load_vae(tmp_path / "decoder.safetensors").latent_channels == 4
    broken = dict(dec)
    broken.pop("decoder.up_blocks.1.resnets.1.conv2.conv.weight")
    save_file(broken, tmp_path / "missing.safetensors")
    with pytest.raises(FormatError, match=r"missing .*up_blocks\.1\.resnets\.1\.conv2\.conv\.weight"):
        load_vae(tmp_path / "missing.safetensors")
    bad = dict(dec)
    bad["decoder.mid_block.attentions.0.to_k.weight"] = torch.zeros(3, 3)
    save_file(bad, tmp_path / "shape.safetensors")
    with pytest.raises(FormatError, match=r"wrong shape .*attentions\.0\.to_k\.weight"):
        load_vae(tmp_path / "shape.safetensors")


@pytest.mark.parametrize("naming", ["diffusers", "comfy_ldm"])
def test_the_released_layout_reads_its_config_from_a_header_faithful_file(naming, tmp_path):
    """The release's layout (Tencent's = diffusers' names; ComfyUI's repackaged file in LDM names, as the
    detection tests lay it out) as a sparse file: detected, built at the release's config, no data read."""
    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse
    from engine.vae.estimate import spec_of
    from tests.engine.layouts_2026 import parts as P
    from tests.engine.layouts_2026.common import meta_shapes

    shapes = meta_shapes(diffusers.AutoencoderKLHunyuanVideo)
    if naming == "comfy_ldm":
        shapes = P.hunyuan_vae_ldm(shapes)
        assert "decoder.mid.attn_1.q.weight" in shapes
    rows = [(k, "BF16", s) for k, s in shapes.items()]
    path = write_sparse(tmp_path / "hunyuan_video_vae_bf16.safetensors", rows)
    assert (detect_file(path).kind, detect_file(path).architecture) == ("vae", "hunyuan_video")
    vae = load_vae(path)
    c = vae.cfg
    assert (c.z, c.widths, c.layers, c.image_channels) == (16, (128, 256, 512, 512), 3, 3)
    assert (vae.downscale, vae.time_factor) == (8, 4)
    assert [(b.upsamplers is not None and (u := b.upsamplers[0]).space, b.upsamplers is not None and u.time)
            for b in vae.decoder.up_blocks] == [(True, False), (True, True), (True, True), (False, False)]  # fmt: skip
    spec = spec_of(vae)
    assert spec.kind == "hunyuan_video" and spec.video and (spec.ch, spec.mid) == (128, 512)


def test_the_command_line_decodes_frames(hv, tmp_path, capsys):
    from engine.cli import main
    from engine.formats.latent import write_latent

    z = torch.randn(1, 4, 2, 8, 12, generator=torch.Generator().manual_seed(4))
    write_latent(tmp_path / "clip.latent", z)
    args = ["decode", "--json", "--quiet", "--vae", hv[1], "--latent", str(tmp_path / "clip.latent")]
    assert main([*args, "--out", f"{tmp_path}/frames/"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 5 and res["size"] == [48, 32]
    assert sorted(p.name for p in (tmp_path / "frames").iterdir()) == [f"{i:06d}.png" for i in range(5)]


def test_the_latent_format_is_the_releases_scalar():
    from engine.vae.latent_formats import LATENT_FORMATS

    fmt = LATENT_FORMATS["hunyuan_video"]
    assert (fmt.channels, fmt.scale, fmt.downscale, fmt.time_factor) == (16, 0.476986, 8, 4)
    z = torch.randn(1, 16, 2, 4, 4)
    assert torch.allclose(fmt.to_vae(fmt.to_model(z)), z, atol=1e-6)


@pytest.mark.parametrize("cls, arch", [("AutoencoderKLHunyuanVideo", "hunyuan_video"),
                                       ("AutoencoderKLHunyuanVideo15", "hunyuan_video15")])  # fmt: skip
def test_plan_a_720p_decode_of_the_released_layouts(cls, arch, tmp_path, capsys, monkeypatch):
    """`loadout plan --decode WxHxF` takes the HunyuanVideo VAEs (it refused all but Wan's and MiniMax-H3's),
    counting the causal attention's keys and values of every latent frame in the head."""
    from engine.cli import main
    from engine.formats.safetensors import write_sparse
    from engine.vae import estimate as est
    from tests.engine.layouts_2026.common import meta_shapes

    rows = [(k, "BF16", s) for k, s in meta_shapes(getattr(diffusers, cls)).items()]
    path = write_sparse(tmp_path / f"{arch}_vae.safetensors", rows)
    assert main(["plan", "--model", str(path), "--decode", "1280x720x129", "--vram", "24", "--json"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["steps"]
    assert step["step"] == "decode" and step["detail"]["latent_frames"] == 33
    kw = dict(kind=arch, latent_channels=16, dtype="bfloat16", latent_frames=33)
    with_kv = est.estimate_decode_bytes(1280, 720, **kw)
    monkeypatch.setitem(est.K_VIDEO_KV, arch, 0.0)
    spec = est.video_spec(arch)
    kv = 2 * spec.mid * 33 * (1280 * 720 // spec.downscale**2) * 2
    assert with_kv - est.estimate_decode_bytes(1280, 720, **kw) == pytest.approx(kv, rel=0.01)
