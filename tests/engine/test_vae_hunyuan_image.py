"""HunyuanImage 2.1's VAE (engine.vae.hunyuan_image) against diffusers' AutoencoderKLHunyuanImage on the same
random, well-scaled weights (reduced widths, the release's 64 latent channels and 32x, float32, CPU): decode and
encode, tiled against whole, loading (both namings), a missing key named, detection of the release's layout from
a header-faithful sparse file, and the command line."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from engine.errors import FormatError
from engine.vae import decode, encode
from engine.vae.loading import load_vae
from engine.vae.run import RunInfo

diffusers = pytest.importorskip("diffusers")

# the release's structure (z 64, 32x: six levels, five resamplers) at a quarter of its widths, one block a level
SMALL = dict(in_channels=3, out_channels=3, latent_channels=64, block_out_channels=(32, 32, 64, 64, 128, 128),
             layers_per_block=1, spatial_compression_ratio=32, sample_size=128)  # fmt: skip
RELEASE = dict(in_channels=3, out_channels=3, latent_channels=64, block_out_channels=(128, 256, 512, 512, 1024, 1024),
               layers_per_block=2, spatial_compression_ratio=32, sample_size=384, scaling_factor=0.75289)  # fmt: skip


@pytest.fixture(scope="module")
def hyi(tmp_path_factory):
    from safetensors.torch import save_file

    torch.manual_seed(0)
    ref = diffusers.AutoencoderKLHunyuanImage(**SMALL).eval()
    g = torch.Generator().manual_seed(0)
    sd = {}
    for k, v in ref.state_dict().items():
        r = torch.randn(v.shape, generator=g)
        sd[k] = 1 + 0.1 * r if "norm" in k and k.endswith("weight") else r * (0.5 / math.sqrt(v[0].numel()))
    ref.load_state_dict(sd)
    path = tmp_path_factory.mktemp("hyi") / "hunyuan_image_2.1_vae_small.safetensors"
    save_file(sd, str(path))
    return ref, str(path), sd


def test_the_config_read_from_the_weights(hyi):
    _, path, _ = hyi
    vae = load_vae(path)
    assert (vae.latent_channels, vae.downscale, vae.image_range) == (64, 32, (-1.0, 1.0))
    c = vae.config
    assert [w for kind, w in c.enc if kind != "res"] == [32, 64, 64, 128, 128]  # downsample_match_channel
    assert [w for kind, w in c.dec if kind != "res"] == [128, 64, 64, 32, 32]
    assert (c.enc_in, c.dec_in) == (32, 128)


def test_decode_and_encode_equal_diffusers(hyi):
    ref, path, _ = hyi
    vae = load_vae(path)
    z = torch.randn(1, 64, 3, 4, generator=torch.Generator().manual_seed(1))
    x = torch.rand(1, 3, 96, 128, generator=torch.Generator().manual_seed(2)) * 2 - 1
    with torch.inference_mode():
        want_img, want_z = ref.decode(z).sample, ref.encode(x).latent_dist.mode()
        got_img, got_z = vae.decode(z), vae.encode(x)
    assert got_img.shape == (1, 3, 96, 128) and got_z.shape == (1, 64, 3, 4)
    assert float((got_img - want_img).abs().max()) <= 1e-4
    assert float((got_z - want_z).abs().max()) <= 1e-4
    # through the run (full mode): the image in [0, 1]
    out = decode(vae, z, tiled=False)
    assert float((out * 2 - 1 - want_img.clamp(-1, 1)).abs().max()) <= 1e-4


def test_tiled_decode_and_encode_equal_the_whole(hyi):
    """Tiles run in lock-step through every GroupNorm, the resamplers' pixel shuffles as steps of their own."""
    _, path, _ = hyi
    vae = load_vae(path)
    z = torch.randn(1, 64, 5, 6, generator=torch.Generator().manual_seed(3))
    whole = decode(vae, z, tiled=False)
    info = RunInfo()
    tiled = decode(vae, z, tiled=True, tile=64, overlap=32, info=info)
    assert info.mode == "tiled" and info.tiles > 4
    assert float((tiled - whole).abs().max()) <= 1e-5
    x = torch.rand(1, 3, 160, 192, generator=torch.Generator().manual_seed(4)) * 2 - 1
    whole_z = encode(vae, x, tiled=False)
    tiled_z = encode(vae, x, tiled=True, tile=64, overlap=32, info=info)
    assert info.mode == "tiled" and info.tiles > 4
    assert float((tiled_z - whole_z).abs().max()) <= 1e-4


