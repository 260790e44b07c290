"""Writing layouts: header-faithful sparse files, small dense ones, manifests, and the registry itself."""

from __future__ import annotations

import math

import pytest

from engine.formats import read_header
from engine.formats.safetensors import SafetensorsFile
from tests.support import synth


def test_sparse_write_is_header_faithful(tmp_path):
    p = synth.write(
        "sdxl_checkpoint", tmp_path / "sdxl.safetensors", metadata={"modelspec.architecture": "x"}
    )
    h = read_header(p)
    rows = synth.layout("sdxl_checkpoint")
    assert {k: (d, s) for k, d, s in rows} == {k: (t.dtype, tuple(t.shape)) for k, t in h.tensors.items()}
    assert h.metadata == {"modelspec.architecture": "x"}
    # an fp16 SDXL base is ~6.9 GB of data; on disk the hole costs next to nothing
    assert h.data_size == synth.nbytes(rows) > 6_000_000_000
    assert p.stat().st_size == h.data_start + h.data_size
    assert p.stat().st_blocks * 512 < 4 << 20


def test_dense_write_is_deterministic_and_readable(tmp_path):
    rows = [r for r in synth.layout("sd_vae") if r[0].startswith(("decoder.conv_in", "post_quant"))]
    a = synth.write(rows, tmp_path / "a.safetensors", dense=True, seed=3)
    b = synth.write(rows, tmp_path / "b.safetensors", dense=True, seed=3)
    c = synth.write(rows, tmp_path / "c.safetensors", dense=True, seed=4)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    with SafetensorsFile(a) as f:
        w = f.tensor("decoder.conv_in.weight")
        assert tuple(w.shape) == (512, 4, 3, 3) and f.tensor("post_quant_conv.bias").dtype.itemsize == 2
        assert w.float().abs().max() > 0 and bool(w.float().isfinite().all())


def test_dense_write_refuses_big_layouts(tmp_path):
    with pytest.raises(ValueError, match="dense"):
        synth.write("sdxl_checkpoint", tmp_path / "x.safetensors", dense=True)
    assert not (tmp_path / "x.safetensors").exists()


def test_from_manifest_rows_write_and_read_back(tmp_path, shared_data):
    rows = synth.from_manifest(shared_data("manifests/flux1_dev_bfl_all_in_one.json"))
    p = synth.write(rows, tmp_path / "flux.safetensors")
    assert len(read_header(p).tensors) == len(rows) == 1439


@pytest.mark.parametrize("name", synth.names())
def test_every_layout_is_consistent(name):
    rows = synth.layout(name)
    keys = [k for k, _, _ in rows]
    assert len(keys) == len(set(keys)), "duplicate keys"
    assert all(all(isinstance(s, int) and s >= 0 for s in shape) for _, _, shape in rows)
    info = synth.info(name)
    assert info.name == name and info.kind
    # every key belongs to a declared component, except the few bookkeeping buffers ("other")
    prefixes = list(info.components.values())
    orphans = [k for k in keys if not any(k.startswith(p) for p in prefixes)]
    assert all("." not in k or k.startswith(("model_ema.", "edm_vpred.")) for k in orphans), orphans[:5]
    assert math.prod(rows[0][2]) >= 0


def test_unknown_layout_names_the_known_ones():
    with pytest.raises(KeyError, match="sd1_checkpoint"):
        synth.layout("no_such_model")


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_taef2_layout_equals_the_real_files(shared_data, part):
    """The TAESD-family layout, built from the taesd.py structure, matches the real TAEF2 state dicts."""
    torch = pytest.importorskip("torch")
    sd = torch.load(
        shared_data(f"weights/taef2_{part}.pth"), weights_only=True, map_location="cpu", mmap=True
    )
    ref = {k: ("F16", tuple(v.shape)) for k, v in sd.items()}
    assert all(v.dtype == torch.float16 for v in sd.values())
    assert {k: (d, s) for k, d, s in synth.layout(f"taef2_{part}", dtype="F16")} == ref


def test_modelspec_metadata_round_trips(tmp_path):
    md = synth.modelspec("sdxl", title="demo", prediction="v", trigger_phrase="xyz")
    p = synth.write("sdxl_unet", tmp_path / "u.safetensors", metadata=md, prefix="model.diffusion_model.")
    got = read_header(p).metadata
    assert got["modelspec.architecture"] == "stable-diffusion-xl-v1-base"
    assert got["modelspec.prediction_type"] == "v" and got["modelspec.trigger_phrase"] == "xyz"
    assert synth.modelspec("sd1", adapter="lora")["modelspec.architecture"] == "stable-diffusion-v1/lora"


