"""Detection: what a model file is (kind, architecture, variant, prediction, components) from its header
alone, with the keys and shapes that decided. Never reads tensor data (except the opt-in SD2 check) and
never imports torch, so the GUI thread may import it.
"""

import hashlib as _hashlib
from pathlib import Path as _Path

from .core import build_components, detect_index
from .file import detect_file
from .keys import KeyIndex, TensorMeta, as_key_index, index_from_shapes
from .result import KINDS, Component, Detection, Evidence, Failure, LoraFacts, Summary


def _rules_version() -> str:
    """A fingerprint of the detection rules (their source), so caches of old detections can be
    recognised as stale. Frozen builds without sources fall back to a fixed string."""
    h = _hashlib.sha1()
    try:
        for f in sorted(_Path(__file__).parent.glob("*.py")):
            h.update(f.read_bytes())
    except OSError:
        return "frozen"
    return h.hexdigest()[:12]


__version__ = _rules_version()

__all__ = [
    "detect_file",
    "detect_index",
    "build_components",
    "Detection",
    "Component",
    "Evidence",
    "Failure",
    "LoraFacts",
    "Summary",
    "KINDS",
    "KeyIndex",
    "TensorMeta",
    "as_key_index",
    "index_from_shapes",
    "__version__",
]
