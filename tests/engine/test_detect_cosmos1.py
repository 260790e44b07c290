"""Cosmos 1.0 (Cosmos-Predict1) detection from header-faithful layouts of the real releases, in NVIDIA's
naming (checked against diffusers' own converter onto its class) and diffusers'; Predict2 stays Predict2."""

from __future__ import annotations

import pytest
from layouts_2026 import cosmos1 as C
from layouts_2026 import video as V
from layouts_2026.common import assert_same, blocks_only, converted, detect, meta_shapes

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
sfu = pytest.importorskip("diffusers.loaders.single_file_utils")


class _Kept(dict):
    """diffusers 0.42's converter pops every key before it looks for `net.blocks.block1…` to pick its 1.0
    renames, so it never picks them; a checkpoint whose pop keeps the key lets it see what it looks for."""

    def pop(self, key, *default):
        return self[key] if key in self else default[0]


def converted_1_0(rows) -> dict:
    return converted(lambda t: sfu.convert_cosmos_transformer_checkpoint_to_diffusers(_Kept(t)), rows)


RELEASES = [(C.T2W_7B, "t2v-7b"), (C.V2W_7B, "i2v-7b"), (C.T2W_14B, "t2v-14b"), (C.V2W_14B, "i2v-14b")]


@pytest.mark.parametrize("cfg, var", RELEASES)
def test_cosmos_1_0_original_naming_is_predict1(cfg, var):
    small = cfg.with_(layers=2)
    ref = meta_shapes(diffusers.CosmosTransformer3DModel, **C.cosmos1_diffusers_config(small))
    assert_same(converted_1_0(C.cosmos1_original(small)), ref)
    for prefix in ("net.", "model.diffusion_model.", ""):
        d = detect(C.cosmos1_original(cfg, prefix))
        assert (d.kind, d.architecture, d.variant) == ("diffusion_model", "cosmos_predict1", var), d.evidence
        assert set(d.components) == {"transformer"}
        assert any(f"{cfg.layers} blocks" in e.reason for e in d.evidence)
    d = detect(ref)
    assert (d.architecture, d.variant) == ("cosmos_predict1", var)


def test_a_cosmos_1_0_shard_of_blocks_still_names_the_size():
    ref = meta_shapes(diffusers.CosmosTransformer3DModel, **C.cosmos1_diffusers_config(C.T2W_7B, layers=2))
    d = detect(
        {k: s for k, s in ref.items() if k.startswith(("transformer_blocks.", "learnable_pos_embed."))}
    )
    assert (d.architecture, d.variant) == ("cosmos_predict1", "7b")


def test_an_unreleased_width_names_no_size():
    d = detect(C.cosmos1_original(C.T2W_7B.with_(dim=2048, layers=2)))
    assert (d.architecture, d.variant) == ("cosmos_predict1", "t2v")
    assert any("no Cosmos 1.0 release" in e.reason for e in d.evidence)


def test_predict2_files_stay_predict2():
    for cfg in (V.COSMOS2_2B_T2I, V.COSMOS2_14B_V2W):
        assert detect(V.cosmos_original(cfg)).architecture == "cosmos_predict2"
        ref = meta_shapes(
            diffusers.CosmosTransformer3DModel, **V.cosmos_diffusers_config(cfg.with_(layers=2))
        )
        assert detect(ref).architecture == "cosmos_predict2"
    assert detect(blocks_only(ref, "transformer_blocks.", 1, 2)).architecture == "cosmos_predict2"


def test_a_shard_of_blocks_alone_is_1_0_by_its_7b_width_and_either_at_14b():
    """diffusers' sharded 1.0 releases keep the position tables in the first shard: a later one holds blocks alone.
    Predict2 has no 4096-wide release, so 7B's blocks are 1.0's; 14B's are either generation's layout."""
    for cfg, arch, also in (
        (C.T2W_7B, "cosmos_predict1", []),
        (C.T2W_14B, "cosmos_predict2", ["cosmos_predict1"]),
    ):
        ref = meta_shapes(diffusers.CosmosTransformer3DModel, **C.cosmos1_diffusers_config(cfg, layers=2))
        d = detect(blocks_only(ref, "transformer_blocks.", 1, 2))
        assert (d.architecture, list(d.also)) == (arch, also), d.evidence
    two = meta_shapes(
        diffusers.CosmosTransformer3DModel, **V.cosmos_diffusers_config(V.COSMOS2_2B_T2I, layers=2)
    )
    assert list(detect(blocks_only(two, "transformer_blocks.", 1, 2)).also) == []
