"""Each algorithm's ΔW and DoRA merge against an independent reference: the lycoris-lora package."""

from __future__ import annotations

import pytest
import torch

from engine.lora import algos
from engine.lora.adapter import adapter_from_tensors

lyc = pytest.importorskip("lycoris.functional", reason="lycoris-lora (test-only reference) is not installed")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


def _r(*shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 0.5).to(dtype)


def _close(ours, ref, dtype):
    ref = ref.float()
    scale = ref.abs().max().clamp_min(1e-6)
    assert ours.dtype == torch.float32
    assert tuple(ours.shape) == tuple(ref.shape)
    assert ((ours - ref).abs().max() / scale) < TOL[dtype]


def _ref(fn, *tensors, **kw):
    # The reference on the same (already rounded) factors, upcast: exact same inputs as ours.
    return fn(*[None if t is None else t.float() for t in tensors], backend="torch", **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["linear", "conv", "tucker"])
def test_lora_locon(dtype, kind):
    r, o, i = 4, 12, 10
    if kind == "linear":
        down, up, mid = _r(r, i, dtype=dtype, seed=1), _r(o, r, dtype=dtype, seed=2), None
    elif kind == "conv":
        down, up, mid = _r(r, i, 3, 3, dtype=dtype, seed=1), _r(o, r, 1, 1, dtype=dtype, seed=2), None
    else:
        down, up = _r(r, i, 1, 1, dtype=dtype, seed=1), _r(o, r, 1, 1, dtype=dtype, seed=2)
        mid = _r(r, r, 3, 3, dtype=dtype, seed=3)
    ref = _ref(lyc.locon.diff_weight, down, up, mid, gamma=0.5)
    _close(algos.lora_delta(up, down, mid) * 0.5, ref, dtype)
    # Native-precision reference too, within the dtype's rounding.
    native = lyc.locon.diff_weight(down, up, mid, gamma=0.5, backend="torch")
    _close(algos.lora_delta(up, down, mid) * 0.5, native, dtype if dtype == torch.float32 else torch.bfloat16)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tucker", [False, True])
def test_loha(dtype, tucker):
    r, o, i = 4, 12, 10
    if tucker:
        w1a, w1b = _r(r, o, dtype=dtype, seed=1), _r(r, i, dtype=dtype, seed=2)
        w2a, w2b = _r(r, o, dtype=dtype, seed=3), _r(r, i, dtype=dtype, seed=4)
        t1, t2 = _r(r, r, 3, 3, dtype=dtype, seed=5), _r(r, r, 3, 3, dtype=dtype, seed=6)
    else:
        w1a, w1b = _r(o, r, dtype=dtype, seed=1), _r(r, i, dtype=dtype, seed=2)
        w2a, w2b = _r(o, r, dtype=dtype, seed=3), _r(r, i, dtype=dtype, seed=4)
        t1 = t2 = None
    # lycoris' argument order is (w1d=w1_b, w1u=w1_a, w2d=w2_b, w2u=w2_a, t1, t2)
    ref = _ref(lyc.loha.diff_weight, w1b, w1a, w2b, w2a, t1, t2, gamma=2.0)
    _close(algos.loha_delta(w1a, w1b, w2a, w2b, t1, t2) * 2.0, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["full", "factored", "conv", "tucker"])
