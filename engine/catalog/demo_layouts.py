"""The key layouts the demo library writes, as (key, dtype, shape) rows in file order: every key and
shape of each real model it imitates, kept as data (demo_layouts.json.gz, ~20 KB) rather than built by
code. The file is generated from the test fixtures' layout builder (tests/support/synth, which checks
its layouts against diffusers, transformers and real files) and committed, so the product neither
imports nor ships the fixtures; tests/engine/test_catalog_demo.py checks the two still agree.
"""

from __future__ import annotations

import gzip
import json
from functools import cache
from importlib.resources import files

DATA = "demo_layouts.json.gz"
Row = tuple[str, str, tuple[int, ...]]


@cache
def _layouts() -> dict[str, tuple[Row, ...]]:
    doc = json.loads(gzip.decompress(files(__package__).joinpath(DATA).read_bytes()))
    return {name: tuple((k, d, tuple(s)) for k, d, s in e["rows"]) for name, e in doc["layouts"].items()}


def names() -> list[str]:
    """The layouts the data file holds."""
    return sorted(_layouts())


def rows(name: str) -> list[Row]:
    """The rows of layout `name` (a KeyError names the ones there are)."""
    try:
        return list(_layouts()[name])
    except KeyError:
        raise KeyError(f"no demo layout {name!r}; known: {', '.join(names())}") from None
