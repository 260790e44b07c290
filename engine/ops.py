"""Castable layers: torch modules whose weights may live elsewhere, or in another dtype, than the
computation, and may be patched on the fly.

Each op behaves exactly like its torch.nn counterpart until one of four things is set:
  * `offload`: the weights stay where they are (RAM, or the mmap on disk) and are moved to the
    input's device for each forward — how partially loaded models run;
  * `compute_dtype`: the weights are cast for each forward (fp8 storage on a device that cannot
    compute in fp8, or an fp16 VAE run in fp32 by the NaN guard);
  * `weight_functions` / `bias_functions`: callables applied to the (moved) weight before the cast —
    how a LoRA patches an offloaded module without baking it into the stored weight;
  * `quantized` (`hold_quantized`): the parameter is a GGUF tensor's raw uint8 blocks — what the
    module costs, moves between tiers and is counted by the ledger — and each forward dequantizes
    the moved bytes (engine.quant) before the patches and the cast.

The idea (keep weights where they are, cast them inside forward) is the one ComfyUI's ops.py uses;
this is our own implementation. Every forward checks the cancel token of the surrounding
`cancel_scope`, so a long decode or a streamed forward stops within one op of a Stop.
"""

from __future__ import annotations

import contextlib
import contextvars
import types
from collections.abc import Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from .jobs import CancelToken
from .quant import QuantSpec

WeightFunction = Callable[[torch.Tensor], torch.Tensor]

_token: contextvars.ContextVar[CancelToken | None] = contextvars.ContextVar(
    "loadout_cancel_token", default=None
)


@contextlib.contextmanager
def cancel_scope(token: CancelToken | None) -> Iterator[None]:
    """Make every castable op run inside this block check `token` (per thread / context)."""
    reset = _token.set(token)
    try:
        yield
    finally:
        _token.reset(reset)


def check_cancelled() -> None:
    token = _token.get()
    if token is not None:
        token.raise_if_cancelled()


