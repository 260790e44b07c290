"""Castable ops: identical to torch.nn until asked to cast, move or patch, then still right."""

import pytest
import torch
from torch import nn

from engine import ops
from engine.errors import Cancelled
from engine.jobs import CancelToken

CASES = [
    (lambda: ops.Linear(8, 5), lambda: nn.Linear(8, 5), (3, 8)),
    (lambda: ops.Conv2d(4, 6, 3, padding=1), lambda: nn.Conv2d(4, 6, 3, padding=1), (2, 4, 7, 7)),
    (lambda: ops.Conv1d(4, 6, 3), lambda: nn.Conv1d(4, 6, 3), (2, 4, 9)),
    (lambda: ops.GroupNorm(2, 4), lambda: nn.GroupNorm(2, 4), (2, 4, 5, 5)),
    (lambda: ops.LayerNorm(8), lambda: nn.LayerNorm(8), (3, 8)),
]


def _copy(dst, src):
    with torch.no_grad():
        for (_, a), (_, b) in zip(
            sorted(dst.named_parameters()), sorted(src.named_parameters()), strict=True
        ):
            a.copy_(b + torch.randn_like(b) * 0.1)  # not the default init: norms start at 1/0
            b.copy_(a)


@pytest.mark.parametrize("make_op,make_ref,shape", CASES)
def test_plain_forward_matches_torch(make_op, make_ref, shape):
    torch.manual_seed(0)
    op, ref = make_op(), make_ref()
    _copy(op, ref)
    x = torch.randn(shape)
    assert torch.equal(op(x), ref(x))


@pytest.mark.parametrize("make_op,make_ref,shape", CASES)
def test_fp16_storage_computed_in_fp32(make_op, make_ref, shape):
    torch.manual_seed(0)
    op, ref = make_op(), make_ref()
    _copy(op, ref)
    op.half()
    op.compute_dtype = torch.float32
    x = torch.randn(shape)
    ref.load_state_dict({k: v.half().float() for k, v in ref.state_dict().items()})
    assert op.weight.dtype == torch.float16  # storage untouched
    torch.testing.assert_close(op(x), ref(x))


@pytest.mark.parametrize("make_op,make_ref,shape", CASES)
def test_weight_function_equals_baked_weight(make_op, make_ref, shape):
    torch.manual_seed(0)
    op, ref = make_op(), make_ref()
    _copy(op, ref)
    delta = torch.randn_like(op.weight) * 0.05
    op.weight_functions.append(lambda w: w + delta)
    with torch.no_grad():
        ref.weight.add_(delta)
    x = torch.randn(shape)
    assert torch.equal(op(x), ref(x))
    assert not torch.equal(op.weight, ref.weight)  # the stored weight was not changed


def test_embedding_and_rmsnorm():
    e = ops.Embedding(10, 4)
    with torch.no_grad():
        e.weight.copy_(torch.randn(10, 4))
    ids = torch.tensor([[1, 2, 9]])
    assert torch.equal(e(ids), e.weight[ids])
    n = ops.RMSNorm(4)
    with torch.no_grad():
        n.weight.fill_(2.0)
    x = torch.randn(3, 4)
    torch.testing.assert_close(n(x), x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * 2)


def test_cancel_scope_stops_the_next_op():
    token = CancelToken()
    model = nn.Sequential(ops.Linear(4, 4), ops.Linear(4, 4))
    calls = []

    def hook(*_):
        calls.append(1)
        token.cancel()

    model[0].register_forward_hook(hook)
    with ops.cancel_scope(token), pytest.raises(Cancelled):
        model(torch.randn(1, 4))
    assert calls == [1]
    model(torch.randn(1, 4))  # outside the scope nothing is checked


def test_castable_modules_and_bytes():
    m = nn.Sequential(ops.Linear(4, 3), nn.ReLU(), ops.GroupNorm(1, 3))
    names = [n for n, _ in ops.castable_modules(m)]
    assert names == ["0", "2"]
    assert ops.module_bytes(m[0]) == (4 * 3 + 3) * 4


# -- convolutions over few positions run as one GEMM on the CPU (ops.conv_as_gemm) ----------------------


@pytest.mark.parametrize(
    "cin,cout,size,stride,batch,bias",
    [(512, 384, 2, 1, 1, True), (512, 384, (3, 2), 1, 3, False), (640, 512, 4, 2, 2, True)],
)
def test_a_wide_convolution_over_few_positions_runs_as_a_gemm_and_equals_torchs(
    cin, cout, size, stride, batch, bias
):
    torch.manual_seed(0)
    op = ops.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)
    ref = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)
    _copy(op, ref)
    h, w = size if isinstance(size, tuple) else (size, size)
    x = torch.randn(batch, cin, h, w)
    assert ops.conv_as_gemm(x, op.weight, op.stride, op.padding, op.dilation, op.groups)
    with torch.no_grad():
        got, want = op(x), ref(x)
    assert got.shape == want.shape and got.is_contiguous()
    assert float((got - want).norm() / want.norm()) < 1e-5  # float32 sums over I·9 terms in another order


def test_the_gemm_rule_keeps_torchs_convolution_where_that_is_faster():
    w = torch.empty(1280, 1280, 3, 3)
    one = (1, 1)

    def gemm(x, weight=w, stride=one, padding=one, groups=1):
        return ops.conv_as_gemm(x, weight, stride, padding, one, groups)

    assert gemm(torch.empty(1, 1280, 8, 8))  # SD1.5's lowest level: weight-bound
    assert gemm(torch.empty(1, 1280, 16, 16), stride=(2, 2))  # its last downsample (8x8 out)
    assert not gemm(torch.empty(1, 1280, 32, 32))  # enough positions: oneDNN's own path wins
    assert not gemm(torch.empty(4, 1280, 8, 8))  # the batch's positions count together
    assert not gemm(torch.empty(1, 1280, 8, 8), weight=torch.empty(1280, 1280, 1, 1))  # 1x1: a GEMM already
    assert not gemm(torch.empty(1, 1280, 8, 8, dtype=torch.float16), weight=w.half())  # fp16 on the CPU
    assert not gemm(torch.empty(1, 1280, 8, 8), weight=torch.empty(1280, 640, 3, 3), groups=2)
    assert not gemm(torch.empty(1280, 8, 8))  # unbatched input


