"""Tiles exchange their halos instead of carrying the overlap's context: every pass starts from each
tile's core plus the halo its own convolutions reach, taken from the neighbours' cores of the pass
before. The cores are then the whole image's values whatever the overlap (0 included), in RAM or on
disk, one tile at a time or batched; and a skip entry a pass only carries is neither read nor
written again."""

from __future__ import annotations

import pytest
import torch
from vae_fixtures import small_kl, small_taesd

from engine.vae import decode, encode, halo, tiling
from engine.vae.run import RunInfo


def _gen(seed):
    return torch.Generator().manual_seed(seed)


# 8-px tiles: 1-latent cores, where a pass's halo (2 px at the latent's scale) reaches past the
# next core and, one unit from an edge, is clipped: such tiles must not share a batch with others
@pytest.mark.parametrize(
    ("tile", "overlap", "disk"), [(64, 16, False), (96, 0, True), (48, 16, True), (8, 0, False)]
)
def test_kl_tiles_equal_the_whole_decode_and_encode(tile, overlap, disk):
    vae = small_kl(seed=3)
    z = torch.randn(2, 4, 17, 13, generator=_gen(1))  # odd sizes: uneven cores, edges on all sides
    full = decode(vae, z, tiled=False)
    info = RunInfo()
    tiled = decode(vae, z, tiled=True, tile=tile, overlap=overlap, disk_store=disk, info=info)
    assert info.tiles >= 4
    torch.testing.assert_close(tiled, full, rtol=0, atol=2e-5)
    x = torch.rand(1, 3, 88, 72, generator=_gen(2))
    got = encode(vae, x, tiled=True, tile=tile, overlap=overlap, disk_store=disk)
    torch.testing.assert_close(got, encode(vae, x, tiled=False), rtol=0, atol=2e-5)


def test_taesd_tiles_equal_the_whole_decode_with_small_tiles():
    vae = small_taesd("taesd", 4, seed=5)
    z = torch.randn(1, 4, 24, 20, generator=_gen(4))
    info = RunInfo()
    tiled = decode(vae, z, tiled=True, tile=32, overlap=16, info=info)  # 4-latent tiles, 2-latent cores
    assert info.tiles == 12 * 10
    torch.testing.assert_close(tiled, decode(vae, z, tiled=False), rtol=0, atol=2e-5)
    x = torch.rand(1, 3, 96, 80, generator=_gen(6))
    got = encode(vae, x, tiled=True, tile=32, overlap=0)
    torch.testing.assert_close(got, encode(vae, x, tiled=False), rtol=0, atol=2e-5)


def test_taesd_passes_spill_to_disk_when_the_budget_says_so():
    """TAESD's tiled part now waits between passes too: its states count in the store's estimate,
    so a budget too small for them in RAM puts them on disk (and the result is the same)."""
    vae = small_taesd("taesd", 4, seed=7)
    z = torch.randn(1, 4, 24, 32, generator=_gen(8))
    small, roomy = RunInfo(), RunInfo()
    a = decode(vae, z, tiled=True, tile=64, overlap=16, budget=2 << 20, info=small)
    b = decode(vae, z, tiled=True, tile=64, overlap=16, budget=1 << 34, info=roomy)
    assert small.store == "disk" and roomy.store == "ram"
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_passes_need_thin_halos_and_cut_where_nothing_else_would():
    kl = halo.cut(small_kl(seed=0).decode_steps())
    plan = halo.Plan(kl, 1)
    assert all(s[0] == "gn" for seg in kl[1:] for s in seg[:1])  # cut at the GroupNorms only
    assert max(h for _, h in plan.x) == 2 and plan.end_scale == 8 and plan.end_depth == 0
    steps = small_taesd("taesd", 4).decode_steps()  # no GroupNorm: one pass, without the cuts
    taesd = halo.cut(steps)
    assert len(taesd) > 6 and sum(len(s) for s in taesd) == len(steps)
    assert all(halo.need(seg) <= halo.MAX_HALO_PX or _modules(seg) == 1 for seg in taesd)
    assert all(seg[-1][0] == "module" for seg in taesd)  # never stored just after an upsample
    enc = halo.cut(small_kl(seed=0).encode_steps())
    for seg, (_, width) in zip(enc, halo.Plan(enc, 8).x, strict=True):
        if any(halo.stride(s) == 2 for s in seg):  # a stride-2 conv starts on an even pixel
            assert width % 2 == 0 and seg[0][0] == "pad_br"


def _modules(seg):
    return sum(s[0] == "module" for s in seg)


