"""A restricted unpickler for model checkpoints: nothing a file names is ever imported or called.

Pickle is a program: every GLOBAL opcode names a Python callable and REDUCE calls it. Here every global
is looked up in fixed tables; anything else stops the load with a FormatError naming it, before any of
the file's code could run. Three kinds of global are admitted:

* tensor machinery (`torch._utils._rebuild_tensor_v2`, storages, dtypes) — in *scan* mode replaced by
  recorders that note dtype, shape and storage without importing torch or reading data; in *load* mode
  the real torch functions (they only build tensors);
* plain containers (`collections.OrderedDict`, `set`, ...);
* a short list of training metadata classes that real Stable Diffusion checkpoints pickle. They are
  replaced by inert stub classes that record their arguments and are never the real class.

The SD1.x list is the one lopho/pickle_inspector (`pickle_inspector/_importlists.py`,
`stable_diffusion_v1`) found in the released checkpoints: collections.OrderedDict,
torch._utils._rebuild_tensor_v2, torch.{Half,Float,Int,Long}Storage,
pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint, numpy.core.multiarray.scalar,
numpy.dtype and _codecs.encode. ComfyUI (`comfy/checkpoint_pickle.py`) likewise stands in an empty class
for every `pytorch_lightning` global when it loads such files.
"""

from __future__ import annotations

import _compat_pickle
import collections
import pickle
import traceback
from typing import Any

from ..errors import EngineError, FormatError, UnsupportedModel

# Storage class name -> (safetensors dtype, bytes per element). Source: torch/storage.py typed storages.
STORAGE_DTYPES: dict[str, tuple[str, int]] = {
    "HalfStorage": ("F16", 2),
    "BFloat16Storage": ("BF16", 2),
    "FloatStorage": ("F32", 4),
    "DoubleStorage": ("F64", 8),
    "LongStorage": ("I64", 8),
    "IntStorage": ("I32", 4),
    "ShortStorage": ("I16", 2),
    "CharStorage": ("I8", 1),
    "ByteStorage": ("U8", 1),
    "BoolStorage": ("BOOL", 1),
    "UntypedStorage": ("U8", 1),
    "Float8_e4m3fnStorage": ("F8_E4M3", 1),
    "Float8_e5m2Storage": ("F8_E5M2", 1),
    "UInt16Storage": ("U16", 2),
    "UInt32Storage": ("U32", 4),
    "UInt64Storage": ("U64", 8),
}

# torch dtype attribute names that may appear as globals (e.g. in tensor metadata), as safetensors names.
TORCH_DTYPES = {
    "float16": "F16",
    "half": "F16",
    "bfloat16": "BF16",
    "float32": "F32",
    "float": "F32",
    "float64": "F64",
    "double": "F64",
    "int64": "I64",
    "long": "I64",
    "int32": "I32",
    "int": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint8": "U8",
    "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}

# Known training metadata: stubbed, never imported, never called.
STUB_GLOBALS = frozenset(
    {
        "pytorch_lightning.callbacks.model_checkpoint.ModelCheckpoint",
        "lightning.pytorch.callbacks.model_checkpoint.ModelCheckpoint",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.dtype",
        "numpy.ndarray",
    }
)

# Plain, side-effect-free containers and values. Nothing here
# allocates in proportion to a number (bytearray(2**40) would), only to what the pickle itself holds.
_CONTAINERS: dict[str, Any] = {
    "collections.OrderedDict": collections.OrderedDict,
    "builtins.set": set,
    "builtins.frozenset": frozenset,
    "builtins.slice": slice,
    "builtins.complex": complex,
}

# Tensor machinery: the same names in scan mode (recorders) and load mode (real torch functions).
REBUILD_GLOBALS = frozenset(
    {
        "torch._utils._rebuild_tensor",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter",
        "torch._utils._rebuild_parameter_with_state",
        "torch._tensor._rebuild_from_type_v2",
        "torch.nn.parameter.Parameter",
        "torch.Tensor",
        "torch.Size",
        "torch.device",
    }
)

_DANGER = {
    "os.system": "which runs a shell command",
    "posix.system": "which runs a shell command",
    "nt.system": "which runs a shell command",
    "builtins.eval": "which runs Python code",
    "builtins.exec": "which runs Python code",
    "builtins.compile": "which compiles Python code",
    "builtins.__import__": "which imports any module",
    "builtins.getattr": "which reaches any attribute of any object",
    "builtins.open": "which opens files",
    "runpy._run_code": "which runs Python code",
}

MAX_DIMS = 16


def refusal(path: str, full: str) -> EngineError:
    """The error for a global outside every table; says what it is and what the user can do.

    torch's own tensor-rebuild functions we do not handle (quantized, sparse, subclass tensors) and
    storages of element types no weight has (complex) mean a real checkpoint Loadout cannot read:
    UnsupportedModel. Anything else is treated as hostile.
    """
    module, _, name = full.rpartition(".")
    if module.split(".", 1)[0] == "torch" and name.startswith("_rebuild") and name.isidentifier():
        return UnsupportedModel(
            f"{path}: holds tensors of a kind Loadout cannot read yet ({full}: quantized, sparse or "
            "subclassed tensors)",
            path=path,
        )
    if module == "torch" and name.endswith("Storage") and name.isidentifier():  # e.g. ComplexFloatStorage
        return UnsupportedModel(
            f"{path}: holds tensors of an element type Loadout cannot use ({full}: complex, quantized "
            "or other non-weight storage)",
            path=path,
        )
    why = _DANGER.get(full)
    if why is None:
        module = full.split(".", 1)[0]
        if module in ("subprocess", "os", "posix", "nt", "shutil", "socket", "sys", "importlib", "runpy"):
            why = "which can run programs or touch the system"
        else:
            why = "which is no tensor, plain container or known training metadata"
    return FormatError(
        f"{path}: this file would run code when loaded: it references {full}, {why}. Loadout refused it "
        "and ran nothing. If you trust its source, convert it to .safetensors with a tool you trust.",
        path=path,
    )


def _latin1_encode(obj: Any, encoding: str = "utf-8", errors: str = "strict") -> bytes:
    """`_codecs.encode` as protocol-2 pickles use it for bytes: str -> latin-1 bytes, nothing else."""
    if not isinstance(obj, str) or encoding not in ("latin1", "latin-1"):
        raise FormatError("the pickle calls _codecs.encode with unexpected arguments")
    return obj.encode("latin-1")


class Stub:
    """An inert stand-in for a known metadata class: keeps what the pickle passed, runs nothing."""

    _stub_name = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs
        self.state: Any = None
        self.items: list = []

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, x: Any) -> None:
        self.items.append(x)

    def extend(self, xs: Any) -> None:
        self.items.extend(xs)

    def __setitem__(self, k: Any, v: Any) -> None:
        self.items.append((k, v))

    def __repr__(self) -> str:
        return f"<stub {self._stub_name}>"