def test_the_gemm_convolution_gives_the_same_bits_wherever_the_weight_lives():
    """A streamed weight is computed from other memory than the resident one (at the same alignment):
    the result must not change, or a partial run would not equal the full run."""
    torch.manual_seed(1)
    op = ops.Conv2d(512, 256, 3, padding=1)
    x = torch.randn(1, 512, 3, 3)
    with torch.no_grad():
        op.weight.copy_(torch.randn(op.weight.shape) / 48)  # FromFile ops start uninitialised
        op.bias.copy_(torch.randn(256))
        want = op(x)
        block = torch.empty(op.weight.numel() + 64, dtype=torch.float32)
        shift = (op.weight.data_ptr() % 64 - block.data_ptr() % 64) % 64 // 4
        moved = block[shift : shift + op.weight.numel()].view_as(op.weight)
        moved.copy_(op.weight)
        assert moved.data_ptr() % 64 == op.weight.data_ptr() % 64
        op.weight = nn.Parameter(moved, requires_grad=False)
        assert torch.equal(op(x), want)


def test_group_statistics_from_channel_statistics():
    """The law of total variance: per-channel means and variances give each group's exactly, also for a
    channel that is constant and groups whose channels sit far apart."""
    g = torch.Generator().manual_seed(3)
    x = (
        torch.randn(2, 8, 6, 5, generator=g, dtype=torch.float64) * 2
        + torch.randn(2, 8, 1, 1, generator=g) * 40
    )
    x[1, 3] = 7.0
    var_c, mean_c = torch.var_mean(x, dim=(2, 3), correction=0)
    mean, var = ops.groups_of_channels(mean_c, var_c, 4)
    want_var, want_mean = torch.var_mean(x.reshape(2, 4, -1), dim=2, correction=0)
    assert mean.dtype == var.dtype == torch.float32
    torch.testing.assert_close(mean, want_mean.float(), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(var, want_var.float(), rtol=1e-6, atol=1e-5)
    w, b = torch.rand(8, dtype=torch.float64) + 0.5, torch.randn(8, dtype=torch.float64)
    got = ops.group_norm_with_stats(x.float(), 4, mean, var, w.float(), b.float(), 1e-6)
    torch.testing.assert_close(
        got, torch.nn.functional.group_norm(x, 4, w, b, 1e-6).float(), rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_group_norm_with_stats_rounds_once_as_torch_does(dtype):
    """A 16-bit GroupNorm with given statistics (a tiled decode's, a GPU's large groups) is computed in
    float32 and rounded once: channels whose means are ~16x their spread lose nothing to a shift
    rounded to 16 bits first (that gave 6x torch's RMS error)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(1, 64, 32, 32, generator=g) * 3 + torch.randn(1, 64, 1, 1, generator=g) * 50).to(dtype)
    w = (1 + 0.1 * torch.randn(64, generator=g)).to(dtype)
    b = (0.1 * torch.randn(64, generator=g)).to(dtype)
    want = torch.nn.functional.group_norm(x.double(), 32, w.double(), b.double(), 1e-6)
    var, mean = torch.var_mean(x.double().reshape(1, 32, -1), dim=2, correction=0)
    ours = ops.group_norm_with_stats(x, 32, mean, var, w, b, 1e-6)
    native = torch.nn.functional.group_norm(x, 32, w, b, 1e-6)
    assert ours.dtype == dtype

    def rms(y):
        return (y.double() - want).square().mean().sqrt().item()

    assert rms(ours) <= 1.1 * rms(native)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_large_groups_on_cuda_normalise_as_torch_does():
    """Above FAST_GN_ELEMS a GroupNorm on the GPU takes per-channel statistics (group_stats): the same
    result as torch's kernel to fp16 rounding, a constant channel included; below it, torch's own."""
    g = torch.Generator(device="cuda").manual_seed(0)
    shape = (2, 64, 512, 512)  # 2^19 elements per group of 2 channels
    x = (
        torch.randn(shape, device="cuda", generator=g) * 3
        + torch.randn(2, 64, 1, 1, device="cuda", generator=g) * 5
    )
    x[0, 5] = 2.5
    w = 1 + 0.1 * torch.randn(64, device="cuda", generator=g)
    b = 0.1 * torch.randn(64, device="cuda", generator=g)
    assert x[0, 0].numel() * 2 >= ops.FAST_GN_ELEMS
    want = torch.nn.functional.group_norm(x.double(), 32, w.double(), b.double(), 1e-6)
    torch.testing.assert_close(ops.group_norm(x, 32, w, b, 1e-6).double(), want, rtol=1e-4, atol=1e-4)
    h, wh, bh = x.half(), w.half(), b.half()
    native = torch.nn.functional.group_norm(h, 32, wh, bh, 1e-6).double()
    ours = ops.group_norm(h, 32, wh, bh, 1e-6)
    assert ours.dtype == torch.float16
    assert (ours.double() - want).abs().max() <= 2 * (native - want).abs().max()
    small = x[:, :, :8, :8].contiguous()
    assert torch.equal(
        ops.group_norm(small, 32, w, b, 1e-6), torch.nn.functional.group_norm(small, 32, w, b, 1e-6)
    )
