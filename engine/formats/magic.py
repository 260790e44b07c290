"""What a file that is no model is, from its first bytes: the sentence a refusal gives the user
("this is a JPEG image, not a model file") instead of a parser's complaint about its bytes."""

from __future__ import annotations

import os

HEAD_BYTES = 64  # what `what_is` looks at
# The reference safetensors implementation refuses headers above 100 MB; a real SDXL header is ~200 KB
# and the largest real ones (Flux all-in-one with T5-XXL) are under 1 MB. Defined here, where the
# first bytes are recognised (sniff, once per file of a library scan), and read by the reader too.
MAX_HEADER_BYTES = 100 * 1024 * 1024

_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
    (b"%PDF", "a PDF document"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf", "a 7-Zip archive"),
    (b"Rar!", "a RAR archive"),
    (b"<!DOCTYPE html", "an HTML page (a download that saved an error page?)"),
    (b"<html", "an HTML page (a download that saved an error page?)"),
    (b"version https://git-lfs", "a Git LFS pointer, not the model itself (run `git lfs pull`)"),
)


def container_of(head: bytes) -> str | None:
    """The model container a file's first bytes (16 suffice) open: 'gguf', 'torch-zip' (torch.save since
    1.6), 'pickle' (legacy torch.save or a bare pickle), 'safetensors'; None for anything else."""
    if head[:4] == b"GGUF":
        return "gguf"
    if head[:4] == b"PK\x03\x04":
        return "torch-zip"
    # safetensors before pickle: a header of 640, 896, 1,152 or 1,408 bytes starts 80 02..80 05, which is
    # also how a pickle starts (PROTO 2-5); a pickle has no '{' after eight bytes that read as a size
    if len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= MAX_HEADER_BYTES:
        return "safetensors"
    if head[:1] == b"\x80" and len(head) > 1 and 2 <= head[1] <= 5:
        return "pickle"
    return None


_CONTAINERS = {
    "gguf": "a GGUF file",
    "torch-zip": "a zip archive (a torch .pt / .ckpt?)",
    "pickle": "a Python pickle (a torch .pt / .ckpt?)",
    "safetensors": "a safetensors file",
}


def what_is(head: bytes) -> str:
    """'a PNG image', 'a text file', … for a file's first bytes (HEAD_BYTES of them suffice). The
    model containers too, for a file given where something else was wanted (a latent as the image)."""
    container = container_of(head)
    if container is not None:
        return _CONTAINERS[container]
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return what
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "a WebP image"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and sum(c.isprintable() or c in "\r\n\t" for c in text) >= 0.95 * len(text):
        return "a text file"
    return "data in no format Loadout knows"


def what_file_is(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return what_is(f.read(HEAD_BYTES))
