"""Cosmos 1.0's tokenizer (engine.vae.cosmos) against diffusers' AutoencoderKLCosmos on the same weights (reduced widths,
the release's blocks and 8x8x8 compression), in diffusers' and NVIDIA's namings: decode, encode, chunks and tiles."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from engine.errors import FormatError
from engine.events import Tiling
from engine.vae import decode, encode
from engine.vae.loading import load_vae
from engine.vae.run import RunInfo
from engine.vae.video import decode_video

diffusers = pytest.importorskip("diffusers")

SMALL = dict(
    encoder_block_out_channels=(8, 16, 32, 32), decode_block_out_channels=(16, 32, 32, 32), resolution=64
)
CPU = torch.device("cpu")


def _ref(seed: int = 0, **kw) -> torch.nn.Module:
    m = diffusers.AutoencoderKLCosmos(**{**SMALL, **kw})
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            norm = ".norm" in n and n.endswith("weight")
            p.copy_(1 + 0.1 * r if norm else r * (0.5 / math.sqrt(p[0].numel())))
    return m.eval()


@pytest.fixture(scope="module")
def ref():
    return _ref()


def _sd(ref) -> dict[str, torch.Tensor]:
    return {k: v.clone().contiguous() for k, v in ref.state_dict().items()}


def _nvidia_names(sd: dict[str, torch.Tensor], method: str = "haar") -> dict[str, torch.Tensor]:
    """diffusers' keys as NVIDIA's tokenizer names them (the reverse of diffusers' convert_cosmos_to_diffusers.py
    VAE_KEYS_RENAME_DICT), written out per module here, independently of the loader; with the wavelet buffers the JIT
    state dict keeps."""
    ups = {int(m[1]) for k in sd if (m := re.match(r"decoder\.up_blocks\.(\d+)\.", k))}
    out = {}
    for k, v in sd.items():
        new = k
        for a, b in (("conv_s", "0"), ("conv_t", "1")):
            new = re.sub(rf"\b(conv_in|conv_out|conv1|conv2)\.{a}\.", rf"\1.{b}.conv3d.", new)
        new = re.sub(
            r"\.(downsamplers|upsamplers)\.0\.(conv\d)\.", lambda m: f".{m[1][:-2]}.{m[2]}.conv3d.", new
        )
        new = new.replace("conv_shortcut.", "nin_shortcut.conv3d.")
        for a, b in (("to_q", "q"), ("to_k", "k"), ("to_v", "v"), ("to_out.0", "proj_out")):
            new = new.replace(f".{a}.", f".{b}.conv3d.")
        new = new.replace("mid_block.resnets.0.", "mid.block_1.").replace(
            "mid_block.resnets.1.", "mid.block_2."
        )
        new = new.replace("mid_block.attentions.0.", "mid.attn_1.0.").replace(
            "mid_block.temp_attentions.0.", "mid.attn_1.1."
        )
        new = re.sub(
            r"\b(attentions|temp_attentions)\.(\d+)\.",
            lambda m: f"attn.{m[2]}.{0 if m[1] == 'attentions' else 1}.",
            new,
        )
        new = re.sub(r"down_blocks\.(\d+)\.resnets\.", r"down.\1.block.", new)
        new = re.sub(r"down_blocks\.(\d+)\.", r"down.\1.", new)
        new = re.sub(r"up_blocks\.(\d+)\.", lambda m: f"up.{max(ups) - int(m[1])}.", new)
        new = re.sub(r"(up\.\d+\.)resnets\.", r"\1block.", new)
        new = re.sub(r"^(post_quant_conv|quant_conv)\.", r"\1.conv3d.", new)
        out[new] = v
    tap = 2**-0.5 if method == "haar" else 1.0
    for side in ("encoder.patcher3d.", "decoder.unpatcher3d."):
        out[side + "wavelets"] = torch.tensor([tap, tap])
        out[side + "_arange"] = torch.arange(2)
    return out


def _z(t: int = 3, h: int = 4, w: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 16, t, h, w, generator=torch.Generator().manual_seed(seed))


def _clip(t: int = 17, h: int = 32, w: int = 40, seed: int = 2) -> torch.Tensor:
    return torch.rand(1, 3, t, h, w, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _save(sd, path):
    from safetensors.torch import save_file

    save_file(sd, str(path))
    return path


@pytest.mark.parametrize("naming", ["diffusers", "nvidia"])
def test_decode_and_encode_match_diffusers_in_both_namings(ref, naming, tmp_path):
    sd = _sd(ref) if naming == "diffusers" else _nvidia_names(_sd(ref))
    if naming == "nvidia":
        assert (
            "decoder.up.0.block.0.conv1.0.conv3d.weight" in sd
            and "decoder.mid.attn_1.1.q.conv3d.weight" in sd
        )
    mine = load_vae(_save(sd, tmp_path / "cosmos_vae.safetensors"))
    cfg = mine.cfg
    assert (cfg.z, cfg.mid, cfg.widths, cfg.layers, cfg.patch, cfg.method) == (
        16,
        32,
        (32, 32, 16),
        (3, 3, 3),
        4,
        "haar",
    )
    assert (cfg.time_up, cfg.space_up) == ((False, True, False),) * 2 and (
        mine.downscale,
        mine.time_factor,
    ) == (8, 8)
    z, x = _z(), _clip()
    with torch.inference_mode():
        want, got = ref.decode(z).sample.clamp(-1, 1), mine.decode(z)
        want_lat, got_lat = ref.encode(x).latent_dist.mode(), mine.encode(x)
    assert got.shape == want.shape == (1, 3, 17, 32, 40)  # 1 + 8 (T - 1) frames at 8x
    assert got_lat.shape == want_lat.shape == (1, 16, 3, 4, 5)
    err, lat_err = (got - want).abs().max(), (got_lat - want_lat).abs().max()
    print(f"cosmos {naming}: decode max abs error {err:.1e}, encode {lat_err:.1e}")
    assert (
        err < 1e-4 and lat_err < 2e-6
    )  # the encode's attention is a small part of it: a tight bound sees it


def test_chunks_are_exact_and_tiles_close(ref):
    """Every convolution causal, the attention over frames causal with its keys and values carried, the norms per frame:
    any chunking gives the whole clip; a tile normalises with its own statistics."""
    from engine.vae.cosmos_loading import build
    from engine.vae.loading import _made, strict_load

    mine = build(_sd(ref), "ref", strict_load, _made)
    z = _z(4, 12, 16, seed=3)
    with torch.inference_mode():
        whole = mine.decode(z).transpose(1, 2)
        one = decode_video(mine, z, Tiling("full", tile_frames=1), device=CPU, dtype=torch.float32)
        three = decode_video(mine, z, Tiling("full", tile_frames=3), device=CPU, dtype=torch.float32)
    assert one.shape == (1, 25, 3, 96, 128)
    assert (one - whole).abs().max() < 1e-5 and (three - whole).abs().max() < 1e-5
    info = RunInfo()
    tiled = decode(mine, z, tiled=True, tile=64, overlap=32, info=info) * 2 - 1
    assert info.mode == "tiled" and info.tiles > 1
    mse = float(((tiled - whole) ** 2).mean())
    psnr = 10 * math.log10(4 / mse)
    print(f"cosmos tiled vs whole: {psnr:.1f} dB")
    assert psnr >= 35


def test_encode_chunks_and_an_image(ref):
    """The first frame alone, then any multiple of 8 frames a chunk: the same latent; an image is a one-frame clip."""
    from engine.vae.cosmos_loading import build
    from engine.vae.loading import _made, strict_load

    mine = build(_sd(ref), "ref", strict_load, _made)
    x = _clip(25)
    with torch.inference_mode():
        want = ref.encode(x).latent_dist.mode()
        by8, by24 = mine.encode(x), mine.encode(x, chunk_frames=24)
        img = encode(mine, (x[:, :, 0] + 1) / 2)
        want_img = ref.encode(x[:, :, :1]).latent_dist.mode()[:, :, 0]
    assert (by8 - want).abs().max() < 2e-6 and (by24 - want).abs().max() < 2e-6  # measured 2e-7
    assert img.shape == (1, 16, 4, 5) and (img - want_img).abs().max() < 2e-6
    with pytest.raises(FormatError, match=r"1 \+ 8 k frames"):
        mine.encode(x[:, :, :12])
    with pytest.raises(FormatError, match="multiples of 8"):
        mine.encode(x[:, :, :9, :30])


@pytest.mark.parametrize("resolutions", [(4,), (8,)])
def test_blocks_with_attention_match_diffusers(resolutions):
    """Tokenizers whose up and down blocks attend (diffusers' attention_resolutions): found from the keys."""
    ref = _ref(seed=4, attention_resolutions=resolutions)
    from engine.vae.cosmos_loading import build
    from engine.vae.loading import _made, strict_load

    mine = build(_sd(ref), "ref", strict_load, _made)
    assert any(mine.cfg.attention) and any(mine.cfg.encoder.attention)
    z, x = _z(2), _clip(9)
    with torch.inference_mode():
        assert (mine.decode(z) - ref.decode(z).sample.clamp(-1, 1)).abs().max() < 1e-4
        assert (mine.encode(x) - ref.encode(x).latent_dist.mode()).abs().max() < 2e-6


def test_the_rearrange_patching_from_the_buffer_or_the_config(tmp_path):
    ref = _ref(seed=5, patch_type="rearrange")
    z, x = _z(2), _clip(9)
    with torch.inference_mode():
        want, want_lat = ref.decode(z).sample.clamp(-1, 1), ref.encode(x).latent_dist.mode()
    nvidia = load_vae(_save(_nvidia_names(_sd(ref), "rearrange"), tmp_path / "nvidia.safetensors"))
    (tmp_path / "vae").mkdir()
    (tmp_path / "vae" / "config.json").write_text(
        json.dumps({"_class_name": "AutoencoderKLCosmos", "patch_type": "rearrange"})
    )
    diff = load_vae(_save(_sd(ref), tmp_path / "vae" / "diffusion_pytorch_model.safetensors"))
    bare = load_vae(_save(_sd(ref), tmp_path / "bare.safetensors"))
    assert (nvidia.cfg.method, diff.cfg.method, bare.cfg.method) == ("rearrange", "rearrange", "haar")
    with torch.inference_mode():
        for m in (nvidia, diff):
            assert (m.decode(z) - want).abs().max() < 1e-4
            assert (m.encode(x) - want_lat).abs().max() < 2e-6


def test_a_decoder_only_file_decodes_and_refuses_to_encode(ref, tmp_path):
    sd = {k: v for k, v in _sd(ref).items() if not k.startswith(("encoder.", "quant_conv."))}
    mine = load_vae(_save(sd, tmp_path / "decoder.safetensors"))
    assert not hasattr(mine, "encoder")
    with torch.inference_mode():
        assert (mine.decode(_z(2)) - ref.decode(_z(2)).sample.clamp(-1, 1)).abs().max() < 1e-4
    with pytest.raises(FormatError, match="holds the decoder only"):
        encode(mine, torch.rand(1, 3, 32, 32))


def test_a_missing_or_misshapen_key_is_named(ref, tmp_path):
    sd = _sd(ref)
    sd.pop("decoder.up_blocks.1.resnets.2.conv2.conv_t.weight")
    with pytest.raises(
        FormatError, match=r"missing .*decoder\.up_blocks\.1\.resnets\.2\.conv2\.conv_t\.weight"
    ):
        load_vae(_save(sd, tmp_path / "broken.safetensors"))
    sd = _nvidia_names(_sd(ref))
    sd["decoder.mid.attn_1.1.norm.norm.bias"] = torch.zeros(3)
    with pytest.raises(FormatError, match=r"temp_attentions\.0\.norm\.norm\.bias"):
        load_vae(_save(sd, tmp_path / "bad.safetensors"))
    sd = _sd(ref)
    sd["decoder.conv_out.conv_t.weight"] = torch.zeros(100, 100, 3, 1, 1)
    with pytest.raises(FormatError, match="3 x p\\^3"):
        load_vae(_save(sd, tmp_path / "odd.safetensors"))


@pytest.mark.parametrize("naming", ["diffusers", "nvidia"])
def test_the_release_layout_from_a_header_faithful_file(naming, tmp_path, capsys):
    """CV8x8x8-1.0's layout (diffusers' defaults) as a sparse bf16 file: detected as Cosmos 1.0's VAE, its config, the
    estimate's widths and kind, and `loadout plan --decode` of its pipeline's 121 frames at 1280x704."""
    from engine.cli import main
    from engine.detect import detect_file
    from engine.formats.safetensors import write_sparse
    from engine.vae import estimate as est

    with torch.device("meta"):
        full = diffusers.AutoencoderKLCosmos()
    sd = dict(full.state_dict())
    if naming == "nvidia":
        sd = {k: v for k, v in _nvidia_names(sd).items() if not k.endswith(("wavelets", "_arange"))}
    path = write_sparse(
        tmp_path / "cosmos_cv8x8x8_1.0.safetensors", [(k, "BF16", tuple(v.shape)) for k, v in sd.items()]
    )
    d = detect_file(str(path))
    assert (d.kind, d.architecture) == ("vae", "cosmos_predict1")
    assert any("CV8x8x8" in e.reason for e in d.evidence)
    mine = load_vae(path)
    cfg = mine.cfg
    assert (cfg.z, cfg.mid, cfg.widths, cfg.layers, cfg.patch) == (16, 512, (512, 512, 256), (3, 3, 3), 4)
    assert cfg.encoder.widths == (128, 256, 512, 512) and cfg.encoder.time_down == (True, False, False)
    spec = est.spec_of(mine)
    decoder = sum(
        p.numel() * 2 for n, p in mine.named_parameters() if not n.startswith(("encoder.", "quant_conv."))
    )
    assert decoder == est.VIDEO_SPECS["cosmos_predict1"].weight_bytes
    assert (spec.kind, spec.ch, spec.mid, spec.time_factor, spec.downscale) == (
        "cosmos_predict1",
        16,
        512,
        8,
        8,
    )
    assert est.video_widths(str(path), "cosmos_predict1") == (16, 512)
    assert main(["plan", "--model", str(path), "--decode", "1280x704x121", "--vram", "24", "--json"]) == 0
    (step,) = json.loads(capsys.readouterr().out)["steps"]
    assert step["step"] == "decode" and step["detail"]["latent_frames"] == 16


def test_comfyui_s_file_with_its_latent_statistics_reads_normalised_latents(ref, tmp_path):
    """ComfyUI's repackaged file holds `latent_mean` / `latent_std` (16 channels x 16 latent frames) and its VAE decodes
    z / 0.5 * std + mean, latent frame i reading the statistics' frame i mod 16 (comfy/ldm/cosmos/vae.py), encodes the
    inverse: so a ComfyUI latent decodes here as there. Three frames of statistics here, so a short clip wraps, across
    chunks of two latent frames."""
    g = torch.Generator().manual_seed(7)
    mean, std = torch.randn(16, 3, generator=g) * 0.1, torch.rand(16, 3, generator=g) + 0.5
    sd = _nvidia_names(_sd(ref)) | {"latent_mean": mean.reshape(-1), "latent_std": std.reshape(-1)}
    mine = load_vae(_save(sd, tmp_path / "cosmos_cv8x8x8_1.0.safetensors"))
    idx = torch.arange(5) % 3
    m, s = mean[:, idx][None, :, :, None, None], std[:, idx][None, :, :, None, None]
    z = _z(5)  # normalised, as ComfyUI's sampler leaves it
    x = _clip(33)
    with torch.inference_mode():
        want = ref.decode(z / 0.5 * s + m).sample.clamp(-1, 1)
        got = decode_video(mine, z, Tiling("full", tile_frames=2), device=CPU, dtype=torch.float32).transpose(
            1, 2
        )
        want_lat = (ref.encode(x).latent_dist.mode() - m) / s * 0.5
        got_lat = mine.encode(x)
    assert (got - want).abs().max() < 1e-4 and (got_lat - want_lat).abs().max() < 1e-5
    info = RunInfo()
    decode(mine, z[:, :, :2], info=info)
    assert any("latent statistics" in n for n in info.notes)
    sd.pop("latent_std")
    with pytest.raises(FormatError, match="without its pair"):
        load_vae(_save(sd, tmp_path / "half.safetensors"))
