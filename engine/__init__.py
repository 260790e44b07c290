"""Loadout's engine: detection, patching, residency and VAE work on real model files. No Qt here.

Importing this package must stay cheap and must not import torch: the GUI thread imports it before
the window appears, and torch is imported later, in the engine thread.
"""

__version__ = "0.1.0"
