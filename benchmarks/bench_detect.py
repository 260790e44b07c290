"""Detection cost per file vs the bare minimum any tool pays: `safetensors.safe_open(...).keys()` plus
metadata on the same header-faithful sparse files (a 6.9 GB SDXL and a 33 GB FLUX.1 all-in-one layout).

Prints per layout one JSON line {"name", "ours_s", "baseline", "baseline_s", "ratio", "tensors"} for
detect_file, and one for the rules alone (detect_index) against the header read they need.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.detect import detect_file  # noqa: E402
from tests.support import synth  # noqa: E402


def _best(fn, repeat: int = 7) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _baseline(path: str) -> None:
    from safetensors import safe_open

    with safe_open(path, framework="np") as f:
        list(f.keys())
        f.metadata()


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("sdxl_checkpoint", "flux1_dev", "sd1_checkpoint"):
            path = str(synth.write(name, Path(tmp) / f"{name}.safetensors"))
            d = detect_file(path)  # warm: imports and page cache
            _baseline(path)
            ours = _best(lambda p=path: detect_file(p))
            base = _best(lambda p=path: _baseline(p))
            row = {
                "name": f"detect_file/{name}",
                "ours_s": round(ours, 6),
                "baseline": "safetensors.safe_open keys()+metadata()",
                "baseline_s": round(base, 6),
                "ratio": round(ours / base, 2),
                "tensors": sum(c.tensors for c in d.components.values()),
                "architecture": d.architecture,
            }
            print(json.dumps(row))
            # Where the time goes: the rules alone vs the header read they stand on.
            from engine.detect import detect_index
            from engine.formats import open_index

            index = open_index(path)
            rules = _best(lambda i=index: detect_index(i))
            header = _best(lambda p=path: open_index(p))
            row = {
                "name": f"detect_index/{name}",
                "ours_s": round(rules, 6),
                "baseline": "engine.formats.open_index (the header read)",
                "baseline_s": round(header, 6),
                "ratio": round(rules / header, 2),
                "tensors": len(index.tensors),
            }
            print(json.dumps(row))


if __name__ == "__main__":
    main()
