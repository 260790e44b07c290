"""Adapters (LoRA, LoCon, LoHa, LoKr, DoRA, full diffs, `set`, norm diffs) and their naming conventions.

This package's top level is torch-free (detection on the GUI thread imports it); the delta math and
adapter loading import torch inside their own modules.
"""

from .describe import LoraInfo, describe_lora

__all__ = ["LoraInfo", "describe_lora"]
