"""ModelPatcher: apply/restore bit-exact, minimal re-patching, clones, cancellation, on-the-fly patches."""

from __future__ import annotations

import pytest
import torch
from lora_fixtures import manifest_entries

from engine.errors import Cancelled
from engine.formats.safetensors import save_tensors
from engine.jobs import CancelToken
from engine.lora.adapter import load_adapter
from engine.patcher import LoraEntry, ModelPatcher

LOKR = "weights/smart_falcon_8_lokr.safetensors"
SD15 = "manifests/sd15_ldm_single_file.json"
P = "model.diffusion_model."
TE = "cond_stage_model.transformer.text_model.encoder.layers."

# A few keys of each kind the real LoKr touches (small enough to hold densely in a test).
TOUCHED = [
    P + "input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight",  # Linear 320x320
    P + "input_blocks.1.1.transformer_blocks.0.attn2.to_k.weight",  # Linear 320x768
    P + "input_blocks.1.1.proj_in.weight",  # 1x1 conv
    P + "input_blocks.2.0.in_layers.2.weight",  # 3x3 conv 320->320
    P + "input_blocks.2.0.emb_layers.1.weight",  # time-embedding Linear
    P + "output_blocks.11.1.transformer_blocks.0.ff.net.0.proj.weight",  # GEGLU Linear 2560x320
    TE + "0.self_attn.q_proj.weight",
    TE + "11.mlp.fc2.weight",
]


def _dense_base(shared_data_fn, keys, dtype=torch.float16, extra=()):
    shapes = {k: s for k, _, s in manifest_entries(SD15)}
    g = torch.Generator().manual_seed(0)
    base = {}
    for k in shapes:
        if k in keys or k in extra:
            base[k] = (torch.randn(*shapes[k], generator=g) * 0.05).to(dtype)
        else:
            base[k] = torch.empty(0)  # present for the key map, never touched
    return base, shapes


def _patcher(shared_data, dtype=torch.float16, extra=()):
    base, shapes = _dense_base(shared_data, TOUCHED, dtype, extra)
    from engine.lora.keymap import KeyMap

    km = KeyMap({k: tuple(s) for k, s in shapes.items()})  # the real layout's shapes
    p = ModelPatcher(base, keymap=km)
    return p, base


def _only_dense(p: ModelPatcher, lokr: str):
    """Drop placements on keys we did not make dense (keeps the test small)."""
    cov = p.coverage(lokr)
    for name in [n for n, t in cov.placements.items() if p.original(t.key).numel() == 0]:
        del cov.placements[name]
    return cov


def test_apply_matches_direct_math_and_restore_is_bit_exact(shared_data):
    lokr = str(shared_data(LOKR))
    p, base = _patcher(shared_data)
    cov = _only_dense(p, lokr)
    assert {t.key for t in cov.placements.values()} == set(TOUCHED)
    before = {k: base[k].clone() for k in TOUCHED}
    rep = p.apply([LoraEntry(lokr, 0.7, 0.3)])
    assert sorted(rep.patched) == sorted(TOUCHED)
    a = load_adapter(lokr)
    km = p.keymap
    for name, m in a.modules.items():
        t = km.resolve(name)
        if t.key not in TOUCHED:
            continue
        s = 0.7 if t.component == "unet" else 0.3
        want = (before[t.key].float() + s * m.delta().reshape(before[t.key].shape)).to(torch.float16)
        assert torch.equal(p.weights[t.key], want), name
        assert not torch.equal(p.weights[t.key], before[t.key])
    p.restore()
    for k in TOUCHED:
        assert p.weights[k] is base[k]
        assert torch.equal(p.weights[k].view(torch.int16), before[k].view(torch.int16))
    assert p.patched_keys == []


