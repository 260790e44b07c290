"""The benchmarks' regression check: run them, keep each figure's best, compare with the baseline.

    python benchmarks/check.py [--rounds 3] [--confirm 2] [--full] [--no-compare] [--latest F] [--baseline F]

Runs the default set (with the sampling step of a narrow 30-block Wan: ops and hand-overs, little
arithmetic; `--full` adds the VAE at the real SD width, 128, the 2048^2 tiled decode, the
TAEF2 round trip and the SD1.5 sampling step against diffusers) `--rounds` times — benchmarks
that repeat inside one process get `--repeat N` once instead — with every line appended to
`benchmarks/results/latest.jsonl`. Then keeps each figure's best line by its `better` direction
(`results/best.jsonl`), and prints every figure more than 20 % worse than `benchmarks/baseline.jsonl`
(and worse by more than its line's `slack`, where it has one), every missed goal, and a table of all figures;
a time judged by its value is first divided by the machine's speed factor, its benchmark's reference
workloads' time against the baseline's (machine_speed). Exits 1 when anything was flagged or a benchmark
failed, 0 otherwise. A flag counts only if it shows again: the benchmarks behind flagged figures run
`--confirm` more rounds (default 2) and each figure keeps its best over all rounds; what cleared is
printed. `--rounds 0` compares the lines already in `latest.jsonl` without running.

Line format and the judged figure: see benchmarks/_record.py. Timings are not part of `make test`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"
LATEST = RESULTS / "latest.jsonl"
BEST = RESULTS / "best.jsonl"
BASELINE = HERE / "baseline.jsonl"
TOLERANCE = 0.20  # a figure more than this much worse than the baseline is a regression

sys.path.insert(0, str(HERE))
from _record import OUT_ENV, ROUND_ENV, goal_met  # noqa: E402


@dataclass(frozen=True)
class Bench:
    """One benchmark run: its script and arguments; `repeat` names its own best-of-N option, if it has
    one (then a best of N is one run with that option, not N runs)."""

    argv: tuple[str, ...]
    repeat: str | None = None


# The VAE keeps the bench's 1024^2 image, 512-px tiles and 64 px of overlap, where the goals
# were set: a 512^2 image with 256-px tiles is 4x cheaper but changes the figures themselves (one busy run
# each: tiled time 3.2x instead of 1.9x the full decode, peak 0.81x instead of 0.24x). The 2048^2 flatness
# check and the TAEF2 round trip (each several minutes on two busy cores, no goal) are left to the full set.
VAE_DEFAULT = ("bench_vae.py", "--big", "0", "--skip-taef2")
DEFAULT = (
    Bench(("bench_detect.py",)),
    Bench(("bench_header.py",)),
    Bench(("bench_sample.py",)),
    Bench(("bench_scan.py",)),
    Bench(("bench_patch.py",)),
    Bench(("bench_lycoris.py",), repeat="--repeat"),
    Bench(("bench_facade.py",), repeat="--repeat"),
    Bench(("bench_load.py",), repeat="--repeat"),
    Bench(("bench_conv_gemm.py",), repeat="--repeat"),
    Bench(("bench_gguf_load.py",), repeat="--repeat"),
    Bench(("bench_ckpt_load.py",), repeat="--repeat"),
    Bench(VAE_DEFAULT, repeat="--repeat"),
    Bench(("bench_vae_video.py",), repeat="--repeat"),
    Bench(("bench_gui.py",)),
    # the per-op cost of a step (streamed modules' hand-over included): ~360 small modules, ~1 min a round
    Bench(("bench_step.py", "--family", "wan_narrow", "--steps", "20"), repeat="--rounds"),
)
# The full set: every VAE figure at width 32 (its defaults), and the real SD VAE width, 128.
FULL = (
    *(b if b.argv != VAE_DEFAULT else Bench(("bench_vae.py",), repeat="--repeat") for b in DEFAULT),
    Bench(("bench_vae_video.py", "--long"), repeat="--repeat"),
    Bench(("bench_vae_vit.py",), repeat="--repeat"),  # MiniMax-H3's ViT VAE against diffusers' decode
    Bench(("bench_vae_encode.py",), repeat="--repeat"),  # a video encode's estimate against its peak
    Bench(("bench_audio.py",), repeat="--repeat"),  # LTX-2's sound decode against diffusers' (1 min a round)
    Bench(
        ("bench_vae.py", "--ch", "128", "--big", "0", "--skip-taef2", "--skip-small-tiles"), repeat="--repeat"
    ),
    # the SD1.5 step against diffusers (issue 15's goals): 2.5 min a round here, its rounds interleaved inside
    Bench(("bench_step.py",), repeat="--rounds"),
)


# --- the check: pure functions over lines ------------------------------------------------------------


def read_lines(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(s) for s in path.read_text(encoding="utf-8").splitlines() if s.strip()]


def figure(line: dict) -> float | None:
    """The number a line is judged by: its ratio, or its value (see _record.record)."""
    return line.get(line.get("judged") or "ratio")


def _beats(a: float | None, b: float | None, better: str) -> bool:
    if b is None:
        return True
    return a is not None and (a < b if better == "lower" else a > b)


def best_of(lines: list[dict]) -> dict[str, dict]:
    """Each figure's best line, by its `better` direction; lines without a figure lose to any with one."""
    best: dict[str, dict] = {}
    for line in lines:
        old = best.get(line["name"])
        if old is None or _beats(figure(line), figure(old), line["better"]):
            best[line["name"]] = line
    return best


