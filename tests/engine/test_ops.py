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