def test_strength_change_repatches_only_that_entrys_keys_and_identical_stack_does_no_work(
    shared_data, tmp_path
):
    lokr = str(shared_data(LOKR))
    p, base = _patcher(shared_data)
    _only_dense(p, lokr)
    # A second LoRA touching one UNet key and one text-encoder key.
    q = TOUCHED[0].removeprefix(P).removesuffix(".weight")
    other = tmp_path / "other.safetensors"
    g = torch.Generator().manual_seed(1)
    save_tensors(
        other,
        {
            f"lora_unet_{q.replace('.', '_')}.lora_down.weight": torch.randn(4, 320, generator=g).half(),
            f"lora_unet_{q.replace('.', '_')}.lora_up.weight": torch.randn(320, 4, generator=g).half() * 0.01,
            f"lora_unet_{q.replace('.', '_')}.alpha": torch.tensor(2.0).half(),
        },
    )
    stack = [LoraEntry(lokr, 1.0, 1.0), LoraEntry(str(other), 0.5, 1.0)]
    p.apply(stack)
    n = p.keys_computed
    assert n == len(TOUCHED)
    rep = p.apply(list(stack))
    assert p.keys_computed == n and rep.patched == [] and rep.unchanged == len(TOUCHED)
    # Change the second entry's model strength: only its one key is recomputed, from the original.
    rep = p.apply([stack[0], LoraEntry(str(other), 0.9, 1.0)])
    assert rep.patched == [TOUCHED[0]]
    # Clip strength of the first entry: only its text-encoder keys.
    rep = p.apply([LoraEntry(lokr, 1.0, 0.2), LoraEntry(str(other), 0.9, 1.0)])
    assert sorted(rep.patched) == sorted(k for k in TOUCHED if k.startswith("cond_stage_model"))
    # Disabling the second entry restores... no: re-patches its key from the original with the LoKr alone.
    fresh, _ = _patcher(shared_data)
    _only_dense(fresh, lokr)
    fresh.apply([LoraEntry(lokr, 1.0, 0.2)])
    p.apply([LoraEntry(lokr, 1.0, 0.2), LoraEntry(str(other), 0.9, 1.0, enabled=False)])
    for k in TOUCHED:
        assert torch.equal(p.weights[k], fresh.weights[k])


def test_clones_share_base_weights_and_only_copy_patched_ones(shared_data):
    lokr = str(shared_data(LOKR))
    p, base = _patcher(shared_data)
    _only_dense(p, lokr)
    p.apply([LoraEntry(lokr, 1.0, 1.0)])
    c = p.clone()
    assert all(c.weights[k] is p.weights[k] for k in p.weights)  # nothing copied
    c.apply([LoraEntry(lokr, 0.5, 1.0)])
    unet = [k for k in TOUCHED if k.startswith(P)]
    te = [k for k in TOUCHED if not k.startswith(P)]
    assert all(c.weights[k] is not p.weights[k] for k in unet)
    assert all(c.weights[k] is p.weights[k] for k in te)  # untouched by the change: still shared
    untouched = P + "out.2.weight"
    assert c.weights[untouched] is base[untouched]
    # The parent is unaffected; restoring the clone gives the shared originals back.
    assert p.stack[0].strength_model == 1.0
    c.restore()
    assert all(c.weights[k] is base[k] for k in TOUCHED)
    assert all(p.weights[k] is not base[k] for k in TOUCHED)


def test_cancel_mid_apply_leaves_weights_exactly_as_before(shared_data):
    lokr = str(shared_data(LOKR))
    p, base = _patcher(shared_data)
    _only_dense(p, lokr)
    p.apply([LoraEntry(lokr, 0.5, 0.5)])
    before = dict(p.weights)
    token = CancelToken()
    seen = []

    def report(progress):
        seen.append(progress)
        if len(seen) == 3:
            token.cancel()

    with pytest.raises(Cancelled):
        p.apply([LoraEntry(lokr, 1.0, 1.0)], token=token, report=report)
    assert len(seen) == 3
    assert all(p.weights[k] is before[k] for k in before)
    assert p.stack[0].strength_model == 0.5
    # And it still works afterwards.
    p.apply([LoraEntry(lokr, 1.0, 1.0)])
    assert all(p.weights[k] is not before[k] for k in TOUCHED)