def worse_by(now: float, then: float, better: str) -> float | None:
    """How much worse `now` is than `then`, as a fraction of `then` (negative: better); None when the
    baseline figure is zero or its sign makes a relative change meaningless."""
    if then <= 0:
        return None
    change = (now - then) / then
    return change if better == "lower" else -change


# --- the machine's speed: the same-run reference workloads against the baseline's ------------------

TIME_UNITS = ("s", "s/s")  # a value in these units stretches with a slower machine; bytes and dB do not
MIN_REFERENCES = 2  # a benchmark's own speed factor needs this many reference workloads


def machine_speed(latest: dict[str, dict], baseline: dict[str, dict]) -> dict[str | None, float]:
    """How much longer than at the baseline this run's *reference* workloads took (load_file, torch.load,
    del + gc, the sampling loop...: the other side of every ratio, code that is not ours), by benchmark:
    the median over its distinct reference workloads where it has two or more (one alone is as noisy as
    the figure: bench_gguf_load's reader ran 0.64x its baseline time on a day every other ran 1.2-3.6x),
    under `None` the median over all of them, for the rest.

    Why: a figure judged by its value (a build time, the graph's CPU per second) has no same-run
    reference of its own to be a ratio of (or had one too noisy to judge by: see bench_load's unload),
    and this machine's speed moves from day to day -- on 2026-11-27 every reference ran 1.2-3.6x its
    baseline time, and the code of the baseline's own commit timed 1.5-2.5x its baseline value. So such a
    figure is judged after dividing by its benchmark's factor, measured in the same processes minutes
    apart: a change in our code moves the figure and not the factor; a slower machine moves both."""
    by_bench: dict[str | None, list[float]] = {}
    seen = set()
    for name, line in latest.items():
        base = baseline.get(name)
        now, then = line.get("baseline_value"), (base or {}).get("baseline_value")
        if line.get("unit") not in TIME_UNITS or not _positive(now) or not _positive(then):
            continue
        key = (line.get("bench"), line.get("baseline"), then)  # one workload behind several figures: once
        if key in seen:
            continue
        seen.add(key)
        by_bench.setdefault(line.get("bench"), []).append(now / then)
    every = [f for fs in by_bench.values() for f in fs]
    speed = {bench: _median(fs) for bench, fs in by_bench.items() if len(fs) >= MIN_REFERENCES}
    if every:
        speed[None] = _median(every)
    return speed


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def scale_of(line: dict, speed: dict[str | None, float]) -> float:
    """The factor a line's judged figure is divided by: its benchmark's (else every benchmark's) speed
    factor for a time judged by value; 1 for ratios (their reference ran beside them) and other units."""
    if line.get("judged") != "value" or line.get("unit") not in TIME_UNITS:
        return 1.0
    return speed.get(line.get("bench"), speed.get(None, 1.0))


