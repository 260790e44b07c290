"""Pickled checkpoints: hostile pickles never run, Lightning metadata is stubbed, bombs are refused."""

import collections
import io
import os
import pickle
import struct
import sys
import tracemalloc
import types
import zipfile

import numpy as np
import pytest
import torch

from engine.errors import FormatError
from engine.formats import open_index
from engine.formats.pickles import (
    MAX_PICKLE_BYTES,
    Stub,
    flatten,
    index_pickle,
    load_pickle,
    load_state_dict,
    tensor_root,
)

ENTRY_POINTS = {
    "open_index": open_index,
    "index_pickle": index_pickle,
    "load_pickle": load_pickle,
    "load_state_dict": load_state_dict,
}


def _weights():
    torch.manual_seed(0)
    return {"w": torch.randn(4, 3).half(), "b": torch.randn(4)}


class _Reduce:
    """Pickles as `fn(*args)`: what a hostile checkpoint does to run code on load."""

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return (self.fn, self.args)


def _attacks(marker):
    py = f"open({str(marker)!r}, 'w').close()"
    shell = f'"{sys.executable}" -c "{py}"'
    import subprocess

    return {
        "system": (_Reduce(os.system, (shell,)), f"{os.system.__module__}.system"),
        "exec": (_Reduce(exec, (py,)), "builtins.exec"),
        "eval": (_Reduce(eval, (f"__import__('os').system({shell!r})",)), "builtins.eval"),
        "popen": (_Reduce(subprocess.Popen, ([sys.executable, "-c", py],)), "subprocess.Popen"),
    }


def _write(path, obj, container):
    if container == "zip":
        torch.save(obj, path)
    elif container == "legacy":
        torch.save(obj, path, _use_new_zipfile_serialization=False)
    else:
        path.write_bytes(pickle.dumps(obj, protocol=2))


@pytest.mark.parametrize("attack", ["system", "exec", "eval", "popen"])
@pytest.mark.parametrize("container", ["zip", "legacy", "bare"])
@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
def test_a_pickle_that_would_run_code_is_refused_and_never_runs(tmp_path, attack, container, entry):
    marker = tmp_path / "pwned"
    evil, global_name = _attacks(marker)[attack]
    p = tmp_path / "evil.ckpt"
    weights = _weights() if container != "bare" else {"w": [1.0, 2.0]}  # pickle.dumps of a tensor is no ckpt
    _write(p, {"state_dict": weights, "callbacks": {"x": evil}}, container)
    with pytest.raises(FormatError) as e:
        ENTRY_POINTS[entry](p)
    assert "would run code" in e.value.message and global_name in e.value.message
    assert not marker.exists()


def test_the_hostile_fixture_really_is_hostile(tmp_path):
    """Control: plain pickle.loads on the same bytes does run the payload (so the tests above can fail)."""
    marker = tmp_path / "ran"
    evil, _ = _attacks(marker)["exec"]
    pickle.loads(pickle.dumps({"x": evil}, protocol=2))
    assert marker.exists()


def test_protocol_0_global_and_getattr_smuggling_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    p = tmp_path / "p0.pt"
    p.write_bytes(f"cos\nsystem\n(S'touch {marker}'\ntR.".encode())
    with pytest.raises(FormatError, match=r"os\.system"):
        load_pickle(p)
    # getattr(collections.OrderedDict, ...) would reach further objects: getattr itself is refused
    body = b"\x80\x02cbuiltins\ngetattr\nccollections\nOrderedDict\nX\x08\x00\x00\x00__init__\x86R."
    p.write_bytes(body)
    with pytest.raises(FormatError, match=r"builtins\.getattr"):
        open_index(p)
    assert not marker.exists()


@pytest.fixture
def fake_lightning(monkeypatch, tmp_path):
    """A stand-in `pytorch_lightning` whose classes leave a marker if anything ever calls into them."""
    marker = tmp_path / "lightning_code_ran"
    names = [
        "pytorch_lightning",
        "pytorch_lightning.callbacks",
        "pytorch_lightning.callbacks.model_checkpoint",
    ]
    mods = {n: types.ModuleType(n) for n in names}

    class ModelCheckpoint:
        def __setstate__(self, state):
            marker.write_text("setstate")

        def __reduce_ex__(self, proto):
            return (ModelCheckpoint, (), {"monitor": "val/loss", "best_model_score": None})

        def __new__(cls, *a):
            if a:
                marker.write_text("new")
            return super().__new__(cls)

    ModelCheckpoint.__module__ = names[-1]
    ModelCheckpoint.__qualname__ = "ModelCheckpoint"
    mods[names[-1]].ModelCheckpoint = ModelCheckpoint
    for n, m in mods.items():
        monkeypatch.setitem(sys.modules, n, m)
    return ModelCheckpoint, marker


