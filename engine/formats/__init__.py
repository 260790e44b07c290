"""Model file formats, read as untrusted input.

* `sniff(path)`: which container a file is, from its first bytes alone.
* `open_index(path) -> ModelIndex`: every tensor's name, dtype, shape and size from the header alone,
  for safetensors, torch zip / legacy pickles (restricted unpickler) and GGUF. Never reads tensor data,
  never imports torch.
* `safetensors`: the validated header reader, lazy mmap tensors, atomic writers; `pickles`: safe
  loading of .ckpt/.pt/.bin; `latent`: ComfyUI .latent files; `gguf`: the GGUF header reader.
* `open_weights(path)`: a loader's lazy, zero-copy view of a safetensors, GGUF or torch zip file's tensors.
"""

from __future__ import annotations

import os

from ..errors import FormatError
from .gguf import GGUFFile
from .index import IndexedTensor, ModelIndex, open_index
from .magic import container_of
from .safetensors import SafetensorsFile, SafetensorsHeader, TensorInfo, read_header

__all__ = [
    "sniff",
    "open_index",
    "ModelIndex",
    "IndexedTensor",
    "read_header",
    "SafetensorsFile",
    "SafetensorsHeader",
    "TensorInfo",
    "MODEL_SUFFIXES",
    "GGUFFile",
    "open_weights",
]

MODEL_SUFFIXES = (".safetensors", ".sft", ".ckpt", ".pt", ".pth", ".bin", ".gguf", ".latent")


def sniff(path: str | os.PathLike) -> str:
    """The container format from the magic bytes (not the name).

    Returns 'safetensors', 'torch-zip' (torch.save since 1.6), 'pickle' (legacy torch.save or a bare
    pickle), 'gguf', 'directory', 'empty' or 'unknown'. Reads at most 16 bytes.
    """
    p = os.fspath(path)
    if os.path.isdir(p):
        return "directory"
    with open(p, "rb") as f:
        head = f.read(16)
    if not head:
        return "empty"
    return container_of(head) or "unknown"


def open_weights(path: str | os.PathLike) -> SafetensorsFile:
    """The file's tensors for loading, by its magic bytes: a SafetensorsFile, or a GGUFFile (the same
    interface; quantized tensors come as their raw blocks)."""
    p = os.fspath(path)
    try:
        kind = sniff(p)
    except OSError as e:
        raise FormatError(f"{p}: cannot read the file ({e.strerror or e})", path=p) from e
    if kind == "gguf":
        return GGUFFile(path)
    if kind == "safetensors":
        return SafetensorsFile(path)
    if kind in ("torch-zip", "pickle"):  # .ckpt / .pt / .pth / .bin (a legacy pickle is refused there, said)
        from .torchzip import TorchZipFile

        return TorchZipFile(path)
    from .magic import what_file_is

    what = "a folder" if kind == "directory" else "an empty file" if kind == "empty" else what_file_is(p)
    raise FormatError(
        f"{os.path.basename(p)}: this is {what}; Loadout loads safetensors, GGUF and torch checkpoint files",
        path=p,
    )