def test_lokr(dtype, layout):
    r = 3
    w1 = w1a = w1b = w2 = w2a = w2b = t2 = None
    if layout == "full":
        w1, w2 = _r(4, 2, dtype=dtype, seed=1), _r(6, 5, dtype=dtype, seed=2)
    elif layout == "factored":
        w1a, w1b = _r(4, r, dtype=dtype, seed=1), _r(r, 2, dtype=dtype, seed=2)
        w2a, w2b = _r(6, r, dtype=dtype, seed=3), _r(r, 5, dtype=dtype, seed=4)
    elif layout == "conv":
        w1 = _r(4, 2, dtype=dtype, seed=1)
        w2a, w2b = _r(6, r, dtype=dtype, seed=3), _r(r, 5, 3, 3, dtype=dtype, seed=4)
    else:
        w1 = _r(4, 2, dtype=dtype, seed=1)
        w2a, w2b, t2 = (
            _r(r, 6, dtype=dtype, seed=3),
            _r(r, 5, dtype=dtype, seed=4),
            _r(r, r, 3, 3, dtype=dtype, seed=5),
        )
    alpha = 1.5
    # lycoris' functional API divides gamma by w1a.shape[1] (else w2a.shape[1]); pass that divisor to get
    # the unscaled ΔW, then apply the module scale LyCORIS' LokrModule uses: alpha / dim, or 1 when both
    # halves are whole.
    divisor = w1a.shape[1] if w1a is not None else (w2a.shape[1] if w2a is not None else 1.0)
    unit = _ref(lyc.lokr.diff_weight, w1, w1a, w1b, w2, w2a, w2b, t2, gamma=float(divisor))
    parts = {
        k: v
        for k, v in dict(
            lokr_w1=w1, lokr_w1_a=w1a, lokr_w1_b=w1b, lokr_w2=w2, lokr_w2_a=w2a, lokr_w2_b=w2b, lokr_t2=t2
        ).items()
        if v is not None
    }
    tensors = {f"lora_unet_x.{k}": v for k, v in parts.items()}
    tensors["lora_unet_x.alpha"] = torch.tensor(alpha)
    module = adapter_from_tensors(tensors).modules["lora_unet_x"]
    assert module.scale == (1.0 if layout == "full" else alpha / r)
    _close(module.delta(), unit * module.scale, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("on_out", [True, False])
@pytest.mark.parametrize("conv", [False, True])
def test_dora_lycoris(dtype, on_out, conv):
    o, i = 8, 6
    shape = (o, i, 3, 3) if conv else (o, i)
    w = _r(*shape, dtype=dtype, seed=1)
    delta = _r(*shape, dtype=dtype, seed=2).float() * 0.1
    rest = [1] * (len(shape) - 1)
    mag = (
        (_r(o, *rest, dtype=dtype, seed=3).abs() + 0.5)
        if on_out
        else (_r(1, i, *rest[1:], dtype=dtype, seed=3).abs() + 0.5)
    )
    ref = lyc.general.weight_decompose(w.float() + delta, mag.float(), 1, on_out, backend="torch")
    ours = algos.dora_apply(w, delta, mag, 1.0, peft=False)
    _close(ours, ref, dtype)
    # Strength 0 leaves the weight untouched; strength s interpolates linearly.
    assert torch.equal(algos.dora_apply(w, delta, mag, 0.0, peft=False), w.float())
    half = algos.dora_apply(w, delta, mag, 0.5, peft=False)
    assert torch.allclose(half, (w.float() + ours) / 2, atol=1e-5)


def test_dora_peft_magnitude_is_per_output_even_for_square_convs():
    # PEFT stores a conv magnitude as (1, out, 1, 1): its axis is the output, even when in == out.
    w = _r(5, 5, 3, 3, dtype=torch.float32, seed=1)
    delta = _r(5, 5, 3, 3, dtype=torch.float32, seed=2) * 0.1
    mag = _r(1, 5, 1, 1, dtype=torch.float32, seed=3).abs() + 0.5
    merged = w + delta
    want = merged * (mag.reshape(5, 1, 1, 1) / merged.reshape(5, -1).norm(dim=1).reshape(5, 1, 1, 1))
    assert torch.allclose(algos.dora_apply(w, delta, mag, 1.0, peft=True), want, atol=1e-5)


def test_real_lokr_module_matches_lycoris(shared_data):
    from engine.lora.adapter import load_adapter

    a = load_adapter(shared_data("weights/smart_falcon_8_lokr.safetensors"))
    assert len(a.modules) == 350
    # Every 25th module (conv and linear, UNet and text encoder): the whole file takes minutes here.
    for m in list(a.modules.values())[::25]:
        p = m.parts
        ref = _ref(
            lyc.lokr.diff_weight,
            None,
            p["lokr_w1_a"],
            p["lokr_w1_b"],
            None,
            p["lokr_w2_a"],
            p["lokr_w2_b"],
            None,
            gamma=m.alpha,
        )
        _close(m.delta(), ref, torch.float16)


def _plain_lora(out_f: int, in_f: int, *, conv: bool, lora_dtype, weight_dtype):
    """A rank-4 plain LoRA module (alpha 2: scale 0.5) on a linear or 3x3 conv layer, and a base weight."""
    k = (3, 3) if conv else ()
    down = _r(4, in_f, *k, dtype=lora_dtype, seed=1)
    up = _r(out_f, 4, *((1, 1) if conv else ()), dtype=lora_dtype, seed=2)
    tensors = {"lora_unet_x.lora_down.weight": down, "lora_unet_x.lora_up.weight": up}
    m = adapter_from_tensors({**tensors, "lora_unet_x.alpha": torch.tensor(2.0)}).modules["lora_unet_x"]
    return m, _r(out_f, in_f, *k, dtype=weight_dtype, seed=3)


@pytest.mark.parametrize("conv", [False, True])
def test_patch_weight_fast_path_equals_the_delta_formula(conv):
    # patch_weight fuses W + s·(alpha/rank)·up@down into one addmm; it must agree with ΔW from delta().
    m, w = _plain_lora(8, 6, conv=conv, lora_dtype=torch.float16, weight_dtype=torch.bfloat16)
    got = m.patch_weight(w, 0.7)
    want = w.float() + 0.7 * m.delta().reshape(w.shape)
    assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-6)
    assert m.scale == 0.5


@pytest.mark.parametrize("conv", [False, True])
def test_patch_weight_on_an_owned_copy_updates_it_in_place_with_the_same_bits(conv):
    # The patcher hands patch_weight its own float32 copy (owned=True): the plain-LoRA case then adds
    # in place. The bits must be those of the out-of-place call, which must leave its input untouched.
    m, w = _plain_lora(
        200, 64 if conv else 300, conv=conv, lora_dtype=torch.float32, weight_dtype=torch.float32
    )
    before = w.clone()
    plain = m.patch_weight(w, 0.7)
    assert torch.equal(w, before) and plain.data_ptr() != w.data_ptr()
    own = w.clone()
    got = m.patch_weight(own, 0.7, owned=True)
    assert got.data_ptr() == own.data_ptr()
    assert torch.equal(got, plain)
    # A non-contiguous owned view (a transposed copy, as the patcher's "transpose" view hands over)
    # keeps the out-of-place path, and so its input.
    flat = before.reshape(200, -1)
    t = flat.t().contiguous().t()
    out = m.patch_weight(t, 0.7, owned=True)
    assert torch.equal(t, flat) and torch.allclose(out, plain.reshape(200, -1), atol=1e-6)
