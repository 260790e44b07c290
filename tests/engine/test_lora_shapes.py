"""algos.delta_shape, the load-time check of every adapter module (engine.lora.adapter), against the
math it stands for: wherever it accepts a module's part shapes, lora_delta / loha_delta / lokr_delta
compute a change of exactly that shape -- so a file it passes cannot fail mid-patch on its shapes."""

from __future__ import annotations

import random

import torch

from engine.lora import algos
from engine.lora.adapter import AdapterModule

PARTS = {
    "lora": ("up", "down", "mid"),
    "loha": ("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b", "hada_t1", "hada_t2"),
    "lokr": ("lokr_w1", "lokr_w1_a", "lokr_w1_b", "lokr_w2", "lokr_w2_a", "lokr_w2_b", "lokr_t2"),
}


def _valid(rng: random.Random, algo: str) -> dict[str, tuple[int, ...]]:
    """Part shapes as the formats write them (so that the random ones below are often close)."""
    o, i, r, r2 = (rng.choice((1, 2, 3, 4, 6)) for _ in range(4))
    k = rng.choice(((), (1, 1), (3, 3), (2,)))
    if algo == "lora":
        if rng.random() < 0.3:
            return {"up": (o, r, 1, 1), "mid": (r, r2, *k), "down": (r2, i, 1, 1)}
        return {"up": (o, r) + ((1, 1) if k else ()), "down": (r, i, *k)}
    if algo == "loha":
        if rng.random() < 0.3:
            return {"hada_w1_a": (r, o), "hada_w1_b": (r2, i), "hada_t1": (r, r2, *k),
                    "hada_w2_a": (r, o), "hada_w2_b": (r2, i), "hada_t2": (r, r2, *k)}  # fmt: skip
        return {"hada_w1_a": (o, r), "hada_w1_b": (r, i, *k), "hada_w2_a": (o, r2), "hada_w2_b": (r2, i, *k)}
    a, b = rng.choice((1, 2, 4)), rng.choice((1, 2, 4))
    w1 = {"lokr_w1": (a, b)} if rng.random() < 0.5 else {"lokr_w1_a": (a, r), "lokr_w1_b": (r, b)}
    pick = rng.random()
    if pick < 0.3:
        w2 = {"lokr_w2": (o, i, *k)}
    elif pick < 0.6:
        w2 = {"lokr_w2_a": (r2, o), "lokr_w2_b": (r, i), "lokr_t2": (r2, r, *k)}
    else:
        w2 = {"lokr_w2_a": (o, r2), "lokr_w2_b": (r2, i, *k)}
    return {**w1, **w2}


def _mutate(rng: random.Random, shapes: dict) -> dict:
    out = dict(shapes)
    for _ in range(rng.randint(1, 2)):
        part = rng.choice(list(out))
        s = list(out[part])
        how = rng.random()
        if how < 0.4 and s:
            s[rng.randrange(len(s))] = rng.choice((1, 2, 3, 5))
        elif how < 0.6:
            s.append(rng.choice((1, 2, 3)))
        elif how < 0.8 and s:
            s.pop(rng.randrange(len(s)))
        else:
            out.pop(part)
            continue
        out[part] = tuple(s)
    return out


def test_delta_shape_is_the_shape_the_math_computes():
    rng = random.Random(7)
    seen = {"accepted": 0, "refused": 0}
    for n in range(3000):
        algo = rng.choice(("lora", "loha", "lokr"))
        shapes = _valid(rng, algo)
        if n % 2:
            shapes = _mutate(rng, shapes)
        module = AdapterModule("m", {p: torch.randn(s) for p, s in shapes.items()}, (algo,))
        try:
            want = algos.delta_shape(shapes, algo)
        except (ValueError, KeyError):
            seen["refused"] += 1
            continue
        seen["accepted"] += 1
        got = module.delta()
        assert tuple(got.shape) == want, (algo, shapes)
    assert seen["accepted"] > 1500 and seen["refused"] > 500, seen
    # and the shapes the formats write are all accepted
    for _ in range(300):
        algo = rng.choice(("lora", "loha", "lokr"))
        algos.delta_shape(_valid(rng, algo), algo)