class Castable:
    """Mixin: the cast/move/patch machinery shared by every op below."""

    offload: bool = False
    compute_dtype: torch.dtype | None = None
    non_blocking: bool = False
    # attr -> how to dequantize that parameter's raw bytes; set by hold_quantized or engine.model.tree
    quantized: Mapping[str, QuantSpec] = types.MappingProxyType({})
    # A streamed forward (engine.denoise.stream) sets `fetch` on offloaded ops: it returns the op's
    # tensors (attr -> tensor) already read ahead onto the compute device, in the stored dtype, so the
    # op casts and patches them exactly as it would its own.
    fetch: Callable[[Castable], dict[str, torch.Tensor]] | None = None
    weight_attr: str = "weight"  # the attribute holding the weight (BFL's RMSNorm calls it `scale`)

    def _castable_init(self) -> None:
        self.weight_functions: list[WeightFunction] = []
        self.bias_functions: list[WeightFunction] = []

    @property
    def needs_cast(self) -> bool:
        return (
            self.offload
            or self.compute_dtype is not None
            or bool(self.weight_functions or self.bias_functions or self.quantized)
        )

    def cast_params(self, like: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Weight and bias ready for computing with `like` (device of the input; dtype compute_dtype
        or the input's). Patches run on the stored dtype, then the result is cast — so an on-the-fly
        patch rounds exactly as a baked one would. A quantized weight moves as its raw bytes and is
        dequantized on the input's device."""
        check_cancelled()
        if self.fetch is not None:
            got = self.fetch(self)
            weight, bias = got.get(self.weight_attr), got.get("bias")
        else:
            weight = getattr(self, "weight", None)
            bias = getattr(self, "bias", None)
        wf, bf, q = self.weight_functions, self.bias_functions, self.quantized
        plain = not (wf or bf or q)
        if plain and not self.offload and self.compute_dtype is None:
            return weight, bias
        dtype = self.compute_dtype or like.dtype
        if not dtype.is_floating_point:
            dtype = _float_dtype(weight)
        if plain:
            # A weight already where and as the computation wants it (most ops of a full run) is used as
            # it is: _prepare's four no-op `to` calls cost ~5 us an op (a launch-bound step pays it often).
            dev = like.device
            if (weight is None or (weight.dtype == dtype and weight.device == dev)) and (
                bias is None or (bias.dtype == dtype and bias.device == dev)
            ):
                return weight, bias
        qw = q.get("weight")
        if qw is not None and hasattr(qw, "bind"):  # a scaled weight: its scale is a tensor of this op
            qw = qw.bind(self)
        return (
            _prepare(weight, like.device, dtype, wf, self.non_blocking, qw),
            _prepare(bias, like.device, dtype, bf, self.non_blocking, q.get("bias")),
        )


def _float_dtype(t: torch.Tensor | None) -> torch.dtype:
    return t.dtype if t is not None and t.is_floating_point() else torch.float32


def _prepare(t, device, dtype, functions, non_blocking, spec: QuantSpec | None = None):
    if t is None:
        return None
    t = t.to(device=device, non_blocking=non_blocking)
    if spec is not None:
        # Patches get the exact float32 values (what the blocks mean), so a patched quantized weight
        # is rounded once, to the compute dtype; unpatched, dequantize straight to it.
        t = spec.dequantize(t, torch.float32 if functions else dtype)
    for fn in functions:
        t = fn(t)
    return t.to(dtype)


def hold_quantized(op: Castable, attr: str, raw: torch.Tensor, spec: QuantSpec) -> None:
    """Make `op.<attr>` a quantized tensor: the parameter becomes `raw`, the uint8 blocks (so the
    module's bytes, its tier moves and the ledger count the quantized size), and `spec` tells forward
    how to dequantize them (the logical shape is spec.shape, not raw's)."""
    if raw.dtype != torch.uint8 or raw.numel() != spec.nbytes:
        raise ValueError(
            f"{spec.ggml_type} {spec.shape} is {spec.nbytes} uint8 bytes, not {raw.dtype} x {raw.numel()}"
        )
    op._parameters[attr] = nn.Parameter(raw, requires_grad=False)
    op.quantized = types.MappingProxyType({**op.quantized, attr: spec})


def _input_dtype(op: Castable, x: torch.Tensor) -> torch.Tensor:
    return x.to(op.compute_dtype) if op.compute_dtype is not None and x.dtype != op.compute_dtype else x


class FromFile(Castable):
    """Mixin for ops whose weights always come from a file: no random init at construction."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self._castable_init()

    def reset_parameters(self) -> None:
        pass


class Linear(FromFile, nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _input_dtype(self, x)
        w, b = self.cast_params(x)
        return F.linear(x, w, b)


class _Conv(FromFile):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _input_dtype(self, x)
        w, b = self.cast_params(x)
        return self._conv_forward(x, w, b)


class Conv1d(_Conv, nn.Conv1d):
    pass


class Conv2d(_Conv, nn.Conv2d):
    def _conv_forward(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.padding_mode == "zeros" and conv_as_gemm(
            x, w, self.stride, self.padding, self.dilation, self.groups
        ):
            return gemm_conv2d(x, w, b, self.stride, self.padding)
        return super()._conv_forward(x, w, b)


# On the CPU a convolution over few output positions with many channels is faster as one GEMM over the
# unfolded input. oneDNN reorders the whole weight into its blocked layout on every call (our weights
# are never prepacked: they may be streamed, patched or cast per call), a cost in the weight's size
# that outweighs the arithmetic once the output is small. SD1.5's 3×3 convolutions (2 AVX-512 cores,
# torch 2.13, benchmarks/bench_conv_gemm.py): 1280->1280 at 8×8 takes 31 -> 15 ms as a GEMM,
# 2560->1280 at 8×8 60 -> 27 ms, 1920->1280 at 16×16 82 -> 66 ms; but 1280->1280 at 16×16 is
# 54 -> 47 ms in one run and a loss in another, and at 32×32 a loss (153 -> 183 ms). Hence the rule:
# at least this many weight elements per output position (all samples of the batch together), which
# keeps the clear wins only. 1×1 kernels gain nothing (oneDNN's path is a GEMM already). The choice
# depends only on shapes, never on where the weight lives, so a partial run computes exactly what the
# full run does.
GEMM_CONV_MIN_WEIGHT_PER_POSITION = 80_000


def _out_size(n: int, k: int, s: int, p: int) -> int:
    return (n + 2 * p - k) // s + 1


def conv_as_gemm(x: torch.Tensor, w: torch.Tensor, stride, padding, dilation, groups: int) -> bool:
    """Whether Conv2d computes this call as unfold + GEMM (see GEMM_CONV_MIN_WEIGHT_PER_POSITION)."""
    if x.device.type != "cpu" or x.dim() != 4 or x.dtype not in (torch.float32, torch.float64):
        return False
    if w.dtype != x.dtype or groups != 1 or tuple(dilation) != (1, 1) or isinstance(padding, str):
        return False
    kh, kw = w.shape[2:]
    if kh * kw == 1:
        return False
    positions = _out_size(x.shape[2], kh, stride[0], padding[0]) * _out_size(
        x.shape[3], kw, stride[1], padding[1]
    )
    positions *= x.shape[0]
    return positions > 0 and w.numel() >= GEMM_CONV_MIN_WEIGHT_PER_POSITION * positions


def gemm_conv2d(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, stride, padding) -> torch.Tensor:
    """conv2d (zero padding, no dilation, one group) as one GEMM over the batch: weight [O, I·kh·kw] @
    unfold(x) [I·kh·kw, N·L], into NCHW output. The unfolded input is a fraction of the weight here
    (few positions), less than the blocked copy of the weight oneDNN would make."""
    n, o = x.shape[0], w.shape[0]
    kh, kw = w.shape[2:]
    ho, wo = (
        _out_size(x.shape[2], kh, stride[0], padding[0]),
        _out_size(x.shape[3], kw, stride[1], padding[1]),
    )
    cols = F.unfold(x, (kh, kw), padding=tuple(padding), stride=tuple(stride))  # [N, K, L]
    cols = cols.permute(1, 0, 2).reshape(cols.shape[1], n * ho * wo)  # a view when N == 1
    w2 = w.reshape(o, -1)
    out = torch.mm(w2, cols) if b is None else torch.addmm(b[:, None], w2, cols)  # [O, N·L]
    return out.view(o, n, ho * wo).transpose(0, 1).contiguous().view(n, o, ho, wo)


class Conv3d(_Conv, nn.Conv3d):
    pass


class GroupNorm(FromFile, nn.GroupNorm):
    def forward(self, x: torch.Tensor, stats: GroupStats | None = None) -> torch.Tensor:
        """Normalise `x`; with `stats`, per (batch, group) statistics taken elsewhere instead of x's own —
        how a tiled decode normalises every tile with the whole image's statistics."""
        x = _input_dtype(self, x)
        w, b = self.cast_params(x)
        if stats is None:
            return group_norm(x, self.num_groups, w, b, self.eps)
        return stats.normalize(self, x, w, b)


# Elements per (batch, group) from which a GroupNorm on a GPU takes its statistics per channel
# (group_stats) instead of torch's own kernel, which reduces each (batch, group) in one thread block:
# 32 blocks for the SD VAE's 32 groups, on a card of 132 SMs. In a full decode of a 1024^2 image
# (width 128, fp16, H100) its moments took 46 ms of the 101 ms the GPU worked. Measured there (fp16,
# 32 groups, median of 20): 128 x 1024^2 3.78 -> 1.30 ms, 128 x 2048^2 14.95 -> 4.91 ms, 512 x 256^2
# (2^20 per group) 0.98 -> 0.36 ms, 256 x 256^2 (2^19) 0.49 -> 0.31 ms; but 512 x 128^2 (2^18)
# 0.22 -> 0.28 ms (launches: the path's fixed cost), and a UNet's 320 x 64^2 0.04 -> 0.28 ms. The
# full decode (from 2^20): 1.40x as fast at 1024^2, 1.29x at 2048^2, 1.19x at 512^2, 64.6-69.7 dB
# from torch's GroupNorm (fp16 rounding), the same peak (benchmarks/gpu/2026-11-26-h100-groupnorm.txt).
# Those timings rounded the scale and shift to fp16 before the last kernel; it now reads them in
# float32 (scale_shift: one mixed-dtype kernel, as precise as torch's), not yet timed on a GPU.
FAST_GN_ELEMS = 1 << 19


def group_norm(x: torch.Tensor, num_groups: int, weight, bias, eps: float) -> torch.Tensor:
    """F.group_norm(x, ...), the same to rounding; on a GPU for large groups through group_stats."""
    if x.is_cuda and x.dim() > 2 and x[0, 0].numel() * (x.shape[1] // num_groups) >= FAST_GN_ELEMS:
        mean, var = group_stats(x, num_groups)
        return group_norm_with_stats(x, num_groups, mean, var, weight, bias, eps)
    return F.group_norm(x, num_groups, weight, bias, eps)


def group_stats(x: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(N, group) mean and biased variance of a CUDA tensor x (N, C, ...), in float32: per channel
    by torch.batch_norm_stats (a Welford reduction in float32 over each (batch, channel): the SD VAE's
    widths give 4-16 times the blocks of torch's GroupNorm; it reads x's dtype as it is, no copy),
    then per group (groups_of_channels)."""
    n, c = x.shape[:2]
    # invstd = 1/sqrt(var + eps), but 0 where var and eps are both 0: a constant channel would read as
    # an infinite variance. A tiny eps, taken off again, keeps 0 as 0 (and an overflow as inf).
    tiny = 1e-30
    mean_c, invstd_c = torch.batch_norm_stats(x.reshape(1, n * c, -1), tiny)
    var_c = (invstd_c.double().pow(-2) - tiny).clamp_(min=0)
    return groups_of_channels(mean_c.view(n, c), var_c.view(n, c), num_groups)


def groups_of_channels(mean_c: torch.Tensor, var_c: torch.Tensor, num_groups: int, dtype=torch.float32):
    """(N, C) per-channel means and biased variances -> (N, groups) ones, in `dtype`: the law of total
    variance over channels of equal size -- the mean of the channels' variances plus the variance of
    their means --, computed in float64."""
    n, c = mean_c.shape
    mean_c = mean_c.double().view(n, num_groups, c // num_groups)
    var_c = var_c.double().view(n, num_groups, c // num_groups)
    mean = mean_c.mean(dim=2)
    var = var_c.mean(dim=2) + (mean_c - mean.unsqueeze(2)).square().mean(dim=2)
    return mean.to(dtype), var.to(dtype)


def group_scale_shift(c, num_groups, mean, var, weight, bias, eps, like: torch.dtype):
    """Per-(N, C) scale and shift, for C channels, that normalise with per-(N, group) mean and variance
    and apply the affine weight and bias, for an input of dtype `like`: in float32 at least (float64
    for a float64 input). Each group's figures broadcast over its channels (N, G, per): 7 kernels, not
    the 11 of repeating them per channel (a GPU's tiled decode launches them at every GroupNorm)."""
    cdt = torch.promote_types(like, torch.float32)
    n, per = var.shape[0], c // num_groups
    rstd = torch.rsqrt(var.to(cdt) + eps).unsqueeze(2)  # float64 statistics are rounded to cdt first
    scale, shift = rstd.expand(n, num_groups, per), -mean.to(cdt).unsqueeze(2) * rstd
    if weight is not None:
        w = weight.to(cdt).view(num_groups, per)
        scale, shift = scale * w, shift * w
    if bias is not None:
        shift = shift + bias.to(cdt).view(num_groups, per)
    return scale.reshape(n, c), shift.expand(n, num_groups, per).reshape(n, c)


def scale_shift(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """x * scale + shift per channel, in one kernel: x (B * N, C, ...) holds B batches of N items (tiles
    of a batch each), scale and shift are (N, C) and broadcast over the B. They stay float32 for a
    16-bit x, computed in float32 and rounded once into x's dtype (as torch's GroupNorm does):
    rounded to fp16 / bf16 first, shift = bias - mean * scale loses the digits that cancel against
    x * scale, and a channel whose mean is 16x its spread gave 6x torch's RMS error (bf16: 0.010
    against 0.0017; fp16: 0.0013 against 0.00022)."""
    n, c = scale.shape
    view = (1, n, c) + (1,) * (x.dim() - 2)
    xs = x.unflatten(0, (x.shape[0] // n, n))
    if x.dtype == scale.dtype:
        return torch.addcmul(shift.view(view), xs, scale.view(view)).flatten(0, 1)
    out = torch.empty_like(xs)
    return torch.addcmul(shift.view(view), xs, scale.view(view), out=out).flatten(0, 1)


def group_norm_with_stats(x, num_groups, mean, var, weight, bias, eps):
    """GroupNorm of x (N, C, ...) with given per-(N, group) mean and variance, computed in fp32 at
    least and returned in x's dtype: x * scale + shift with per-channel scale and shift."""
    return scale_shift(x, *group_scale_shift(x.shape[1], num_groups, mean, var, weight, bias, eps, x.dtype))


class GroupStats:
    """Per-(N, group) mean and variance that normalise other tensors than the ones they were taken from
    (a tiled decode's tiles, with the whole image's), each GroupNorm's per-channel scale and shift
    worked out once and kept for every tile of the pass (one kernel a tile instead of ~15)."""

    def __init__(self, mean: torch.Tensor, var: torch.Tensor):
        self.mean, self.var = mean, var
        self._affine: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def normalize(self, gn: nn.GroupNorm, x: torch.Tensor, weight, bias) -> torch.Tensor:
        key = (id(gn), id(weight), id(bias), x.dtype, x.device)
        got = self._affine.get(key)
        if got is None:
            mean, var = self.mean.to(x.device), self.var.to(x.device)
            got = group_scale_shift(x.shape[1], gn.num_groups, mean, var, weight, bias, gn.eps, x.dtype)
            # the key holds the ids of live tensors: keep them alive with it, so no id is reused
            self._affine[key] = got = (*got, weight, bias)
        return scale_shift(x, got[0], got[1])


BAND_BYTES = 2 << 20  # a band of rows of a float32 temporary on the CPU (the tiles' GroupNorm moments)
# On a GPU a band is sized to keep the device busy, not the cache warm: each band is a few kernel
# launches. A tiled SD-VAE decode (width 128, fp16, 512-px tiles, states on the device, H200) took
# 0.92 s at 1024^2 with 2 MiB bands, 0.45 s with 8 MiB, 0.32 s with 32 MiB, 0.30 s unbanded; at 2048^2
# 32 MiB bands took 1.07 s at a 3.60 GB peak against 0.97 s at 3.82 GB unbanded (the full decode:
# 0.75 s, 8.7 GB). benchmarks/gpu/2026-11-26-h200-bands.txt.
GPU_BAND_BYTES = 32 << 20


def band_bytes(device: torch.device) -> int:
    """Bytes of a band of rows (engine.vae.groupstats' moments, the tiled convolutions in
    engine.vae.tiling)."""
    return BAND_BYTES if device.type == "cpu" else GPU_BAND_BYTES


class LayerNorm(FromFile, nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _input_dtype(self, x)
        w, b = self.cast_params(x)
        return F.layer_norm(x, self.normalized_shape, w, b, self.eps)


class RMSNorm(Castable, nn.Module):
    """RMS norm with a learned scale (T5, Flux): x / rms(x) * weight."""

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.bias = None
        self._castable_init()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _input_dtype(self, x)
        w, _ = self.cast_params(x)
        return F.rms_norm(x, (x.shape[-1],), w, self.eps)


class ScaleRMSNorm(RMSNorm):
    """RMSNorm whose learned scale is stored as `scale` (black-forest-labs/flux `modules/layers.py`
    RMSNorm, used by FLUX.1's QK-norm): the same op under the file's own name."""

    weight_attr = "scale"

    def __init__(self, dim: int, eps: float = 1e-6, device=None, dtype=None):
        nn.Module.__init__(self)
        self.eps = eps
        self.scale = nn.Parameter(torch.empty(dim, device=device, dtype=dtype))
        self.bias = None
        self._castable_init()

    @property
    def weight(self) -> torch.Tensor:
        return self.scale


class ChannelRMSNorm(Castable, nn.Module):
    """RMS norm over the channel axis of an (N, C, ...) tensor with a learned per-channel `gamma` of shape
    (C, 1, 1[, 1]) — the Wan VAE's RMS_norm (Wan-Video/Wan2.1 `wan/modules/vae.py`): x / ||x||_C *
    sqrt(C) * gamma, the norm taken in float32 for 16-bit inputs."""

    weight_attr = "gamma"

    def __init__(self, dim: int, spatial_dims: int = 3, device=None, dtype=None):
        super().__init__()
        self.scale = dim**0.5
        self.gamma = nn.Parameter(torch.empty((dim,) + (1,) * spatial_dims, device=device, dtype=dtype))
        self.bias = None
        self._castable_init()

    @property
    def weight(self) -> torch.Tensor:
        return self.gamma

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _input_dtype(self, x)
        w, _ = self.cast_params(x)
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return F.normalize(wide, dim=1).to(x.dtype) * (w * self.scale)

    def silu_into(self, x: torch.Tensor, out: torch.Tensor) -> None:
        """SiLU(self(x)) written into `out` (x's shape and dtype, any strides: e.g. the inside of a
        convolution's padded buffer), with the same arithmetic as forward then F.silu but no tensor of
        x's size of its own: F.normalize's x / max(||x||_C, 1e-12), rounded to x's dtype, times
        gamma * sqrt(C), then SiLU, in place."""
        x = _input_dtype(self, x)
        w, _ = self.cast_params(x)
        wide = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        denom = torch.linalg.vector_norm(wide, 2, dim=1, keepdim=True).clamp_min_(1e-12)
        torch.div(wide, denom, out=out)
        out.mul_(w * self.scale)
        F.silu(out, inplace=True)


class Embedding(FromFile, nn.Embedding):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        check_cancelled()
        w = self.weight
        if self.needs_cast:
            dtype = self.compute_dtype or _float_dtype(w)
            spec = self.quantized.get("weight")
            w = _prepare(w, ids.device, dtype, self.weight_functions, self.non_blocking, spec)
        return F.embedding(
            ids, w, self.padding_idx, self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse
        )


CASTABLE_TYPES = (
    Linear,
    Conv1d,
    Conv2d,
    Conv3d,
    GroupNorm,
    LayerNorm,
    RMSNorm,
    ScaleRMSNorm,
    ChannelRMSNorm,
    Embedding,
)


def castable_modules(root: nn.Module) -> Iterator[tuple[str, Castable]]:
    """Every castable op under `root`, with its qualified name."""
    for name, m in root.named_modules():
        if isinstance(m, Castable):
            yield name, m


def set_compute_dtype(root: nn.Module, dtype: torch.dtype | None) -> None:
    for _, m in castable_modules(root):
        m.compute_dtype = dtype


def module_bytes(m: nn.Module) -> int:
    """Bytes of the module's own parameters and buffers (not its children's)."""
    return sum(
        t.numel() * t.element_size() for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
    )
