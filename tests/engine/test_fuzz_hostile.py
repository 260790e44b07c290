"""A few seeded cases of each hostile-file fuzz target (tests/support/fuzz.py, `make fuzz` for many):
every `loadout` run on an edited file ends as the exit-code contract says, and each unedited base
file passes every command first."""

from __future__ import annotations

import pytest

from tests.support import fuzz


@pytest.mark.parametrize("target", sorted(fuzz.TARGETS))
def test_hostile_files_end_as_the_contract_says(target, tmp_path):
    exits: dict = {}
    kinds = {"pickled-lora": fuzz.PICKLED_KINDS, "gguf": fuzz.GGUF_EDITS, "step-inputs": fuzz.TENSOR_EDITS,
             "latent": fuzz.TENSOR_EDITS, "image": fuzz.IMAGE_KINDS,
             "torch-checkpoint": fuzz.CKPT_KINDS}.get(target, fuzz.HEADER_EDITS)  # fmt: skip
    findings = fuzz.fuzz(target, seed=2026, n=len(kinds), workdir=tmp_path, exits=exits)  # each kind once
    assert not findings, "\n".join(f"{f.case}\n  loadout {' '.join(f.argv)}\n  {f.what}" for f in findings)
    assert sum(exits.values()) >= len(kinds)  # every case ran its commands
