"""Property tests: apply -> restore is bit-exact, and strengths a then b equal b directly, for any stack."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.lora.adapter import adapter_from_tensors
from engine.patcher import LoraEntry, ModelPatcher

P = "model.diffusion_model."
LIN = "input_blocks.1.1.transformer_blocks.0.attn1.to_q"
CONV = "input_blocks.1.0.in_layers.2"
NORM = "input_blocks.1.1.norm"
QKV = "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight"
SHAPES = {
    P + LIN + ".weight": (8, 8),
    P + CONV + ".weight": (8, 4, 3, 3),
    P + CONV + ".bias": (8,),
    P + NORM + ".weight": (8,),
    P + NORM + ".bias": (8,),
    QKV: (24, 8),
    "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_bias": (24,),
}


def _r(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 0.3


def _pool():
    k = "lora_te_text_model_encoder_layers_0_self_attn_"
    pool = {
        "lora": {  # LoRA with alpha on a Linear, LoCon on the conv, q and v into the fused qkv
            f"diffusion_model.{LIN}.lora_down.weight": _r(2, 8, seed=1).half(),
            f"diffusion_model.{LIN}.lora_up.weight": _r(8, 2, seed=2).half(),
            f"diffusion_model.{LIN}.alpha": torch.tensor(1.0),
            f"diffusion_model.{CONV}.lora_down.weight": _r(2, 4, 3, 3, seed=3),
            f"diffusion_model.{CONV}.lora_up.weight": _r(8, 2, 1, 1, seed=4),
            f"{k}q_proj.lora_down.weight": _r(2, 8, seed=5).bfloat16(),
            f"{k}q_proj.lora_up.weight": _r(8, 2, seed=6).bfloat16(),
            f"{k}v_proj.lora_down.weight": _r(2, 8, seed=7),
            f"{k}v_proj.lora_up.weight": _r(8, 2, seed=8),
        },
        "loha_dora": {
            f"diffusion_model.{LIN}.hada_w1_a": _r(8, 2, seed=11),
            f"diffusion_model.{LIN}.hada_w1_b": _r(2, 8, seed=12),
            f"diffusion_model.{LIN}.hada_w2_a": _r(8, 2, seed=13),
            f"diffusion_model.{LIN}.hada_w2_b": _r(2, 8, seed=14),
            f"diffusion_model.{LIN}.dora_scale": _r(8, 1, seed=15).abs() + 0.5,
            f"{k}k_proj.lokr_w1": _r(2, 2, seed=16),
            f"{k}k_proj.lokr_w2_a": _r(4, 2, seed=17),
            f"{k}k_proj.lokr_w2_b": _r(2, 4, seed=18),
            f"{k}k_proj.alpha": torch.tensor(4.0),
        },
        "full": {
            f"diffusion_model.{CONV}.diff": _r(8, 4, 3, 3, seed=21) * 0.1,
            f"diffusion_model.{CONV}.diff_b": _r(8, seed=22),
            f"diffusion_model.{NORM}.w_norm": _r(8, seed=23),
            f"diffusion_model.{NORM}.b_norm": _r(8, seed=24),
            # diffusers/PEFT names with a LoRA bias, into the v rows of the fused OpenCLIP bias
            "text_encoder.text_model.encoder.layers.0.self_attn.v_proj.lora_A.weight": _r(2, 8, seed=25),
            "text_encoder.text_model.encoder.layers.0.self_attn.v_proj.lora_B.weight": _r(8, 2, seed=26),
            "text_encoder.text_model.encoder.layers.0.self_attn.v_proj.lora_B.bias": _r(8, seed=27),
        },
        "set": {f"diffusion_model.{LIN}.set_weight": _r(8, 8, seed=31)},
    }
    return {name: adapter_from_tensors(t, path=name) for name, t in pool.items()}


POOL = _pool()


def _base(dtype):
    return {k: _r(*s, seed=100 + i).to(dtype) for i, (k, s) in enumerate(SHAPES.items())}


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


strengths = st.floats(min_value=-2, max_value=2, allow_nan=False, width=32)
entries = st.builds(
    LoraEntry,
    file=st.sampled_from(sorted(POOL)),
    strength_model=strengths,
    strength_clip=strengths,
    enabled=st.booleans(),
    order=st.integers(0, 3),
)
stacks = st.lists(entries, min_size=0, max_size=4)
dtypes = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])


def _patcher(dtype):
    base = _base(dtype)
    return ModelPatcher(base, loader=POOL.__getitem__), base


def test_the_pool_reaches_every_key():
    p, _ = _patcher(torch.float32)
    for f in POOL:
        cov = p.coverage(f)
        assert cov.mapped == cov.modules, (f, cov.to_json())
    touched = set(p.plan([LoraEntry(f) for f in POOL]))
    assert touched == set(SHAPES)


@settings(deadline=None, max_examples=60)
@given(stack=stacks, dtype=dtypes)
def test_apply_then_restore_is_bit_exact(stack, dtype):
    p, base = _patcher(dtype)
    snapshot = {k: _bits(v).clone() for k, v in base.items()}
    p.apply(stack)
    p.restore()
    for k, v in p.weights.items():
        assert v is base[k]
        assert torch.equal(_bits(v), snapshot[k])
    assert p.patched_keys == []


@settings(deadline=None, max_examples=60)
@given(a=stacks, b_strengths=st.lists(st.tuples(strengths, strengths), min_size=4, max_size=4), dtype=dtypes)
def test_strengths_a_then_b_equal_b_directly(a, b_strengths, dtype):
    b = [LoraEntry(e.file, sm, sc, e.enabled, e.order) for e, (sm, sc) in zip(a, b_strengths, strict=False)]
    p, _ = _patcher(dtype)
    p.apply(a)
    p.apply(b)
    q, _ = _patcher(dtype)
    q.apply(b)
    for k in SHAPES:
        assert torch.equal(_bits(p.weights[k]), _bits(q.weights[k])), k
