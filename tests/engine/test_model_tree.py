"""Components: module trees holding exactly the file's tensors, typed from their own weights."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from residency_files import SD15_MANIFEST, SD15_PREFIXES, write_components, write_dense

from engine import ops
from engine.errors import FormatError
from engine.formats.safetensors import TensorInfo, write_sparse
from engine.model import Component, build_components
from engine.model.tree import classify


@pytest.fixture(scope="module")
def sd15_sparse(tmp_path_factory):
    from loadout_test_support import data_file

    manifest = json.loads(data_file(SD15_MANIFEST).read_text())["tensors"]
    p = tmp_path_factory.mktemp("sd15") / "sd15.safetensors"
    write_sparse(p, [(k, v["dtype"], tuple(v["shape"])) for k, v in manifest.items()])
    return p, manifest


def test_sd15_components_hold_exactly_the_file_keys(sd15_sparse):
    path, manifest = sd15_sparse
    comps = build_components(path, SD15_PREFIXES)
    for name, c in comps.items():
        want = {k for k in manifest if k.startswith(c.prefix)}
        assert {c.prefix + k for k in c.module.state_dict()} == want, name
        # built on the mmap: every byte is in the disk tier, and the tensors say so themselves
        assert c.tier_bytes() == {"device": 0, "ram": 0, "disk": c.file_bytes}
        assert c.measured_tiers() == c.tier_bytes()
    kinds = {n: Counter(u.kind for u in c.units) for n, c in comps.items()}
    assert kinds["unet"] == {
        "linear": 184,
        "conv2d": 98,
        "layernorm": 48,
        "groupnorm": 61,
    }  # 16 transformers × 3
    assert kinds["vae"] == {"conv2d": 72, "groupnorm": 52}
    assert kinds["clip_l"] == {"linear": 72, "layernorm": 25, "embedding": 2, "plain": 1}
    unet = comps["unet"].module
    assert isinstance(unet.get_submodule("input_blocks.1.1.norm"), ops.GroupNorm)  # spatial transformer
    assert isinstance(unet.get_submodule("input_blocks.1.1.transformer_blocks.0.norm1"), ops.LayerNorm)
    assert isinstance(unet.get_submodule("input_blocks.0.0"), ops.Conv2d)
    clip = comps["clip_l"].module
    assert isinstance(clip.get_submodule("text_model.embeddings.token_embedding"), ops.Embedding)
    assert clip.get_buffer("text_model.embeddings.position_ids").dtype == torch.int64


def _info(shape, dtype="F16"):
    return TensorInfo("x", dtype, tuple(shape), 0, 0)


@pytest.mark.parametrize(
    "path,tensors,kind",
    [
        ("proj", {"weight": _info((4, 8)), "bias": _info((4,))}, "linear"),
        ("proj", {"weight": _info((4, 8))}, "linear"),
        ("emb.token_embedding", {"weight": _info((10, 8))}, "embedding"),
        ("conv", {"weight": _info((4, 3, 3, 3)), "bias": _info((4,))}, "conv2d"),
        ("conv", {"weight": _info((4, 3, 3))}, "conv1d"),
        ("conv", {"weight": _info((4, 3, 1, 3, 3))}, "conv3d"),
        ("out.0", {"weight": _info((64,)), "bias": _info((64,))}, "groupnorm"),
        ("encoder.layers.0.layer_norm1", {"weight": _info((64,)), "bias": _info((64,))}, "layernorm"),
        ("transformer.resblocks.0.ln_1", {"weight": _info((64,)), "bias": _info((64,))}, "layernorm"),
        ("t.blocks.3.norm2", {"weight": _info((64,)), "bias": _info((64,))}, "layernorm"),
        ("input_blocks.1.1.norm", {"weight": _info((64,)), "bias": _info((64,))}, "groupnorm"),
        ("block.0.layer.0.layer_norm", {"weight": _info((64,))}, "rmsnorm"),
        ("x", {"scale": _info((64,))}, "plain"),
        ("x", {"weight": _info((4, 8)), "bias": _info((5,))}, "plain"),
        ("x", {"weight": _info((4,), "I64")}, "plain"),
        ("mlp.experts", {"gate_up_proj": _info((8, 64, 32)), "down_proj": _info((8, 16, 64))}, "experts"),
        ("mlp.experts", {"gate_up_proj": _info((8, 64, 32)), "down_proj": _info((4, 16, 64))}, "plain"),
    ],
)
def test_classification_rule(path, tensors, kind):
    assert classify(path, tensors) == kind


def test_forward_from_disk_tier_equals_torch_and_loaded(tmp_path):
    p = write_components(tmp_path / "m.safetensors", {"a": [64, 128]})
    c = Component("a", p, "a.", compute_dtype="float32")
    ref = {k: v.float() for k, v in __import__("safetensors.torch").torch.load_file(p).items()}
    x = torch.randn(3, 256)
    want = F.linear(x, ref["a.l1.weight"], ref["a.l1.bias"])
    assert c.units[0].tier == "disk" and c.module.l1.offload  # streams from the mmap, cast on the fly
    assert torch.equal(c.module.l1(x), want)
    for u in c.units:
        c.move_unit(u, "device")  # on the CPU: a real copy in RAM, fp16 storage, fp32 compute
    assert c.module.l1.weight.dtype == torch.float16 and not c.module.l1.offload
    assert torch.equal(c.module.l1(x), want)
    assert c.measured_tiers() == c.tier_bytes() == {"device": c.file_bytes, "ram": 0, "disk": 0}
    ln = c.module.final_layer_norm
    torch.testing.assert_close(
        ln(x), F.layer_norm(x, (256,), ref["a.final_layer_norm.weight"], ref["a.final_layer_norm.bias"])
    )


def test_conv_and_groupnorm_run_their_own_forward(tmp_path):
    p = write_dense(
        tmp_path / "c.safetensors",
        [
            ("m.conv.weight", "F32", (8, 4, 3, 3)),
            ("m.conv.bias", "F32", (8,)),
            ("m.norm_out.weight", "F32", (64,)),
            ("m.norm_out.bias", "F32", (64,)),
        ],
    )
    c = Component("vae", p, "m.")
    sd = __import__("safetensors.torch").torch.load_file(p)
    x = torch.randn(1, 4, 9, 9)
    torch.testing.assert_close(c.module.conv(x), F.conv2d(x, sd["m.conv.weight"], sd["m.conv.bias"]))
    y = torch.randn(1, 64, 5, 5)
    gn = c.module.norm_out
    assert gn.num_groups == 32
    torch.testing.assert_close(gn(y), F.group_norm(y, 32, sd["m.norm_out.weight"], sd["m.norm_out.bias"]))


def test_storage_dtype_override_casts_on_load(tmp_path):
    p = write_dense(tmp_path / "f.safetensors", [("m.l.weight", "F32", (16, 8)), ("m.l.bias", "F32", (16,))])
    c = Component("unet", p, "m.", storage_dtype="bfloat16", compute_dtype="float32")
    assert c.full_bytes("device") == (16 * 8 + 16) * 2 and c.full_bytes("disk") == (16 * 8 + 16) * 4
    for u in c.units:
        c.move_unit(u, "device")
    assert c.module.l.weight.dtype == torch.bfloat16
    assert c.tier_bytes()["device"] == c.full_bytes("device") == c.measured_tiers()["device"]


def test_a_prefix_with_no_tensors_is_a_clear_error(tmp_path):
    p = write_components(tmp_path / "m.safetensors", {"a": [8]})
    with pytest.raises(FormatError, match="no tensors start with"):
        Component("vae", p, "first_stage_model.")


def test_components_from_detection(sd15_sparse):
    path, _ = sd15_sparse
    comps = build_components(path)  # prefixes from engine.detect
    assert set(comps) == {"unet", "clip_l", "vae"}
    assert comps["unet"].prefix == "model.diffusion_model."


def test_ops_of_one_shape_share_no_state(sd15_sparse):
    """Ops are copied from one meta module per shape: each must still be its own module — its own
    parameters once bound, hooks, patch lists and submodules."""
    path, _ = sd15_sparse
    unet = build_components(path, SD15_PREFIXES)["unet"]
    convs = [
        u.module
        for u in unet.units
        if type(u.module) is ops.Conv2d and u.module.weight.shape == (320, 320, 3, 3)
    ]
    a, b = convs[:2]
    assert len(convs) > 2 and a is not b
    assert a.weight is not b.weight and a.weight.data_ptr() != b.weight.data_ptr()
    for name in ("_parameters", "_buffers", "_modules", "_forward_hooks", "_forward_pre_hooks"):
        assert getattr(a, name) is not getattr(b, name)
    assert a.weight_functions is not b.weight_functions
    a.register_forward_hook(lambda *args: None)
    a.weight_functions.append(object())
    assert not b._forward_hooks and not b.weight_functions
    assert a.stride == b.stride == (1, 1) and a.kernel_size == (3, 3) and a.in_channels == 320
