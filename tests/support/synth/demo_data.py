"""The demo library's layouts as data: the product's `loadout demo` writes its sparse and hand-set files
from engine/catalog/demo_layouts.json.gz, generated here once and committed, so it does not need (or
ship) these generators. `python -m tests.support.synth demo-layouts PATH` writes the file again;
tests/engine/test_catalog_demo.py checks the committed one still equals `encode()`.
"""

from __future__ import annotations

import gzip
import json

from . import layout

# layout name -> the options the demo writes it with (every row keeps its own dtype)
DEMO_LAYOUTS: dict[str, dict] = {
    "sd1_checkpoint": {},
    "sdxl_checkpoint": {},
    "flux1_dev_transformer": {"dtype": "BF16"},
    "clip_l": {},
    "t5xxl": {},
    "flux1_vae": {},
    "sd_vae": {},
    "taesd_decoder": {},  # keys and shapes of the hand-set preview decoder / encoder
    "taesd_encoder": {},
    "embedding_sdxl": {},  # a small dense file, random values from a seed
}


def encode() -> bytes:
    """The data file's bytes: gzip'd JSON, {"layouts": {name: {"options", "rows": [[key, dtype, shape]]}}},
    rows in file order. Deterministic (no gzip timestamp), so a regenerated file diffs clean."""
    doc = {
        "format": 1,
        "source": "written by the test fixtures' synth package (demo-layouts); not edited by hand",
        "layouts": {
            name: {"options": opts, "rows": [[k, d, list(s)] for k, d, s in layout(name, **opts)]}
            for name, opts in DEMO_LAYOUTS.items()
        },
    }
    raw = json.dumps(doc, separators=(",", ":")).encode()
    return gzip.compress(raw, compresslevel=9, mtime=0)
