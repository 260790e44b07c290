"""One benchmark figure, one JSON line: printed, and appended to the results file `make bench` names.

Every `bench_*.py` emits through `record()`, so `benchmarks/check.py` can compare any line with the
committed baseline without knowing the benchmark. A line's *judged* figure is its `ratio` against a
baseline measured in the same run, or its `value` where no ratio is meaningful (a time or a PSNR with
an absolute goal); `goal` bounds that figure (null: none stated yet) and `better` says which way is
good. The machine's facts ride along so a baseline from another machine is recognisable.
"""

from __future__ import annotations

import functools
import json
import math
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

OUT_ENV = "LOADOUT_BENCH_OUT"  # a JSONL file each line is appended to (`make bench` sets it)
ROUND_ENV = "LOADOUT_BENCH_ROUND"  # which of several rounds this run is (benchmarks/check.py sets it)

STANDARD = (
    "name", "bench", "value", "unit", "baseline", "baseline_value", "ratio", "judged", "goal", "better",
    "goal_met", "slack", "round", "machine",
)  # fmt: skip


@functools.cache
def machine() -> dict:
    """Facts that make timings comparable, read without importing torch (an import would cost the
    benchmark that records first, and change the process it measures)."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        usable = os.cpu_count()
    return {
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "torch": torch_version,
        "python": platform.python_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
        "commit": _commit(),
    }


def _commit() -> str | None:
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--short=10", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return r.stdout.strip() or None


def _round(x: float | None, digits: int = 4) -> float | None:
    if x is None or not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))


def goal_met(figure: float | None, goal: float | None, better: str) -> bool | None:
    if goal is None or figure is None:
        return None
    return figure <= goal if better == "lower" else figure >= goal


def record(
    name: str,
    value: float,
    unit: str,
    *,
    baseline: str | None = None,
    baseline_value: float | None = None,
    ratio: float | None = None,
    judged: str | None = None,
    goal: float | None = None,
    better: str = "lower",
    slack: float | None = None,
    **extra,
) -> dict:
    """Print one figure as a JSON line and append it to $LOADOUT_BENCH_OUT when set.

    `ratio` defaults to value / baseline_value. `judged` ("ratio" or "value") names the figure that
    `goal` bounds and the regression check compares; it defaults to the ratio when there is a baseline
    figure. `slack` (in the judged figure's units) is a change too small to mean anything for a user,
    whatever its percentage: the check flags a regression only when the figure is worse by more than
    its tolerance *and* by more than this.
    """
    if better not in ("lower", "higher"):
        raise ValueError(f"better must be 'lower' or 'higher', not {better!r}")
    clash = set(extra) & set(STANDARD)
    if clash:
        raise ValueError(f"extra fields shadow standard ones: {sorted(clash)}")
    if ratio is None and baseline_value:
        ratio = value / baseline_value
    # A line with a baseline figure is judged by its ratio even when that came out undefined (a zero
    # baseline): it must not silently switch to comparing its raw value with a baseline ratio.
    judged = judged or ("ratio" if ratio is not None or baseline_value is not None else "value")
    if judged not in ("ratio", "value"):
        raise ValueError(f"judged must be 'ratio' or 'value', not {judged!r}")
    line = {
        "name": name,
        "bench": Path(sys.argv[0]).stem.removeprefix("bench_"),
        "value": _round(value, 6),
        "unit": unit,
        "baseline": baseline,
        "baseline_value": _round(baseline_value, 6),
        "ratio": _round(ratio),
        "judged": judged,
        "goal": goal,
        "better": better,
    }
    line["goal_met"] = goal_met(line[judged], goal, better)
    if slack is not None:
        line["slack"] = slack
    line.update(extra)
    if os.environ.get(ROUND_ENV):
        line["round"] = int(os.environ[ROUND_ENV])
    line["machine"] = machine()
    text = json.dumps(line)
    print(text, flush=True)
    out = os.environ.get(OUT_ENV)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return line
