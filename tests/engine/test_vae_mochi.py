"""The Mochi 1 VAE's decoder (engine.vae.mochi) against diffusers' AutoencoderKLMochi on the same weights
(a reduced config: widths 64/32/32/32, one residual block per block, the release's time x3, x2, x1), in
diffusers' and the release's namings, chunked and tiled."""

from __future__ import annotations

import math

import pytest
import torch

from engine.errors import FormatError
from engine.events import Tiling
from engine.vae import decode
from engine.vae.causal_conv import Stream
from engine.vae.loading import load_vae
from engine.vae.mochi import build
from engine.vae.run import RunInfo
from engine.vae.video import decode_video

diffusers = pytest.importorskip("diffusers")

SMALL = dict(encoder_block_out_channels=(32, 32, 32, 32), decoder_block_out_channels=(32, 32, 32, 64),
             layers_per_block=(1, 1, 1, 1, 1), add_attention_block=(False,) * 5)  # fmt: skip
CPU = torch.device("cpu")


def _randomise(m: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in m.named_parameters():
            r = torch.randn(p.shape, generator=g)
            norm = ".norm" in n and n.endswith("weight")
            p.copy_(1 + 0.1 * r if norm else r * (0.5 / math.sqrt(p[0].numel())))
    return m.eval()


def psnr(a: torch.Tensor, b: torch.Tensor, peak: float = 2.0) -> float:
    mse = float(((a.float() - b.float()) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


@pytest.fixture(scope="module")
def ref():
    return _randomise(diffusers.AutoencoderKLMochi(**SMALL))


def _sd(ref) -> dict[str, torch.Tensor]:
    return {k: v.clone().contiguous() for k, v in ref.state_dict().items()}


def _release_names(sd: dict[str, torch.Tensor], prefix: str = "decoder.") -> dict[str, torch.Tensor]:
    """diffusers' decoder keys as the Genmo release names them (models.py's Decoder: `blocks.0` = the
    input conv then residual blocks, `blocks.1..3` up blocks, `blocks.4` the last residual blocks,
    each residual block's `stack.{0,2,3,5}`), written out per module here, independently of the loader."""
    res = {".norm1.norm_layer.": ".stack.0.", ".conv1.conv.": ".stack.2.", ".norm2.norm_layer.": ".stack.3.",
           ".conv2.conv.": ".stack.5."}  # fmt: skip
    out = {}
    for k, v in sd.items():
        if not k.startswith("decoder."):
            continue
        parts = k.split(".")
        if parts[1] == "conv_in":
            new = f"blocks.0.0.{parts[2]}"
        elif parts[1] == "proj_out":
            new = f"output_proj.{parts[2]}"
        elif parts[1] == "block_in":
            new = f"blocks.0.{int(parts[3]) + 1}." + ".".join(parts[4:])
        elif parts[1] == "block_out":
            new = f"blocks.4.{parts[3]}." + ".".join(parts[4:])
        elif parts[3] == "proj":
            new = f"blocks.{int(parts[2]) + 1}.proj.{parts[4]}"
        else:
            new = f"blocks.{int(parts[2]) + 1}.blocks.{parts[4]}." + ".".join(parts[5:])
        new = "." + new
        for a, b in res.items():
            new = new.replace(a, b)
        out[prefix + new[1:]] = v
    return out


def _release_encoder_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """diffusers' encoder keys as the release names them (models.py's Encoder: `layers.0` the input 1x1x1 conv,
    then `block_in`'s residual blocks, the down blocks (`layers.0` their conv, then their residual blocks), then
    `block_out`'s; attention as `attn_block.norm` / `attn_block.attn.qkv` (q, k, v stacked) / `.out`;
    `output_norm`, `output_proj`), written out per module here, independently of the loader."""
    res = {"norm1.norm_layer.": "stack.0.", "conv1.conv.": "stack.2.", "norm2.norm_layer.": "stack.3.",
           "conv2.conv.": "stack.5."}  # fmt: skip
    enc = {k.removeprefix("encoder."): v for k, v in sd.items() if k.startswith("encoder.")}
    n_in = len({k.split(".")[2] for k in enc if k.startswith("block_in.resnets.")})
    n_down = len({k.split(".")[1] for k in enc if k.startswith("down_blocks.")})
    stages = [("block_in.", "layers.{j}", 1)]
    stages += [(f"down_blocks.{i}.", f"layers.{1 + n_in + i}.layers.{{j}}", 1) for i in range(n_down)]
    stages += [("block_out.", "layers.{j}", 1 + n_in + n_down)]
    out = {"encoder.layers.0.weight": enc["proj_in.weight"][:, :, None, None, None],
           "encoder.layers.0.bias": enc["proj_in.bias"], "encoder.output_proj.weight": enc["proj_out.weight"],
           "encoder.output_norm.weight": enc["norm_out.norm_layer.weight"],
           "encoder.output_norm.bias": enc["norm_out.norm_layer.bias"]}  # fmt: skip
    for i in range(n_down):
        for x in ("weight", "bias"):
            out[f"encoder.layers.{1 + n_in + i}.layers.0.{x}"] = enc[f"down_blocks.{i}.conv_in.conv.{x}"]
    for src, dst, first in stages:
        n = len(
            {k.removeprefix(src + "resnets.").split(".")[0] for k in enc if k.startswith(src + "resnets.")}
        )
        for j in range(n):
            base = "encoder." + dst.format(j=first + j)
            for a, b in res.items():
                for x in ("weight", "bias"):
                    out[f"{base}.{b}{x}"] = enc[f"{src}resnets.{j}.{a}{x}"]
            if f"{src}attentions.{j}.to_q.weight" in enc:
                a = f"{src}attentions.{j}."
                out[f"{base}.attn_block.attn.qkv.weight"] = torch.cat(
                    [enc[a + f"to_{c}.weight"] for c in "qkv"]
                )
                out[f"{base}.attn_block.attn.out.weight"] = enc[a + "to_out.0.weight"]
                out[f"{base}.attn_block.attn.out.bias"] = enc[a + "to_out.0.bias"]
                out[f"{base}.attn_block.norm.weight"] = enc[f"{src}norms.{j}.norm_layer.weight"]
                out[f"{base}.attn_block.norm.bias"] = enc[f"{src}norms.{j}.norm_layer.bias"]
    return out


def _levels_reference(ref, z: torch.Tensor) -> torch.Tensor:
    """The release's decoder (models.py's DepthToSpaceTime drops st - 1 frames after each up block that
    expands time) assembled from diffusers' own modules."""
    d = ref.decoder
    x, _ = d.block_in(d.conv_in(z))
    for up in d.up_blocks:
        x, _ = up(x)
        if up.temporal_expansion > 1:
            x = x[:, :, up.temporal_expansion - 1 :]
    x, _ = d.block_out(x)
    return d.proj_out(d.nonlinearity(x).permute(0, 2, 3, 4, 1)).permute(0, 4, 1, 2, 3).clamp(-1, 1)


def _z(t: int = 3, h: int = 5, w: int = 6, seed: int = 1) -> torch.Tensor:
    return torch.randn(1, 12, t, h, w, generator=torch.Generator().manual_seed(seed))


def test_the_decode_matches_diffusers_and_the_release(ref):
    z = _z()
    with torch.inference_mode():
        want_end = ref.decode(z).sample.clamp(-1, 1)
        want_levels = _levels_reference(ref, z)
        got_end = build(_sd(ref), "ref").decode(z)  # the default: diffusers' decode
        got_levels = build(_sd(ref), "ref", drop="levels").decode(z)  # the release's own decoder
    assert got_end.shape == got_levels.shape == want_end.shape == (1, 3, 13, 40, 48)  # 6T - 5 frames
    err_end, err_levels = (got_end - want_end).abs().max(), (got_levels - want_levels).abs().max()
    print(f"mochi decode: max abs error {err_end:.2e} (diffusers), {err_levels:.2e} (release);"
          f" {psnr(got_end, want_end):.1f} / {psnr(got_levels, want_levels):.1f} dB;"
          f" the two drops differ by {psnr(want_end, want_levels):.1f} dB")  # fmt: skip
    assert err_end < 1e-4 and err_levels < 1e-4
    assert psnr(want_end, want_levels) < 40  # the tests above could tell the two drops apart


@pytest.mark.parametrize("drop", ["levels", "end"])
def test_chunked_decoding_is_exact_and_frames_drop_once_per_clip(ref, drop):
    mine = build(_sd(ref), "ref", drop=drop)
    z = _z(4)
    with torch.inference_mode():
        head, up = Stream(), Stream()
        whole = mine.decode_up(mine.decode_head(z, head), up)
        one = decode_video(mine, z, Tiling("full", tile_frames=1), device=CPU, dtype=torch.float32)
        two = decode_video(mine, z, Tiling("full", tile_frames=2), device=CPU, dtype=torch.float32)
    assert one.shape == (1, 19, 3, 40, 48)
    assert torch.equal(one, two) or (one - two).abs().max() < 1e-5
    assert (one.transpose(1, 2) - whole.clamp(-1, 1)).abs().max() < 1e-5


def test_tiles_are_close_to_the_whole_frame(ref):
    """Each GroupNorm normalises a tile with that tile's statistics: close to the whole frame's."""
    mine = build(_sd(ref), "ref")
    z = _z(2, 12, 16, seed=2)
    with torch.inference_mode():
        want = mine.decode(z).transpose(1, 2)
    info = RunInfo()
    tiled = decode(mine, z, tiled=True, tile=64, overlap=32, info=info) * 2 - 1
    assert info.mode == "tiled" and info.tiles > 1
    print(f"mochi tiled vs full: {psnr(tiled, want):.1f} dB, max abs {(tiled - want).abs().max():.3f}")
    assert psnr(tiled, want) >= 35


@pytest.mark.parametrize("naming", ["diffusers", "release", "release_decoder_file"])
def test_both_namings_load_and_decode_the_same(ref, naming, tmp_path):
    from safetensors.torch import save_file

    sd = _sd(ref)  # diffusers' file has the encoder too (test_vae_mochi_encode.py encodes with it)
    if naming == "release":  # ComfyUI's repackaged file: the release's encoder beside it
        sd = _release_names(sd) | _release_encoder_names(sd)
    elif naming == "release_decoder_file":  # Genmo's decoder.safetensors: no `decoder.` prefix
        sd = _release_names(sd, prefix="")
    save_file(sd, tmp_path / "vae.safetensors")
    mine = load_vae(tmp_path / "vae.safetensors")
    assert mine.cfg.widths == (64, 32, 32, 32) and mine.cfg.time == (3, 2, 1) and mine.downscale == 8
    z = _z(2)
    with torch.inference_mode():
        got = mine.decode(z)
        want = ref.decode(z).sample.clamp(-1, 1)  # the default drop is diffusers'
    assert (got - want).abs().max() < 1e-4
    if naming == "release_decoder_file":
        with pytest.raises(FormatError, match="holds the decoder only"):
            mine.encode(torch.zeros(1, 3, 7, 16, 16))
    else:
        assert mine.cfg.encoder.widths == (32, 32, 32, 32)


def test_a_missing_or_misshapen_key_is_named(ref, tmp_path):
    from safetensors.torch import save_file

    sd = _sd(ref)
    sd.pop("decoder.up_blocks.1.resnets.0.conv2.conv.weight")
    save_file(sd, tmp_path / "broken.safetensors")
    with pytest.raises(FormatError, match=r"missing .*decoder\.blocks\.2\.blocks\.0\.stack\.5\.weight"):
        load_vae(tmp_path / "broken.safetensors")
    sd = _sd(ref)
    sd["decoder.block_in.resnets.0.norm2.norm_layer.bias"] = torch.zeros(3)
    save_file(sd, tmp_path / "bad.safetensors")
    with pytest.raises(FormatError, match=r"wrong shape .*decoder\.blocks\.0\.1\.stack\.3\.bias"):
        load_vae(tmp_path / "bad.safetensors")
    sd = _sd(ref)
    sd["decoder.up_blocks.0.proj.weight"] = torch.zeros(100, 64)
    with pytest.raises(FormatError, match=r"up_blocks|blocks\.1\.proj\.weight has 100 outputs"):
        build(sd, "odd")


@pytest.mark.parametrize("naming", ["release", "diffusers"])
def test_the_release_layout_loads_from_a_header_faithful_file(naming, tmp_path, capsys):
    """The published VAE's layout (diffusers' defaults: widths 128/256/512/768, residual blocks 3/6/4/3/3,
    projections to 512 x 3 x 4, 256 x 2 x 4, 128 x 1 x 4 channels) as a sparse bf16 file: the config, the
    estimate's widths and kind read from it."""
    from engine.formats.safetensors import write_sparse
    from engine.vae import estimate as est

    with torch.device("meta"):
        full = diffusers.AutoencoderKLMochi()
    sd = dict(full.state_dict())
    if naming == "release":
        sd = _release_names(sd) | _release_encoder_names(sd)
    path = tmp_path / "mochi_vae.safetensors"
    write_sparse(path, [(k, "BF16", tuple(v.shape)) for k, v in sd.items()])
    mine = load_vae(path)
    cfg = mine.cfg
    assert cfg.widths == (768, 512, 256, 128) and cfg.res_blocks == (3, 6, 4, 3, 3)
    assert cfg.time == (3, 2, 1) and cfg.time_factor == 6 and cfg.downscale == 8 and cfg.z == 12
    spec = est.spec_of(mine)
    assert (
        spec == est.video_spec("mochi", spec.weight_bytes)
        and spec.weight_bytes == est.VIDEO_SPECS["mochi"].weight_bytes
    )
    assert est.video_widths(str(path), "mochi") == (128, 768)
    from engine.formats.latent import write_latent
    from engine.preflight import estimate as preflight
    from engine.requests import EstimateDecode

    write_latent(tmp_path / "clip.latent", torch.zeros(1, 12, 5, 60, 106))
    got = preflight(EstimateDecode(str(path), str(tmp_path / "clip.latent")))
    assert (got.width, got.height, got.frames) == (848, 480, 25)  # 6T - 5
    assert got.tiled_bytes < got.full_bytes
    # `loadout plan` of the pipeline's default clip (848x480, 163 frames = 6 x 28 - 5) on a 6 GiB card
    import json

    from engine.cli import main

    capsys.readouterr()
    assert main(["plan", "--model", str(path), "--decode", "848x480x163", "--vram", "6", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    (step,) = plan["steps"]
    d = step["detail"]
    assert step["step"] == "decode" and d["frames"] == 163 and d["latent_frames"] == 28
    assert step["mode"] == "tiled" and step["peak_bytes"] <= plan["budget_bytes"]


def test_the_cli_decodes_a_clip_into_png_frames(ref, tmp_path, capsys):
    import json

    from PIL import Image
    from safetensors.torch import save_file

    from engine.cli import main
    from engine.formats.latent import write_latent

    vae = tmp_path / "mochi_vae_small.safetensors"
    save_file({k: v.half() for k, v in _release_names(_sd(ref)).items()}, vae)
    write_latent(tmp_path / "clip.latent", _z(2, 4, 6))
    out = f"{tmp_path}/frames/"
    assert main(["decode", "--json", "--quiet", "--vae", str(vae), "--latent", str(tmp_path / "clip.latent"),
                 "--out", out]) == 0  # fmt: skip
    res = json.loads(capsys.readouterr().out)
    assert res["frames"] == 7 and res["size"] == [48, 32] and res["fps"] == 30
    names = sorted(p.name for p in (tmp_path / "frames").iterdir())
    assert names == [f"{i:06d}.png" for i in range(7)]
    with Image.open(tmp_path / "frames" / "000006.png") as im:
        assert im.mode == "RGB" and im.size == (48, 32)