@dataclass(frozen=True)
class Row:
    name: str
    judged: str
    better: str
    now: float | None
    then: float | None  # the baseline's figure; None when the baseline lacks it
    change: float | None  # fraction worse than the baseline (negative: better)
    goal: float | None
    regressed: bool
    missed_goal: bool
    new: bool
    measured: str = ""  # the line's own value and unit, for the reader
    scale: float = 1.0  # the machine's speed factor `now` was divided by (see machine_speed)


@dataclass(frozen=True)
class Report:
    rows: tuple[Row, ...]
    not_measured: tuple[str, ...]  # in the baseline, absent now (a skipped or renamed figure)
    failed_benches: tuple[str, ...] = ()
    speed: dict = None  # machine_speed's factors (None: not scaled)

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.regressed]

    @property
    def missed_goals(self) -> list[Row]:
        return [r for r in self.rows if r.missed_goal]

    @property
    def ok(self) -> bool:
        return not (self.regressions or self.missed_goals or self.failed_benches)


def compare(
    latest: dict[str, dict],
    baseline: dict[str, dict],
    tolerance: float = TOLERANCE,
    failed_benches: tuple[str, ...] = (),
    scaled: bool = True,
) -> Report:
    """Each figure of `latest` against `baseline`; with `scaled`, times judged by value are divided by
    their benchmark's machine-speed factor first (machine_speed). Goals hold for the raw figure: they
    are what a user's machine must do."""
    speed = machine_speed(latest, baseline) if scaled else {}
    rows = []
    for name, line in latest.items():
        raw, better, goal = figure(line), line["better"], line.get("goal")
        base = baseline.get(name)
        then = figure(base) if base is not None else None
        scale = scale_of(line, speed) if then is not None else 1.0
        now = raw / scale if raw is not None else None
        change = worse_by(now, then, better) if now is not None and then is not None else None
        slack = line.get("slack", base.get("slack") if base else None) or 0.0
        beyond_slack = change is not None and abs(now - then) > slack
        rows.append(
            Row(
                name=name,
                judged=line.get("judged", "ratio"),
                better=better,
                now=now,
                then=then,
                change=change,
                goal=goal,
                regressed=change is not None and change > tolerance and beyond_slack,
                missed_goal=goal_met(raw, goal, better) is False,
                new=base is None,
                measured=_measured(line),
                scale=scale,
            )
        )
    gone = tuple(n for n in baseline if n not in latest)
    return Report(tuple(rows), gone, tuple(failed_benches), speed or None)


# --- printing ----------------------------------------------------------------------------------------


def _measured(line: dict) -> str:
    v, unit = line.get("value"), line.get("unit") or ""
    if v is None:
        return "-"
    if unit == "B":
        return f"{v / 2**20:.4g} MiB"
    return f"{v:.4g} {unit}".strip()


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _goal(r: Row) -> str:
    return "-" if r.goal is None else ("<= " if r.better == "lower" else ">= ") + f"{r.goal:g}"


def _status(r: Row) -> str:
    marks = [m for m, on in (("REGRESSED", r.regressed), ("MISSED GOAL", r.missed_goal)) if on]
    if r.new:
        marks.append("new")
    if not r.regressed and r.change is not None and r.change > TOLERANCE:
        marks.append("ok (within its slack)")
    status = ", ".join(marks) or "ok"
    return status + (f" (now = measured / {r.scale:.3g}, the machine)" if r.scale != 1.0 else "")


def speed_note(report: Report) -> str | None:
    """One line on the machine-speed factors the times judged by value were divided by."""
    speed = report.speed or {}
    if None not in speed or not any(r.scale != 1.0 for r in report.rows):
        return None
    by = ", ".join(f"{b} {f:.2f}x" for b, f in sorted((b, f) for b, f in speed.items() if b is not None))
    return (f"machine: the same-run reference workloads took {speed[None]:.2f}x their baseline time (median; "
            f"by benchmark: {by}); each time judged by value is divided by its benchmark's factor")  # fmt: skip


