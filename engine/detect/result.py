"""The Detection object of DESIGN.md and its parts: immutable values, kept typed from the detector to the
window. JSON exists only at the edges: `to_json()` for `--json` output and the cache row, `from_json()`
to read a cache row back; `Detection.from_json(d.to_json()).to_json() == d.to_json()` for every d.

Immutable all the way down: frozen dataclasses, tuples for lists, `types.MappingProxyType` over a private
copy for mappings (so a Detection can cross threads in a Qt signal and nobody can change it on the way).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
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

# Kinds whose weights are no model of their own, with what each is and where it goes: every command
# that takes a model (load, the coverage's base, plan, step) refuses them in these words. The one place
# that lists them.
NOT_A_MODEL = {"lora": "a LoRA", "embedding": "a textual-inversion embedding"}
_GOES = {
    "lora": "it patches a model (give it with --lora beside the model, or add it to the LoRA stack)",
    "embedding": "it belongs in a prompt",
}


def not_a_model(kind: str) -> str | None:
    """'a LoRA: it patches a model (…), and is not loaded alone' for a kind in NOT_A_MODEL, else None."""
    return f"{NOT_A_MODEL[kind]}: {_GOES[kind]}, and is not loaded alone" if kind in NOT_A_MODEL else None


_EMPTY: Mapping = MappingProxyType({})


def freeze(value: Any) -> Any:
    """JSON-like data made immutable: dicts -> read-only mappings, lists -> tuples (recursively)."""
    if isinstance(value, Mapping):
        return MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """The inverse of freeze() for JSON output: read-only mappings -> dicts, tuples -> lists."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [thaw(v) for v in value]
    return value


def _frozen_mapping(value: Any) -> Mapping:
    # A mapping we froze before (dataclasses.replace passes it back) is kept; anything else is copied.
    return value if type(value) is MappingProxyType else freeze(value or {})


_NONE = type(None)
_STR, _OPT_STR, _INT, _OPT_INT = {str}, {str, _NONE}, {int}, {int, _NONE}
_NUM = {int, float, _NONE}
_LIST, _DICT, _OPT_LIST, _OPT_DICT = {list}, {dict}, {list, _NONE}, {dict, _NONE}


class _Schema:
    """A JSON object's fields and the JSON types each may have (exact types: `true` is no number)."""

    def __init__(self, what: str, **fields: set[type]):
        self.what, self.fields = what, fields
        self._get = operator.itemgetter(*fields)
        # Every allowed combination of types, so a well-formed object costs one set lookup (cache reads).
        self._allowed = frozenset(itertools.product(*fields.values()))

    def values(self, d: Any) -> tuple:
        """d's values in field order; ValueError (never KeyError/TypeError) when d is not such an object."""
        if type(d) is not dict:
            raise ValueError(f"{self.what}: expected an object, got {type(d).__name__}")
        try:
            values = self._get(d)
        except KeyError as e:
            raise ValueError(f"{self.what}: no {e}") from None
        if tuple(map(type, values)) not in self._allowed:
            bad = next(k for k, v in zip(self.fields, values, strict=True) if type(v) not in self.fields[k])
            raise ValueError(f"{self.what}.{bad}: unexpected {type(d[bad]).__name__}")
        return values


def _names(values: list, what: str) -> list:
    if not {type(v) for v in values} <= _STR:
        raise ValueError(f"{what}: not a list of names")
    return values


@dataclass(frozen=True)
class Evidence:
    """One key (and its shape) that decided something, with a reason a user can read."""

    key: str
    shape: tuple[int, ...] | None
    reason: str

    def __post_init__(self) -> None:
        if self.shape is not None and type(self.shape) is not tuple:
            object.__setattr__(self, "shape", tuple(self.shape))

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "shape": None if self.shape is None else list(self.shape),
            "reason": self.reason,
        }

    @classmethod
    def from_json(cls, d: Any) -> Evidence:
        key, shape, reason = _EVIDENCE.values(d)
        if shape is not None:
            if not {type(n) for n in shape} <= _INT:
                raise ValueError("evidence.shape: not a list of integers")
            shape = tuple(shape)
        return cls(key, shape, reason)


_EVIDENCE = _Schema("evidence", key=_STR, shape=_OPT_LIST, reason=_STR)


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

    @classmethod
    def from_json(cls, d: Any) -> Component:
        return cls(*_COMPONENT.values(d))


_COMPONENT = _Schema("component", prefix=_STR, tensors=_INT, params=_INT, bytes=_INT, dtype=_OPT_STR)


@dataclass(frozen=True)
class LoraFacts:
    """`lora` of the Detection JSON: an adapter file's format, algorithms, most common rank, alpha,
    the components it targets and the base architecture it was trained on (None when unknown)."""

    format: str | None
    algos: tuple[str, ...]
    rank: int | None
    alpha: float | None
    targets: tuple[str, ...]
    base: str | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "algos", tuple(self.algos))
        object.__setattr__(self, "targets", tuple(self.targets))

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "algos": list(self.algos),
            "rank": self.rank,
            "alpha": self.alpha,
            "targets": list(self.targets),
            "base": self.base,
        }

    @classmethod
    def from_json(cls, d: Any) -> LoraFacts:
        fmt, algos, rank, alpha, targets, base = _LORA.values(d)
        return cls(fmt, _names(algos, "lora.algos"), rank, alpha, _names(targets, "lora.targets"), base)


_LORA = _Schema("lora", format=_OPT_STR, algos=_LIST, rank=_OPT_INT, alpha=_NUM, targets=_LIST, base=_OPT_STR)


