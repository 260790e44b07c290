"""`loadout step` as a user runs it: the full SD1.5 UNet layout (every key and shape of the reference
manifest, dense random float32 weights: 3.4 GB) in the original and in diffusers' naming, fully and
partially loaded, with a real LyCORIS LoKr; JSON and exit codes on a small model."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from denoise_files import PREFIX, SD1, SD1_TINY, diffusers_unet_config, random_weights, unet_rows, write  # noqa: E402
from loadout_test_support import data_file  # noqa: E402

from engine.formats.safetensors import SafetensorsFile, save_tensors  # noqa: E402

SD15_MANIFEST = "manifests/sd15_ldm_single_file.json"
LOKR = "weights/smart_falcon_8_lokr.safetensors"
KEYS = ("architecture", "steps", "s_per_step", "first_step_s", "peak_device_bytes", "resident_bytes",
        "streamed_bytes_per_step", "mode")  # fmt: skip


def _out(path) -> torch.Tensor:
    return SafetensorsFile(path).tensor("out").clone()


def _step(cli, *args):
    r = cli("step", *args, "--json", "--cpu", timeout=600)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert all(k in d for k in KEYS), d
    return d


@pytest.fixture(scope="module")
def sd15(tmp_path_factory):
    """The SD1.5 UNet in both namings (diffusers' names from diffusers' own converter)."""
    from diffusers.loaders.single_file_utils import convert_ldm_unet_checkpoint

    manifest = json.loads(data_file(SD15_MANIFEST).read_text())["tensors"]
    rows = [(k, "F32", tuple(v["shape"])) for k, v in manifest.items() if k.startswith(PREFIX)]
    d = tmp_path_factory.mktemp("sd15")
    w = random_weights(rows, seed=15)
    ldm = write(d / "sd15_unet.safetensors", w)
    config = diffusers_unet_config(SD1, "sd1")
    diff = write(d / "sd15_unet_diffusers.safetensors", convert_ldm_unet_checkpoint(w, config))
    del w
    yield d, ldm, diff
    for p in (ldm, diff):  # 6.9 GB: not left for pytest's tmp-path retention
        p.unlink(missing_ok=True)


@pytest.mark.slow
def test_the_full_sd15_unet_in_both_namings_full_and_partial(cli, sd15, shared_data):
    d, ldm, diff = sd15
    a = _step(cli, "--model", str(ldm), "--size", "64x64", "--out", str(d / "a.safetensors"))
    assert a["architecture"] == "sd1" and a["naming"] == "ldm" and a["mode"] == "full"
    assert a["resident_bytes"] == 859520964 * 4 and a["streamed_bytes_per_step"] == 0
    assert a["output_shape"] == [1, 4, 8, 8] and a["input_shapes"]["context"] == [1, 77, 768]
    b = _step(cli, "--model", str(diff), "--size", "64x64", "--vram-budget", "1", "--steps", "2",
              "--out", str(d / "b.safetensors"))  # fmt: skip
    assert b["naming"] == "diffusers" and b["mode"] == "partial" and b["resident_bytes"] <= 1024**3
    assert b["resident_bytes"] + b["streamed_bytes_per_step"] == a["resident_bytes"]
    # The same weights from another file: equal up to float32 round-off (the CPU's matmul kernels
    # follow the operands' alignment, which follows each file's offsets). Partial = full of one file
    # is bit for bit: tests/engine/test_step.py.
    a_out, b_out = _out(d / "a.safetensors"), _out(d / "b.safetensors")
    assert ((a_out - b_out).norm() / a_out.norm()).item() <= 1e-5
    lokr = str(shared_data(LOKR))
    c = _step(cli, "--model", str(ldm), "--size", "64x64", "--vram-budget", "2", "--lora", f"{lokr}:0.8",
              "--out", str(d / "c.safetensors"))  # fmt: skip
    got, plain = _out(d / "c.safetensors"), _out(d / "a.safetensors")
    assert c["mode"] == "partial" and torch.isfinite(got).all() and not torch.equal(got, plain)


def test_a_whole_sd15_checkpoint_steps_its_unet_alone(cli, tmp_path):
    """A full checkpoint (UNet, CLIP-L, VAE; header-faithful sparse: zeros) — only the UNet is loaded and
    run; shapes are what is checked."""
    from engine.formats.safetensors import write_sparse

    manifest = json.loads(data_file(SD15_MANIFEST).read_text())["tensors"]
    ckpt = write_sparse(
        tmp_path / "sd15.safetensors", [(k, v["dtype"], tuple(v["shape"])) for k, v in manifest.items()]
    )
    r = _step(
        cli,
        "--model",
        str(ckpt),
        "--size",
        "64x48",
        "--vram-budget",
        "0",
        "--out",
        str(tmp_path / "o.safetensors"),
    )
    assert r["architecture"] == "sd1" and r["component"] == "unet" and r["mode"] == "partial"
    assert r["resident_bytes"] == 0 and r["streamed_bytes_per_step"] == 859520964 * 4
    out = _out(tmp_path / "o.safetensors")
    assert out.shape == (1, 4, 6, 8) and torch.isfinite(out).all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return d, write(d / "sd1.safetensors", random_weights(unet_rows(SD1_TINY)))


def test_step_text_output_and_inputs(cli, tiny):
    d, model = tiny
    save_tensors(d / "in.safetensors", {"x": torch.randn(2, 4, 8, 8), "timesteps": torch.tensor([10.0, 500.0]),
                                        "context": torch.randn(2, 77, 768)})  # fmt: skip
    r = cli("step", "--model", str(model), "--inputs", str(d / "in.safetensors"), "--steps", "2", "--cpu")
    assert r.returncode == 0, r.stderr
    assert "sd1 unet (ldm naming) on cpu in float32, full" in r.stdout and "2 step(s)" in r.stdout
    assert "output [2, 4, 8, 8]" in r.stdout and "ignored" not in r.stdout
    # a tensor this model does not take (SDXL's ADM vector, a misspelt name) is run without, and said
    save_tensors(d / "extra.safetensors", {"x": torch.randn(1, 4, 8, 8), "timesteps": torch.tensor([10.0]),
                                           "context": torch.randn(1, 77, 768), "y": torch.randn(1, 2816),
                                           "timestep": torch.tensor([3.0])})  # fmt: skip
    r = cli("step", "--model", str(model), "--inputs", str(d / "extra.safetensors"), "--cpu")
    assert r.returncode == 0, r.stderr
    assert "ignored input(s) timestep, y: this model takes x, timesteps, context" in r.stdout
    r = cli("step", "--model", str(model), "--inputs", str(d / "extra.safetensors"), "--cpu", "--json")
    assert json.loads(r.stdout)["ignored_inputs"] == ["timestep", "y"]


def test_a_damaged_layout_is_a_format_error_not_a_torch_error(cli, tmp_path):
    """Header edits that keep every size consistent -- a conv weight stored flat, a norm with an int8
    bias, a linear weight with an extra axis, a conv kernel folded into its input channels, a norm
    whose weight is gone -- are exit 3 naming the layer or the misfit, not torch's missing `forward`,
    `kernel_size`, `Given groups=` or "'Module' object has no attribute 'weight'" out of the step
    (fuzzes of such edits on SDXL and FLUX.1 layouts, safetensors and GGUF, found all five)."""
    base = random_weights(unet_rows(SD1_TINY))
    p = PREFIX + "output_blocks.1.0."
    conv, norm = p + "out_layers.3.weight", PREFIX + "output_blocks.8.1.norm.bias"
    lin = next(k for k in base if k.endswith("attn1.to_q.weight"))
    edits = {
        "flat": (conv, base[conv].reshape(-1), "holds weight float32"),
        "int8": (norm, torch.zeros(4 * base[norm].numel(), dtype=torch.int8), "bias int8"),
        "axis": (lin, base[lin].unsqueeze(-1), "do not compute as a sd1 unet"),
        "fold": (conv, base[conv].reshape(base[conv].shape[0], -1), "damaged or edited file"),
        "gone": (norm.replace(".bias", ".weight"), None, "'output_blocks.8.1.norm' holds bias float32"),
    }
    for name, (key, t, says) in edits.items():
        edited = {**base, key: t} if t is not None else {k: v for k, v in base.items() if k != key}
        model = write(tmp_path / f"{name}.safetensors", edited)
        r = cli("step", "--model", str(model), "--size", "64x64", "--cpu")
        assert r.returncode == 3 and says in r.stderr and "damaged or edited file" in r.stderr, (
            name,
            r.stderr,
        )


def test_step_exit_codes(cli, tiny):
    d, model = tiny
    r = cli("step", "--model", str(model), "--size", "60x64", "--cpu")
    assert r.returncode == 3 and "multiples of 8" in r.stderr
    r = cli("step", "--model", str(model), "--size", "big", "--cpu")
    assert r.returncode == 2
    save_tensors(d / "bad.safetensors", {"x": torch.randn(1, 4, 8, 8)})
    r = cli("step", "--model", str(model), "--inputs", str(d / "bad.safetensors"), "--cpu")
    assert r.returncode == 3 and "missing input(s) timesteps, context" in r.stderr
    (d / "junk.safetensors").write_bytes(b"not a model")
    r = cli("step", "--model", str(d / "junk.safetensors"), "--cpu")
    assert r.returncode == 3