def _lightning_ckpt(path, mc_cls, container="zip"):
    obj = {
        "epoch": 6,
        "global_step": 470000,
        "pytorch-lightning_version": "1.4.2",
        "state_dict": _weights(),
        # PL < 1.5 keyed callback states by the callback class (as SD1.x checkpoints do)
        "callbacks": {mc_cls: {"best_model_score": None, "current_score": np.float64(0.25)}},
        "an_instance": mc_cls(),
        "array": np.arange(3),
    }
    _write(path, obj, container)


@pytest.mark.parametrize("container", ["zip", "legacy"])
def test_lightning_checkpoint_loads_with_stubs_and_no_code_runs(tmp_path, fake_lightning, container):
    mc_cls, marker = fake_lightning
    p = tmp_path / "sd.ckpt"
    _lightning_ckpt(p, mc_cls, container)
    assert not marker.exists()
    if container == "zip":  # what makes the stubs necessary
        with pytest.raises(pickle.UnpicklingError):
            torch.load(p, weights_only=True)
    idx = open_index(p)
    assert set(idx.tensors) == {"w", "b"} and idx.tensors["w"].dtype == "F16"
    assert idx.metadata["global_step"] == "470000"
    assert "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint" in idx.pickle_globals
    obj = load_pickle(p)
    for k, v in _weights().items():
        assert torch.equal(obj["state_dict"][k], v)
    (key,) = obj["callbacks"]
    assert issubclass(key, Stub) and key is not mc_cls
    assert isinstance(obj["an_instance"], Stub) and obj["an_instance"].state["monitor"] == "val/loss"
    assert isinstance(obj["array"], Stub)
    sd = load_state_dict(p)
    assert set(sd) == {"w", "b"}
    assert not marker.exists()


def test_lightning_checkpoint_with_a_hostile_payload_is_still_refused(tmp_path, fake_lightning):
    mc_cls, marker = fake_lightning
    p = tmp_path / "sd.ckpt"
    evil, name = _attacks(marker)["exec"]
    torch.save({"state_dict": _weights(), "callbacks": {mc_cls: {"x": evil}}}, p)
    for fn in ENTRY_POINTS.values():
        with pytest.raises(FormatError, match=name):
            fn(p)
    assert not marker.exists()


def test_tensor_sharing_and_parameters_survive_load(tmp_path):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    obj = {"a": w, "row": w[1], "p": torch.nn.Parameter(torch.ones(2))}
    p = tmp_path / "s.pt"
    torch.save(obj, p)
    idx = open_index(p)
    assert idx.data_size == 48 + 8 and idx.tensors["row"].shape == (4,)
    sd = load_state_dict(p)
    assert torch.equal(sd["row"], w[1]) and torch.equal(sd["p"], torch.ones(2))
    assert type(sd["p"]) is torch.Tensor and not sd["p"].requires_grad  # data, not a trainable leaf


def _zip_with_data_pkl(path, payload: bytes, *, lie_size: int | None = None):
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/data.pkl", payload)
        zf.writestr("archive/version", "3\n")
    if lie_size is not None:  # rewrite the central directory's uncompressed size
        raw = bytearray(path.read_bytes())
        cd = raw.index(b"PK\x01\x02")
        raw[cd + 24 : cd + 28] = struct.pack("<I", lie_size)
        path.write_bytes(bytes(raw))


@pytest.mark.parametrize("lie", [None, 1000], ids=["honest-size", "lying-size"])
def test_zip_bomb_data_pkl_is_refused_without_inflating(tmp_path, lie):
    p = tmp_path / "bomb.ckpt"
    payload = b"\x80\x02" + b"(" * (MAX_PICKLE_BYTES + 4 * 1024 * 1024) + b"."
    _zip_with_data_pkl(p, payload, lie_size=lie)
    assert p.stat().st_size < 1024 * 1024  # it compresses to almost nothing
    tracemalloc.start()
    try:
        with pytest.raises(FormatError):
            open_index(p)
        with pytest.raises(FormatError):
            load_pickle(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # neither the claimed nor the real inflated size is ever held


def test_pickle_claiming_huge_bytes_does_not_allocate(tmp_path):
    p = tmp_path / "huge.bin"
    p.write_bytes(b"\x80\x04\x8e" + struct.pack("<Q", 2**60) + b"xx")  # BINBYTES8 of 2**60 bytes
    tracemalloc.start()
    try:
        with pytest.raises(FormatError):
            open_index(p)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024


def test_storage_mismatches_are_corruption(tmp_path):
    p = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(8)}, p)
    with zipfile.ZipFile(p) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    data_key = next(n for n in members if "/data/" in n)
    for name, change in [(data_key, members[data_key][:-4]), (data_key, None)]:
        q = tmp_path / "bad.pt"
        with zipfile.ZipFile(q, "w") as zf:
            for n, b in members.items():
                if n == name and change is None:
                    continue
                zf.writestr(n, change if n == name else b)
        with pytest.raises(FormatError, match="storage"):
            open_index(q)


