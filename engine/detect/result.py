"""The Detection object of DESIGN.md and its parts, as frozen dataclasses with `to_json()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

KINDS = (
    "checkpoint",
    "diffusion_model",
    "vae",
    "vae_approx",
    "text_encoder",
    "clip_vision",
    "lora",
    "embedding",
    "controlnet",
    "ip_adapter",
    "upscaler",
    "unknown",
)
COMPONENT_ORDER = ("unet", "transformer", "clip_l", "clip_g", "clip_h", "t5xxl", "vae", "other")


@dataclass(frozen=True)
class Evidence:
    """One key (and its shape) that decided something, with a reason a user can read."""

    key: str
    shape: tuple[int, ...] | None
    reason: str

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "shape": None if self.shape is None else list(self.shape),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class Component:
    """A part of a model file (UNet, a text encoder, the VAE, ...) and what it costs."""

    prefix: str
    tensors: int
    params: int
    bytes: int
    dtype: str | None

    def to_json(self) -> dict:
        return {
            "prefix": self.prefix,
            "tensors": self.tensors,
            "params": self.params,
            "bytes": self.bytes,
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class Detection:
    """What a file is, from its header alone, and why. `error` is set when it cannot be read or used."""

    path: str
    file_bytes: int | None
    format: str | None
    kind: str = "unknown"
    architecture: str | None = None
    also: tuple[str, ...] = ()  # other families that use this very layout (a VAE or backbone they share)
    variant: str | None = None
    prediction: str | None = None
    components: dict[str, Component] = field(default_factory=dict)
    lora: dict | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    summary: dict | None = None
    evidence: tuple[Evidence, ...] = ()
    error: dict | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def params(self) -> int:
        return sum(c.params for c in self.components.values())

    def to_json(self) -> dict[str, Any]:
        """Exactly the DESIGN.md object, plus `summary` (readable metadata: kohya / modelspec facts)."""
        return {
            "path": self.path,
            "file_bytes": self.file_bytes,
            "format": self.format,
            "kind": self.kind,
            "architecture": self.architecture,
            "also": list(self.also),
            "variant": self.variant,
            "prediction": self.prediction,
            "components": {k: v.to_json() for k, v in self.components.items()},
            "lora": self.lora,
            "metadata": dict(self.metadata),
            "summary": self.summary,
            "evidence": [e.to_json() for e in self.evidence],
            "error": self.error,
        }