def format_report(report: Report, baseline_path: Path, rounds: str) -> str:
    out = []
    for r in sorted(report.regressions, key=lambda r: r.name):
        scaled = f" ({r.measured} measured / {r.scale:.3g}, the machine)" if r.scale != 1.0 else ""
        out.append(
            f"REGRESSED    {r.name}: {r.judged} {_num(r.now)}{scaled} vs baseline {_num(r.then)} "
            f"({r.change:+.0%} worse; {r.better} is better)"
        )
    for r in sorted(report.missed_goals, key=lambda r: r.name):
        out.append(f"MISSED GOAL  {r.name}: {r.judged} {_num(r.now)}, goal {_goal(r)}")
    for b in report.failed_benches:
        out.append(f"FAILED       {b} (its figures are missing)")
    if out:
        out.append("")
    width = max([len(r.name) for r in report.rows] + [6])
    out.append(f"{'figure':<{width}}  {'judged':<6}  {'now':>9}  {'baseline':>9}  {'change':>7}  "
               f"{'goal':>9}  {'measured':>12}  status")  # fmt: skip
    for r in sorted(report.rows, key=lambda r: r.name):
        change = "-" if r.change is None else f"{r.change:+.0%}"
        out.append(
            f"{r.name:<{width}}  {r.judged:<6}  {_num(r.now):>9}  {_num(r.then):>9}  {change:>7}  "
            f"{_goal(r):>9}  {r.measured:>12}  {_status(r)}"
        )
    for n in report.not_measured:
        out.append(f"{n:<{width}}  (in the baseline, not measured this time)")
    out.append("")
    note = speed_note(report)
    if note:
        out.append(note)
    new = sum(r.new for r in report.rows)
    out.append(
        f"{len(report.rows)} figures ({rounds}) against {baseline_path}: "
        f"{len(report.regressions)} regressed > {TOLERANCE:.0%}, {len(report.missed_goals)} missed goals, "
        f"{len(report.failed_benches)} benchmarks failed, {new} new, {len(report.not_measured)} not measured"
        f" -> {'OK' if report.ok else 'FAIL'}"
    )
    return "\n".join(out)


def machine_note(latest: dict[str, dict], baseline: dict[str, dict]) -> str | None:
    """A warning when the baseline was measured on another kind of machine (its times won't compare;
    ratios measured in the same run travel better)."""
    keys = ("cpus", "usable_cpus", "torch", "platform")
    now = {tuple((k, (l.get("machine") or {}).get(k)) for k in keys) for l in latest.values()}  # noqa: E741
    then = {tuple((k, (l.get("machine") or {}).get(k)) for k in keys) for l in baseline.values()}  # noqa: E741
    if not now or not then or now == then:
        return None
    fmt = "; ".join(", ".join(f"{k}={v}" for k, v in m) for m in sorted(then, key=str))
    fmt_now = "; ".join(", ".join(f"{k}={v}" for k, v in m) for m in sorted(now, key=str))
    return f"note: the baseline was measured on another machine ({fmt}); this one: {fmt_now}"


# --- running -----------------------------------------------------------------------------------------


def run(benches: tuple[Bench, ...], rounds: int, out: Path, quiet: bool, first: int = 1) -> tuple[str, ...]:
    """Run every benchmark (rounds interleaved, so each figure's runs see different moments of a busy
    machine), appending their lines to `out` (emptied first unless these are later rounds: `first` >
    1); returns the benchmarks that failed."""
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    if first == 1:
        out.write_text("")
        log.write_text("")
    failed: list[str] = []
    last = first + rounds - 1
    plan = [(b, r) for r in range(first, last + 1) for b in benches if b.repeat is None or r == first]
    for b, r in plan:
        argv = list(b.argv) + ([b.repeat, str(rounds)] if b.repeat else [])
        label = " ".join(argv)
        env = dict(os.environ, **{OUT_ENV: str(out), ROUND_ENV: str(r)})
        tag = f"round {r}/{last}" if b.repeat is None else f"best of {rounds} inside"
        print(f"# {label} ({tag})", file=sys.stderr, flush=True)
        t = time.perf_counter()
        with open(log, "a", encoding="utf-8") as lf:
            p = subprocess.run(
                [sys.executable, str(HERE / argv[0]), *argv[1:]],
                cwd=ROOT,
                env=env,
                stdout=lf if quiet else None,
                check=False,
            )
        print(f"#   {time.perf_counter() - t:.0f} s, exit {p.returncode}", file=sys.stderr, flush=True)
        if p.returncode != 0 and label not in failed:
            failed.append(label)
    return tuple(failed)