@pytest.mark.parametrize("member", ["data.pkl", "data/0"])
def test_a_member_marked_encrypted_is_corruption(tmp_path, member):
    """A damaged general-purpose flag can mark a member encrypted (the fuzz test found one): zipfile
    then raised a RuntimeError where a FormatError belongs. torch.save never encrypts."""
    p = tmp_path / "m.pt"
    torch.save({"w": torch.zeros(8)}, p)
    raw = bytearray(p.read_bytes())
    with zipfile.ZipFile(p) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith("/" + member))
    raw[info.header_offset + 6] |= 1  # the local header's flag
    for at in range(len(raw) - 46):  # and the central directory's (its entry names that header)
        entry = raw[at : at + 4] == b"PK\x01\x02"
        if entry and int.from_bytes(raw[at + 42 : at + 46], "little") == info.header_offset:
            raw[at + 8] |= 1
    p.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="encrypted"):
        open_index(p)


def test_tensor_view_past_its_storage_is_corruption(tmp_path):
    p = tmp_path / "v.pt"
    torch.save({"w": torch.zeros(8)}, p)
    with zipfile.ZipFile(p) as zf:
        members = {i.filename: zf.read(i) for i in zf.infolist()}
    pkl = next(n for n in members if n.endswith("data.pkl"))
    # shape (8,) -> (9,): the view would read one element past the storage
    assert members[pkl].count(b"K\x08\x85") == 1
    members[pkl] = members[pkl].replace(b"K\x08\x85", b"K\x09\x85")
    q = tmp_path / "bad.pt"
    with zipfile.ZipFile(q, "w") as zf:
        for n, b in members.items():
            zf.writestr(n, b)
    with pytest.raises(FormatError, match="storage"):
        open_index(q)


@pytest.mark.parametrize("container", ["zip", "legacy"])
def test_truncated_checkpoints(tmp_path, container):
    p = tmp_path / "t.pt"
    _write(p, {"state_dict": _weights()}, container)
    raw = p.read_bytes()
    cuts = sorted(
        {1, 2, 8, 30, 64, len(raw) // 3, len(raw) // 2, len(raw) - 100, len(raw) - 22, len(raw) - 1}
    )
    for cut in cuts:
        q = tmp_path / f"cut{cut}.pt"
        q.write_bytes(raw[:cut])
        with pytest.raises(FormatError):
            open_index(q)
        with pytest.raises(FormatError):
            load_pickle(q)


def test_refusal_message_is_for_a_user(tmp_path):
    p = tmp_path / "e.pt"
    p.write_bytes(pickle.dumps(_Reduce(os.system, ("true",)), protocol=2))
    with pytest.raises(FormatError) as e:
        open_index(p)
    msg = e.value.message
    assert str(p) in msg and "runs a shell command" in msg and ".safetensors" in msg
    assert e.value.to_json()["type"] == "format"


def test_bare_pickle_of_plain_data_indexes_empty(tmp_path):
    p = tmp_path / "plain.pt"
    p.write_bytes(pickle.dumps({"name": "x", "step": 3, "nested": [1, {2, 3}]}, protocol=2))
    idx = open_index(p)
    assert idx.format == "pickle" and idx.tensors == {} and idx.metadata == {"name": "x", "step": "3"}


def test_bytes_in_protocol_2_via_codecs_encode(tmp_path):
    p = tmp_path / "codecs.pt"
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2), "blob": b"\x00\xffabc"}, buf, pickle_protocol=2)
    p.write_bytes(buf.getvalue())
    idx = open_index(p)
    assert set(idx.tensors) == {"w"}
    assert load_pickle(p)["blob"] == b"\x00\xffabc"


def test_torch_tensor_kinds_we_cannot_read_are_unsupported_not_hostile(tmp_path):
    from engine.errors import UnsupportedModel

    p = tmp_path / "q.pt"  # what a quantized tensor pickles as (quantize_per_tensor is deprecated)
    p.write_bytes(b"\x80\x02ctorch._utils\n_rebuild_qtensor\n)R.")
    with pytest.raises(UnsupportedModel, match="_rebuild_qtensor"):
        open_index(p)
    with pytest.raises(UnsupportedModel):
        load_pickle(p)
    # a complex tensor is a real torch object no weight uses: unsupported, never "would run code"
    torch.save({"w": torch.ones(2, dtype=torch.complex64)}, p)
    for read in (open_index, load_pickle):
        with pytest.raises(UnsupportedModel, match="element type .*ComplexFloatStorage"):
            read(p)