def _original(sd: dict) -> dict:
    """diffusers' names back to Tencent's (the mapping of diffusers' convert_hunyuan_image_to_diffusers.py),
    under the checkpoint's `vae.` prefix, the convolutions 5-D with one frame as the release stores them."""
    per = SMALL["layers_per_block"]
    out = {}
    for k, v in sd.items():
        new = re.sub(r"\.mid_block\.resnets\.(\d)\.", lambda m: f".mid.block_{int(m.group(1)) + 1}.", k)
        new = re.sub(r"\.mid_block\.attentions\.0\.to_(q|k|v)\.", r".mid.attn_1.\1.", new)
        new = new.replace(".mid_block.attentions.0.proj.", ".mid.attn_1.proj_out.")
        new = new.replace(".mid_block.attentions.0.norm.", ".mid.attn_1.norm.")
        for flat, orig, n, resample in (("encoder.down_blocks", "encoder.down", per, "downsample"),
                                        ("decoder.up_blocks", "decoder.up", per + 1, "upsample")):  # fmt: skip
            m = re.match(rf"{flat}\.(\d+)\.(.*)$", new)
            if m:
                level, j = divmod(int(m.group(1)), n + 1)
                where = f"block.{j}" if j < n else resample
                new = f"{orig}.{level}.{where}.{m.group(2)}"
        out["vae." + new] = v[:, :, None] if v.dim() == 4 and v.shape[-1] == 3 else v
    return out


def test_the_original_naming_loads_the_same(hyi, tmp_path):
    from safetensors.torch import save_file

    _, path, sd = hyi
    orig = _original(sd)
    assert (
        "vae.decoder.up.0.upsample.conv.weight" in orig and "vae.encoder.mid.attn_1.proj_out.weight" in orig
    )
    save_file(orig, str(tmp_path / "pytorch_model.safetensors"))
    a, b = load_vae(path), load_vae(tmp_path / "pytorch_model.safetensors")
    z = torch.randn(1, 64, 2, 3, generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        assert torch.equal(a.decode(z), b.decode(z))


def test_a_missing_key_is_named(hyi, tmp_path):
    from safetensors.torch import save_file

    _, _, sd = hyi
    part = {k: v for k, v in sd.items() if k != "decoder.up_blocks.2.conv.bias"}
    save_file(part, str(tmp_path / "broken.safetensors"))
    with pytest.raises(FormatError, match=r"decoder\.up_blocks\.2\.conv\.bias"):
        load_vae(tmp_path / "broken.safetensors")


def test_the_release_layout_is_detected_and_loads_from_a_header_faithful_file(tmp_path):
    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse
    from tests.engine.layouts_2026.common import meta_shapes

    shapes = meta_shapes(diffusers.AutoencoderKLHunyuanImage, **RELEASE)
    assert shapes["decoder.up_blocks.3.conv.weight"] == (4096, 1024, 3, 3)
    path = write_sparse(
        tmp_path / "hunyuan_image_2.1_vae.safetensors", [(k, "BF16", s) for k, s in shapes.items()]
    )
    d = detect_file(path)  # header only: the file's data is a hole
    assert (d.kind, d.architecture) == ("vae", "hunyuan_image21")
    assert d.components["vae"].tensors == len(shapes)
    (ev,) = d.evidence
    assert ev.key == "decoder.up_blocks.3.conv.weight" and ev.shape == (4096, 1024, 3, 3)
    assert "64 latent channels, 5 2x levels → 32x → HunyuanImage 2.1's VAE" in ev.reason
    vae = load_vae(path)
    assert [w for kind, w in vae.config.dec if kind == "up"] == [1024, 512, 512, 256, 128]
    assert (vae.latent_channels, vae.downscale, vae.config.dec_in) == (64, 32, 1024)


def test_an_sd_vae_is_still_an_autoencoderkl():
    from tests.engine.layouts_2026.common import detect, meta_shapes

    d = detect(meta_shapes(diffusers.AutoencoderKL, block_out_channels=(128, 256, 512, 512),
                           down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                           latent_channels=16))  # fmt: skip
    assert (d.kind, d.architecture) == ("vae", None)
    assert "16 latent channels → SD3 / FLUX.1" in d.evidence[0].reason


def test_the_command_line_decodes_a_png(hyi, tmp_path, capsys):
    from PIL import Image

    from engine.cli import main
    from engine.formats.latent import write_latent

    _, path, _ = hyi
    write_latent(tmp_path / "z.latent", torch.randn(1, 64, 2, 3, generator=torch.Generator().manual_seed(6)))
    out = tmp_path / "out.png"
    args = [
        "decode",
        "--json",
        "--quiet",
        "--vae",
        path,
        "--latent",
        str(tmp_path / "z.latent"),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["size"] == [96, 64]
    assert Image.open(out).size == (96, 64)


def test_its_memory_estimate_is_its_own_kind(hyi):
    from engine.vae import estimate as est

    _, path, _ = hyi
    spec = est.spec_of(load_vae(path))
    assert (spec.kind, spec.latent_channels, spec.ch, spec.downscale, spec.video) == (
        "hunyuan_image21",
        64,
        32,
        32,
        False,
    )
    act = est.activation_bytes(spec, "decode", 512 * 512, 4)
    assert act == int(est.K_ACT[("hunyuan_image21", "decode")] * 32 * 512 * 512 * 4)
    assert spec.k_head() == est.K_HEAD["hunyuan_image21"] * 32 and spec.context_px("decode") == 64
