"""The named layouts: whole files and single components, each with what detection should say of it.

Every entry is a function (Builder-producing) plus a `LayoutInfo` with the expected kind,
architecture, variant and component prefixes, so detection tests can assert against facts that
come from how the file was built, not from a second hand-written table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ._build import Builder, DTypeSpec, Entry, resolve_dtype


@dataclass(frozen=True)
class LayoutInfo:
    """What a correct detector reports for this layout (DESIGN.md vocabulary)."""

    name: str
    kind: str
    architecture: str | None
    variant: str = "normal"
    # the training objective when the family has one (flow for SD3/Flux/AuraFlow, v for HunyuanDiT, eps for
    # SD1/PixArt) or a marker key says it; None where only weight values could tell (SD2, bare SDXL UNets)
    prediction: str | None = None
    # component name -> key prefix within the file ("" for a component saved on its own)
    components: dict[str, str] = field(default_factory=dict)
    naming: str = ""
    note: str = ""


@dataclass(frozen=True)
class _Spec:
    info: LayoutInfo
    build: Callable[..., None]  # build(rows_builder_factory, **options)
    defaults: dict = field(default_factory=dict)


REGISTRY: dict[str, _Spec] = {}


def register(name: str, kind: str, arch: str | None, components: dict[str, str], **info_kw) -> Callable:
    """Decorator: `fn(part, **options)` where part(component, prefix) -> Builder."""

    def deco(fn: Callable[..., None]) -> Callable[..., None]:
        defaults = info_kw.pop("defaults", {})
        REGISTRY[name] = _Spec(
            LayoutInfo(name, kind, arch, components=dict(components), **info_kw), fn, defaults
        )
        return fn

    return deco


class Parts:
    """Hands each component its own Builder with the right prefix and dtype, sharing one row list."""

    def __init__(self, dtype: DTypeSpec, prefix: str = ""):
        self.dtype = dtype
        self.prefix = prefix
        self.rows: list[Entry] = []

    def __call__(self, component: str, prefix: str = "") -> Builder:
        return Builder(resolve_dtype(self.dtype, component), self.prefix + prefix, self.rows)


def build(name: str, dtype: DTypeSpec = "F16", prefix: str = "", **options) -> list[Entry]:
    try:
        spec = REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown layout {name!r}; known: {', '.join(sorted(REGISTRY))}") from None
    parts = Parts(dtype, prefix)
    spec.build(parts, **{**spec.defaults, **options})
    return parts.rows
