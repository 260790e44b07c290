"""Detection: what a model file is (kind, architecture, variant, prediction, components) from its header
alone, with the keys and shapes that decided. Never reads tensor data (except the opt-in SD2 check) and
never imports torch, so the GUI thread may import it.
"""

from .core import build_components, detect_index
from .file import detect_file
from .keys import KeyIndex, TensorMeta, as_key_index, index_from_shapes
from .result import KINDS, Component, Detection, Evidence

__all__ = [
    "detect_file",
    "detect_index",
    "build_components",
    "Detection",
    "Component",
    "Evidence",
    "KINDS",
    "KeyIndex",
    "TensorMeta",
    "as_key_index",
    "index_from_shapes",
]