def flagged_benches(report: Report, best: dict[str, dict], benches: tuple[Bench, ...]) -> tuple[Bench, ...]:
    """The benchmarks that made a regressed figure or a missed goal (by each line's `bench`, the script's
    name), in their order in `benches`."""
    names = {best[r.name].get("bench") for r in (*report.regressions, *report.missed_goals)}
    return tuple(b for b in benches if Path(b.argv[0]).stem.removeprefix("bench_") in names)


def _rel(p: Path) -> Path:
    try:
        return p.resolve().relative_to(ROOT)
    except ValueError:
        return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="best of N (0: compare latest.jsonl only)")
    ap.add_argument("--full", action="store_true", help="add the VAE at width 128 and more (slow on a CPU)")
    ap.add_argument("--confirm", type=int, default=2,
                    help="more rounds for the benchmarks behind a flag, before it counts (0: none)")  # fmt: skip
    ap.add_argument("--no-compare", action="store_true", help="only run (what `make bench` does)")
    ap.add_argument("--latest", type=Path, default=LATEST)
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    ap.add_argument("--best", type=Path, default=BEST, help="where to write each figure's best line")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    failed: tuple[str, ...] = ()
    if a.rounds > 0:
        failed = run(FULL if a.full else DEFAULT, a.rounds, a.latest, quiet=not a.no_compare)
    if a.no_compare:
        print(f"# {a.latest}: {len(read_lines(a.latest))} lines", file=sys.stderr)
        return 1 if failed else 0
    lines = read_lines(a.latest)
    best = best_of(lines)
    baseline = best_of(read_lines(a.baseline))
    report = compare(best, baseline, failed_benches=failed)
    confirmed = ""
    again = (
        flagged_benches(report, best, FULL if a.full else DEFAULT) if a.rounds > 0 and a.confirm > 0 else ()
    )
    if again:
        # A flag must show again to count: on a shared machine one slow moment moves a figure 20 % (the
        # A/B runs of every closing note since 2026-11-24), so the benchmarks behind a flag run
        # `--confirm` more rounds and each figure keeps its best over all of them. A real regression
        # of 20 % survives a best of five; a burst of load does not.
        before = {r.name: r.now for r in (*report.regressions, *report.missed_goals)}
        print(f"# {len(before)} flagged; running {', '.join(b.argv[0] for b in again)} {a.confirm} more "
              f"round(s) to confirm", file=sys.stderr, flush=True)  # fmt: skip
        failed += run(again, a.confirm, a.latest, quiet=True, first=a.rounds + 1)
        lines = read_lines(a.latest)
        best = best_of(lines)
        report = compare(best, baseline, failed_benches=failed)
        still = {r.name for r in (*report.regressions, *report.missed_goals)}
        after = {r.name: r.now for r in report.rows}  # judged as `before` was: scaled for the machine
        cleared = [f"{n} {_num(v)} -> {_num(after.get(n))}" for n, v in before.items() if n not in still]
        confirmed = (f"confirm: {a.confirm} more round(s) of {len(again)} benchmark(s) behind {len(before)} flag(s); "
                     f"{len(still)} still flagged" + (f"; cleared: {'; '.join(cleared)}" if cleared else ""))  # fmt: skip
    a.best.parent.mkdir(parents=True, exist_ok=True)
    a.best.write_text("".join(json.dumps(line) + "\n" for line in best.values()), encoding="utf-8")
    note = machine_note(best, baseline)
    if note:
        print(note)
    if not baseline:
        print(f"note: no baseline at {_rel(a.baseline)}; `make bench-baseline` makes these best figures it")
    if a.rounds > 0:
        rounds = f"best of {a.rounds}"
    else:
        seen = {line.get("round") for line in lines} - {None}
        n = len(seen) or 1
        rounds = f"best of the {n} round{'s' if n > 1 else ''} in {_rel(a.latest)}"
    print(format_report(report, _rel(a.baseline), rounds))
    if confirmed:
        print(confirmed)
    if a.rounds > 0:
        print(f"took {time.perf_counter() - t0:.0f} s")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
