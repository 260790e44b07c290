"""CausalConv3d's replicate padding (`pad="replicate"`, `"replicate_time"`): the whole convolution equals
F.pad's replicate padding then a plain convolution, and chunking through a Stream, slicing and a fused
norm give the same bits as the whole call."""

import pytest
import torch
import torch.nn.functional as F

from engine import ops
from engine.vae.causal_conv import CausalConv3d, Stream


def _conv(pad: str, kernel=(3, 3, 3), padding=(1, 1, 1)) -> CausalConv3d:
    torch.manual_seed(3)
    conv = CausalConv3d(6, 5, kernel, padding=padding, pad=pad)
    with torch.no_grad():  # the castable ops' parameters start empty
        conv.weight.copy_(0.1 * torch.randn_like(conv.weight))
        conv.bias.copy_(torch.randn_like(conv.bias))
    return conv


def _reference(conv: CausalConv3d, x: torch.Tensor, pad: str) -> torch.Tensor:
    pl, pr, pt, pb = conv.space_pad
    hist = conv.history
    if pad == "replicate":
        xp = F.pad(x, (pl, pr, pt, pb, hist, 0), mode="replicate")
    else:  # replicate_time: the first frame repeated, zero rows and columns
        xp = torch.cat([x[:, :, :1]] * hist + [x], dim=2)
        xp = F.pad(xp, (pl, pr, pt, pb))
    return F.conv3d(xp, conv.weight, conv.bias)


@pytest.mark.parametrize("pad", ["replicate", "replicate_time"])
def test_replicate_padding_equals_f_pad_whole_chunked_and_sliced(pad):
    conv = _conv(pad)
    x = torch.randn(1, 6, 5, 7, 9)
    with torch.inference_mode():
        want = _reference(conv, x, pad)
        whole = conv.step(x, None)
        assert (whole - want).abs().max() < 1e-5
        for n in (1, 2):
            s = Stream()
            parts = torch.cat([conv.step(x[:, :, a : a + n], s) for a in range(0, 5, n)], dim=2)
            assert torch.equal(parts, whole), n
            assert torch.equal(conv.step(x, Stream(), frames=n), whole), n


def test_replicate_padding_with_a_fused_norm_and_a_chunk_of_one_frame():
    """A first chunk of one frame (fewer frames than the history) starts the clip right, and the norm's
    SiLU is what gets replicated."""
    conv = _conv("replicate")
    norm = ops.ChannelRMSNorm(6)
    with torch.no_grad():
        norm.gamma.copy_(1 + 0.1 * torch.randn_like(norm.gamma))
    x = torch.randn(1, 6, 4, 6, 5)
    with torch.inference_mode():
        want = _reference(conv, F.silu(norm(x)), "replicate")
        s = Stream()
        got = torch.cat([conv.step(x[:, :, a : a + 1], s, norm) for a in range(4)], dim=2)
        assert (got - want).abs().max() < 1e-5
        assert torch.equal(conv.sliced(x, Stream(), norm, 1), conv.step(x, Stream(), norm))


def test_zero_padding_is_unchanged_and_a_bad_mode_is_refused():
    conv = _conv("zeros")
    x = torch.randn(1, 6, 3, 5, 5)
    with torch.inference_mode():
        xp = F.pad(x, (1, 1, 1, 1, 2, 0))
        assert (conv.step(x, None) - F.conv3d(xp, conv.weight, conv.bias)).abs().max() < 1e-5
    with pytest.raises(ValueError, match="pad"):
        CausalConv3d(2, 2, 3, padding=1, pad="reflect")


def test_spatial_only_replicate_padding():
    """A 1x3x3 convolution (no history): only the borders replicate."""
    conv = _conv("replicate", kernel=(1, 3, 3), padding=(0, 1, 1))
    x = torch.randn(1, 6, 2, 5, 6)
    with torch.inference_mode():
        want = F.conv3d(F.pad(x, (1, 1, 1, 1, 0, 0), mode="replicate"), conv.weight, conv.bias)
        assert (conv.step(x, Stream()) - want).abs().max() < 1e-5
