"""The model library: find model files in ComfyUI / A1111 / any folders, detect them from their headers,
cache the results in SQLite, pick up preview and note sidecars, and hash files in the background.

Safe to import from the GUI thread: nothing here imports torch at module level (the demo writer
imports it inside its functions).
"""

from .cache import LibraryCache, cache_dir
from .hashing import BackgroundHasher, FileHashes, HashRun, hash_file, hash_missing, is_sparse
from .layout import FOLDER_KINDS, MODEL_SUFFIXES, Root, declared_kind_for_path, read_extra_model_paths
from .library import Library, LibraryEntry, detector_fingerprint, error_detection, resolve_roots, scan
from .walk import Found, Problem, discover

__all__ = [
    "BackgroundHasher", "FOLDER_KINDS", "FileHashes", "Found", "HashRun", "Library", "LibraryCache",
    "LibraryEntry", "MODEL_SUFFIXES", "Problem", "Root", "cache_dir", "declared_kind_for_path",
    "detector_fingerprint", "discover", "error_detection", "hash_file", "hash_missing", "is_sparse",
    "read_extra_model_paths", "resolve_roots", "scan",
]  # fmt: skip