def stub_class(full: str) -> type:
    module, _, name = full.rpartition(".")
    return type(name, (Stub,), {"_stub_name": full, "__module__": f"loadout_stub.{module}"})


class StorageType:
    """Scan mode: a storage class named by the pickle (e.g. torch.HalfStorage)."""

    def __init__(self, name: str):
        self.name = name
        self.dtype, self.itemsize = STORAGE_DTYPES[name]


class StorageRef:
    """Scan mode: one storage the pickle refers to (its bytes live outside the pickle)."""

    def __init__(self, key: str, stype: StorageType, numel: int):
        self.key, self.stype, self.numel = key, stype, numel

    @property
    def nbytes(self) -> int:
        return self.numel * self.stype.itemsize


class TensorRef:
    """Scan mode: a tensor view of a storage: dtype, shape, and where in the storage (element offset and
    strides), no data."""

    def __init__(
        self, storage: StorageRef, shape: tuple[int, ...], offset: int = 0, strides: tuple[int, ...] = ()
    ):
        self.storage, self.shape, self.offset, self.strides = storage, shape, offset, strides

    @property
    def dtype(self) -> str:
        return self.storage.stype.dtype

    @property
    def nbytes(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n * self.storage.stype.itemsize


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if not isinstance(x, (tuple, list)) or len(x) > MAX_DIMS:
        raise FormatError(f"a tensor's {what} is not a short tuple of integers: the file is corrupt")
    for v in x:
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise FormatError(f"a tensor's {what} {x!r} holds a non-integer or negative value")
    return tuple(x)


def _record_tensor(storage: Any, offset: Any, size: Any, stride: Any, *_rest: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise FormatError("a tensor is rebuilt from something that is not a storage: the file is corrupt")
    shape = _ints(size, "shape")
    strides = _ints(stride, "strides")
    if len(strides) != len(shape) or not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
        raise FormatError(f"a tensor of shape {list(shape)} has an invalid offset or strides")
    if all(shape):  # a non-empty view must lie inside its storage
        last = offset + sum((s - 1) * st for s, st in zip(shape, strides, strict=True))
        if last >= storage.numel:
            raise FormatError(
                f"a tensor of shape {list(shape)} reaches element {last:,} of a storage of "
                f"{storage.numel:,}: the file is corrupt"
            )
    return TensorRef(storage, shape, offset, strides)


def _record_parameter(data: Any, *_rest: Any) -> Any:
    return data


def _record_from_type(func: Any, _new_type: Any, args: Any, _state: Any) -> Any:
    if not callable(func) or not isinstance(args, tuple):
        raise FormatError("a tensor subclass is rebuilt with unexpected arguments: the file is corrupt")
    return func(*args)  # func came from find_class, so it is one of ours


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


_SCAN_REBUILD: dict[str, Any] = {
    "torch._utils._rebuild_tensor": _record_tensor,
    "torch._utils._rebuild_tensor_v2": _record_tensor,
    "torch._utils._rebuild_parameter": _record_parameter,
    "torch._utils._rebuild_parameter_with_state": _record_parameter,
    "torch._tensor._rebuild_from_type_v2": _record_from_type,
    "torch.nn.parameter.Parameter": _Marker("Parameter"),
    "torch.Tensor": _Marker("Tensor"),
    "torch.Size": tuple,
    "torch.device": lambda *a: _Marker(f"device{a!r:.40}"),
}


class Allowlist:
    """Resolves globals for one unpickling; remembers every name the file referenced."""

    def __init__(self, path: str, *, load: bool):
        self.path = path
        self.load = load
        self.seen: set[str] = set()
        self.stubs: dict[str, type] = {}

    def resolve(self, module: str, name: str) -> Any:
        if not isinstance(module, str) or not isinstance(name, str):
            raise FormatError(f"{self.path}: the pickle names a global that is not text: the file is corrupt")
        # Protocol 0-2 pickles use Python 2 names (__builtin__, commands, copy_reg): report and match
        # them by their Python 3 names, as pickle's own fix_imports does.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f"{module}.{name}"
        self.seen.add(full)
        if full in _CONTAINERS:
            return _CONTAINERS[full]
        if full == "_codecs.encode":
            return _latin1_encode
        if full in STUB_GLOBALS:
            if full not in self.stubs:
                self.stubs[full] = stub_class(full)
            return self.stubs[full]
        if module == "torch" and name in STORAGE_DTYPES:
            return self._torch_attr(name) if self.load else StorageType(name)
        if module == "torch" and name in TORCH_DTYPES:
            return self._torch_attr(name) if self.load else _Marker(f"torch.{name}")
        if full in REBUILD_GLOBALS:
            if self.load:
                import importlib

                return getattr(importlib.import_module(module), name)
            return _SCAN_REBUILD[full]
        raise refusal(self.path, full)

    @staticmethod
    def _torch_attr(name: str) -> Any:
        import torch

        return getattr(torch, name)


class ScanUnpickler(pickle.Unpickler):
    """Scan mode: records storages and tensor shapes; reads no tensor data, imports no torch."""

    def __init__(self, file: Any, allow: Allowlist, *, storages: dict[str, StorageRef] | None = None):
        super().__init__(file)
        self.allow = allow
        self.storages = storages if storages is not None else {}
        self.with_storages = storages is not None

    def find_class(self, module: str, name: str) -> Any:
        return self.allow.resolve(module, name)

    def persistent_load(self, pid: Any) -> Any:
        p = self.allow.path
        if not self.with_storages:
            raise FormatError(f"{p}: the pickle refers to outside data but is no torch checkpoint")
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage":
            raise FormatError(f"{p}: the pickle refers to outside data of an unknown kind ({pid!r:.80})")
        stype, key, _location, numel = pid[1], pid[2], pid[3], pid[4]
        if not isinstance(stype, StorageType):
            raise FormatError(f"{p}: a storage of an unknown type ({stype!r:.60}): the file is corrupt")
        if not isinstance(key, str) or not isinstance(numel, int) or isinstance(numel, bool) or numel < 0:
            raise FormatError(f"{p}: a storage reference is malformed ({pid!r:.80}): the file is corrupt")
        old = self.storages.get(key)
        if old is not None:
            if old.stype.name != stype.name or old.numel != numel:
                raise FormatError(f"{p}: storage {key!r} is described two different ways: corrupt file")
            return old
        ref = StorageRef(key, stype, numel)
        self.storages[key] = ref
        return ref


def scan_load(file: Any, allow: Allowlist, storages: dict[str, StorageRef] | None = None) -> Any:
    """Unpickle one object in scan mode, turning every malformed-pickle failure into a FormatError.

    On a failure the unpickler and whatever it built (a hostile stream can build memoryviews of
    bytearrays) are freed here and now: otherwise the exception's frames keep them in a reference
    cycle that the garbage collector frees later, in whatever thread it runs — where freeing a
    bytearray before its view raises "deallocated bytearray object has exported buffers"."""
    try:
        return _scan_load(file, allow, storages)
    except BaseException as e:
        free_failure(e)
        raise


def free_failure(e: BaseException | None, depth: int = 0) -> None:
    """Clear the finished frames of a failed unpickling (and of its causes), so the unpickler and what
    it built are freed now rather than by the garbage collector."""
    while e is not None and depth < 8:
        traceback.clear_frames(e.__traceback__)
        free_failure(e.__cause__, depth + 1)
        e, depth = e.__context__, depth + 1


def _scan_load(file: Any, allow: Allowlist, storages: dict[str, StorageRef] | None = None) -> Any:
    try:
        return ScanUnpickler(file, allow, storages=storages).load()
    except FormatError as e:
        if not e.message.startswith(allow.path):
            raise FormatError(f"{allow.path}: {e.message}", path=allow.path) from None
        raise
    except UnsupportedModel:
        raise
    except RecursionError:
        raise FormatError(f"{allow.path}: the pickle nests too deeply: the file is corrupt") from None
    except MemoryError:
        raise FormatError(f"{allow.path}: the pickle would need too much memory: corrupt file") from None
    except Exception as e:  # pickle reports a malformed stream with many exception types
        raise FormatError(
            f"{allow.path}: the pickled data is damaged ({type(e).__name__}: {e}): the file is corrupt "
            "or truncated",
            path=allow.path,
        ) from None