@pytest.mark.parametrize("quant", ["scaled_fp8", "comfy_quant"])
def test_quantised_layouts_halve_the_linear_weights(tmp_path, quant):
    rows = synth.layout("t5xxl", dtype="F16")
    q = getattr(synth, quant)(rows)
    dts = {k: d for k, d, _ in q}
    linear = [k for k, _, s in rows if k.endswith(".weight") and len(s) == 2 and "shared" not in k]
    assert linear and all(dts[k] == "F8_E4M3" for k in linear)
    assert dts["shared.weight"] == "F16" and dts["encoder.final_layer_norm.weight"] == "F16"
    scale = "scale_weight" if quant == "scaled_fp8" else "weight_scale"
    assert all(dts[k[: -len("weight")] + scale] == "F32" for k in linear)
    assert ("scaled_fp8" in dts) == (quant == "scaled_fp8")
    assert all((k[: -len("weight")] + "comfy_quant" in dts) == (quant == "comfy_quant") for k in linear)
    h = read_header(synth.write(q, tmp_path / "q.safetensors"))
    assert len(h.tensors) == len(q) and h.data_size < 0.6 * synth.nbytes(rows)


def test_crc_of_zeros_matches_zlib():
    import zlib

    from tests.support.synth.ckpt import crc32_zeros

    for n in (0, 1, 3, 64, 1000, 65537, 1 << 20):
        assert crc32_zeros(n) == zlib.crc32(bytes(n))


def test_sparse_ckpt_loads_with_torch_exactly(tmp_path):
    """torch.load (weights_only, mmap) reads our pickled SD1 checkpoint back with every key, shape and
    dtype; the 2 GB of tensor data are holes."""
    import zipfile

    torch = pytest.importorskip("torch")
    from engine.formats.dtypes import dtype_name

    rows = synth.layout("sd1_checkpoint", dtype="F16")
    p = synth.write_ckpt(rows, tmp_path / "sd15.ckpt", extra={"global_step": 840000})
    assert p.stat().st_size > 2_000_000_000 and p.stat().st_blocks * 512 < 16 << 20
    with zipfile.ZipFile(p) as z:
        assert z.namelist()[0] == "sd15/data.pkl"
        z.read("sd15/data.pkl")  # zipfile checks this record's CRC (never read the 2 GB of holes)
    small = synth.write_ckpt("taesd_decoder", tmp_path / "taesd_decoder.pth", wrap=None)
    with zipfile.ZipFile(small) as z:
        assert z.testzip() is None  # every record's CRC, holes included (2.4 MB)
    ck = torch.load(p, mmap=True, weights_only=True, map_location="cpu")
    assert ck["global_step"] == 840000
    got = {k: (dtype_name(v.dtype), tuple(v.shape)) for k, v in ck["state_dict"].items()}
    assert got == {k: (d, s) for k, d, s in rows}
    assert list(ck["state_dict"]) == [k for k, _, _ in rows]  # order kept, as torch.save keeps it


def test_sparse_ckpt_beyond_4gb_uses_zip64(tmp_path):
    torch = pytest.importorskip("torch")
    rows = [("big", "F32", (1_100_000_000,)), ("small", "I64", (1, 77))]
    p = synth.write_ckpt(rows, tmp_path / "big.pth", wrap=None)
    sd = torch.load(p, mmap=True, weights_only=True)
    assert tuple(sd["big"].shape) == (1_100_000_000,) and sd["small"].dtype == torch.int64
    assert float(sd["small"].sum()) == 0.0  # holes read as zeros


def test_ema_shadows_follow_litema_naming():
    """LitEma keys: 'model_ema.' + the key after 'model.' with its dots removed (the rule diffusers'
    SD conversion uses to find them), plus decay and num_updates."""
    rows = synth.layout("sd1_checkpoint", ema=True)
    keys = {k for k, _, _ in rows}
    unet = [k for k in keys if k.startswith("model.diffusion_model.")]
    ema = {k for k in keys if k.startswith("model_ema.")}
    assert ema == {"model_ema." + "".join(k.split(".")[1:]) for k in unet} | {
        "model_ema.decay",
        "model_ema.num_updates",
    }
    assert len(rows) == len(synth.layout("sd1_checkpoint")) + len(unet) + 2


def test_module_command_lists_and_writes(tmp_path):
    import subprocess
    import sys

    from loadout_test_support import ROOT

    run = [sys.executable, "-m", "tests.support.synth"]
    out = subprocess.run([*run, "list"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0 and "sdxl_checkpoint" in out.stdout and "flux2_dev_transformer" in out.stdout
    target = tmp_path / "sd15.ckpt"
    done = subprocess.run([*run, "write", "sd1_checkpoint", str(target), "--ckpt"], cwd=ROOT, timeout=120)
    assert done.returncode == 0 and target.stat().st_size > 2_000_000_000
    bad = subprocess.run(
        [*run, "write", "no_such", str(tmp_path / "x")], capture_output=True, cwd=ROOT, timeout=120
    )
    assert bad.returncode == 2 and not (tmp_path / "x").exists()


def test_info_follows_the_options():
    full = synth.info("sd3_medium")
    assert set(full.components) == {"transformer", "vae", "clip_l", "clip_g", "t5xxl"}
    bare = synth.info("sd3_medium", clip=False, t5xxl=False)
    assert set(bare.components) == {"transformer", "vae"}
    assert synth.info("sdxl_checkpoint", v_pred=True).prediction == "v"
    assert synth.info("flux1_dev_transformer", prefix="model.diffusion_model.").components == {
        "transformer": "model.diffusion_model."
    }
