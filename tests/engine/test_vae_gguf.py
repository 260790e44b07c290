"""VAEs stored in GGUF (ComfyUI-GGUF's layout): the blocks stay quantized in the modules — what the
ledger counts and the tiers move — and each op dequantizes them; the decode equals the decode of the
dequantized safetensors twin, bit for bit in float32."""

from __future__ import annotations

import json

import pytest
import torch
from vae_fixtures import small_kl

from engine.formats.safetensors import save_tensors
from engine.vae import decode, load_vae
from tests.support.gguf_files import write_gguf_twin
from tests.support.wan_vae import write_wan_vae


def _bytes(m: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in m.state_dict().values())


def _big(key: str, t: torch.Tensor) -> bool:
    return t.dim() > 1 and t.numel() >= 1024  # ComfyUI-GGUF keeps small and 1-D tensors in float


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0"])
def test_kl_vae_in_gguf_decodes_like_its_twin(tmp_path, qtype):
    sd = {k: v.contiguous() for k, v in small_kl(ch=32, seed=3).state_dict().items()}
    twin, quantized = write_gguf_twin(tmp_path / "vae.gguf", sd, "sd1", _big, qtype)
    save_tensors(tmp_path / "twin.safetensors", twin)
    assert any(twin[k].dim() == 4 for k in quantized)  # 3x3 convs are stored reshaped, orig_shape kept

    vae, ref = load_vae(tmp_path / "vae.gguf"), load_vae(tmp_path / "twin.safetensors")
    held = dict(vae.named_parameters())
    assert all(held[k].dtype == torch.uint8 for k in quantized)  # the blocks, not floats
    assert _bytes(vae) < _bytes(ref) * (0.5 if qtype == "Q8_0" else 0.3)

    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(decode(vae, z), decode(ref, z))
    tiled = decode(vae, z, tile=32, overlap=8)  # tiles run the same quantized ops
    assert torch.equal(tiled, decode(ref, z, tile=32, overlap=8))


def test_a_stable_diffusion_cpp_vae_decodes_like_its_twin(tmp_path):
    """stable-diffusion.cpp's converter quantizes every tensor but biases whose rows fill whole blocks: the
    GroupNorms' 1-dim weights too; 3x3 convolutions stay float (rows of 3). (The Wan VAE keeps all of its
    tensors in float there: its convolutions' and RMS norms' rows are 1 or 3 wide.) Full and tiled
    decodes equal the twin's."""
    from tests.support.gguf_files import sdcpp_pick

    sd = {k: v.contiguous() for k, v in small_kl(ch=32, seed=5).state_dict().items()}
    twin, quantized = write_gguf_twin(tmp_path / "vae.gguf", sd, "sd1", sdcpp_pick(32), ggml_dims=True)
    assert any(sd[k].dim() == 1 for k in quantized)  # the norms' weights
    save_tensors(tmp_path / "twin.safetensors", twin)
    got, ref = load_vae(tmp_path / "vae.gguf"), load_vae(tmp_path / "twin.safetensors")
    z = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(2))
    assert torch.equal(decode(got, z), decode(ref, z))
    assert torch.equal(decode(got, z, tile=32, overlap=8), decode(ref, z, tile=32, overlap=8))


def test_wan_vae_in_gguf_decodes_like_its_twin(tmp_path):
    from safetensors.torch import load_file

    sd = load_file(write_wan_vae(tmp_path / "wan.safetensors"))
    twin, quantized = write_gguf_twin(tmp_path / "wan.gguf", sd, "wan", _big)
    assert any(twin[k].dim() == 5 for k in quantized)  # causal 3-D convs: 5-D, stored reshaped
    save_tensors(tmp_path / "twin.safetensors", twin)

    vae, ref = load_vae(tmp_path / "wan.gguf"), load_vae(tmp_path / "twin.safetensors")
    assert _bytes(vae) < _bytes(ref) * 0.5
    z = torch.randn(1, 16, 2, 8, 8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(decode(vae, z), decode(ref, z))


def test_gguf_vae_through_the_cli(tmp_path, capsys):
    """As a user: inspect says what it is, decode writes the picture, the ledger holds the blocks."""
    from engine.cli import main
    from engine.formats.latent import write_latent

    sd = {k: v.contiguous() for k, v in small_kl(ch=32, seed=4).state_dict().items()}
    _, quantized = write_gguf_twin(tmp_path / "vae.gguf", sd, "sd1", _big)
    assert main(["inspect", str(tmp_path / "vae.gguf"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["error"] is None and got["kind"] == "vae", got
    assert main(["inspect", str(tmp_path / "vae.gguf")]) == 0
    assert "orig_shape" not in capsys.readouterr().out  # per-tensor layout facts are not the file's story
    write_latent(tmp_path / "z.latent", torch.randn(1, 4, 8, 8))
    out = tmp_path / "out.png"
    assert (
        main(
            [
                "decode",
                "--vae",
                str(tmp_path / "vae.gguf"),
                "--latent",
                str(tmp_path / "z.latent"),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert out.stat().st_size > 0
