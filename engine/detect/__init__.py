"""Detection: what a model file is (kind, architecture, variant, prediction, components) from its header
alone, with the keys and shapes that decided. Never reads tensor data (except the opt-in SD2 check) and
never imports torch, so the GUI thread may import it.
"""

import hashlib as _hashlib
import importlib as _importlib
from pathlib import Path as _Path

from .result import KINDS, Component, Detection, Evidence, Failure, LoraFacts, Summary

# The rules are imported on first use (PEP 562): the catalog reads cached Detections through this
# package, and a warm scan, which detects nothing, would otherwise spend a tenth of its run importing
# them and the format readers.
_LAZY = {
    "build_components": ".core",
    "detect_index": ".core",
    "detect_file": ".file",
    "KeyIndex": ".keys",
    "TensorMeta": ".keys",
    "as_key_index": ".keys",
    "index_from_shapes": ".keys",
}


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


def __getattr__(name: str):
    if name == "__version__":
        value = _rules_version()
    elif name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name], __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups find it without this function
    return value


def __dir__():
    return sorted({*globals(), *_LAZY, "__version__"})


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