def test_a_whole_image_layer_inside_a_step_is_refused():
    block = torch.nn.Sequential(torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.GroupNorm(2, 4))
    with pytest.raises(ValueError, match="GroupNorm"):
        halo.need([("module", block)])


def test_disk_store_keeps_a_carried_entry_without_reading_or_writing_it(tmp_path, monkeypatch):
    store = tiling.DiskStore(torch.device("cpu"), folder=str(tmp_path))
    try:
        x, skip = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
        store.put(0, [x, skip])
        files = sorted(p.name for p in store.dir.iterdir())
        got = store.get(0, [True, False])
        assert got[1] is None and torch.equal(got[0], x)
        writes = []
        real_open = open

        def counting_open(path, mode="r", *a, **k):
            if "w" in mode or "+" in mode:
                writes.append(path)
            return real_open(path, mode, *a, **k)

        monkeypatch.setattr("builtins.open", counting_open)
        x2 = torch.randn(1, 2, 3, 3)
        store.put(0, [x2, None])  # the skip entry carried: kept as it is
        assert len(writes) == 1
        monkeypatch.undo()
        a, b = store.get(0)
        assert torch.equal(a, x2) and torch.equal(b, skip)
        assert sorted(p.name for p in store.dir.iterdir()) == files  # x's old file was overwritten
    finally:
        store.close()


def test_halos_written_in_place_equal_halos_given_and_taken_with_far_fewer_copies(monkeypatch):
    """Where the store keeps each state itself (RAM here, the device on a GPU) each pass's halos are
    written straight into the stored states when it ends, in two sweeps over the grid (left-right,
    then up-down with the corners); a store of copies (disk, pinned host RAM) has them given aside
    and taken. Both give the same image bit for bit -- with a batch of 2 latents,
    uneven tiles on every side, one tile at a time and batched -- and in place dispatches far fewer
    copies: the ops a GPU's tiled decode is bound by launching."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Copies(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += func in (torch.ops.aten.copy_.default, torch.ops.aten.clone.default)
            return func(*args, **(kwargs or {}))

    vae = small_kl(seed=4)
    z = torch.randn(2, 4, 21, 19, generator=_gen(9))
    out, copies = {}, {}
    for kind, disk in (("in place", False), ("disk", True)):
        with Copies() as c:
            out[kind] = decode(vae, z, tiled=True, tile=64, overlap=16, disk_store=disk)
        copies[kind] = c.n
    # one copy from every neighbour, diagonal ones included (where the two sweeps cannot serve)
    monkeypatch.setattr(halo.InPlace, "_narrowest", lambda self, sc: 0)
    with Copies() as c:
        out["each"] = decode(vae, z, tiled=True, tile=64, overlap=16, disk_store=False)
    copies["each"] = c.n
    monkeypatch.undo()
    # the RAM store with its states treated as copies: the same store, the other exchange
    monkeypatch.setattr(tiling.TileStore, "keeps", lambda self, t: False)
    with Copies() as c:
        out["given"] = decode(vae, z, tiled=True, tile=64, overlap=16, disk_store=False)
    copies["given"] = c.n
    monkeypatch.undo()
    for kind in ("each", "given", "disk"):
        assert torch.equal(out["in place"], out[kind]), kind
    # in place, two sweeps: 1,552 copies; from each neighbour: 2,560; given and taken: 6,440
    assert copies["in place"] < 0.75 * copies["each"] < 0.5 * copies["given"], copies
    real = tiling.batch_tiles
    monkeypatch.setattr(
        tiling, "batch_tiles", lambda tiles, s, px, reach=1: real(tiles, s, 64 * 64 * 4, reach)
    )
    info = RunInfo()
    batched = decode(vae, z, tiled=True, tile=64, overlap=16, disk_store=False, info=info)
    assert info.tiles == 16
    torch.testing.assert_close(batched, out["in place"], rtol=0, atol=2e-5)


def test_the_two_sweeps_take_a_full_grid_of_abutting_cores_only():
    from engine.vae.choice import Tile, plan_tiles

    tiles = plan_tiles(17, 13, 8, 2)
    at = halo._grid(tiles)
    assert at is not None and len(at) == len(tiles) and at[0, 0] == 0
    assert halo._grid(tiles[:-1]) is None  # a cell missing
    gap = [Tile((0, 4, 0, 4), (0, 4, 0, 4)), Tile((0, 4, 5, 9), (0, 4, 5, 9))]
    assert halo._grid(gap) is None  # cores that do not abut
