"""GGUF tensors dequantized in torch: bit for bit what llama.cpp's gguf-py computes in numpy, for every
ggml type Loadout reads (the lattice IQ1-IQ3 types and NVFP4 through gguf-py itself), read back from
files gguf-py wrote; and castable ops that hold the
quantized bytes and dequantize them per forward, before any LoRA patch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine import ops
from engine.errors import FormatError, UnsupportedModel
from engine.formats.gguf import read_gguf
from engine.quant import SUPPORTED, QuantSpec, block_layout, check_supported, dequantize

gguf = pytest.importorskip("gguf")  # llama.cpp's gguf-py: the test-only reference
np = pytest.importorskip("numpy")
T = gguf.GGMLQuantizationType

# Byte offsets of each block's ggml_half scales (ggml-common.h), set to finite random halves in
# random blocks: random bytes there would be NaN or inf about 1 time in 32.
HALVES = {
    "Q8_0": (0,),
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
    "TQ1_0": (52,),
    "TQ2_0": (64,),
    "MXFP4": (),  # an E8M0 exponent byte: every value is a finite power of two
    "IQ1_S": (0,),
    "IQ1_M": (),  # its half scale is spread over four words' top nibbles: see _random_bytes
    "IQ2_XXS": (0,),
    "IQ2_XS": (0,),
    "IQ2_S": (0,),
    "IQ3_XXS": (0,),
    "IQ3_S": (0,),
    "NVFP4": (),  # four UE4M3 scales: finite for every byte (0x7F reads 0)
}
FLOAT_SHAPES = [(7, 13), (3,), (2, 3, 5), (1, 1)]


def _shapes(name: str) -> list[tuple[int, ...]]:
    block, _ = block_layout(name)
    if block == 1:
        return FLOAT_SHAPES
    # rows are whole blocks; the row count (and other dims) need not be anything in particular
    return [(block,), (7, block * 3), (2, 3, block * 2), (5, block)]


def _random_bytes(name: str, shape, rng) -> np.ndarray:
    """Valid random data of `shape` as the file stores it (byte shape, uint8): random quants, random
    finite scales (normal, subnormal and zero halves), random float values for the float types."""
    block, size = block_layout(name)
    if block == 1:
        x = (rng.standard_normal(shape) * 3).astype(np.float32)
        return gguf.quants.quantize(x, T[name]).view(np.uint8) if name != "F32" else x.view(np.uint8)
    n = int(np.prod(shape, dtype=np.int64)) // block
    raw = rng.integers(0, 256, size=(n, size), dtype=np.uint8)
    scales = (rng.standard_normal((n, len(HALVES[name]))) * 0.05).astype(np.float16)
    scales[::7] = np.float16(3e-6)  # subnormal
    scales[::11] = np.float16(-0.0)
    for i, off in enumerate(HALVES[name]):
        raw[:, off : off + 2] = scales[:, i : i + 1].view(np.uint8)
    if name == "MXFP4":  # exponents up to 2^122: the largest level (12) times it stays finite
        raw[:, 0] %= 250
    if name == "IQ1_M":  # bit 14 of the scale (its top exponent bit) is bit 6 of the last byte: clear
        raw[:, 55] &= 0xBF  # it, and the exponent is never all ones (no inf or NaN)
    if shape[-1] % block:  # rows that are not whole blocks (a conv weight): flat bytes
        return raw.reshape(-1)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


def _quantized_bytes(name: str, shape, rng) -> np.ndarray | None:
    """Real float data quantized by gguf-py (None where it has no numpy quantizer for the type)."""
    x = rng.standard_normal(shape).astype(np.float32)
    try:
        q = gguf.quants.quantize(x, T[name])
    except NotImplementedError:
        return None
    return q.view(np.uint8) if name != "F32" else x.view(np.uint8)


def _write(path, tensors: dict[str, tuple[np.ndarray, str]]) -> None:
    w = gguf.GGUFWriter(str(path), arch="loadout-test")
    for key, (raw, name) in tensors.items():
        w.add_tensor(key, raw, raw_dtype=T[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _read(path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """name -> (ggml type, torch-order shape, the raw bytes) via our header reader."""
    out = {}
    for t in read_gguf(path).tensors.values():
        raw = np.fromfile(path, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        out[t.name] = (t.ggml_type, t.shape, raw)
    return out


def _reference(raw: np.ndarray, name: str, shape) -> torch.Tensor:
    _, size = block_layout(name)
    ref = gguf.quants.dequantize(raw.reshape(*shape[:-1], -1), T[name])
    assert ref.dtype == np.float32 and tuple(ref.shape) == tuple(shape)
    return torch.from_numpy(np.ascontiguousarray(ref))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


@pytest.mark.parametrize("name", SUPPORTED)
def test_bit_exact_against_gguf_numpy(tmp_path, name):
    rng = np.random.default_rng(sum(map(ord, name)))
    tensors = {}
    for i, shape in enumerate(_shapes(name)):
        tensors[f"random.{i}"] = (_random_bytes(name, shape, rng), name)
        q = _quantized_bytes(name, shape, rng)
        if q is not None:
            tensors[f"quantized.{i}"] = (q, name)
    path = tmp_path / f"{name}.gguf"
    _write(path, tensors)
    read = _read(path)
    assert set(read) == set(tensors)
    for key, (ggml_type, shape, raw) in read.items():
        assert ggml_type == name
        ref = _reference(raw, name, shape)
        ours = dequantize(torch.from_numpy(raw), name, shape)
        assert ours.dtype == torch.float32 and ours.shape == ref.shape, key
        assert torch.equal(ours, ref), key
        assert torch.equal(_bits(ours), _bits(ref)), key  # signed zeros too


def test_the_reference_reader_sees_the_same_bytes(tmp_path):
    rng = np.random.default_rng(1)
    _write(tmp_path / "m.gguf", {"w": (_random_bytes("Q4_K", (3, 512), rng), "Q4_K")})
    ours = _read(tmp_path / "m.gguf")["w"][2]
    (ref,) = gguf.GGUFReader(str(tmp_path / "m.gguf")).tensors
    assert np.array_equal(ours, np.asarray(ref.data).reshape(-1))


@pytest.mark.parametrize(
    "name", ["Q4_0", "Q5_1", "Q3_K", "Q6_K", "TQ1_0", "MXFP4", "IQ2_XXS", "BF16", "F16", "F32"]
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_other_dtypes_round_the_float32_values_once(name, dtype):
    rng = np.random.default_rng(2)
    shape = _shapes(name)[1]
    raw = torch.from_numpy(_random_bytes(name, shape, rng).reshape(-1))
    exact = dequantize(raw, name, shape)
    assert torch.equal(dequantize(raw, name, shape, dtype), exact.to(dtype))


def test_a_big_tensor_is_decoded_in_chunks_with_the_same_result(monkeypatch):
    from engine.quant import kernels

    rng = np.random.default_rng(3)
    raw = torch.from_numpy(_random_bytes("Q5_K", (37, 512), rng).reshape(-1))
    whole = dequantize(raw, "Q5_K", (37, 512))
    monkeypatch.setitem(kernels.CHUNK_ELEMENTS, "cpu", 3 * 256)  # 3 blocks a pass, a ragged last one
    assert torch.equal(dequantize(raw, "Q5_K", (37, 512)), whole)


def test_blocks_at_any_offset_and_in_any_shape():
    rng = np.random.default_rng(4)
    raw = _random_bytes("Q8_0", (4, 64), rng).reshape(-1)
    padded = torch.from_numpy(np.concatenate([np.zeros(3, np.uint8), raw]))[3:]  # odd storage offset
    assert torch.equal(
        dequantize(padded, "Q8_0", (4, 64)), dequantize(torch.from_numpy(raw), "Q8_0", (4, 64))
    )
    f16 = torch.from_numpy(
        np.concatenate([np.zeros(1, np.uint8), _random_bytes("F16", (3, 5), rng).reshape(-1)])
    )
    assert dequantize(f16[1:], "F16", (3, 5)).shape == (3, 5)
    # the byte shape does not matter, only the logical one: ComfyUI-GGUF stores some conv weights
    # reshaped and records the original shape (comfy.gguf.orig_shape.*)
    as_rows = torch.from_numpy(raw.reshape(4, -1))
    assert dequantize(as_rows, "Q8_0", (8, 4, 2, 4)).shape == (8, 4, 2, 4)


@pytest.mark.parametrize("name", ["Q8_1", "Q8_K", "Q1_0", "I8", 15, 9999])
def test_unsupported_types_are_named(name):
    label = {15: "Q8_K", 9999: "ggml type 9999"}.get(name, name)
    for call in (
        lambda: check_supported(name),
        lambda: QuantSpec(name, (256,)),
        lambda: dequantize(torch.zeros(66, dtype=torch.uint8), name, (256,)),
    ):
        with pytest.raises(UnsupportedModel, match=label) as e:
            call()
        assert "Q8_0" in e.value.message  # says what would load


def test_sizes_that_do_not_fit_are_format_errors():
    with pytest.raises(FormatError, match="whole blocks"):
        QuantSpec("Q4_0", (3, 100))
    with pytest.raises(FormatError, match="corrupt"):
        dequantize(torch.zeros(17, dtype=torch.uint8), "Q4_0", (32,))
    with pytest.raises(TypeError):
        dequantize(torch.zeros(18, dtype=torch.int8), "Q4_0", (32,))
    assert QuantSpec("Q4_K", [3, 512]).nbytes == 3 * 2 * 144


# -- castable ops holding quantized weights ------------------------------------------------------


def _quantized_op(make, name, shape, seed=0):
    rng = np.random.default_rng(seed)
    raw = torch.from_numpy(_random_bytes(name, shape, rng).reshape(-1))
    spec = QuantSpec(name, shape)
    op = make()
    ops.hold_quantized(op, "weight", raw, spec)
    return op, dequantize(raw, name, shape)


@pytest.mark.parametrize("name", ["Q4_K", "IQ2_XXS"])  # a torch decoder; one through gguf-py
def test_linear_with_a_quantized_weight_matches_the_float_weight(name):
    op, w = _quantized_op(lambda: ops.Linear(512, 24, device="meta"), name, (24, 512))
    op.bias = nn.Parameter(torch.randn(24), requires_grad=False)
    x = torch.randn(3, 512)
    assert torch.equal(op(x), nn.functional.linear(x, w, op.bias))
    size = block_layout(name)[1]
    assert op.weight.dtype == torch.uint8 and op.weight.numel() == 24 * 2 * size  # holds the blocks
    assert ops.module_bytes(op) == 24 * 2 * size + 24 * 4  # what the ledger counts
    op.compute_dtype = torch.bfloat16
    ref = nn.functional.linear(x.bfloat16(), w.bfloat16(), op.bias.bfloat16())
    assert torch.equal(op(x), ref)


def test_conv_and_embedding_hold_quantized_weights():
    conv, w = _quantized_op(
        lambda: ops.Conv2d(4, 8, 3, padding=1, bias=False, device="meta"), "Q8_0", (8, 4, 3, 3)
    )
    x = torch.randn(2, 4, 6, 6)
    assert torch.equal(conv(x), nn.functional.conv2d(x, w, padding=1))
    emb, w = _quantized_op(lambda: ops.Embedding(12, 256, device="meta"), "Q6_K", (12, 256), 1)
    ids = torch.tensor([[0, 11, 3]])
    assert torch.equal(emb(ids), w[ids])


def test_a_lora_patch_applies_after_dequantization():
    op, w = _quantized_op(lambda: ops.Linear(256, 16, bias=False, device="meta"), "Q5_0", (16, 256), 3)
    delta = torch.randn(16, 256) * 0.01
    seen = []

    def patch(weight):
        seen.append((weight.dtype, tuple(weight.shape)))
        return weight + delta

    op.weight_functions.append(patch)
    op.compute_dtype = torch.float16
    x = torch.randn(2, 256)
    out = op(x)
    assert seen == [(torch.float32, (16, 256))]  # the exact dequantized values, logical shape
    assert torch.equal(out, nn.functional.linear(x.half(), (w + delta).half()))
    op.weight_functions.clear()  # unpatched again: the stored blocks were never touched
    assert torch.equal(op(x), nn.functional.linear(x.half(), w.half()))


def test_hold_quantized_checks_the_bytes():
    op = ops.Linear(32, 2, device="meta")
    with pytest.raises(ValueError):
        ops.hold_quantized(op, "weight", torch.zeros(35, dtype=torch.uint8), QuantSpec("Q8_0", (2, 32)))


@pytest.mark.cuda
@pytest.mark.parametrize("name", SUPPORTED)
def test_cuda_decodes_the_same_bits(name):
    rng = np.random.default_rng(5)
    shape = _shapes(name)[1]
    raw = torch.from_numpy(_random_bytes(name, shape, rng).reshape(-1))
    cpu = dequantize(raw, name, shape)
    gpu = dequantize(raw.cuda(), name, shape)
    assert gpu.device.type == "cuda" and torch.equal(_bits(gpu.cpu()), _bits(cpu))


# -- a GGUF file as components: quantized bytes in the ledger, dequantized per op ----------------


def _gguf_model(path, rng) -> dict[str, torch.Tensor]:
    """A small GGUF model (ComfyUI-GGUF's choices: 2-D weights quantized, 1-D and small ones F32,
    a conv weight reshaped to whole blocks with its original shape recorded). Returns the float
    tensors a loader must produce (dequantized in float32)."""
    w = gguf.GGUFWriter(str(path), arch="flux")
    expect = {}

    def add(key, raw, name, shape, stored=None):
        w.add_tensor(key, raw if stored is None else raw.reshape(stored), raw_dtype=T[name])
        expect[key] = dequantize(torch.from_numpy(raw.reshape(-1).copy()), name, shape)

    add("blocks.0.attn.qkv.weight", _random_bytes("Q4_K", (96, 256), rng), "Q4_K", (96, 256))
    add("blocks.0.attn.qkv.bias", _random_bytes("F32", (96,), rng), "F32", (96,))
    add("blocks.0.mlp.0.weight", _random_bytes("Q8_0", (64, 96), rng), "Q8_0", (64, 96))
    add("blocks.0.norm.weight", _random_bytes("F16", (96,), rng), "F16", (96,))
    add("blocks.0.norm.bias", _random_bytes("BF16", (96,), rng), "BF16", (96,))
    conv = _random_bytes("Q6_K", (16, 4, 4, 4), rng)  # 1,024 elements: rows of 4 are not blocks
    add("proj.weight", conv, "Q6_K", (16, 4, 4, 4), stored=(4, 210))  # 4 rows of one block
    w.add_array("comfy.gguf.orig_shape.proj.weight", [16, 4, 4, 4])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expect


def test_orig_shape_is_the_tensor_shape(tmp_path):
    from engine.formats import open_index

    _gguf_model(tmp_path / "m.gguf", np.random.default_rng(6))
    h = read_gguf(tmp_path / "m.gguf")
    assert h.tensors["proj.weight"].dims == (256, 4) and h.tensors["proj.weight"].shape == (16, 4, 4, 4)
    assert open_index(tmp_path / "m.gguf").tensors["proj.weight"].shape == (16, 4, 4, 4)


def test_bad_orig_shape_is_a_format_error(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "b.gguf"), arch="flux")
    w.add_tensor("w", np.zeros((2, 32), np.float32))
    w.add_array("comfy.gguf.orig_shape.w", [3, 32])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(FormatError, match="orig_shape"):
        read_gguf(tmp_path / "b.gguf")


def test_a_gguf_component_keeps_its_bytes_quantized(tmp_path):
    from engine.model import build_components

    path = tmp_path / "m.gguf"
    expect = _gguf_model(path, np.random.default_rng(7))
    (c,) = build_components(path, {"transformer": ""}).values()
    file_bytes = sum(t.nbytes for t in read_gguf(path).tensors.values())
    assert c.file_bytes == file_bytes < sum(t.numel() * 2 for t in expect.values())
    assert c.tier_bytes() == {"device": 0, "ram": 0, "disk": file_bytes} == c.measured_tiers()
    qkv = c.module.get_submodule("blocks.0.attn")
    # every tier holds the blocks, never a dequantized copy: a copy in RAM (the CPU's device tier),
    # then the mmap again
    for tier in ("device", "disk"):
        for u in c.units:
            c.move_unit(u, tier)
        assert c.tier_bytes()[tier] == file_bytes == c.measured_tiers()[tier]
        x = torch.randn(2, 256)
        w = expect["blocks.0.attn.qkv.weight"]
        assert qkv.qkv.weight.dtype == torch.uint8
        assert torch.equal(qkv.qkv(x), nn.functional.linear(x, w, expect["blocks.0.attn.qkv.bias"]))
    conv = c.module.get_submodule("proj")
    assert isinstance(conv, ops.Conv2d) and conv.quantized["weight"].shape == (16, 4, 4, 4)
    y = torch.randn(1, 4, 5, 5)
    assert torch.equal(conv(y), nn.functional.conv2d(y, expect["proj.weight"]))
    norm = c.module.get_submodule("blocks.0.norm")
    assert norm.weight.dtype == torch.float16 and not norm.quantized  # floats stay plain tensors


@pytest.mark.cuda
def test_a_gguf_component_on_cuda_moves_its_blocks(tmp_path):
    from engine.model import build_components

    path = tmp_path / "m.gguf"
    expect = _gguf_model(path, np.random.default_rng(8))
    built = build_components(path, {"transformer": ""}, device="cuda", storage="float32", compute="float32")
    (c,) = built.values()
    file_bytes = sum(t.nbytes for t in read_gguf(path).tensors.values())
    for tier in ("ram", "device"):
        for u in c.units:
            c.move_unit(u, tier)
        assert c.tier_bytes()[tier] == c.measured_tiers()[tier] == file_bytes
    x = torch.randn(2, 256, device="cuda")
    w, b = expect["blocks.0.attn.qkv.weight"].cuda(), expect["blocks.0.attn.qkv.bias"].cuda()
    assert torch.equal(c.module.get_submodule("blocks.0.attn.qkv")(x), nn.functional.linear(x, w, b))


def test_unsupported_types_in_a_file_name_the_tensor(tmp_path):
    from engine.formats.gguf import write_sparse_gguf
    from engine.model import build_components

    path = tmp_path / "q8k.gguf"  # llama.cpp's intermediate type: no file should hold it
    write_sparse_gguf(path, {"general.architecture": "flux"}, [("blocks.0.w.weight", "Q8_K", (8, 256))])
    with pytest.raises(UnsupportedModel, match=r"blocks\.0\.w\.weight.*Q8_K"):
        build_components(path, {"transformer": ""})


def test_loadout_load_puts_the_quantized_bytes_in_the_ledger(cli, tmp_path):
    """`loadout load flux1-dev-Q4_K.gguf` as a user runs it: a header-faithful FLUX.1-dev transformer
    in ComfyUI-GGUF's layout (bare keys; 2-D weights Q4_K or Q8_0, the rest F32), its data a hole."""
    import json

    from loadout_test_support import data_file

    from engine.formats.gguf import write_sparse_gguf

    manifest = json.loads(data_file("manifests/flux1_dev_bfl_all_in_one.json").read_text())["tensors"]
    pre, rows, bf16 = "model.diffusion_model.", [], 0
    for k, v in manifest.items():
        if k.startswith(pre):
            s = tuple(v["shape"])
            q = "F32" if len(s) == 1 else "Q4_K" if s[-1] % 256 == 0 else "Q8_0" if s[-1] % 32 == 0 else "F32"
            rows.append((k[len(pre) :], q, s))
            bf16 += 2 * int(np.prod(s))
    path = tmp_path / "flux1-dev-Q4_K.gguf"
    write_sparse_gguf(path, {"general.architecture": "flux", "general.quantization_version": 2}, rows)
    quantized = sum(t.nbytes for t in read_gguf(path).tensors.values())
    r = cli("load", str(path), "--vram-budget", "0.05", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["ledger"]
    assert row["name"] == "transformer" and row["full_bytes"] == quantized < bf16 / 3
    assert row["device_bytes"] > 0 and row["device_bytes"] + row["disk_bytes"] == quantized


def test_quantized_tensors_no_op_can_take_are_named(tmp_path):
    """A quantized weight whose bias does not fit it (an edited orig_shape) names the layer and its
    shapes; a quantized bare parameter (stable-diffusion.cpp's converter quantizes Wan's `modulation`)
    loads, held as its blocks, and reads dequantized (tests/engine/test_quant_sdcpp.py runs such files)."""
    from engine.denoise.common import held
    from engine.model import build_components

    rng = np.random.default_rng(8)
    for key, stored, orig, says in (
        (
            "blocks.0.mlp.0.weight",
            (64, 96),
            [96, 64],
            r"blocks.0.mlp.0: a Q8_0 layer whose tensors \(weight ",
        ),
        ("blocks.0.modulation", (6, 96), None, None),
    ):
        w = gguf.GGUFWriter(str(tmp_path / "m.gguf"), arch="flux")
        raw = _random_bytes("Q8_0", stored, rng)
        w.add_tensor(key, raw, raw_dtype=T["Q8_0"])
        w.add_tensor("blocks.0.mlp.0.bias", np.zeros(64, np.float32))
        if orig:
            w.add_array(f"comfy.gguf.orig_shape.{key}", orig)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if says is not None:
            with pytest.raises(UnsupportedModel, match=says):
                build_components(tmp_path / "m.gguf", {"transformer": ""})
            continue
        (comp,) = build_components(tmp_path / "m.gguf", {"transformer": ""}).values()
        block = comp.module.get_submodule("blocks.0")
        assert block.modulation.dtype == torch.uint8 and block.modulation.numel() == raw.size
        want = gguf.quants.dequantize(raw, T["Q8_0"])
        assert torch.equal(held(block, "modulation"), torch.from_numpy(want.reshape(stored)))