@dataclass(frozen=True)
class Failure:
    """`error` of the Detection JSON: why a file cannot be read or used (a value, not an exception).
    type: "format" (corrupt, truncated, not a model), "unsupported" (a real model Loadout cannot load),
    or another engine error type; message: written for the user."""

    type: str
    message: str

    def to_json(self) -> dict:
        return {"type": self.type, "message": self.message}

    @classmethod
    def from_json(cls, d: Any) -> Failure:
        return cls(*_FAILURE.values(d))


_FAILURE = _Schema("error", type=_STR, message=_STR)


_SUMMARY_PARTS = ("training", "modelspec", "other")


@dataclass(frozen=True)
class Summary:
    """The metadata as users read it (engine.detect.meta): kohya training facts, modelspec card fields,
    other short strings. Each part is a read-only mapping, empty when the file says nothing of it."""

    training: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    modelspec: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    other: Mapping[str, str] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        for name in _SUMMARY_PARTS:
            object.__setattr__(self, name, _frozen_mapping(getattr(self, name)))

    def __bool__(self) -> bool:
        return bool(self.training or self.modelspec or self.other)

    def __reduce__(self):  # MappingProxyType does not pickle: rebuilt from plain dicts
        return (Summary, tuple(thaw(getattr(self, n)) for n in _SUMMARY_PARTS))

    def to_json(self) -> dict | None:
        out = {n: thaw(getattr(self, n)) for n in _SUMMARY_PARTS if getattr(self, n)}
        return out or None

    @classmethod
    def from_json(cls, d: Any) -> Summary:
        if d is None:
            return _NO_SUMMARY
        if type(d) is not dict or not d.keys() <= set(_SUMMARY_PARTS):
            raise ValueError("summary: expected an object with training / modelspec / other")
        if not all(type(v) is dict and v for v in d.values()):
            raise ValueError("summary: each part is a non-empty object (to_json leaves empty ones out)")
        return cls(**d)


_NO_SUMMARY = Summary()  # immutable, so one instance serves every file without metadata


@dataclass(frozen=True)
class Detection:
    """What a file is, from its header alone, and why. `error` is set when it cannot be read or used.

    Construction freezes what it is given (a dict of components, a list of evidence): detectors build
    mutable locals and hand them over once."""

    path: str
    file_bytes: int | None
    format: str | None
    kind: str = "unknown"
    architecture: str | None = None
    variant: str | None = None
    prediction: str | None = None
    components: Mapping[str, Component] = field(default_factory=lambda: _EMPTY)
    lora: LoraFacts | None = None
    metadata: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    summary: Summary = _NO_SUMMARY
    evidence: tuple[Evidence, ...] = ()
    error: Failure | None = None
    # Other families that use this very layout (a VAE or a backbone they share). Last, so positional
    # construction keeps working; to_json writes it after `architecture`.
    also: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Cheap when given frozen parts (from_json, dataclasses.replace): a warm library scan builds
        # one Detection per cached file.
        if type(self.components) is not MappingProxyType:
            object.__setattr__(self, "components", MappingProxyType(dict(self.components)))
        if type(self.metadata) is not MappingProxyType:
            object.__setattr__(self, "metadata", freeze(self.metadata))
        if type(self.evidence) is not tuple:
            object.__setattr__(self, "evidence", tuple(self.evidence))
        if type(self.also) is not tuple:
            object.__setattr__(self, "also", tuple(self.also))
        # The typed parts only: a dict here is a caller still speaking JSON (fail now, not at to_json()).
        if not (
            isinstance(self.summary, Summary)
            and (self.lora is None or isinstance(self.lora, LoraFacts))
            and (self.error is None or isinstance(self.error, Failure))
        ):
            for name, cls in (("lora", LoraFacts), ("summary", Summary), ("error", Failure)):
                v = getattr(self, name)
                if not (isinstance(v, cls) or (v is None and name != "summary")):
                    raise TypeError(f"Detection.{name} must be a {cls.__name__}, not {type(v).__name__}")

    def __reduce__(self):  # for worker processes: MappingProxyType does not pickle, plain dicts do
        return (
            Detection,
            (self.path, self.file_bytes, self.format, self.kind, self.architecture, self.variant,
             self.prediction, dict(self.components), self.lora, thaw(self.metadata), self.summary,
             self.evidence, self.error, self.also),
        )  # fmt: skip

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
            "lora": None if self.lora is None else self.lora.to_json(),
            "metadata": thaw(self.metadata),
            "summary": self.summary.to_json(),
            "evidence": [e.to_json() for e in self.evidence],
            "error": None if self.error is None else self.error.to_json(),
        }

    @classmethod
    def from_json(cls, d: Any) -> Detection:
        """The Detection a to_json() object describes. ValueError when `d` is not one (a cache row of
        another version, a hand-edited file): the caller detects the file again."""
        (path, file_bytes, fmt, kind, arch, also, variant, prediction, components, lora, metadata,
         summary, evidence, error) = _DETECTION.values(d)  # fmt: skip
        return cls(
            path, file_bytes, fmt, kind, arch, variant, prediction,
            MappingProxyType({k: Component.from_json(v) for k, v in components.items()}),
            None if lora is None else LoraFacts.from_json(lora),
            freeze(metadata),
            Summary.from_json(summary),
            tuple(Evidence.from_json(e) for e in evidence),
            None if error is None else Failure.from_json(error),
            tuple(_names(also, "detection.also")),
        )  # fmt: skip


_DETECTION = _Schema(
    "detection", path=_STR, file_bytes=_OPT_INT, format=_OPT_STR, kind=_STR, architecture=_OPT_STR,
    also=_LIST, variant=_OPT_STR, prediction=_OPT_STR, components=_DICT, lora=_OPT_DICT, metadata=_DICT,
    summary=_OPT_DICT, evidence=_LIST, error=_OPT_DICT,
)  # fmt: skip