def test_devices_and_dtypes_as_values_are_plain_data(tmp_path):
    p = tmp_path / "d.pt"
    torch.save({"w": torch.ones(2), "device": torch.device("cpu"), "dtype": torch.float16}, p)
    assert set(open_index(p).tensors) == {"w"}
    obj = load_pickle(p)
    assert obj["device"] == torch.device("cpu") and obj["dtype"] is torch.float16


@pytest.mark.parametrize("opcode", [pickle.BYTEARRAY8, pickle.BINBYTES8, pickle.BINUNICODE8])
def test_a_counted_item_larger_than_the_file_is_refused_before_anything_is_allocated(
    tmp_path, monkeypatch, opcode
):
    """A damaged 8-byte count (10^18 bytes) is a FormatError from the reader, quietly: left to the
    unpickler, a BYTEARRAY8 failed its allocation and CPython printed "deallocated bytearray object has
    exported buffers" through sys.excepthook (where pytest-qt turned it into a failure elsewhere)."""
    hooked = []
    monkeypatch.setattr(sys, "excepthook", lambda *a: hooked.append(a[1]))
    p = tmp_path / "huge_count.pt"
    p.write_bytes(b"\x80\x02" + opcode + (10**18).to_bytes(8, "little") + b"abc" + pickle.STOP)
    with pytest.raises(FormatError, match="larger than the rest of the file"):
        load_pickle(p)
    assert hooked == []


def test_any_checkpoint_torch_saves_indexes_and_loads_as_torch_load_reads_it(tmp_path):
    """Valid torch.save files of the structures scripts and trainers save -- nested dicts, lists and
    tuples, OrderedDicts, `state_dict` wrappers with scalars beside them, views sharing one storage,
    non-contiguous and expanded tensors, 0-d and empty ones, every dtype a weight has, Parameters --
    in the zip and the legacy container: our header-only index names every tensor with torch.load's
    shape and dtype, and our restricted load gives torch.load's values."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from engine.formats.dtypes import DTYPES

    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
              torch.int8, torch.uint8, torch.bool]  # fmt: skip
    shape = st.lists(st.integers(0, 3), max_size=3)

    @st.composite
    def tensors(draw):
        dt, s = draw(st.sampled_from(dtypes)), draw(shape)
        base = (torch.arange(max(1, 2 * int(np.prod(s or [1])) + 3)) % 7 - 3).to(dt)
        how = draw(st.sampled_from(["plain", "view", "transposed", "expanded", "parameter"]))
        n = int(np.prod(s)) if s else 1
        t = base[:n].reshape(s) if how != "view" else base[2 : 2 + n].reshape(s)
        if how == "transposed" and t.dim() >= 2:
            t = t.transpose(0, 1)
        elif how == "expanded" and t.dim() >= 1 and t.shape[0] == 1:
            t = t.expand(3, *t.shape[1:])
        elif how == "parameter" and dt.is_floating_point:
            t = torch.nn.Parameter(t, requires_grad=False)
        return t

    names = st.text(
        st.characters(blacklist_categories=("Cs",), blacklist_characters="."), min_size=1, max_size=8
    )
    tree = st.recursive(
        tensors(),
        lambda kids: st.dictionaries(names, kids, max_size=3) | st.lists(kids, max_size=3),
        max_leaves=8,
    )
    wrap = st.sampled_from(["bare", "state_dict", "ordered"])

    @settings(max_examples=40, deadline=None)
    @given(st.dictionaries(names, tree, min_size=1, max_size=3), wrap, st.booleans())
    def check(obj, how, use_zip):
        obj = {"state_dict": obj, "global_step": 7} if how == "state_dict" else obj
        if how == "ordered":
            obj = collections.OrderedDict(obj)
        p = tmp_path / "any.ckpt"
        torch.save(obj, p, _use_new_zipfile_serialization=use_zip)
        want = flatten(tensor_root(torch.load(p, weights_only=True)), lambda o: isinstance(o, torch.Tensor))
        idx = open_index(p)
        assert set(idx.tensors) == set(want)
        got = load_state_dict(p)
        for k, t in want.items():
            assert idx.tensors[k].shape == tuple(t.shape), k
            assert DTYPES[idx.tensors[k].dtype][1] == str(t.dtype).removeprefix("torch."), k
            assert got[k].dtype == t.dtype and torch.equal(got[k], t), k

    check()
